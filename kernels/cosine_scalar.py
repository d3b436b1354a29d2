"""Scalar math of cosine dedup (random projections, SimHash): written once, compiled twice.

Every function in ``DEVICE_FUNCTIONS`` is plain Python over NumPy scalars.
:mod:`gpu_dedup.kernels.cosine_cpu` compiles them with ``numba.njit`` and
:mod:`gpu_dedup.kernels.cosine_cuda` with ``numba.cuda.jit(device=True)``
(through :func:`gpu_dedup.kernels.twin.compile_twins`); only the outer loops
differ.  ``tests/reference_cosine.py`` re-states every rule below in pure
Python and the tests compare the two bit for bit.

Specification
-------------
Arithmetic on hashes is modulo 2**64 (uint64 wrap-around is the definition).

1. **Mixer.** ``fmix64(z)``: MurmurHash3's 64-bit finalizer, a bijection of
   [0, 2**64): ``z ^= z >> 33; z *= 0xFF51AFD7ED558CCD; z ^= z >> 33;
   z *= 0xC4CEB9FE1A85EC53; z ^= z >> 33``.
2. **Seed key.** ``seed_key(seed) = fmix64(seed + GOLDEN)`` with
   ``GOLDEN = 0x9E3779B97F4A7C15``.
3. **Hyperplanes.** Hyperplane ``j`` (``0 <= j < D``) has the entry
   ``R(key, j)`` at coordinate ``key`` (a uint64: the dimension index of a
   dense vector, or the feature hash of a text feature)::

       z = fmix64(key ^ seed_key)
       h = fmix64(z + (j // 8 + 1) * GOLDEN)
       R(key, j) = GAUSS8[(h >> (8 * (j % 8))) & 255]

   ``GAUSS8[b] = 2 * floor(16 * Phi^-1((b + 0.5) / 256)) + 1`` (``Phi^-1``
   the standard normal quantile): 256 odd integers in [-93, 93], symmetric
   (``GAUSS8[255 - b] = -GAUSS8[b]``), never 0, a quantized N(0, 32**2).
   Entries are independent of the draw order: any entry is computed on its
   own, on any backend, with no generator state.
4. **Sign bit.** Bit ``j`` of a signature is ``1`` when ``r_j . u >= 0``
   (the dot product is an exact integer, so ``== 0`` is decided exactly) and
   is stored at bit ``j % 64`` (LSB first) of uint64 word ``j // 64``.
5. **Band value / band hash.** Band ``b`` of ``k`` bits (``1 <= k <= 64``) is
   bits ``b*k .. b*k + k - 1`` of the signature read as an integer ``v``
   (bit ``b*k`` lowest); its hash is ``fmix64(v + (b + 1) * GOLDEN)``, which
   is injective in ``v`` for a fixed band (``fmix64`` is a bijection), so
   two rows share a bucket exactly when their ``k`` bits agree.
6. **Text features.** Text is UTF-8 decoded as in :mod:`.scalar`
   (``decode_utf8``: U+FFFD per maximal ill-formed subpart).  Char mode:
   token = code point + 1.  Word mode: words are maximal runs of code points
   that are not whitespace (``is_space``: Python's ``str.isspace``); token =
   ``wordhash`` = FNV-1a over code points: ``h = 0xCBF29CE484222325``, then
   per code point ``h = (h ^ (cp + 1)) * 0x100000001B3``.  A document of
   ``T`` tokens has the ``T - n + 1`` windows of ``n`` consecutive tokens; if
   ``0 < T < n`` it has one window of all ``T`` tokens; if ``T == 0`` none.
   Feature hash of a window ``t_0 .. t_{m-1}``:
   ``g = sum t_i * NGRAM_MUL**(m-1-i)`` (Horner from 0, mod 2**64,
   ``NGRAM_MUL = 0x9FB21C651E98DF25``), ``f = fmix64(g)``.
7. **SimHash (Charikar).**  A document's vector has weight ``w_f`` on
   coordinate ``f`` (its distinct features); bit ``j`` is
   ``[sum_f w_f * R(f, j) >= 0]``, the sign bit of rule 4 over the 2**64
   feature coordinates, accumulated in int64 (exact: integer weights).
   Summing ``weight(f) * R(f, j)`` over every *occurrence* equals summing
   ``tf_f * weight(f) * R(f, j)`` over distinct features, so the kernel
   streams occurrences.
8. **Exact dot products.** Dense: float32 coordinates, products in float64
   (exact: 24 + 24 mantissa bits), four partial sums over ``i % 4``
   combined as ``(s0 + s1) + (s2 + s3)``: a fixed order, so CPU and GPU
   round identically (a fused multiply-add of an exact product rounds like
   the separate add).  Sparse: sorted merge of two documents' distinct
   features, products of the integer-valued float64 weights, summed in
   feature order in float64.  Each product is formed exactly in int64 and
   rounded once to float64 (the correctly rounded float64 product) while
   both weights are below 2**31; then no float multiply exists for a
   compiler to fuse with the sum (NVVM contracts ``s += a * b`` into an FMA,
   which rounds differently once ``a * b`` is inexact, above 2**53).  Above
   that (a feature repeated ~10**5 times in both documents) the product is a
   float64 multiply.
"""

import numpy as np
from .hash_scalar import I64, REPLACEMENT, decode_utf8, is_space  # noqa: F401  (twins compile them here)

U64 = np.uint64
I32 = np.int32
F64 = np.float64

ZERO = U64(0)
ONE = U64(1)
S8 = U64(8)
S33 = U64(33)
S63 = U64(63)
BYTE = U64(255)
GOLDEN = U64(0x9E3779B97F4A7C15)
FM1 = U64(0xFF51AFD7ED558CCD)
FM2 = U64(0xC4CEB9FE1A85EC53)
FNV_OFFSET = U64(0xCBF29CE484222325)
FNV_PRIME = U64(0x100000001B3)
NGRAM_MUL = U64(0x9FB21C651E98DF25)
POP1 = U64(0x5555555555555555)
POP2 = U64(0x3333333333333333)
POP4 = U64(0x0F0F0F0F0F0F0F0F)
POPM = U64(0x0101010101010101)
S1 = U64(1)
S2 = U64(2)
S4 = U64(4)
S56 = U64(56)
EXACT_WEIGHT = F64(2.0**31)  # sparse weights below this multiply exactly in int64 (rule 8)


def gauss8_table() -> np.ndarray:
    """GAUSS8 (rule 3) as int64, from the standard library's normal quantile."""
    from statistics import NormalDist

    nd = NormalDist()
    vals = [2 * int(np.floor(16.0 * nd.inv_cdf((b + 0.5) / 256.0))) + 1 for b in range(256)]
    out = np.array(vals, np.int64)
    out.setflags(write=False)
    return out


GAUSS8 = gauss8_table()


def fmix64(z):
    """MurmurHash3 fmix64: a bijection of uint64 (rule 1)."""
    z = z ^ (z >> S33)
    z = z * FM1
    z = z ^ (z >> S33)
    z = z * FM2
    z = z ^ (z >> S33)
    return z


def key_mix(key, seed_key):
    """First step of rule 3: ``fmix64(key ^ seed_key)``."""
    return fmix64(U64(key) ^ seed_key)


def hyperplane_word(z, w):
    """64 bits of hyperplane entries: bytes 0..7 are hyperplanes ``8w .. 8w + 7`` (rule 3)."""
    return fmix64(z + (U64(w) + ONE) * GOLDEN)


def band_value(sig, row, band, k):
    """Bits ``band*k .. band*k + k - 1`` of signature row ``row`` (``sig``: uint64 words), as an integer."""
    start = band * k
    w = start >> 6
    off = start & 63
    v = sig[row, w] >> U64(off)
    if off + k > 64:
        v = v | (sig[row, w + 1] << U64(64 - off))
    if k < 64:
        v = v & ((ONE << U64(k)) - ONE)
    return v


def band_hash(v, band):
    """Rule 5: ``fmix64(v + (band + 1) * GOLDEN)``."""
    return fmix64(v + (U64(band) + ONE) * GOLDEN)


def popcount64(x):
    """Number of set bits of a uint64 (SWAR)."""
    x = x - ((x >> S1) & POP1)
    x = (x & POP2) + ((x >> S2) & POP2)
    x = (x + (x >> S4)) & POP4
    return I64((x * POPM) >> S56)


def hamming_row_pair(sig, a, b):
    """Hamming distance between signature rows ``a`` and ``b``."""
    h = I64(0)
    for w in range(sig.shape[1]):
        h += popcount64(sig[a, w] ^ sig[b, w])
    return h


def dot_rows(x, a, y, b):
    """Rule 8 (dense): float64 dot of float32 rows ``x[a]`` and ``y[b]`` in a fixed order."""
    d = x.shape[1]
    s0 = F64(0.0)
    s1 = F64(0.0)
    s2 = F64(0.0)
    s3 = F64(0.0)
    i = 0
    while i + 4 <= d:
        s0 += F64(x[a, i]) * F64(y[b, i])
        s1 += F64(x[a, i + 1]) * F64(y[b, i + 1])
        s2 += F64(x[a, i + 2]) * F64(y[b, i + 2])
        s3 += F64(x[a, i + 3]) * F64(y[b, i + 3])
        i += 4
    if i < d:
        s0 += F64(x[a, i]) * F64(y[b, i])
    if i + 1 < d:
        s1 += F64(x[a, i + 1]) * F64(y[b, i + 1])
    if i + 2 < d:
        s2 += F64(x[a, i + 2]) * F64(y[b, i + 2])
    return (s0 + s1) + (s2 + s3)


def exact_product(x, y):
    """Rule 8: the product of two integer-valued float64 weights (>= 0), rounded once to float64: formed
    exactly in int64 while both are below 2**31, so no float multiply is left to fuse with a sum."""
    if x < EXACT_WEIGHT and y < EXACT_WEIGHT:
        return F64(I64(x) * I64(y))
    return x * y


def sparse_dot(feat, weight, a0, a1, b0, b1):
    """Rule 8 (sparse): sum of weight products over features common to the sorted runs [a0, a1), [b0, b1)."""
    s = F64(0.0)
    i = a0
    j = b0
    while i < a1 and j < b1:
        fi = feat[i]
        fj = feat[j]
        if fi == fj:
            s += exact_product(weight[i], weight[j])
            i += 1
            j += 1
        elif fi < fj:
            i += 1
        else:
            j += 1
    return s


def code_point(data, pos, end):
    """``decode_utf8`` with its one-byte case first: a target inlines this and calls the decoder only for
    a multi-byte or ill-formed sequence."""
    b = I64(data[pos])
    if b < 0x80:
        return b, pos + 1
    return decode_utf8(data, pos, end)


def wordhash_next(data, pos, end):
    """Skip whitespace from ``pos``; FNV-1a hash of the next word (rule 6).

    Returns (hash, found, position after the word).
    """
    while pos < end:
        cp, nxt = code_point(data, pos, end)
        if not is_space(cp):
            break
        pos = nxt
    if pos >= end:
        return ZERO, False, pos
    h = FNV_OFFSET
    while pos < end:
        cp, nxt = code_point(data, pos, end)
        if is_space(cp):
            break
        h = (h ^ (U64(cp) + ONE)) * FNV_PRIME
        pos = nxt
    return h, True, pos


def next_token(data, pos, end, word_mode):
    """Next token of rule 6 from ``pos``: (token, found, next position)."""
    if word_mode:
        return wordhash_next(data, pos, end)
    if pos >= end:
        return ZERO, False, pos
    cp, nxt = code_point(data, pos, end)
    return U64(cp) + ONE, True, nxt


def window_feature(ring, n, head, m):
    """Feature hash of the ``m`` tokens of ``ring`` (``n`` slots in use) starting at slot ``head``."""
    g = ZERO
    s = head
    for _ in range(m):
        g = g * NGRAM_MUL + ring[s]
        s += 1
        if s == n:
            s = 0
    return fmix64(g)


def simhash_add(acc, z, weight, gauss, w0, scratch):
    """acc[j] += weight * R(key, 8 * w0 + j) for j < acc.shape[0] (``z = key_mix(key, seed_key)``):
    hyperplane words ``w0 .. w0 + acc.shape[0] / 8 - 1``.  ``scratch``: work space of a target's
    replacement (the CPU's, :func:`gpu_dedup.kernels.cosine_cpu.simhash_add`); unused here."""
    for w in range(acc.shape[0] >> 3):
        h = hyperplane_word(z, w0 + w)
        base = w << 3
        for b in range(8):
            acc[base + b] += weight * gauss[I64((h >> U64(8 * b)) & BYTE)]


def feature_step(ring, count, head, n, t):
    """Push token ``t`` into the window ring (rule 6); returns (count, head, feature, emitted)."""
    if count < n:
        ring[count] = t
        count += 1
        if count == n:
            return count, head, window_feature(ring, n, 0, n), True
        return count, head, ZERO, False
    ring[head] = t
    head += 1
    if head == n:
        head = 0
    return count, head, window_feature(ring, n, head, n), True


def doc_feature_count(data, start, end, word_mode, n):
    """Feature occurrences (rule 6) of the document ``data[start:end]``: ``T - n + 1`` of ``T >= n`` tokens,
    1 of ``0 < T < n``, 0 of none (what :func:`doc_features` writes, counted without hashing)."""
    tokens = 0
    pos = start
    while True:
        _, found, pos = next_token(data, pos, end, word_mode)
        if not found:
            break
        tokens += 1
    if tokens >= n:
        return tokens - n + 1
    return 1 if tokens > 0 else 0


def doc_features(data, start, end, word_mode, n, ring, buf):
    """Feature hashes (rule 6) of the document ``data[start:end]`` into ``buf``; returns how many."""
    k = 0
    count = 0
    head = 0
    pos = start
    while True:
        t, found, pos = next_token(data, pos, end, word_mode)
        if not found:
            break
        count, head, f, emitted = feature_step(ring, count, head, n, t)
        if emitted:
            buf[k] = f
            k += 1
    if 0 < count < n:  # short document: one feature of all its tokens (ring slots 0 .. count - 1)
        buf[k] = window_feature(ring, n, 0, count)
        k += 1
    return k


def doc_simhash(data, start, end, word_mode, n, ring, seed_key, use_idf, idf_q, idf_shift, gauss, acc, w0, scratch):
    """Rule 7 for one document: ``acc`` (zeroed here) receives the sums of hyperplanes
    ``8 * w0 .. 8 * w0 + acc.shape[0] - 1``; returns the number of feature occurrences
    (``scratch``: passed to :func:`simhash_add`)."""
    for j in range(acc.shape[0]):
        acc[j] = 0
    k = 0
    count = 0
    head = 0
    pos = start
    while True:
        t, found, pos = next_token(data, pos, end, word_mode)
        if not found:
            break
        count, head, f, emitted = feature_step(ring, count, head, n, t)
        if emitted:
            w = idf_q[I64(f >> idf_shift)] if use_idf else I64(1)
            simhash_add(acc, key_mix(f, seed_key), w, gauss, w0, scratch)
            k += 1
    if 0 < count < n:
        f = window_feature(ring, n, 0, count)
        w = idf_q[I64(f >> idf_shift)] if use_idf else I64(1)
        simhash_add(acc, key_mix(f, seed_key), w, gauss, w0, scratch)
        k += 1
    return k


# Order matters only for readability: twins are compiled lazily by name.
DEVICE_FUNCTIONS = (
    "decode_utf8",
    "code_point",
    "is_space",
    "fmix64",
    "key_mix",
    "hyperplane_word",
    "band_value",
    "band_hash",
    "popcount64",
    "hamming_row_pair",
    "dot_rows",
    "exact_product",
    "sparse_dot",
    "wordhash_next",
    "next_token",
    "window_feature",
    "simhash_add",
    "feature_step",
    "doc_feature_count",
    "doc_features",
    "doc_simhash",
)
