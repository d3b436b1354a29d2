import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.kernels.params import hash_params

from gpu_dedup.stages.exact import exact_groups, exact_keys
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
    for text in ("a longer text", "a", ""):
        a = exact_keys(pa.array([text], pa.large_string()), seed=1)
        b = exact_keys(pa.array([text], pa.large_string()), seed=2)
        assert a[0, 0] == b[0, 0] and a[0, 1] != b[0, 1] and a[0, 2] != b[0, 2]
    assert hash_params(1, 0).exact_seed1 != hash_params(2, 0).exact_seed1


def test_keys_are_distinct_for_many_near_identical_texts():
    """Texts that differ in one byte anywhere, or only in length (trailing NUL), get different keys."""
    base = "the same long document text, repeated to span several 8-byte words " * 3
    texts = [base[:i] + "#" + base[i + 1:] for i in range(len(base))] + [base, base + "\x00", base[:-1]]
    keys = exact_keys(pa.array(texts, pa.large_string()))
    assert len({tuple(k) for k in keys.tolist()}) == len(texts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2), st.integers(0, 3), st.booleans()),
                max_size=40))
def test_groups_are_the_references_when_keys_share_one_lane_and_not_another(rows):
    """Keys from a few values per lane, so that documents share the first hash but not the length or the
    second hash (and the reverse), ranks tie, and some documents are not eligible."""
    keys = np.array([r[:3] for r in rows], np.uint64).reshape(-1, 3)
    ranks = np.array([r[3] for r in rows], np.int64)
    eligible = np.array([r[4] for r in rows], bool)
    assert list(exact_groups(keys, ranks, eligible)) == ref.exact_representatives(keys, ranks, eligible)
    assert list(exact_groups(keys, ranks)) == ref.exact_representatives(keys, ranks)


def test_groups_at_scale_are_the_references():
    """10^5 random keys, a few thousand of them copied over others (and some with only the first hash
    copied): the one unstable sort that sets the unique documents aside changes nothing."""
    rng = np.random.default_rng(5)
    n = 100_000
    keys = rng.integers(0, 2**63, (n, 3), dtype=np.uint64)
    keys[rng.integers(0, n, 3000)] = keys[rng.integers(0, n, 3000)]
    keys[rng.integers(0, n, 500), 1] = keys[rng.integers(0, n, 500), 1]
    ranks = rng.integers(0, n // 2, n)
    assert list(exact_groups(keys, ranks)) == ref.exact_representatives(keys, ranks)


def test_runs_of_one_first_hash_are_the_groups_without_the_full_sort(monkeypatch):
    """10^5 documents, every one with copies (ten texts of each of 10^4, in the order a corpus of ten copies
    has them), ranks in document order: the runs of equal first hash are the groups, taken without the sort
    by all four keys; one first-hash collision between different texts, or a rank that falls inside a run,
    takes the full sort. Every case is the reference's."""
    import gpu_dedup.stages.exact as exact

    rng = np.random.default_rng(7)
    base = rng.integers(0, 2**63, (10_000, 3), dtype=np.uint64)
    keys = np.tile(base, (10, 1))  # copy c of text i at row c * 10^4 + i
    ranks = np.arange(keys.shape[0])
    sorts = []
    full = exact.stable_order
    monkeypatch.setattr(exact, "stable_order", lambda *k: sorts.append(len(k)) or full(*k))
    assert list(exact_groups(keys, ranks)) == ref.exact_representatives(keys, ranks)
    assert sorts == [1]  # the first hash's sort alone
    collided = keys.copy()
    collided[5, 1] = collided[6, 1]  # text 5's copy at row 5 shares text 6's first hash, not its other lanes
    sorts.clear()
    assert list(exact_groups(collided, ranks)) == ref.exact_representatives(collided, ranks)
    assert sorts == [1, 4]
    falling = ranks[::-1].copy()  # the best-ranked copy is the last one in document order
    sorts.clear()
    assert list(exact_groups(keys, falling)) == ref.exact_representatives(keys, falling)
    assert sorts == [1, 4]


def test_the_key_frame_is_the_blocks_own_columns_where_every_row_has_a_key():
    """Every row eligible and keyed: the columns as they are (no copy of 10^7 rows); otherwise the keyed rows."""
    from gpu_dedup.stages.exact import NO_KEY, key_frame

    n = 6
    docs = {"row": np.arange(n), "rank": np.arange(n)[::-1].copy(), "eligible": np.ones(n, bool)}
    keys = {k: np.arange(n, dtype=np.uint64) + i for i, k in enumerate(("k0", "k1", "k2"))}
    whole = key_frame(docs, keys)
    assert all(whole[k] is v for k, v in {**docs, **keys}.items() if k != "eligible")
    docs["eligible"][1] = False
    keys["k0"][4] = np.uint64(int(NO_KEY))
    some = key_frame(docs, keys)
    assert some["row"].tolist() == [0, 2, 3, 5] and some["rank"].tolist() == [5, 3, 2, 0]
    assert some["k2"].tolist() == [2, 4, 5, 7] and some["k0"] is not keys["k0"]
