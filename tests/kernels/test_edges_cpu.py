"""The host's one-pass star round (kernels/edges_cpu.py) against the array code it replaces on the host: the same
pairs in the same order, the same memberships closed (centres, and those whose pair reached the threshold), the
same centres recorded, round after round, with and without forced centres or verification, through whole runs
of star rounds."""

import importlib

import numpy as np
import pytest

from gpu_dedup.kernels.edges_cpu import star_pairs
from gpu_dedup.stages.buckets import Buckets
from gpu_dedup.stages.edges import Centres, StarRounds

edges = importlib.import_module("gpu_dedup.stages.edges")  # the module (the package exports its function)


def _buckets(seed: int, docs: int = 400, buckets: int = 150, empty: bool = False) -> Buckets:
    """Random buckets of 2 to 12 distinct ascending documents (one with no member where ``empty``)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(2, 13, buckets)
    if empty:
        sizes[buckets // 2] = 0
    members = np.concatenate([np.sort(rng.choice(docs, s, replace=False)) for s in sizes]).astype(np.int64)
    offsets = np.zeros(buckets + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return Buckets(np.zeros(buckets, np.int32), rng.integers(0, 2**63, buckets, dtype=np.uint64), offsets, members)


def _forced(seed: int, b: Buckets, rounds: int) -> Centres:
    """Centres a prior forces on some buckets at some rounds: documents of the bucket or of the prior (>= 10^6)."""
    rng = np.random.default_rng(seed + 99)
    at = rng.choice(len(b), len(b) // 4, replace=False)
    doc = np.where(rng.random(at.shape[0]) < 0.5, 10**6 + rng.integers(0, 50, at.shape[0]), b.members[b.offsets[at]])
    return Centres(at.astype(np.int64), rng.integers(0, rounds, at.shape[0]).astype(np.int64), doc.astype(np.int64))


def _rounds(b, forced, rounds, sim, monkeypatch, host: bool, keep_all: bool = False):
    monkeypatch.setattr(edges, "HOST_PASS", host)
    state = StarRounds(b, 0.5, rounds, keep_all=keep_all, forced=forced)
    seen = []
    for _ in range(rounds):
        src, dst = state.propose()
        seen.append((src.copy(), dst.copy(), state.open_.copy()))
        state.accept(sim(src, dst) if src.shape[0] else None)
    return seen, state.result()


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("forced", [False, True])
@pytest.mark.parametrize("keep_all", [False, True])
def test_host_rounds_propose_and_close_what_the_array_code_does(seed, forced, keep_all, monkeypatch):
    b = _buckets(seed, empty=seed % 3 == 2)
    rounds = 3
    f = _forced(seed, b, rounds) if forced else None
    table = np.random.default_rng(seed).integers(0, 5, 10**6 + 50) / 4

    def sim(src, dst):  # a similarity of the pair, symmetric: below, at and above the threshold
        return (table[src] + table[dst]) / 2

    host = _rounds(b, f, rounds, sim, monkeypatch, True, keep_all)
    array = _rounds(b, f, rounds, sim, monkeypatch, False, keep_all)
    for (hs, hd, ho), (as_, ad, ao) in zip(host[0], array[0]):
        assert np.array_equal(hs, as_) and np.array_equal(hd, ad) and np.array_equal(ho, ao)
    assert sum(s.shape[0] for s, _, _ in host[0][1:]) > 0 or keep_all  # later rounds re-star what round 0 left
    hr, ar = host[1], array[1]
    for a, c in ((hr.verified, ar.verified), (hr.scored, ar.scored)):
        assert np.array_equal(a.src, c.src) and np.array_equal(a.dst, c.dst)
        assert np.array_equal(a.similarity, c.similarity)
    for k in ("bucket", "round", "doc"):
        assert np.array_equal(getattr(hr.centres, k), getattr(ar.centres, k)), k


def test_a_group_of_one_forced_centre_and_empty_rounds():
    """A group whose centre is forced compares every member (its first too); a group of one own member compares
    nothing and closes it; no groups give nothing."""
    i64 = np.zeros(0, np.int64)
    open_ = np.ones(4, bool)
    members, keys, own = star_pairs(i64, np.array([0, 3, 4], np.int64), np.array([0, 0, 0, 1], np.int64),
                                    np.array([5, 6, 7, 8], np.int64), np.array([9, -1], np.int64), open_)
    assert members.tolist() == [0, 1, 2] and own.tolist() == [False, True]
    assert keys.tolist() == [(5 << 32) | 9, (6 << 32) | 9, (7 << 32) | 9]
    assert open_.tolist() == [True, True, True, False]
    members, keys, own = star_pairs(i64, np.zeros(1, np.int64), i64, i64, i64, np.ones(0, bool))
    assert members.shape == keys.shape == own.shape == (0,)
