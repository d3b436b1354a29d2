import numpy as np
import pyarrow as pa

from gpu_dedup.exact import exact_groups, exact_keys
from gpu_dedup.hashing import hash_params
from tests import reference as ref


def test_keys_match_reference_and_groups_collapse_identical_texts():
    texts = ["same text", "other", "same text", "", "", "same text "]
    keys = exact_keys(pa.array(texts, pa.large_string()), seed=42)
    prm = ref.params(42, 0)
    for t, k in zip(texts, keys):
        assert tuple(int(x) for x in k) == ref.exact_key(t.encode(), prm)
    rep = exact_groups(keys, ranks=np.arange(6))
    assert list(rep) == [0, 1, 0, 3, 3, 5]


def test_representative_is_best_ranked_and_ineligible_stay_alone():
    keys = exact_keys(pa.array(["x", "x", "x", "x"], pa.large_string()))
    rep = exact_groups(keys, ranks=np.array([3, 2, 0, 1]), eligible=np.array([True, True, False, True]))
    assert list(rep) == [3, 3, 2, 3]


def test_seed_changes_hashes():
    # (a text of <= 4 bytes is a single Horner token: its hash does not depend on the base)
    a = exact_keys(pa.array(["a longer text"], pa.large_string()), seed=1)
    b = exact_keys(pa.array(["a longer text"], pa.large_string()), seed=2)
    assert a[0, 0] == b[0, 0] and (a[0, 1] != b[0, 1])
    assert hash_params(1, 0).exact_base1 != hash_params(2, 0).exact_base1
