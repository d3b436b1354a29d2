"""Exact cosine and the Hamming estimate (verify stage, similarity: cosine) against the reference."""

import math

import numpy as np
import pytest

from gpu_dedup.backends import Backend
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


# ---------------------------------------------------------------- Cosine.exact_similarity on its backend


class Recording:
    """A backend that records which of its cosine entry points ran, computing with ``inner``; ``xp``: the
    array module it says it computes in (a stand-in module: the vectors count as being elsewhere)."""

    def __init__(self, inner, xp=None):
        self.inner, self.xp, self.calls = inner, xp or inner.xp, []

    holds = Backend.holds  # whether the vectors are in its memory (its xp's), as every backend answers

    def row_norms(self, vectors):
        self.calls.append(("row_norms", vectors.shape[0]))
        return self.inner.row_norms(vectors)

    def cosine_pairs(self, vectors, norms, left, right):
        self.calls.append(("cosine_pairs", vectors.shape[0]))
        return self.inner.cosine_pairs(vectors, norms, left, right)


def _elsewhere():
    """An array module that is not NumPy but makes NumPy arrays: NumPy under another name."""
    import types

    xp = types.ModuleType("elsewhere")
    xp.__getattr__ = lambda name: getattr(np, name)
    return xp


def _vector_case():
    from gpu_dedup.config import Config
    from gpu_dedup.stages.families import RowData, family_for
    from gpu_dedup.stages.vectors import from_numpy

    rng = np.random.default_rng(21)
    x = rng.standard_normal((40, 13)).astype(np.float32)
    x[5] = 0  # no direction: scores 0 with everything
    x[9] = x[8] * np.float32(3.0)
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "input": {"vector_column": "emb"}})
    left = np.array([0, 8, 5, 30, 39, 12, 12, 3], np.int64)
    right = np.array([1, 9, 6, 2, 0, 12, 30, 3], np.int64)
    return family_for(cfg, 40), RowData(vectors=from_numpy(x, bad_vectors="keep")), x, left, right


def test_vector_exact_similarity_runs_on_the_backend_it_is_given(cpu_backend):
    from dataclasses import replace

    from gpu_dedup.backends import on_device, to_device, to_host

    fam, rows, x, left, right = _vector_case()
    be = Recording(cpu_backend)
    # the vectors where the backend computes (device memory on a GPU backend, as a GPU run holds them)
    rows.vectors = replace(rows.vectors, matrix=to_device(rows.vectors.matrix, be.xp))
    got = fam.exact_similarity(rows, left, right, be)
    assert [c[0] for c in be.calls] == ["row_norms", "cosine_pairs"] and be.calls[1][1] == 40  # in place
    assert on_device(got) == on_device(rows.vectors.matrix)  # the results are where the vectors are
    got = to_host(got)
    assert got.dtype == np.float64 and np.array_equal(got, cosine_similarity(left, right, x))
    for k in range(left.shape[0]):
        want = ref.cosine([float(v) for v in x[left[k]]], [float(v) for v in x[right[k]]])
        assert got[k] == pytest.approx(want, rel=1e-13, abs=1e-15)
    assert got[2] == 0.0 and got[5] == pytest.approx(1.0, abs=1e-15)


def test_vectors_elsewhere_than_the_backend_send_only_the_rows_the_pairs_name(cpu_backend):
    fam, rows, x, left, right = _vector_case()
    be = Recording(cpu_backend, xp=_elsewhere())
    got = fam.exact_similarity(rows, left, right, be)
    distinct = np.unique(np.concatenate((left, right))).shape[0]
    assert be.calls == [("row_norms", distinct), ("cosine_pairs", distinct)] and distinct < 40
    assert np.array_equal(got, cosine_similarity(left, right, x))  # the same bits as scoring in place
    none = np.zeros(0, np.int64)
    empty = fam.exact_similarity(rows, none, none, Recording(cpu_backend, _elsewhere()))
    assert empty.shape == (0,) and empty.dtype == np.float64
