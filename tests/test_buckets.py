import time
from collections import defaultdict

import numpy as np

from gpu_dedup.buckets import buckets, edges, unique_pairs


def _brute_buckets(bh):
    groups = defaultdict(list)
    for doc in range(bh.shape[0]):
        for band in range(bh.shape[1]):
            groups[(band, int(bh[doc, band]))].append(doc)
    return {k: v for k, v in groups.items() if len(v) > 1}


def test_buckets_match_brute_force_grouping():
    rng = np.random.default_rng(0)
    bh = rng.integers(0, 6, size=(200, 4)).astype(np.uint64)
    b = buckets(bh)
    got = {(int(b.band[i]), int(b.hash[i])): list(b.members[b.offsets[i] : b.offsets[i + 1]]) for i in range(len(b))}
    assert got == _brute_buckets(bh)
    frame = b.to_frame()
    assert len(frame) == b.members.shape[0] and set(frame.columns) == {"band", "band_hash", "doc"}


def test_star_edges_are_linear_and_connect_each_bucket():
    rng = np.random.default_rng(1)
    bh = rng.integers(0, 5, size=(300, 3)).astype(np.uint64)
    b = buckets(bh)
    e = edges(b)
    assert np.all(e.src < e.dst)
    assert len(set(zip(e.src, e.dst))) == len(e)
    assert len(e) <= int((b.sizes - 1).sum())
    for i in range(len(b)):  # every bucket is connected through its smallest member
        members = b.members[b.offsets[i] : b.offsets[i + 1]]
        center = members.min()
        pairs = set(zip(e.src, e.dst))
        assert all((center, m) in pairs for m in members if m != center)


def test_no_buckets_no_edges():
    bh = np.arange(20, dtype=np.uint64).reshape(10, 2)
    b = buckets(bh)
    assert len(b) == 0 and len(edges(b)) == 0
    assert len(edges(buckets(np.zeros((0, 3), np.uint64)))) == 0


def test_giant_bucket_costs_linear_edges():
    """A boilerplate bucket of 300k copies in every band: 300k-1 edges, fast."""
    n, bands = 300_000, 16
    bh = np.zeros((n, bands), np.uint64)
    t0 = time.perf_counter()
    e = edges(buckets(bh))
    elapsed = time.perf_counter() - t0
    assert len(e) == n - 1
    assert np.all(e.src == 0)
    assert elapsed < 30  # all-pairs would be 4.5e10 edges


def test_unique_pairs_large_indices_path():
    src = np.array([2**33, 5, 2**33, 5], np.int64)
    dst = np.array([2**34, 7, 2**34, 6], np.int64)
    s, d = unique_pairs(src, dst)
    assert list(zip(s, d)) == [(5, 6), (5, 7), (2**33, 2**34)]
