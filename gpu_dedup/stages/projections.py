"""Signatures stage for ``similarity: cosine``: random hyperplanes -> packed sign bits -> band hashes.

A row ``u`` gets the ``D``-bit signature ``bit_j = [r_j . u >= 0]`` (seed 004:
``Pr[bit_j(u) = bit_j(v)] = 1 - theta(u, v) / pi``); ``m`` bands of ``k``
bits become an ``(n, m)`` uint64 matrix of band hashes that
:func:`gpu_dedup.stages.buckets.buckets` groups exactly like MinHash band
hashes.

Hyperplanes (the same on every backend)
---------------------------------------
Entry ``R[i, j]`` of hyperplane ``j`` at dimension ``i`` is computed on its own
from ``(seed, i, j)`` by a hash (``kernels/cosine_scalar.py``, rule 3): an odd
integer in [-93, 93] distributed as a quantized N(0, 32**2).  No generator
state, no draw order: a GPU thread, a CPU loop and the pure-Python reference
produce the same matrix, and the text path (SimHash) uses the very same
entries with feature hashes as dimension indices.

The signatures hold them as int8 (:func:`plane_codes`, ``d * bits`` bytes: 1 GiB at 10^6 dimensions and 1,024
bits, 4 GiB at :data:`MAX_DIM` and 4,096 bits), made in blocks of dimensions, and multiply float32 copies of one
block of :data:`EXACT_BLOCK` dimensions at a time: the same values, so the same exact sums.

Exact bits by construction
--------------------------
Floating-point sums depend on the summation order, which differs between
BLAS libraries, thread counts and GPUs, so a bit whose ``|r . u|`` is tiny
could flip between backends.  Here every product is an integer:

1. **Quantize** each row: ``s = max_j |u_j|`` and ``q_j = rint(u_j * (127 / s))``
   in float64 (round half to even), an integer in [-127, 127].  A positive
   scale leaves the sign of every ``r . u`` unchanged; the rounding adds an
   error of at most 0.5 per coordinate, i.e. at most ``0.5 * sqrt(d) / 127``
   of the largest coordinate in norm (about 0.008 rad for a random unit
   vector in 256 dimensions, whose norm is ~4x its largest coordinate).
   Measured cost (``gpu_dedup.bench.cosine``, ``results/bench/cosine.md``):
   the rate of equal bits per cosine from -0.5 to 0.99 stays within 0.0015
   of ``1 - theta / pi`` at 8, 256 and 1024 dimensions, as close as float64
   Gaussian hyperplanes without quantization get.
2. **Project** in float32: ``|q_i * R_ij| <= 127 * 93 = 11811``, so every
   partial sum over ``d <= 1024`` dimensions is an integer below
   ``1024 * 11811 < 2**24`` and float32 represents it exactly: any order,
   any blocking, FMA or not, and TF32 tensor cores (whose 10-bit mantissa
   holds the 7-bit inputs exactly and which accumulate in float32) all give
   the same exact integer: on the GPU, CuPy's float32 matmul (cuBLAS, with or
   without ``CUPY_TF32``) returns the CPU's bits, including for projections
   that are exactly 0.  (Assumed: the BLAS computes plain dot products, as
   OpenBLAS, MKL and cuBLAS SGEMM do; a Strassen-like algorithm could exceed
   2**24 in its intermediate sums.)  Above 1024 dimensions the product is split into
   blocks of 1024 dimensions, each exact in float32, summed in int64.
3. ``bit = [sum >= 0]`` decides ``== 0`` exactly (bit 1).

Rows that are zero vectors, or hold NaN/inf, have no direction: their status
is nonzero, their signature words are 0, and they must not be bucketed
(:func:`bucket_rows` skips them).

Band hashes
-----------
Band ``b`` is bits ``b*k .. b*k + k - 1`` (``k <= 64``) read as an integer
``v``; its hash is ``fmix64(v + (b + 1) * 0x9E3779B97F4A7C15)``, injective in
``v`` within a band, so rows share a bucket exactly when their ``k`` bits
agree (no hash collisions at all).

Array modules
-------------
Functions take ``xp`` (NumPy or CuPy); the same lines run on both.  With
NumPy, quantization and text SimHash use Numba kernels (``fast=None``);
``fast=False`` runs the GPU's array-module lines on NumPy, which is how the
tests check them.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from gpu_dedup.backends import ByArrays, array_module, get_backend
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.kernels import cosine_cpu as cpu
from gpu_dedup.kernels.cosine_scalar import FM1, FM2, GAUSS8, GOLDEN, S33
from gpu_dedup.stages.buckets import buckets

EXACT_BLOCK = 1024  # dimensions per exactly-summed float32 block (1024 * 127 * 93 < 2**24)
MAX_DIM = 1 << 20  # int64 sums of blocks are exact far beyond this; bounds the int8 hyperplanes (d * bits bytes)
BATCH_ROWS = 8192  # rows quantized + projected at once (bounds the float32 projection buffer)
BATCH_BYTES = 256 << 20  # at most this many bytes of quantized rows per batch (8,192 rows up to 8,192 dimensions)

OK, ZERO_VECTOR, NON_FINITE, NULL_ROW, BAD_LENGTH, EMPTY_TEXT = 0, 1, 2, 3, 4, 5
STATUS_NAMES = {OK: "ok", ZERO_VECTOR: "zero_vector", NON_FINITE: "non_finite", NULL_ROW: "null",
                BAD_LENGTH: "bad_length", EMPTY_TEXT: "empty_text"}


@dataclass(frozen=True)
class Signatures:
    """Packed sign bits: bit ``j`` of row ``i`` is bit ``j % 64`` of ``bits[i, j // 64]``.

    ``status[i]`` is 0 for a row with a signature; otherwise it says why the
    row has none (see ``STATUS_NAMES``) and the row is never bucketed.
    """

    bits: np.ndarray  # (n, D // 64) uint64
    status: np.ndarray  # (n,) int8

    def __len__(self) -> int:
        return self.bits.shape[0]

    @property
    def nbits(self) -> int:
        return self.bits.shape[1] * 64

    @property
    def valid(self):
        return self.status == OK


# ---------------------------------------------------------------- hashing (array-module twins of the kernels)


def _u64(xp, v):
    return xp.uint64(v)


def fmix64(z, xp=np):
    """Rule 1 of ``kernels/cosine_scalar.py`` on a uint64 array (wrap-around is the definition)."""
    s = _u64(xp, S33)
    z = z ^ (z >> s)
    z = z * _u64(xp, FM1)
    z = z ^ (z >> s)
    z = z * _u64(xp, FM2)
    return z ^ (z >> s)


def seed_key(seed: int) -> int:
    """Rule 2: ``fmix64(seed + GOLDEN)`` as a Python int."""
    with np.errstate(over="ignore"):
        z = np.array([(int(seed) + int(GOLDEN)) % 2**64], np.uint64)
        return int(fmix64(z)[0])


def hyperplane_words(keys, words: int, seed: int, xp=np):
    """(len(keys), words) uint64: word ``w`` holds the entries of hyperplanes ``8w .. 8w + 7`` (rule 3)."""
    keys = xp.asarray(keys, dtype=xp.uint64)
    z = fmix64(keys ^ _u64(xp, seed_key(seed)), xp)
    steps = (xp.arange(words, dtype=xp.uint64) + _u64(xp, 1)) * _u64(xp, GOLDEN)
    return fmix64(z[:, None] + steps[None, :], xp)


def hyperplanes(dim: int, bits: int, seed: int, xp=np):
    """(dim, bits) float32 matrix ``R[i, j]`` (rule 3): integer entries in [-93, 93].

    4 bytes per entry: the signatures hold :func:`plane_codes` (1 byte per entry) instead and make float32
    blocks of :data:`EXACT_BLOCK` dimensions where they multiply; this whole matrix is for tests and readers.
    """
    return plane_codes(dim, bits, seed, xp).astype(xp.float32)


def plane_codes(dim: int, bits: int, seed: int, xp=np, fast: bool | None = None):
    """(dim, bits) int8 matrix ``R[i, j]`` (rule 3), the values of :func:`hyperplanes` in one byte each.

    Made in blocks of dimensions, so the peak is this matrix plus one block's temporaries (``dim * bits``
    bytes; the int64 lines over the whole matrix took 21 bytes per entry, ~21 GiB at 10^6 dimensions and
    1,024 bits).  NumPy: kept per process (read-only, :data:`CODES_CACHE_BYTES`); a device makes them each time.
    """
    if bits % 8:
        raise ValueError(f"bits = {bits} must be a multiple of 8")
    return _PLANE_CODES.pick(xp, fast)(dim, bits, seed, xp)


CODES_BLOCK_ENTRIES = 1 << 20  # hyperplane entries made at once (the array-module lines: ~25 bytes each)
CODES_CACHE_BYTES = 1 << 30  # host plane codes kept per process beyond the latest (which is always kept)
_GAUSS8_CODES = GAUSS8.astype(np.int8)
_codes_cache: OrderedDict = OrderedDict()
_codes_lock = threading.Lock()


def _plane_codes_lines(dim: int, bits: int, seed: int, xp):
    out = xp.empty((dim, bits), dtype=xp.int8)
    table = xp.asarray(_GAUSS8_CODES)
    shifts = xp.arange(8, dtype=xp.uint64) * _u64(xp, 8)
    step = max(1, CODES_BLOCK_ENTRIES // bits)
    for lo in range(0, dim, step):  # dim / step blocks of dimensions, each whole array steps
        hi = min(lo + step, dim)
        h = hyperplane_words(xp.arange(lo, hi, dtype=xp.uint64), bits // 8, seed, xp)  # (hi - lo, bits / 8)
        byte = ((h[:, :, None] >> shifts[None, None, :]) & _u64(xp, 255)).astype(xp.int64)  # (hi - lo, bits/8, 8)
        out[lo:hi] = table[byte.reshape(hi - lo, bits)]
    return out


def _plane_codes_make(dim: int, bits: int, seed: int) -> np.ndarray:
    if sys.byteorder != "little":
        return _plane_codes_lines(dim, bits, seed, np)
    out = np.empty((dim, bits), dtype=np.int8)
    step = max(1, CODES_BLOCK_ENTRIES // bits)
    for lo in range(0, dim, step):  # byte b of word w (little-endian) is entry 8w + b: rule 3's shifts
        hi = min(lo + step, dim)
        h = hyperplane_words(np.arange(lo, hi, dtype=np.uint64), bits // 8, seed, np)
        out[lo:hi] = _GAUSS8_CODES[h.view(np.uint8)]
    return out


def _plane_codes_host(dim: int, bits: int, seed: int, xp=np) -> np.ndarray:
    """Made once per (dim, bits, seed) in this process: the latest always kept, older ones while all of them
    take at most :data:`CODES_CACHE_BYTES`."""
    key = (int(dim), int(bits), int(seed))
    with _codes_lock:
        got = _codes_cache.get(key)
        if got is not None:
            _codes_cache.move_to_end(key)
            return got
    r = _plane_codes_make(*key)
    r.setflags(write=False)
    with _codes_lock:
        _codes_cache[key] = r
        _codes_cache.move_to_end(key)
        while len(_codes_cache) > 1 and sum(a.nbytes for a in _codes_cache.values()) > CODES_CACHE_BYTES:
            _codes_cache.popitem(last=False)
    return r


_PLANE_CODES = ByArrays(_plane_codes_lines, host=_plane_codes_host)


# ---------------------------------------------------------------- quantize, project, pack


def quantize(x, xp=np, fast: bool | None = None):
    """Rows of ``x`` (float16/32/64) as integers in [-127, 127] (float32), and a status per row.

    ``q_j = rint(x_j * (127 / max_j |x_j|))`` in float64 (half to even).
    Status: 0 ok, 1 zero vector, 2 NaN/inf; such rows are all zeros.
    """
    return _QUANTIZE.pick(xp, fast)(x, xp)


def _quantize_host(x, xp=np):
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    q = np.empty(x32.shape, np.float32)
    status = np.empty(x32.shape[0], np.int8)
    cpu.quantize_rows(x32, q, status)
    return q, status


def _quantize_lines(x, xp):
    x64 = xp.asarray(x, dtype=xp.float32).astype(xp.float64)
    finite = xp.isfinite(x64).all(axis=1)
    s = xp.where(finite[:, None], xp.abs(x64), 0.0).max(axis=1) if x64.shape[1] else xp.zeros(x64.shape[0])
    ok = finite & (s > 0)
    scale = xp.where(ok, 127.0 / xp.where(ok, s, 1.0), 0.0)
    q = xp.rint(xp.where(ok[:, None], x64, 0.0) * scale[:, None]).astype(xp.float32)
    status = xp.where(finite, xp.where(ok, OK, ZERO_VECTOR), NON_FINITE).astype(xp.int8)
    return q, status


_QUANTIZE = ByArrays(_quantize_lines, host=_quantize_host)


def project(q, r, xp=np):
    """Exact integer ``q @ r`` for integer-valued float32 ``q`` (|q| <= 127) and ``r`` (|r| <= 93).

    ``r``: float32, or the int8 :func:`plane_codes` (made float32 one block of dimensions at a time, the same
    values, so the same products).  One float32 product up to :data:`EXACT_BLOCK` dimensions (exact: every
    partial sum is an integer below 2**24); beyond, blocks of that many dimensions summed in int64.  Returns
    float32 (small d) or int64.
    """
    d = q.shape[1]
    if d <= EXACT_BLOCK:
        return q @ _float32(r, xp)
    out = None
    for lo in range(0, d, EXACT_BLOCK):  # d / 1024 BLAS calls, not a loop over rows
        part = (q[:, lo:lo + EXACT_BLOCK] @ _float32(r[lo:lo + EXACT_BLOCK], xp)).astype(xp.int64)
        if out is None:
            out = part
        else:
            out += part
    return out


def _float32(r, xp):
    return r if r.dtype == xp.float32 else r.astype(xp.float32)


def pack_signs(p, xp=np, fast: bool | None = None):
    """``(n, D)`` projections -> ``(n, D // 64)`` uint64 words of ``[p >= 0]`` (bit j at bit j % 64 of word j // 64).

    NumPy: one Numba pass (``fast=None``); otherwise (CuPy, or ``fast=False``)
    packs the flattened row-major array (CuPy's ``packbits`` has no ``axis``);
    with ``D`` a multiple of 64 each row is whole words, as ``axis=1`` would give.
    """
    if p.shape[1] % 64:
        raise ValueError(f"{p.shape[1]} bits per row: must be a multiple of 64")
    return _PACK_SIGNS.pick(xp, fast)(p, xp)


def _pack_signs_host(p, xp=np):
    out = np.empty((p.shape[0], p.shape[1] // 64), np.uint64)
    cpu.pack_signs(np.ascontiguousarray(p), out)
    return out


def _pack_signs_lines(p, xp):
    packed = xp.packbits((p >= 0).ravel(), bitorder="little")
    return packed.view(xp.uint64).reshape(p.shape[0], p.shape[1] // 64)


_PACK_SIGNS = ByArrays(_pack_signs_lines, host=_pack_signs_host)


def batch_step(d: int, batch_rows: int = BATCH_ROWS) -> int:
    """Rows per batch: ``batch_rows``, or fewer so that a batch's quantized rows (float32) take at most
    :data:`BATCH_BYTES` (at 10^6 dimensions 8,192 rows would be 32 GiB); whole rows, so the same bits."""
    return max(1, min(int(batch_rows), BATCH_BYTES // (4 * max(int(d), 1))))


def signatures(x, bits: int, seed: int, xp=np, *, batch_rows: int = BATCH_ROWS, fast: bool | None = None,
               status=None) -> Signatures:
    """Packed ``bits``-bit signatures of the rows of ``x`` (an (n, d) float matrix).

    Work runs in batches of ``batch_rows`` rows (quantize, one matrix product,
    pack; fewer rows when their quantized copy would pass :data:`BATCH_BYTES`), so memory beyond the input is
    the int8 hyperplanes (``d * bits`` bytes), a batch's quantized rows and its ``batch_rows * bits`` sums.
    ``status`` (optional, int8 per row, e.g. from :func:`vectors.from_arrow`)
    marks rows already known to have no vector; they stay unsigned.
    """
    if bits < 64 or bits % 64:
        raise ValueError(f"bits = {bits} must be a positive multiple of 64")
    n, d = x.shape
    if d < 1:
        raise ValueError("vectors have no dimensions")
    if d > MAX_DIM:
        raise ValueError(f"vectors have {d} dimensions; at most {MAX_DIM} are supported")
    r = plane_codes(d, bits, seed, xp)  # int8: d * bits bytes
    if d <= EXACT_BLOCK:
        r = r.astype(xp.float32)  # one product per batch: made float32 once (at most 16 MiB)
    out = xp.zeros((n, bits // 64), dtype=xp.uint64)
    st = xp.zeros(n, dtype=xp.int8)
    step = batch_step(d, batch_rows)
    for lo in range(0, n, step):  # n / step steps, each a batch of rows
        hi = min(lo + step, n)
        q, s = quantize(x[lo:hi], xp, fast)
        out[lo:hi] = pack_signs(project(q, r, xp), xp)
        st[lo:hi] = s
    if status is not None:
        st = xp.where(xp.asarray(status) != OK, xp.asarray(status, dtype=xp.int8), st)
    out[st != OK] = 0
    return Signatures(out, st)


# ---------------------------------------------------------------- bands


def band_values(bits, bands: int, rows: int, xp=np):
    """(n, bands) uint64: band ``b`` = signature bits ``b*rows .. b*rows + rows - 1`` as an integer."""
    if not 1 <= rows <= 64:
        raise ValueError(f"rows = {rows} must be in [1, 64]")
    if bands * rows > bits.shape[1] * 64:
        raise ValueError(f"bands * rows = {bands} * {rows} = {bands * rows} exceeds the {bits.shape[1] * 64} "
                         "signature bits")
    n = bits.shape[0]
    out = xp.empty((n, bands), dtype=xp.uint64)
    mask = _u64(xp, (1 << rows) - 1) if rows < 64 else None
    for b in range(bands):  # a few array steps per band
        start = b * rows
        w, off = divmod(start, 64)
        v = bits[:, w] >> _u64(xp, off)
        if off + rows > 64:
            v = v | (bits[:, w + 1] << _u64(xp, 64 - off))
        out[:, b] = v if mask is None else v & mask
    return out


def band_hashes(bits, bands: int, rows: int, xp=np, fast: bool | None = None):
    """(n, bands) uint64 band hashes (rule 5): ``fmix64(v + (b + 1) * GOLDEN)``, injective per band.

    NumPy: a Numba kernel (``fast=None``); otherwise (CuPy, or ``fast=False``)
    array-module lines, a few per band.
    """
    return _BAND_HASHES.pick(xp, fast)(bits, bands, rows, xp)


def _band_hashes_host(bits, bands: int, rows: int, xp=np):
    band_values(bits[:0], bands, rows, np)  # argument checks
    out = np.empty((bits.shape[0], bands), np.uint64)
    cpu.band_hashes(np.ascontiguousarray(bits), int(bands), int(rows), out)
    return out


def _band_hashes_lines(bits, bands: int, rows: int, xp):
    v = band_values(bits, bands, rows, xp)
    steps = (xp.arange(bands, dtype=xp.uint64) + _u64(xp, 1)) * _u64(xp, GOLDEN)
    return fmix64(v + steps[None, :], xp)


_BAND_HASHES = ByArrays(_band_hashes_lines, host=_band_hashes_host)


def bucket_rows(hashes, status):
    """Buckets (:func:`gpu_dedup.stages.buckets.buckets`) of the rows whose ``status`` is 0, with
    members named by their row index: unsigned rows are never bucketed."""
    xp = array_module(hashes)
    valid = xp.asarray(status) == OK
    if bool(valid.all()):
        return buckets(hashes)
    return buckets(hashes[valid], docs=xp.flatnonzero(valid))


# ---------------------------------------------------------------- text (SimHash over hashed features)


def text_signatures(texts, bits: int, seed: int, shingle: str = "word", ngram: int = 3, idf=None, docs=None,
                    backend="cpu") -> Signatures:
    """SimHash signatures of normalized ``texts`` (StringBuffers or Arrow strings), rule 7.

    ``idf``: an :class:`gpu_dedup.stages.vectors.IdfTable` (tf-idf weights) or
    None (tf weights).  Documents without a feature (empty texts) get status
    ``EMPTY_TEXT`` and no signature.  ``docs`` restricts to those rows.
    """
    if bits < 64 or bits % 64:
        raise ValueError(f"bits = {bits} must be a positive multiple of 64")
    buf = texts if hasattr(texts, "offsets") else string_buffers(texts)
    xp = array_module(buf.offsets)  # device texts: the docs, the idf table and the bits on the device
    docs = xp.arange(len(buf), dtype=xp.int64) if docs is None else docs
    use_idf = idf is not None
    table = idf.weights_on(xp) if use_idf else np.zeros(1, np.int64)
    shift = np.uint64(64 - idf.bits) if use_idf else np.uint64(0)
    out, count = get_backend(backend).simhash_text(buf, docs, bits, seed_key(seed), shingle == "word", int(ngram),
                                                   use_idf, table, shift)
    xp = array_module(out)
    status = xp.where(count > 0, OK, EMPTY_TEXT).astype(xp.int8)
    out[status != OK] = 0
    return Signatures(out, status)
