"""The buckets' pre-filter: a row is unmarked only when no other row has its hash in that band."""

import numpy as np
import pytest

from gpu_dedup.kernels.buckets_cpu import log2_slots, maybe_shared


def _shared(bh: np.ndarray) -> np.ndarray:
    """(bands, rows): whether another row has the same hash in the band (by counting, no kernel)."""
    out = np.zeros((bh.shape[1], bh.shape[0]), bool)
    for j in range(bh.shape[1]):
        _, inverse, counts = np.unique(bh[:, j], return_inverse=True, return_counts=True)
        out[j] = counts[inverse] > 1
    return out


@pytest.mark.parametrize("rows", [0, 1, 2, 7, 5000, 70_000])
def test_every_shared_hash_is_marked(rows):
    rng = np.random.default_rng(rows)
    bh = rng.integers(0, 2**64, size=(rows, 5), dtype=np.uint64)
    if rows > 10:
        bh[: rows // 10] = bh[rows // 10 : 2 * (rows // 10)]  # whole rows repeated
        bh[::7, 2] = 3  # hashes with few significant bits: one big bucket
        bh[1::50, 4] = 2**63  # and one with only the top bit
    truth = _shared(bh)
    got = maybe_shared(bh)
    assert got.shape == (5, rows)
    assert not (truth & ~got).any()  # never drops a member of a bucket
    if rows >= 5000:  # and drops most singletons (false marks: about 1 in SLOTS_PER_ROW)
        singles = ~truth
        assert (got & singles).sum() < 0.1 * singles.sum()


def test_strided_and_non_contiguous_input():
    rng = np.random.default_rng(3)
    wide = rng.integers(0, 2**64, size=(4000, 8), dtype=np.uint64)
    wide[:500] = wide[500:1000]
    bh = wide[:, ::2]  # a strided view is copied to the kernel's layout
    got, truth = maybe_shared(bh), _shared(bh)
    assert not (truth & ~got).any() and got.sum() < truth.sum() + 0.1 * (~truth).sum()


def test_bitmap_size_bounds():
    assert log2_slots(0) == 12 and log2_slots(1) == 12
    assert 2 ** log2_slots(10**6) >= 32 * 10**6
    assert log2_slots(10**10) == 32  # slots are uint32
