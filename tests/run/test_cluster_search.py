"""A seeded random search for cluster runs that differ from one process, or fail where one process succeeds
(the cases and the comparison: tests/run/cluster_search.py).  Marked ``slow`` (deselected by default):

    pytest -m slow tests/run/test_cluster_search.py

GPU_DEDUP_SEARCH_SEEDS=FIRST:LAST runs other cases (default 0:40, about 4 minutes on 2 loaded cores); a failing
case leaves its inputs and both outputs under the test's tmp_path, and its message names its seed."""

import json
import os

import pytest

from gpu_dedup.run.entry import run_dedup
from tests.run.cluster_search import one_case
from tests.run.clusters import scheduler_of

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def cluster2():
    with scheduler_of(2) as address:
        yield address


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_random_configs_and_corpora_on_workers_equal_single_process(cluster2, tmp_path):
    first, last = map(int, os.environ.get("GPU_DEDUP_SEARCH_SEEDS", "0:40").split(":"))
    failed = []
    for seed in range(first, last):
        case = one_case(seed, cluster2, tmp_path, run_dedup)
        if case["problems"]:
            failed.append(json.dumps(case, default=str))
    assert not failed, f"{len(failed)} of {last - first} cases differ:\n" + "\n".join(failed)
