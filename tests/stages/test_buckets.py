import time
from collections import defaultdict

import numpy as np
import pytest

from gpu_dedup.stages.buckets import _MEMBER_BUCKET, Buckets, buckets
from gpu_dedup.stages.edges import edges, unique_pairs


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


def _sim_table(pairs, default=0.1):
    """A similarity callback from a dict {(a, b): s} (symmetric), vectorised with a sorted lookup."""
    keys = np.array(sorted((min(a, b) << 32) | max(a, b) for a, b in pairs), np.int64)
    vals = np.array([pairs.get((k >> 32, k & 0xFFFFFFFF), pairs.get((k & 0xFFFFFFFF, k >> 32))) for k in keys])

    def sim(a, b):
        k = (np.minimum(a, b) << 32) | np.maximum(a, b)
        pos = np.clip(np.searchsorted(keys, k), 0, max(len(keys) - 1, 0))
        hit = (keys[pos] == k) if len(keys) else np.zeros(len(k), bool)
        return np.where(hit, vals[pos] if len(keys) else 0.0, default)
    return sim


def test_star_rounds_restar_what_a_weak_centre_rejects():
    from gpu_dedup.stages.buckets import group_buckets
    from gpu_dedup.stages.edges import star_rounds

    b = group_buckets(np.zeros(4, np.int32), np.zeros(4, np.uint64), np.array([0, 1, 2, 3]))
    sim = _sim_table({(1, 2): 0.9, (1, 3): 0.9, (2, 3): 0.9})
    _res = star_rounds(b, sim, 0.8, rounds=1)
    one, scored1 = _res.verified, len(_res.scored)
    assert len(one) == 0 and scored1 == 3  # the plain star: 0 is a weak centre, nothing joins
    _res = star_rounds(b, sim, 0.8, rounds=2)
    two, scored2 = _res.verified, len(_res.scored)
    assert sorted(zip(two.src.tolist(), two.dst.tolist())) == [(1, 2), (1, 3)] and scored2 == 5


def test_star_rounds_one_round_equals_verified_star_edges_and_stays_linear():
    from gpu_dedup.stages.edges import star_rounds

    rng = np.random.default_rng(3)
    bh = rng.integers(0, 4, size=(400, 6)).astype(np.uint64)
    b = buckets(bh)
    sims = rng.random((400, 400))
    sims = (sims + sims.T) / 2

    def sim(a, c):
        return sims[a, c]

    _res = star_rounds(b, sim, 0.5, rounds=1)
    e1, scored1 = _res.verified, len(_res.scored)
    star = edges(b)
    keep = sims[star.src, star.dst] >= 0.5
    assert sorted(zip(e1.src.tolist(), e1.dst.tolist())) == sorted(zip(star.src[keep].tolist(), star.dst[keep].tolist()))
    assert scored1 == len(star)
    for rounds in (2, 3, 5):
        _res = star_rounds(b, sim, 0.5, rounds=rounds)
        e, scored = _res.verified, len(_res.scored)
        assert scored <= rounds * b.members.shape[0]  # linear in memberships
        assert np.all(sims[e.src, e.dst] >= 0.5) and np.all(e.src < e.dst)
        members = {(int(b.band[i]), int(b.hash[i])): set(b.members[b.offsets[i]:b.offsets[i + 1]].tolist())
                   for i in range(len(b))}
        together = {(s, d) for m in members.values() for s in m for d in m if s < d}
        assert set(zip(e.src.tolist(), e.dst.tolist())) <= together  # only pairs that share a bucket
    _res = star_rounds(b, sim, 0.5, rounds=1, keep_all=True)
    e_none, scored = _res.verified, len(_res.scored)
    assert len(e_none) == scored


def test_buckets_of_wide_hashes_match_brute_force_grouping():
    """Full 64-bit hashes, most rows in no bucket (the host drops those before sorting)."""
    rng = np.random.default_rng(5)
    bh = rng.integers(0, 2**64, size=(3000, 6), dtype=np.uint64)
    bh[100:400] = bh[1000:1300]  # near duplicates: every band shared
    bh[::97, 3] = 12345  # one bucket spread over the corpus
    bh[2000:2010, 5] = bh[10, 5]
    b = buckets(bh)
    got = {(int(b.band[i]), int(b.hash[i])): list(b.members[b.offsets[i] : b.offsets[i + 1]]) for i in range(len(b))}
    assert got == _brute_buckets(bh)
    docs = np.arange(3000, dtype=np.int64) * 3 + 11  # rows named by doc numbers
    b2 = buckets(bh, docs=docs)
    assert np.array_equal(b2.members, docs[b.members]) and np.array_equal(b2.offsets, b.offsets)
    single = buckets(bh, min_size=1)  # every row, singletons included
    assert single.members.shape[0] == bh.size


def test_group_buckets_of_a_shuffled_long_frame_match_brute_force():
    """A shuffle partition's long frame (band, hash, doc) in any order, most pairs alone; the same hash in two
    bands is two buckets."""
    from gpu_dedup.stages.buckets import group_buckets, long_frame

    rng = np.random.default_rng(8)
    bh = rng.integers(0, 2**64, size=(2000, 5), dtype=np.uint64)
    bh[50:150] = bh[900:1000]
    bh[::41, 1] = 99
    bh[::53, 2] = 99  # the same value in another band
    frame = long_frame({"band_hashes": bh, "lsh_row": np.arange(2000, dtype=np.int64)})
    perm = rng.permutation(frame["doc"].shape[0])
    b = group_buckets(frame["band"][perm], frame["hash"][perm], frame["doc"][perm])
    got = {(int(b.band[i]), int(b.hash[i])): list(b.members[b.offsets[i] : b.offsets[i + 1]]) for i in range(len(b))}
    assert got == _brute_buckets(bh)
    assert list(got) == sorted(got)  # ordered by (band, hash)
    assert group_buckets(frame["band"], frame["hash"], frame["doc"], min_size=1).members.shape[0] == bh.size


@pytest.mark.parametrize("n", [1, 3, 7])
def test_bucket_dest_sends_every_member_of_a_bucket_to_one_partition(n):
    """Partitions of the buckets shuffle: all rows of one (band, hash) go to one partition, the same hash in
    two bands may go to two, and random hashes spread evenly."""
    from gpu_dedup.stages.buckets import bucket_dest, long_frame

    rng = np.random.default_rng(n)
    bh = rng.integers(0, 2**64, size=(3000, 4), dtype=np.uint64)
    bh[::7] = bh[1::7]  # pairs sharing every band
    bh[::11, 2] = 5
    frame = long_frame({"band_hashes": bh, "lsh_row": np.arange(3000, dtype=np.int64)})
    d = bucket_dest(frame, n)
    assert d.dtype == np.int64 and d.min() >= 0 and d.max() < n
    seen: dict = {}
    for band, h, k in zip(frame["band"].tolist(), frame["hash"].tolist(), d.tolist()):
        assert seen.setdefault((band, h), k) == k
    counts = np.bincount(d, minlength=n)
    assert counts.min() > 0.85 * d.shape[0] / n


@pytest.mark.parametrize(("bands", "blocks", "workers"), [(16, 1, 1), (16, 10, 2), (16, 40, 2), (5, 9, 3), (3, 2, 4)])
def test_band_rounds_cover_every_band_once_in_order(bands, blocks, workers):
    """As many rounds as a worker holds blocks, at most one a band, each a run of consecutive bands."""
    from gpu_dedup.stages.buckets import band_rounds

    rounds = band_rounds(bands, blocks, workers)
    assert len(rounds) == max(1, min(bands, -(-blocks // workers)))
    assert [b for lo, hi in rounds for b in range(lo, hi)] == list(range(bands))
    assert all(hi > lo for lo, hi in rounds)


@pytest.mark.parametrize("parts", [1, 3])
@pytest.mark.parametrize("rounds", [2, 5])
def test_buckets_made_band_round_by_band_round_equal_one_round(parts, rounds):
    """Each partition's buckets of the rounds, concatenated in round order, are the buckets the partition
    gets when every band moves at once (same buckets, same order, same members)."""
    from gpu_dedup.stages.buckets import (band_rounds, bucket_dest, bucket_part, concat_bucket_parts,
                                          long_frame)

    rng = np.random.default_rng(parts * 10 + rounds)
    bh = rng.integers(0, 60, size=(900, 5)).astype(np.uint64)  # few values: large buckets in every band
    blocks = [{"band_hashes": bh[a:a + 300], "lsh_row": np.arange(300, dtype=np.int64)} for a in (0, 300, 600)]

    def routed(bands):
        frames_ = [long_frame(b, first_doc=300 * i, bands=bands) for i, b in enumerate(blocks)]
        whole = {k: np.concatenate([f[k] for f in frames_]) for k in ("band", "hash", "doc")}
        d = bucket_dest(whole, parts)
        return [{k: v[d == p] for k, v in whole.items()} for p in range(parts)]

    one = [bucket_part(p, 2) for p in routed(None)]
    plan = band_rounds(5, rounds * 2, 2)
    assert len(plan) == rounds
    by_round = [[bucket_part(p, 2) for p in routed(r)] for r in plan]
    for p in range(parts):
        got = concat_bucket_parts(*[r[p] for r in by_round])
        for k in ("band", "hash", "offsets", "members"):
            assert np.array_equal(got[k], one[p][k]) and got[k].dtype == one[p][k].dtype, k
    empty = concat_bucket_parts(*[bucket_part({k: v[:0] for k, v in routed(r)[0].items()}, 2) for r in plan])
    assert empty["members"].shape[0] == 0 and empty["offsets"].tolist() == [0]


def test_each_membership_s_bucket_on_the_host_is_the_gpu_lines():
    rng = np.random.default_rng(5)
    sizes = rng.integers(0, 6, 300)  # buckets of no member too: both skip them
    offsets = np.zeros(sizes.shape[0] + 1, np.int64)
    offsets[1:] = np.cumsum(sizes)
    b = Buckets(np.zeros(300, np.int32), np.zeros(300, np.uint64), offsets, np.arange(offsets[-1], dtype=np.int64))
    lines = _MEMBER_BUCKET.pick(np, fast=False)(offsets, int(offsets[-1]))  # what a GPU runs
    assert np.array_equal(b.member_bucket, lines)
    assert np.array_equal(lines, np.repeat(np.arange(300), sizes))
