"""Scalar hash math of gpu_dedup: written once, compiled twice.

Every function in ``DEVICE_FUNCTIONS`` is plain Python over NumPy integer
scalars. :mod:`gpu_dedup.kernels.hash_cpu` compiles them with ``numba.njit`` and
:mod:`gpu_dedup.kernels.hash_cuda` with ``numba.cuda.jit(device=True)``; only the
outer loops (threads, blocks, prange) differ between the two targets.  Under
``NUMBA_ENABLE_CUDASIM=1`` the CUDA twins run as these very functions.

Hash family v2 (``params.HASH_FAMILY``; the golden-value tests in ``tests/`` pin it)
------------------------------------------------------------------------------------
Arithmetic on 64-bit values wraps modulo 2**64 and on 32-bit values modulo
2**32: the wrap *is* the definition (no prime modulus anywhere).  The
constants come from ``seed`` (``params.HashParams``, draw order there):
``shingle_base``, ``word_base``, ``band_base`` (odd, ``= 5 mod 8``),
``exact_seed1``, ``exact_seed2`` and per permutation ``a_i`` (odd) and
``b_i``, both 32-bit.

* ``mix64(z)``: the splitmix64 finalizer, a bijection of 64-bit values::

      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
      z = (z ^ (z >> 27)) * 0x94D049BB133111EB
      z = z ^ (z >> 31)

1. **Text** is UTF-8, decoded by ``decode_utf8``: an ill-formed sequence
   yields U+FFFD for each maximal subpart (the ``errors="replace"`` rule).
2. **Tokens.** Char mode: each code point ``cp`` is a token,
   ``t = mix64(cp + 1)``.  Word mode: words are maximal runs of code points
   that are not whitespace (``is_space`` equals ``str.isspace``).  A word's
   UTF-8 bytes (its decoded code points re-encoded, so an ill-formed subpart
   counts as EF BF BD) are split into little-endian 8-byte chunks
   ``c_0 .. c_{q-1}`` (the last one zero-padded); with ``L`` its byte length,
   ``W = L + sum_j c_j * word_base**(j + 1)`` and ``t = mix64(W)``.
3. **Shingles.** A document of ``T`` tokens has the ``T - n + 1`` windows of
   ``n`` consecutive tokens; if ``0 < T < n`` it has exactly one shingle made
   of all ``T`` tokens; if ``T == 0`` it has none.  The 64-bit **shingle
   value** of tokens ``t_0 .. t_{m-1}`` is the polynomial
   ``H = sum_i t_i * shingle_base**(m - 1 - i)`` (Horner from 0).  CPU kernels
   roll it, ``H' = (H - t_out * shingle_base**(n-1)) * shingle_base + t_in``;
   GPU kernels evaluate it directly per window, or as the difference
   ``P_{i+n} - P_i * shingle_base**n`` of Horner prefixes ``P_g`` of the
   first ``g`` tokens: the same value (exact in the ring of integers mod 2**64).  Exact Jaccard verification compares sets of
   ``H``.
4. **Permutations.** Key ``x = H >> 32`` (32 bits); permutation ``i`` is the
   affine bijection of 32-bit values ``h_i(x) = (a_i * x + b_i) mod 2**32``
   (``a_i`` odd).  Signature value ``i`` = min over the document's shingles
   (uint32); a document without shingles keeps ``SENTINEL = 2**32 - 1`` (its
   shingle count, 0, tells it apart from a real value).
5. **Band hash** of band ``k`` (rows ``k*r .. k*r+r-1``): Horner from
   ``k + 1`` over the ``r`` 32-bit values in base ``band_base`` (mod 2**64),
   then ``mix64``: 64 bits.
6. **Exact-duplicate key** of a byte string: its length and two lanes
   ``h = exact_seed``; ``h = mix64(h ^ w)`` for each little-endian 8-byte word
   ``w`` (the last one zero-padded).

Why this family: the mixed tokens make the shingle values behave like random
64-bit numbers, so a distinct pair of shingles collides with probability
about 2**-64 (exact Jaccard stays exact) and the 32-bit keys are uniform;
the bases are ``5 mod 8``, so that ``base**k - 1`` has exactly ``v2(k) + 2``
factors of two and the differences that repeated or swapped tokens leave
(multiples of ``base**k - 1``) do not vanish modulo 2**64.  ``h_i`` is a
*permutation* of the 32-bit keys (no collisions) and costs one 32-bit
multiply-add and a minimum: it vectorises as 8 (AVX2) or 16 (AVX-512) lanes
on the CPU and is one ``IMAD`` on the GPU.  The constant ``b_i`` keeps two
permutations whose multipliers have a small ratio from choosing the same
minimum.  64-bit multiply-shift families ((a*x + b) >> 32 on 64-bit keys, or
Dietzfelbinger's multiply-add-shift of a 32-bit key) need 64-bit lane
products: about three times slower per permutation on an AVX-512 CPU, each
in its best vector form (``python -m gpu_dedup.bench.signatures``, second
table), and several instructions per product on the GPU.
"""

import numpy as np

U64 = np.uint64
U32 = np.uint32
I64 = np.int64

ZERO = U64(0)
ONE = U64(1)
MASK32 = U64(0xFFFFFFFF)
SH32 = U64(32)
SENTINEL = U32(0xFFFFFFFF)  # signature value of a document without shingles
MIX_C1 = U64(0xBF58476D1CE4E5B9)
MIX_C2 = U64(0x94D049BB133111EB)
BYTES_HIGH = U64(0x8080808080808080)  # bit 7 of every byte
BYTES_21 = U64(0x2121212121212121)
BYTE_SHIFTS = U64(0x0008101820283038)  # top byte of (1 << 8k) * this = 8k
REPLACEMENT = I64(0xFFFD)


def mix64(z):
    """The splitmix64 finalizer: a bijection of 64-bit values (wrapping products)."""
    z = (z ^ (z >> U64(30))) * MIX_C1
    z = (z ^ (z >> U64(27))) * MIX_C2
    return z ^ (z >> U64(31))


def load8(data, p):
    """The 8 bytes ``data[p:p+8]`` as a little-endian 64-bit value (unsigned indices: one load on the CPU)."""
    q = U64(p)
    return (U64(data[q]) | (U64(data[q + U64(1)]) << U64(8)) | (U64(data[q + U64(2)]) << U64(16))
            | (U64(data[q + U64(3)]) << U64(24)) | (U64(data[q + U64(4)]) << U64(32))
            | (U64(data[q + U64(5)]) << U64(40)) | (U64(data[q + U64(6)]) << U64(48))
            | (U64(data[q + U64(7)]) << U64(56)))


def special_bytes(v):
    """Flags of the bytes of ``v`` that are not plain ASCII word bytes (``< 0x21`` or ``>= 0x80``).

    Bit 7 of the *lowest* such byte is set and no bit below it (a byte below
    it is ``>= 0x21``, so the subtraction borrows nothing into it); bits
    above may be spurious.  Three operations: only the lowest flag is used.
    """
    return ((v - BYTES_21) | v) & BYTES_HIGH


def first_flag_shift(f):
    """``8 * k`` for the lowest byte ``k`` whose bit 7 is set in ``f`` (``f != 0``)."""
    low = f & (~f + ONE)
    return ((low >> U64(7)) * BYTE_SHIFTS) >> U64(56)


def first_special_shift(f0, f1):
    """``8 * k`` for the first flagged byte ``k`` of 16 bytes flagged ``f0`` (bytes 0-7) and ``f1``
    (bytes 8-15), ``f0 | f1 != 0``.  The CPU twin counts trailing zeros instead (same result)."""
    z = U64(f0 == ZERO)  # 1: the first flag is in the second word
    return first_flag_shift(f0 | (f1 & (ZERO - z))) + (z << U64(6))


def utf8_width(cp):
    """Bytes of the UTF-8 encoding of code point ``cp``."""
    if cp < 0x80:
        return 1
    if cp < 0x800:
        return 2
    if cp < 0x10000:
        return 3
    return 4


def utf8_byte(cp, width, i):
    """Byte ``i`` (0-based) of the ``width``-byte UTF-8 encoding of ``cp``."""
    if i == 0:
        if width == 1:
            return cp
        if width == 2:
            return 0xC0 | (cp >> 6)
        if width == 3:
            return 0xE0 | (cp >> 12)
        return 0xF0 | (cp >> 18)
    return 0x80 | ((cp >> (6 * (width - 1 - i))) & 0x3F)


def decode_utf8(data, pos, end):
    """Decode one code point of ``data[pos:end]``; return (code point, next pos).

    Ill-formed input yields U+FFFD per maximal subpart, exactly as
    ``bytes.decode("utf-8", errors="replace")``.
    """
    b0 = I64(data[pos])
    if b0 < 0x80:
        return b0, pos + 1
    if b0 < 0xC2:
        return REPLACEMENT, pos + 1
    if b0 < 0xE0:
        need = 1
        cp = b0 & 0x1F
        lo = 0x80
        hi = 0xBF
    elif b0 < 0xF0:
        need = 2
        cp = b0 & 0x0F
        lo = 0xA0 if b0 == 0xE0 else 0x80
        hi = 0x9F if b0 == 0xED else 0xBF
    elif b0 < 0xF5:
        need = 3
        cp = b0 & 0x07
        lo = 0x90 if b0 == 0xF0 else 0x80
        hi = 0x8F if b0 == 0xF4 else 0xBF
    else:
        return REPLACEMENT, pos + 1
    p = pos + 1
    for _ in range(need):
        if p >= end:
            return REPLACEMENT, p
        c = I64(data[p])
        if c < lo or c > hi:
            return REPLACEMENT, p
        cp = (cp << 6) | (c & 0x3F)
        lo = 0x80
        hi = 0xBF
        p += 1
    return cp, p


def is_space(cp):
    """Python's ``str.isspace`` for one code point."""
    if cp <= 0x20:
        return cp == 0x20 or (cp >= 0x09 and cp <= 0x0D) or (cp >= 0x1C and cp <= 0x1F)
    if cp < 0x85:
        return False
    if cp == 0x85 or cp == 0xA0 or cp == 0x1680:
        return True
    if cp < 0x2000:
        return False
    return cp <= 0x200A or cp == 0x2028 or cp == 0x2029 or cp == 0x202F or cp == 0x205F or cp == 0x3000


def char_token(cp):
    """Token of one code point (char mode)."""
    return mix64(U64(cp) + ONE)


def next_char(data, pos, end):
    """Token of the code point at ``pos`` (``pos < end``) and the position after it."""
    b = I64(data[U64(pos)])
    if b < 0x80:
        return char_token(b), pos + 1
    cp, nxt = decode_utf8(data, pos, end)
    return char_token(cp), nxt


def next_word(data, pos, end, word_base, word_base2):
    """Skip whitespace from ``pos``, then hash the next word (step 2 of the spec).

    Returns (token, found, position after the word or after the one ASCII
    whitespace byte that ends it).  ``word_base2`` is
    ``word_base**2``.  Fast path: a word of at most 15 plain ASCII bytes
    followed by an ASCII space, at least 16 bytes before ``end``: two 8-byte
    loads, no loop over its bytes.  Anything else takes the general path
    (code point by code point, re-encoded), which gives the same value.
    """
    while pos < end:
        b = I64(data[U64(pos)])
        if b < 0x80:
            if not is_space(b):
                break
            pos += 1
        else:
            cp, nxt = decode_utf8(data, pos, end)
            if not is_space(cp):
                break
            pos = nxt
    if pos >= end:
        return ZERO, False, pos
    if pos + 16 <= end:
        v0 = load8(data, pos)
        v1 = load8(data, pos + 8)
        f0 = special_bytes(v0)
        f1 = special_bytes(v1)
        if (f0 | f1) != ZERO:
            s = first_special_shift(f0, f1)  # 8 * the offset of the first special byte
            k = I64(s >> U64(3))
            b = I64(data[U64(pos + k)])
            if b < 0x80 and is_space(b):  # the word ends at a plain ASCII space (skipped too)
                # bytes below the lowest flag: (lowest flag bit >> 7) - 1; all ones when a word has no flag
                m0 = ((f0 & (~f0 + ONE)) >> U64(7)) - ONE
                m1 = (((f1 & (~f1 + ONE)) >> U64(7)) - ONE) & (ZERO - U64(f0 == ZERO))
                w = U64(k) + (v0 & m0) * word_base + (v1 & m1) * word_base2
                return mix64(w), True, pos + k + 1
    return word_general(data, pos, end, word_base)


def word_general(data, pos, end, word_base):
    """The general path of ``next_word`` from the first byte of a word: its code points, re-encoded as
    UTF-8, in 8-byte chunks.  Returns (token, True, position after the word)."""
    w = ZERO
    chunk = ZERO
    sh = ZERO
    power = word_base
    length = 0
    while pos < end:
        b = I64(data[U64(pos)])
        if b < 0x80:
            if is_space(b):
                break
            cp = b
            nxt = pos + 1
        else:
            cp, nxt = decode_utf8(data, pos, end)
            if is_space(cp):
                break
        width = utf8_width(cp)
        for i in range(width):
            chunk |= U64(utf8_byte(cp, width, i)) << sh
            sh += U64(8)
            if sh == U64(64):
                w += chunk * power
                power *= word_base
                chunk = ZERO
                sh = ZERO
        length += width
        pos = nxt
    w += chunk * power
    return mix64(w + U64(length)), True, pos


def next_shingle(data, end, word_mode, n, base, base_n1, word_base, word_base2, pos, h, count, tail, ring):
    """Advance the rolling window by one token (CPU kernels).

    State (pos, h, count, tail) starts at (document start, 0, 0, 0); ``ring``
    (n slots) holds the window's tokens, ``tail`` the slot of the oldest one;
    ``base_n1 = base**(n-1)``.  Returns (pos, h, count, tail, emit, done):
    ``emit`` when ``h`` is now a shingle value (a full window, or the one
    shingle of a short document at its end), ``done`` at the document's end.
    """
    if word_mode:
        t, found, pos = next_word(data, pos, end, word_base, word_base2)
    else:
        found = pos < end
        t = ZERO
        if found:
            t, pos = next_char(data, pos, end)
    if not found:
        if count > 0 and count < n:  # short document: one shingle of all its tokens
            return pos, h, n, tail, True, True
        return pos, h, count, tail, False, True
    if count < n:
        ring[U64(count)] = t
        h = h * base + t
        count += 1
        return pos, h, count, tail, count == n, False
    out = ring[U64(tail)]
    ring[U64(tail)] = t
    tail += 1
    if tail == n:
        tail = 0
    return pos, (h - out * base_n1) * base + t, count, tail, True, False


def shingle_batch(data, end, word_mode, n, base, base_n1, word_base, word_base2, pos, h, count, tail, ring, buf,
                  cap):
    """Fill ``buf`` with up to ``cap`` shingle values ``H``, rolling (``next_shingle``).

    Returns (pos, h, count, tail, filled, done).
    """
    k = 0
    while k < cap:
        pos, h, count, tail, emit, done = next_shingle(data, end, word_mode, n, base, base_n1, word_base,
                                                       word_base2, pos, h, count, tail, ring)
        if emit:
            buf[U64(k)] = h
            k += 1
        if done:
            return pos, h, count, tail, k, True
    return pos, h, count, tail, k, False


def perm_key(h):
    """The 32-bit permutation key of shingle value ``h``."""
    return U32(h >> SH32)


def permute(x, a, b):
    """Permutation ``(a * x + b) mod 2**32`` of a 32-bit key (64-bit products, no overflow warnings)."""
    return U32((U64(a) * U64(x) + U64(b)) & MASK32)


def shingle_at(data, start, pos, end, word_mode, n, base, word_base, word_base2):
    """Direct value ``H`` of the shingle whose first token starts at byte ``pos``.

    Returns (H, m, token): ``token`` is False when no token starts at ``pos``;
    otherwise ``m`` tokens were hashed into ``H`` (``m == n``: a full
    shingle; ``m < n``: fewer than ``n`` tokens remain, which is a shingle
    only when it is the document's first token, the short-document rule).
    Used by GPU kernels, where threads take byte positions independently.
    """
    h = ZERO
    m = 0
    if word_mode:
        if not word_start(data, start, pos, end):
            return ZERO, 0, False
        while m < n:
            t, found, pos = next_word(data, pos, end, word_base, word_base2)
            if not found:
                break
            h = h * base + t
            m += 1
        return h, m, True
    if not char_start(data, start, pos, end):
        return ZERO, 0, False
    while m < n and pos < end:
        t, pos = next_char(data, pos, end)
        h = h * base + t
        m += 1
    return h, m, True


def band_hash(sig, band, rows, band_base):
    """64-bit hash of band ``band`` (``rows`` consecutive 32-bit values) of ``sig``."""
    h = U64(band) + ONE
    start = band * rows
    for j in range(start, start + rows):
        h = h * band_base + U64(sig[j])
    return mix64(h)


def exact_hash(data, start, end, seed1, seed2):
    """Two 64-bit lanes of the exact-duplicate key of the bytes ``data[start:end]``."""
    h1 = seed1
    h2 = seed2
    p = start
    while p + 8 <= end:
        w = load8(data, p)
        h1 = mix64(h1 ^ w)
        h2 = mix64(h2 ^ w)
        p += 8
    if p < end:
        w = ZERO
        s = ZERO
        while p < end:
            w |= U64(data[U64(p)]) << s
            s += U64(8)
            p += 1
        h1 = mix64(h1 ^ w)
        h2 = mix64(h2 ^ w)
    return h1, h2


def sorted_intersection(x, xs, xe, y, ys, ye):
    """Size of the intersection of two sorted unique runs x[xs:xe], y[ys:ye]."""
    i = xs
    j = ys
    c = 0
    while i < xe and j < ye:
        if x[i] == y[j]:
            c += 1
            i += 1
            j += 1
        elif x[i] < y[j]:
            i += 1
        else:
            j += 1
    return c


def char_start(data, start, pos, end):
    """True when a code point of document ``data[start:end]`` starts at byte ``pos``.

    Decoding is self-synchronizing: ASCII and lead bytes (anything but
    0x80..0xBF) always start a code point, because ``decode_utf8`` only ever
    consumes continuation bytes after a lead.  A continuation byte starts one
    (an ill-formed subpart, U+FFFD) unless the nearest non-continuation byte at
    most 3 bytes back, decoded, reaches past it.  Used by GPU kernels where
    each thread takes byte positions independently.
    """
    b = I64(data[pos])
    if b < 0x80 or b >= 0xC0:
        return True
    q = pos - 1
    while q >= start and q >= pos - 3:
        c = I64(data[q])
        if c < 0x80 or c >= 0xC0:
            cp, nxt = decode_utf8(data, q, end)
            return nxt <= pos
        q -= 1
    return True


def word_start(data, start, pos, end):
    """True when a word (maximal run of non-space code points) starts at ``pos``."""
    if not char_start(data, start, pos, end):
        return False
    cp, nxt = decode_utf8(data, pos, end)
    if is_space(cp):
        return False
    if pos == start:
        return True
    q = pos - 1  # the previous code point starts at most 4 bytes back
    while q > start and not char_start(data, start, q, end):
        q -= 1
    prev, nxt = decode_utf8(data, q, end)
    return is_space(prev)


# Order matters only for readability: twins are compiled lazily by name.
DEVICE_FUNCTIONS = (
    "mix64",
    "load8",
    "special_bytes",
    "first_flag_shift",
    "first_special_shift",
    "utf8_width",
    "utf8_byte",
    "decode_utf8",
    "is_space",
    "char_token",
    "next_char",
    "next_word",
    "word_general",
    "next_shingle",
    "shingle_batch",
    "perm_key",
    "permute",
    "shingle_at",
    "band_hash",
    "exact_hash",
    "sorted_intersection",
    "char_start",
    "word_start",
)
