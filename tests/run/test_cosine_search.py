"""A seeded random search over cosine dedup against the slow reference (the cases and the checks:
tests/run/cosine_search.py).  Marked ``slow`` (deselected by default):

    pytest -m slow tests/run/test_cosine_search.py

GPU_DEDUP_COSINE_SEEDS=FIRST:LAST runs other cases (default 0:600, 2 to 4 minutes on 2 loaded cores); a
failing case's message names its seed, its corpus and its config."""

import os
from collections import Counter

import pytest

from tests.run.cosine_search import one_case


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_random_cosine_corpora_and_configs_agree_with_the_reference(tmp_path):
    first, last = map(int, os.environ.get("GPU_DEDUP_COSINE_SEEDS", "0:600").split(":"))
    failed, kinds = [], Counter()
    for seed in range(first, last):
        kind, problems, _ = one_case(seed, tmp_path)
        kinds[kind] += 1
        failed += problems[:3]
    assert not failed, f"{len(failed)} problems in {last - first} cases ({dict(kinds)}):\n" + "\n".join(failed)
