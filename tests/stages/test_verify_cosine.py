"""Exact cosine and the Hamming estimate (verify stage, similarity: cosine) against the reference."""

import math

import numpy as np
import pytest

from gpu_dedup.stages import projections as pj
from gpu_dedup.stages.verify import (
    cosine_similarity,
    hamming_cosine,
    hamming_distance,
    vector_norms,
)
from tests import reference_cosine as ref


def test_exact_cosine_equals_reference_for_every_dimension_remainder():
    rng = np.random.default_rng(4)
    for d in (1, 2, 3, 4, 5, 7, 64, 257):
        x = rng.standard_normal((9, d)).astype(np.float32)
        x[3] = 0
        left = np.array([0, 1, 2, 3, 4, 8, 5], np.int64)
        right = np.array([1, 1, 7, 4, 3, 0, 6], np.int64)
        got = cosine_similarity(left, right, x)
        for k in range(left.shape[0]):
            want = ref.cosine([float(v) for v in x[left[k]]], [float(v) for v in x[right[k]]])
            assert got[k] == pytest.approx(want, rel=1e-13, abs=1e-15)
        assert got[1] == pytest.approx(1.0, abs=1e-15) and got[3] == 0.0 and got[4] == 0.0
        assert np.allclose(vector_norms(x), np.linalg.norm(x.astype(np.float64), axis=1), rtol=1e-14)


def test_exact_cosine_is_scale_invariant_and_symmetric_bit_for_bit():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((50, 33)).astype(np.float32)
    a, b = rng.integers(0, 50, 200), rng.integers(0, 50, 200)
    c1 = cosine_similarity(a, b, x)
    assert np.array_equal(c1, cosine_similarity(b, a, x))  # products commute; the order of terms is fixed
    assert np.allclose(c1, cosine_similarity(a, b, x * 4.0), rtol=0, atol=1e-15)  # power-of-two scale: exact


def test_hamming_and_its_cosine_estimate_equal_reference():
    rng = np.random.default_rng(6)
    bits = rng.integers(0, 2**63, (7, 3), dtype=np.int64).astype(np.uint64) * np.uint64(2) + np.uint64(1)
    left = np.array([0, 1, 2, 6], np.int64)
    right = np.array([1, 1, 5, 0], np.int64)
    h = hamming_distance(left, right, bits)
    est = hamming_cosine(left, right, bits)
    for k in range(4):
        wa, wb = [int(w) for w in bits[left[k]]], [int(w) for w in bits[right[k]]]
        assert h[k] == ref.hamming(wa, wb)
        assert est[k] == pytest.approx(ref.hamming_cosine(wa, wb, 192), abs=1e-15)
    assert h[1] == 0 and est[1] == 1.0
    # the first 70 bits only
    e70 = hamming_cosine(left, right, bits, nbits=70)
    wa, wb = ref.unpack([int(w) for w in bits[0]], 192)[:70], ref.unpack([int(w) for w in bits[1]], 192)[:70]
    assert e70[0] == pytest.approx(math.cos(math.pi * sum(p != q for p, q in zip(wa, wb)) / 70), abs=1e-15)


def test_hamming_estimate_tracks_exact_cosine():
    rng = np.random.default_rng(12)
    u = rng.standard_normal((300, 48)).astype(np.float32)
    v = (u + 0.3 * rng.standard_normal((300, 48))).astype(np.float32)
    x = np.concatenate([u, v])
    sig = pj.signatures(x, 1024, 5)
    left, right = np.arange(300), np.arange(300) + 300
    exact = cosine_similarity(left, right, x)
    est = hamming_cosine(left, right, sig.bits)
    assert abs(float(np.mean(est - exact))) < 0.01 and float(np.std(est - exact)) < 0.03
