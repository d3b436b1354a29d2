"""backends/radix.py (through backends.stable_order and backends.sorted_copy): the host's radix sort gives NumPy's stable orders and sorted copies, for every integer key
type, one key or several (packed into one value or sorted one after another), and whole runs do not change."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.backends import distinct, radix, sorted_copy, stable_order

DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_]


@pytest.fixture
def by_radix(monkeypatch):
    """Every sort of two or more rows by radix (RADIX_MIN is 2**16 in a run)."""
    monkeypatch.setattr(radix, "RADIX_MIN", 2)
    calls = []
    real = radix._order, radix._sorted
    monkeypatch.setattr(radix, "_order", lambda *a: calls.append("order") or real[0](*a))
    monkeypatch.setattr(radix, "_sorted", lambda *a: calls.append("sorted") or real[1](*a))
    return calls


def key(dtype, n: int, rng, span: str):
    info = np.iinfo(dtype) if dtype is not np.bool_ else None
    if info is None:
        return rng.integers(0, 2, n).astype(np.bool_)
    lo, hi = (info.min, info.max) if span == "full" else (max(info.min, -3), min(info.max, 5))
    return rng.integers(lo, hi, n, dtype=dtype, endpoint=True)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("span", ["full", "narrow"])
def test_one_key_sorts_as_numpy_stable(by_radix, dtype, span):
    rng = np.random.default_rng(7)
    a = key(dtype, 5000, rng, span)
    assert np.array_equal(stable_order(a), np.argsort(a, kind="stable"))
    got = sorted_copy(a)
    assert got.dtype == a.dtype and np.array_equal(got, np.sort(a))
    assert by_radix == ["order", "sorted"]


def test_several_keys_sort_as_lexsort_packed_or_one_after_another(by_radix):
    rng = np.random.default_rng(3)
    n = 4000
    small = rng.integers(0, 7, n).astype(np.int32)  # 3 bits
    doc = rng.integers(0, 1 << 20, n)  # 20 bits
    signed = rng.integers(-(1 << 40), 1 << 40, n)  # 41 bits
    full = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=np.uint64, endpoint=True)  # 64 bits
    for keys in [(small, doc), (small, doc, signed), (doc, small), (small, full, doc), (full, full), (signed, small)]:
        want = np.lexsort(keys[::-1])
        got = stable_order(*keys)
        assert got.dtype == np.int64 and np.array_equal(got, want)
    assert by_radix == ["order"] * 6


def test_equal_keys_keep_their_rows_in_order_and_nothing_is_changed(by_radix):
    a = np.full(300, 9, np.int64)
    b = np.zeros(300, np.uint64)
    before = a.copy(), b.copy()
    assert np.array_equal(stable_order(a, b), np.arange(300))
    assert np.array_equal(sorted_copy(a), a)
    assert np.array_equal(a, before[0]) and np.array_equal(b, before[1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(0, 40), st.integers(0, (1 << 64) - 1)),
                max_size=300))
def test_random_rows_sort_as_numpy(rows):
    saved = radix.RADIX_MIN
    radix.RADIX_MIN = 2
    try:
        a = np.array([r[0] for r in rows], np.int64)
        b = np.array([r[1] for r in rows], np.int16)
        c = np.array([r[2] for r in rows], np.uint64)
        assert np.array_equal(stable_order(b, a), np.lexsort((a, b)))
        assert np.array_equal(stable_order(a, b, c), np.lexsort((c, b, a)))
        assert np.array_equal(sorted_copy(a), np.sort(a)) and np.array_equal(sorted_copy(c), np.sort(c))
        assert np.array_equal(distinct(c), np.unique(c))
    finally:
        radix.RADIX_MIN = saved


def test_floats_and_below_radix_min_sort_with_numpy(monkeypatch):
    calls = []
    monkeypatch.setattr(radix, "_order", lambda *a: calls.append(a))
    x = np.array([0.5, -1.0, 0.5, 2.0])
    assert np.array_equal(stable_order(x), np.argsort(x, kind="stable"))
    small = np.arange(radix.RADIX_MIN - 1, dtype=np.int64)[::-1].copy()
    assert np.array_equal(stable_order(small), np.argsort(small, kind="stable"))
    assert calls == []


def test_a_sort_while_another_thread_sorts_takes_numpys(monkeypatch):
    """Numba's default thread pool cannot be entered from two threads at once: the second sort goes to NumPy."""
    monkeypatch.setattr(radix, "RADIX_MIN", 2)
    inside, go = threading.Event(), threading.Event()
    real = radix._order

    def slow(keys, n):
        inside.set()
        assert go.wait(30)
        return real(keys, n)

    monkeypatch.setattr(radix, "_order", slow)
    a = np.arange(1000, dtype=np.int64)[::-1].copy()
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("first", stable_order(a)))
    t.start()
    assert inside.wait(30)
    out["second"] = stable_order(a)  # while the first holds the radix sort: NumPy's
    go.set()
    t.join(30)
    assert np.array_equal(out["first"], out["second"]) and np.array_equal(out["second"], np.arange(1000)[::-1])


def test_a_run_with_every_sort_by_radix_equals_one_with_numpys(tmp_path, monkeypatch):
    """Every stage's grouping by radix (RADIX_MIN 2) or by NumPy (RADIX_MIN above the rows) gives the same
    removal set, duplicates table and report counts."""
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards
    from gpu_dedup.run.entry import run_dedup

    corpus = planted_corpus(n_docs=1500, n_clusters=120, cluster_size=(2, 6), words=(20, 60), seed=5)
    write_shards(corpus.table, tmp_path / "in", shards=3)
    cfg = Config.from_dict({"backend": "cpu", "select": {"keep": "longest"}})
    got = {}
    for name, low in (("numpy", 1 << 40), ("radix", 2)):
        monkeypatch.setattr(radix, "RADIX_MIN", low)
        got[name] = run_dedup(tmp_path / "in", tmp_path / name, cfg)
    a, b = got["numpy"], got["radix"]
    assert a.report["counts"] == b.report["counts"] and a.report["counts"]["removed"] > 0
    assert np.array_equal(a.kept, b.kept)
    assert (tmp_path / "numpy" / "duplicates.parquet").read_bytes() == (tmp_path / "radix" / "duplicates.parquet").read_bytes()


def test_rows_in_order_already_are_not_sorted_again(by_radix):
    """Rows already in the keys' order (a frame a stage sorted before) come back as they are, with no sort;
    one row out of order, on any key, takes the sort; float keys always do (NaN compares false)."""
    rng = np.random.default_rng(11)
    label = np.sort(rng.integers(0, 500, 5000))
    rank = rng.integers(0, 10**9, 5000)
    rank = rank[np.lexsort((rank, label))]  # ascending within each label
    assert np.array_equal(stable_order(label, rank), np.arange(5000)) and by_radix == []
    ties = np.repeat(np.arange(50), 100)  # every row tied with its neighbours on the first key
    assert np.array_equal(stable_order(ties, np.zeros(5000, np.int32)), np.arange(5000)) and by_radix == []
    for k in (0, 2499, 4998):
        late = rank.copy()
        j = int(np.flatnonzero(label[k + 1:] == label[k])[0]) + k + 1 if (label[k + 1:] == label[k]).any() else k + 1
        late[k], late[j] = late[j], late[k]  # two ranks swapped: out of order where the labels tie (or on labels)
        got = stable_order(label, late)
        assert np.array_equal(got, np.lexsort((late, label)))
    assert by_radix.count("order") >= 1
    nan = np.zeros(5000)
    nan[7] = np.nan
    assert np.array_equal(stable_order(nan), np.argsort(nan, kind="stable"))
