"""Random-projection signatures, band hashes and buckets against the pure-Python reference."""

import hashlib
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_dedup.curves import (
    cosine_collision,
    cosine_error_areas,
    cosine_layout,
    cosine_min_rows,
    cosine_s_curve,
    cosine_s_curve_points,
    optimal_layout,
)
from gpu_dedup.stages import projections as pj
from tests import reference_cosine as ref

SEED = 20251111


def _words(sig_row):
    return [int(w) for w in sig_row]


# ---------------------------------------------------------------- hyperplanes


def test_gauss8_table_is_pinned_and_symmetric():
    g = pj.GAUSS8
    assert g.tolist() == ref.GAUSS8
    assert g.dtype == np.int64 and g.shape == (256,)
    assert np.all(g % 2 == 1) and np.all(g[::-1] == -g) and np.all(np.diff(g) >= 0)
    assert (int(g.min()), int(g.max())) == (-93, 93) and g[:6].tolist() == [-93, -81, -75, -71, -67, -65]
    assert abs(float(np.std(g)) - 32.0) < 0.6  # a quantized N(0, 32**2)
    assert hashlib.sha256(g.tobytes()).hexdigest()[:16] == "d47d6ec755505843"


def test_hyperplanes_equal_reference_and_golden_values():
    r = pj.hyperplanes(7, 72, SEED)
    assert r.dtype == np.float32 and r.shape == (7, 72)
    assert r.astype(np.int64).tolist() == ref.hyperplanes(7, 72, SEED)
    # golden entries pin the specification (rule 3 of kernels/cosine_scalar.py)
    assert pj.seed_key(0) == ref.seed_key(0) == 0x9CA066F1A4AB2EEA
    assert [int(v) for v in pj.hyperplanes(2, 16, 0)[1, :8]] == [ref.entry(1, j, 0) for j in range(8)]
    assert [int(v) for v in pj.hyperplanes(1, 8, 42)[0]] == [-37, 13, 31, -31, 11, 35, 13, 1]


def test_hyperplanes_of_a_prefix_of_dimensions_and_bits_are_a_prefix():
    big = pj.hyperplanes(40, 256, SEED)
    assert np.array_equal(pj.hyperplanes(13, 64, SEED), big[:13, :64])
    assert not np.array_equal(pj.hyperplanes(13, 64, SEED + 1), big[:13, :64])


def test_hyperplanes_under_the_array_module_path_equal_the_host_cache(monkeypatch):
    a = pj.plane_codes(9, 128, 3)
    b = pj.plane_codes(9, 128, 3, fast=False)  # the device's lines on NumPy
    assert a.dtype == b.dtype == np.int8 and np.array_equal(a, b)
    assert np.array_equal(pj.hyperplanes(9, 128, 3), a.astype(np.float32))
    assert pj.plane_codes(9, 128, 3) is a  # kept
    with pytest.raises(ValueError, match="read-only|not writeable"):
        a[0, 0] = 1
    monkeypatch.setattr(pj, "CODES_BLOCK_ENTRIES", 3 * 128 + 5)  # blocks of 3 dimensions, the last one short
    assert np.array_equal(pj._plane_codes_make(11, 128, 5), pj.plane_codes(11, 128, 5, fast=False))
    assert np.array_equal(pj._plane_codes_make(11, 128, 5), pj._plane_codes_lines(11, 128, 5, np))
    assert np.array_equal(pj._plane_codes_make(11, 128, 5)[:, :72].tolist(), ref.hyperplanes(11, 72, 5))


def test_host_plane_codes_kept_within_a_byte_budget(monkeypatch):
    monkeypatch.setattr(pj, "_codes_cache", pj.OrderedDict())
    monkeypatch.setattr(pj, "CODES_CACHE_BYTES", 2 * 3 * 64)  # two of (3, 64)
    a = pj.plane_codes(3, 64, 1)
    pj.plane_codes(3, 64, 2)
    assert pj.plane_codes(3, 64, 1) is a  # both fit
    pj.plane_codes(3, 64, 3)  # the least recently used (seed 2) goes
    assert list(pj._codes_cache) == [(3, 64, 1), (3, 64, 3)]
    big = pj.plane_codes(20, 64, 4)  # larger than the budget alone: kept as the latest, the others go
    assert list(pj._codes_cache) == [(20, 64, 4)] and pj.plane_codes(20, 64, 4) is big


# ---------------------------------------------------------------- quantization and exact bits


def _rows(rng, n, d):
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[1] = 0.0
    x[2, 0] = np.nan
    x[3, d // 2] = np.inf
    x[4] = 1e-30  # tiny but a direction
    return x


@pytest.mark.parametrize("fast", [True, False])
def test_quantize_equals_reference(fast):
    rng = np.random.default_rng(1)
    x = _rows(rng, 12, 9)
    x[5] = [254.0, 1.0, -1.0, 0.5, 127.0, -127.0, 0.0, 3.0, 2.0]  # 1 * 127/254 = 0.5: half to even
    q, status = pj.quantize(x, fast=fast)
    for i in range(x.shape[0]):
        rq, rs = ref.quantize([float(v) for v in x[i]])
        assert status[i] == rs
        assert q[i].astype(np.int64).tolist() == rq
    assert q[5, 1] == 0 and q[5, 2] == 0 and q[5, 0] == 127


@pytest.mark.parametrize("d", [1, 5, 64, 130])
def test_signatures_equal_reference(d):
    rng = np.random.default_rng(d)
    x = _rows(rng, 8, max(d, 5))[:, :d] if d >= 5 else rng.standard_normal((8, d)).astype(np.float32)
    planes = ref.hyperplanes(d, 128, SEED)
    sig = pj.signatures(x, 128, SEED)
    for i in range(x.shape[0]):
        bits, status = ref.signature_bits([float(v) for v in x[i]], 128, SEED, planes)
        assert int(sig.status[i]) == status
        assert _words(sig.bits[i]) == ref.pack(bits)


def test_signatures_above_the_exact_block_split_and_stay_exact():
    rng = np.random.default_rng(7)
    d = pj.EXACT_BLOCK + 300
    x = rng.standard_normal((6, d)).astype(np.float32)
    sig = pj.signatures(x, 64, SEED)
    q, _ = pj.quantize(x)
    r = pj.hyperplanes(d, 64, SEED)
    exact = q.astype(np.int64) @ r.astype(np.int64)  # integer products: the definition
    assert np.array_equal(pj.pack_signs(exact), sig.bits)
    planes = ref.hyperplanes(d, 64, SEED)
    bits, _ = ref.signature_bits([float(v) for v in x[0]], 64, SEED, planes)
    assert _words(sig.bits[0]) == ref.pack(bits)


def test_projection_is_exact_whatever_the_summation_order():
    """Float32 sums of the quantized products equal the integer sums in any order and blocking:
    the property that makes CPU (BLAS) and GPU (cuBLAS, TF32) bits identical."""
    rng = np.random.default_rng(3)
    d = pj.EXACT_BLOCK
    x = rng.standard_normal((64, d)).astype(np.float32)
    x[:, :4] *= 40  # a few large coordinates: many near-zero projections after quantization
    q, _ = pj.quantize(x)
    r = pj.hyperplanes(d, 256, SEED)
    exact = q.astype(np.int64) @ r.astype(np.int64)
    assert np.abs(exact).max() < 2**24
    p32 = pj.project(q, r)
    assert np.array_equal(p32.astype(np.int64), exact)
    perm = rng.permutation(d)  # another summation order
    assert np.array_equal((q[:, perm] @ r[perm]).astype(np.int64), exact)
    acc = np.zeros((64, 256), np.float32)  # sequential float32 accumulation, one dimension at a time
    for i in range(0, d, 97):
        acc += q[:, i:i + 97] @ r[i:i + 97]
    assert np.array_equal(acc.astype(np.int64), exact)
    assert np.array_equal(pj.pack_signs(exact), pj.pack_signs(p32))


def test_zero_projection_sets_the_bit():
    # q = (1, 1) against entries (a, -a) sums to exactly 0: bit 1 (r . u >= 0)
    r = pj.hyperplanes(2, 64, SEED).astype(np.int64)
    cols = np.flatnonzero(r[0] == -r[1])
    x = np.array([[1.0, 1.0]], np.float32)
    bits = ref.unpack(_words(pj.signatures(x, 64, SEED).bits[0]), 64)
    assert all(bits[j] == 1 for j in cols)


@pytest.mark.parametrize("batch", [1, 3, 1000])
def test_batches_and_fast_flag_do_not_change_signatures(batch):
    rng = np.random.default_rng(11)
    x = _rows(rng, 37, 24)
    a = pj.signatures(x, 192, SEED)
    b = pj.signatures(x, 192, SEED, batch_rows=batch, fast=False)  # the GPU's array-module lines on NumPy
    assert np.array_equal(a.bits, b.bits) and np.array_equal(a.status, b.status)
    assert a.status[1] == pj.ZERO_VECTOR and a.status[2] == a.status[3] == pj.NON_FINITE
    assert not a.bits[1:4].any()
    assert a.nbits == 192 and list(a.valid[:5]) == [True, False, False, False, True]


def test_given_status_marks_rows_unsigned():
    x = np.ones((3, 4), np.float32)
    s = pj.signatures(x, 64, SEED, status=np.array([0, pj.NULL_ROW, 0], np.int8))
    assert s.status.tolist() == [0, pj.NULL_ROW, 0] and s.bits[1, 0] == 0 and s.bits[0, 0] == s.bits[2, 0]


def test_input_dtypes_float16_and_float64_follow_float32():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((10, 16)).astype(np.float16)
    assert np.array_equal(pj.signatures(x, 64, 1).bits, pj.signatures(x.astype(np.float32), 64, 1).bits)
    y = rng.standard_normal((10, 16))
    assert np.array_equal(pj.signatures(y, 64, 1).bits, pj.signatures(y.astype(np.float32), 64, 1).bits)


def test_signature_argument_checks():
    with pytest.raises(ValueError, match="multiple of 64"):
        pj.signatures(np.ones((2, 3), np.float32), 100, 1)
    with pytest.raises(ValueError, match="no dimensions"):
        pj.signatures(np.ones((2, 0), np.float32), 64, 1)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.lists(st.floats(-1e6, 1e6, width=32), min_size=3, max_size=3), min_size=1, max_size=6),
       st.integers(0, 2**64 - 1))
def test_signatures_property(rows, seed):
    x = np.array(rows, np.float32)
    sig = pj.signatures(x, 64, seed)
    planes = ref.hyperplanes(3, 64, seed)
    for i in range(x.shape[0]):
        bits, status = ref.signature_bits([float(v) for v in x[i]], 64, seed, planes)
        assert int(sig.status[i]) == status and _words(sig.bits[i]) == ref.pack(bits)


# ---------------------------------------------------------------- bands and buckets


@pytest.mark.parametrize("bands,rows", [(3, 20), (4, 64), (2, 64), (7, 9), (1, 1), (12, 21)])
@pytest.mark.parametrize("fast", [True, False])
def test_band_hashes_equal_reference(bands, rows, fast):
    rng = np.random.default_rng(bands * 100 + rows)
    words = 4
    sig = rng.integers(0, 2**63, (9, words), dtype=np.int64).astype(np.uint64) * np.uint64(3)
    if bands * rows > words * 64:
        pytest.skip("layout larger than the signature")
    h = pj.band_hashes(sig, bands, rows, fast=fast)
    assert h.dtype == np.uint64 and h.shape == (9, bands)
    for i in range(9):
        assert [int(v) for v in h[i]] == ref.band_hashes(_words(sig[i]), bands, rows)
    v = pj.band_values(sig, bands, rows)
    assert [int(a) for a in v[0]] == [ref.band_value(_words(sig[0]), b, rows) for b in range(bands)]


def test_band_hash_is_injective_within_a_band():
    v = np.arange(1 << 16, dtype=np.uint64)
    for band in (0, 5):
        h = pj.fmix64(v + np.full(1, band + 1, np.uint64) * pj.GOLDEN)
        assert np.unique(h).shape[0] == v.shape[0]


def test_band_layout_checks():
    sig = np.zeros((2, 2), np.uint64)
    with pytest.raises(ValueError, match=r"rows = 65 must be in \[1, 64\]"):
        pj.band_hashes(sig, 1, 65)
    with pytest.raises(ValueError, match="exceeds the 128 signature bits"):
        pj.band_hashes(sig, 7, 20)


def test_bucket_rows_groups_equal_band_bits_and_skips_unsigned_rows():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((6, 32)).astype(np.float32)
    x = np.concatenate([base, base[:3] * 2.0, base[:2] + 1e-4, np.zeros((2, 32), np.float32)])
    sig = pj.signatures(x, 128, SEED)
    h = pj.band_hashes(sig.bits, 8, 16)
    b = pj.bucket_rows(h, sig.status)
    got = {(int(b.band[i]), frozenset(b.members[b.offsets[i]:b.offsets[i + 1]].tolist())) for i in range(len(b))}
    expected = ref.groups([[int(v) for v in row] for row in h], valid=(sig.status == 0).tolist())
    assert got == expected
    assert not set(b.members.tolist()) & {11, 12}  # the zero vectors share a signature but are not bucketed
    assert (0, frozenset({0, 6, 9})) in got or any(0 in m and 6 in m for _, m in got)  # a scaled copy collides


# ---------------------------------------------------------------- collision probability


def test_bit_agreement_follows_one_minus_theta_over_pi():
    rng = np.random.default_rng(9)
    d, pairs, bits = 64, 400, 256
    for c in (-0.5, 0.0, 0.5, 0.9, 0.98):
        u = rng.standard_normal((pairs, d))
        u /= np.linalg.norm(u, axis=1, keepdims=True)
        g = rng.standard_normal((pairs, d))
        g -= np.sum(g * u, axis=1, keepdims=True) * u
        g /= np.linalg.norm(g, axis=1, keepdims=True)
        v = c * u + math.sqrt(1 - c * c) * g
        s = pj.signatures(np.concatenate([u, v]).astype(np.float32), bits, SEED)
        from gpu_dedup.stages.verify import hamming_distance

        h = hamming_distance(np.arange(pairs), np.arange(pairs) + pairs, s.bits)
        agree = 1 - h.sum() / (pairs * bits)
        expected = 1 - math.acos(c) / math.pi
        sd = math.sqrt(expected * (1 - expected) / (pairs * bits))
        assert abs(agree - expected) < 5 * sd + 0.004, (c, agree, expected)


# ---------------------------------------------------------------- S-curve and layout


def test_cosine_s_curve_formula():
    for s in (-1.0, 0.0, 0.5, 0.9, 0.97, 1.0):
        assert cosine_s_curve(s, 19, 13) == pytest.approx(ref.cosine_s_curve(s, 19, 13), abs=1e-12)
    assert cosine_collision(0.0) == pytest.approx(0.5) and cosine_collision(1.0) == 1.0
    pts = cosine_s_curve_points(19, 13, step=0.25)
    assert [p[0] for p in pts] == [0.0, 0.25, 0.5, 0.75, 1.0] and pts[-1][1] == 1.0


@pytest.mark.parametrize("t,bits", [(0.9, 256), (0.8, 128), (0.95, 512), (0.5, 64)])
def test_cosine_layout_is_the_jaccard_rule_on_the_angle_axis(t, bits):
    # p = 1 - theta/pi integrated uniformly: the MinHash rule at J = p, whenever rows <= 64 does not bind
    assert cosine_layout(t, bits) == optimal_layout(1 - math.acos(t) / math.pi, bits)


def test_cosine_layout_brute_force_with_bounds():
    t, bits, wfp, wfn = 0.85, 96, 0.2, 0.8
    best = None
    for b in range(1, bits + 1):
        for r in range(10, min(64, bits // b) + 1):
            fp, fn = cosine_error_areas(t, [b], [r])
            cost = wfp * fp[0] + wfn * fn[0]
            if best is None or cost < best[0] - 1e-15:
                best = (cost, b, r)
    assert cosine_layout(t, bits, wfp, wfn, min_rows=10) == (best[1], best[2])
    assert cosine_layout(0.9, 256) == (19, 13)
    m, k = cosine_layout(0.9, 1024, min_rows=22)
    assert k >= 22 and m * k <= 1024
    with pytest.raises(ValueError, match="cosine threshold"):
        cosine_layout(1.0, 64)


def test_min_rows_keeps_unrelated_rows_out_of_buckets():
    assert cosine_min_rows(100_000) == 21  # 100k * 2**-21 <= 0.05
    assert cosine_min_rows(1_000_000) == 25
    assert cosine_min_rows(100_000, background=0.3) > 21
    assert cosine_min_rows(1) == 1


def test_pack_signs_kernel_equals_the_array_lines():
    """The Numba packing equals NumPy's packbits path, zeros (and -0.0) included, float32 and int64."""
    rng = np.random.default_rng(4)
    p = rng.integers(-3, 4, size=(37, 192)).astype(np.float32)
    p[0, :5] = -0.0
    for arr in (p, p.astype(np.int64)):
        assert np.array_equal(pj.pack_signs(arr), pj.pack_signs(arr, fast=False))


# ---------------------------------------------------------------- memory at many dimensions


def _peak_bytes(fn):
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_hyperplanes_at_many_dimensions_take_about_a_byte_per_entry():
    """Signing vectors of ``d`` dimensions holds the hyperplanes as one int8 per entry, made in blocks of
    dimensions: no (d, bits) int64 or float32 matrix (it was 21 bytes per entry at its peak, ~21 GiB at
    10^6 dimensions and 1,024 bits), and the same bits as the float32 matrix gives."""
    d, bits, seed = 3 * pj.EXACT_BLOCK * 4 + 77, 1024, 977  # a (d, bits, seed) no other test caches
    x = np.random.default_rng(2).standard_normal((5, d)).astype(np.float32)
    entries = d * bits
    peak = _peak_bytes(lambda: pj.signatures(x, bits, seed))
    assert peak < 1.25 * entries + (16 << 20), f"{peak / entries:.1f} bytes per hyperplane entry"
    q, _ = pj.quantize(x)
    r = pj.hyperplanes(d, bits, seed)
    assert np.array_equal(pj.signatures(x, bits, seed).bits, pj.pack_signs(q.astype(np.int64) @ r.astype(np.int64)))


def test_batches_of_many_dimensions_hold_a_bounded_quantized_copy(monkeypatch):
    assert pj.batch_step(1024) == pj.BATCH_ROWS and pj.batch_step(10**6) == pj.BATCH_BYTES // (4 * 10**6)
    assert pj.batch_step(10**9) == 1 and pj.batch_step(64, 5) == 5
    x = np.random.default_rng(4).standard_normal((9, 2 * pj.EXACT_BLOCK + 3)).astype(np.float32)
    want = pj.signatures(x, 128, SEED)
    monkeypatch.setattr(pj, "BATCH_BYTES", 2 * 4 * x.shape[1])  # two rows a batch
    assert pj.batch_step(x.shape[1]) == 2
    got = pj.signatures(x, 128, SEED)
    assert np.array_equal(got.bits, want.bits) and np.array_equal(got.status, want.status)
    assert np.array_equal(pj.signatures(x, 128, SEED, fast=False).bits, want.bits)
