"""Scalar hash math of gpu_dedup: written once, compiled twice.

Every function in ``DEVICE_FUNCTIONS`` is plain Python over NumPy integer
scalars. :mod:`gpu_dedup.kernels.cpu` compiles them with ``numba.njit`` and
:mod:`gpu_dedup.kernels.cuda` with ``numba.cuda.jit(device=True)``; only the
outer loops (threads, blocks, prange) differ between the two targets.  Under
``NUMBA_ENABLE_CUDASIM=1`` the CUDA twins run as these very functions.

Specification (the golden-value tests in ``tests/`` pin it)
------------------------------------------------------------
All arithmetic is exact: no operation ever overflows 64 bits.  Products are
taken modulo the Mersenne primes ``P61 = 2**61 - 1`` and ``P31 = 2**31 - 1``
by splitting operands into 32-bit halves (``mulmod61``); ``a*x + b`` is never
allowed to wrap in uint64 before the modulus.

Parameters come from ``seed`` through splitmix64 (host side, see
``gpu_dedup.minhash.HashParams``): polynomial bases and the permutation pairs
``(a_i, b_i)`` with ``1 <= a_i < P`` and ``0 <= b_i < P``.

1. **Decoding.** Text is UTF-8. ``decode_utf8`` returns one code point and the
   next byte position; an ill-formed sequence yields U+FFFD for each maximal
   subpart (the Unicode / CPython ``errors="replace"`` rule).
2. **Tokens.** Char mode: token = code point + 1.  Word mode: words are maximal
   runs of code points that are not whitespace (``is_space`` equals Python's
   ``str.isspace``); token = ``wordhash`` = Horner polynomial of (code point +
   1) in base ``word_base`` modulo P61, starting from 0.
3. **Shingles.** A document of ``T`` tokens has the ``T - n + 1`` windows of
   ``n`` consecutive tokens; if ``0 < T < n`` it has exactly one shingle made
   of all ``T`` tokens; if ``T == 0`` it has none (its signature stays at the
   sentinel ``P``).  Shingle value ``H = sum(t_i * base**(m-1-i)) mod P61``
   (Horner from 0, ``m`` tokens), then ``x = finalize61(H)``, a bijective-ish
   non-linear mixer built from xor-shifts and ``mulmod61`` (no wrapping).
   Rolling (CPU) and direct (GPU) evaluation give identical ``H``.
4. **Permutations.** 64-bit mode: ``perm61(x) = (a*x + b) mod P61`` with
   ``x < P61``.  32-bit mode: ``x31 = x mod P31`` then
   ``perm31(x31) = (a*x31 + b) mod P31`` (``a*x31 + b < 2**63``, exact in
   uint64).  Signature value ``i`` = minimum over the document's shingles.
5. **Band hash** of band ``k`` (rows ``k*r .. k*r+r-1``):
   Horner from ``k + 1`` over the ``r`` signature values in base
   ``band_base`` modulo P61, then ``finalize61``.
6. **Exact-duplicate key** of a byte string: two Horner polynomials modulo P61
   (bases ``exact_base1``, ``exact_base2``) over its little-endian 4-byte
   words (last word zero-padded) each plus one, finalized, together with the
   byte length.
"""

import numpy as np

U64 = np.uint64
I64 = np.int64

P61 = U64((1 << 61) - 1)
P31 = U64((1 << 31) - 1)
MASK32 = U64(0xFFFFFFFF)
MASK29 = U64((1 << 29) - 1)
ZERO = U64(0)
ONE = U64(1)
SH3 = U64(3)
SH29 = U64(29)
SH31 = U64(31)
SH32 = U64(32)
SH61 = U64(61)
# odd constants < P61 for the finalizer (digits of pi and e, reduced)
FIN_C1 = U64(0x1243F6A8885A308D)
FIN_C2 = U64(0x0B7E151628AED2A6)
REPLACEMENT = I64(0xFFFD)


def mulmod61(a, b):
    """(a * b) mod P61 for a, b < 2**61, exact, via 32-bit halves.

    2**64 = 8 (mod P61) and 2**61 = 1 (mod P61); every partial sum stays
    below 2**63.
    """
    a_hi = a >> SH32
    a_lo = a & MASK32
    b_hi = b >> SH32
    b_lo = b & MASK32
    hi = (a_hi * b_hi) << SH3  # < 2**61
    mid = a_hi * b_lo + a_lo * b_hi  # < 2**62
    lo = a_lo * b_lo  # < 2**64
    s = hi + (mid >> SH29) + ((mid & MASK29) << SH32) + (lo & P61) + (lo >> SH61)
    s = (s & P61) + (s >> SH61)
    if s >= P61:
        s -= P61
    return s


def addmod61(a, b):
    """(a + b) mod P61 for a < P61 and b <= P61 + 1 (sum < 2**62)."""
    s = a + b
    s = (s & P61) + (s >> SH61)
    if s >= P61:
        s -= P61
    return s


def submod61(a, b):
    """(a - b) mod P61 for a, b < P61."""
    if a >= b:
        return a - b
    return a + P61 - b


def mod31(x):
    """x mod P31 for x < 2**64."""
    s = (x & P31) + (x >> SH31)  # < 2**34
    s = (s & P31) + (s >> SH31)  # < 2**31 + 8
    if s >= P31:
        s -= P31
    return s


def poly_step(h, t, base):
    """Horner step (h * base + t) mod P61 for h, base < P61 and t <= P61."""
    return addmod61(mulmod61(h, base), t)


def finalize61(h):
    """Non-linear mixer on [0, P61): xor-shifts and two exact mulmods."""
    h = h ^ (h >> SH31)
    h = mulmod61(h, FIN_C1)
    h = h ^ (h >> SH29)
    h = mulmod61(h, FIN_C2)
    h = h ^ (h >> SH32)
    if h >= P61:
        h -= P61
    return h


def perm61(x, a, b):
    """(a * x + b) mod P61 for x, a, b < P61."""
    return addmod61(mulmod61(a, x), b)


def perm31(x, a, b):
    """(a * x + b) mod P31 for x, a, b < P31; exact in uint64."""
    return mod31(a * x + b)


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


def next_word(data, pos, end, word_base):
    """Skip whitespace from ``pos``, hash the next word.

    Returns (word hash, found, position after the word).
    """
    while pos < end:
        cp, nxt = decode_utf8(data, pos, end)
        if not is_space(cp):
            break
        pos = nxt
    if pos >= end:
        return ZERO, False, pos
    h = ZERO
    while pos < end:
        cp, nxt = decode_utf8(data, pos, end)
        if is_space(cp):
            break
        h = poly_step(h, U64(cp) + ONE, word_base)
        pos = nxt
    return h, True, pos


def char_shingles(data, end, n, base, base_n1, head, tail, h, count, buf, cap):
    """Fill ``buf`` with up to ``cap`` finalized char-shingle values (rolling).

    State (head, tail, h, count) starts at (start, start, 0, 0). Returns
    (head, tail, h, count, filled, done).  ``base_n1 = base**(n-1) mod P61``.
    """
    k = 0
    while k < cap:
        if head >= end:
            if count > 0 and count < n:  # short document: one shingle of all tokens
                buf[k] = finalize61(h)
                k += 1
                count = n
            return head, tail, h, count, k, True
        cp, head = decode_utf8(data, head, end)
        t = U64(cp) + ONE
        if count < n:
            h = poly_step(h, t, base)
            count += 1
            if count == n:
                buf[k] = finalize61(h)
                k += 1
        else:
            cpo, tail = decode_utf8(data, tail, end)
            h = poly_step(submod61(h, mulmod61(U64(cpo) + ONE, base_n1)), t, base)
            buf[k] = finalize61(h)
            k += 1
    return head, tail, h, count, k, False


def word_shingles(data, end, n, base, base_n1, word_base, head, tail, h, count, buf, cap, ring):
    """Word-shingle twin of :func:`char_shingles` (tokens are word hashes).

    ``ring`` (n slots) keeps the window's word hashes, so each word is decoded
    and hashed once; ``tail`` is the ring slot of the window's oldest word
    (state starts at tail = 0, not at a byte position).
    """
    k = 0
    while k < cap:
        t, found, nxt = next_word(data, head, end, word_base)
        if not found:
            head = end
            if count > 0 and count < n:
                buf[k] = finalize61(h)
                k += 1
                count = n
            return head, tail, h, count, k, True
        head = nxt
        if count < n:
            ring[count] = t
            h = poly_step(h, t, base)
            count += 1
            if count == n:
                buf[k] = finalize61(h)
                k += 1
        else:
            to = ring[tail]
            ring[tail] = t
            tail += 1
            if tail == n:
                tail = 0
            h = poly_step(submod61(h, mulmod61(to, base_n1)), t, base)
            buf[k] = finalize61(h)
            k += 1
    return head, tail, h, count, k, False


def char_shingle_at(data, pos, end, n, base):
    """Direct (non-rolling) hash of the char shingle starting at byte ``pos``.

    Returns (H, tokens read); used by GPU kernels where threads take
    shingles independently.
    """
    h = ZERO
    m = 0
    while m < n and pos < end:
        cp, pos = decode_utf8(data, pos, end)
        h = poly_step(h, U64(cp) + ONE, base)
        m += 1
    return h, m


def word_shingle_at(data, pos, end, n, base, word_base):
    """Direct hash of the word shingle whose first word starts at/after ``pos``."""
    h = ZERO
    m = 0
    while m < n:
        t, found, pos = next_word(data, pos, end, word_base)
        if not found:
            break
        h = poly_step(h, t, base)
        m += 1
    return h, m


def minhash_update61(sig, xs, k, a, b, num_perm):
    """sig[j] = min(sig[j], min_i perm61(xs[i], a[j], b[j])) for i < k."""
    for j in range(num_perm):
        aj = a[j]
        bj = b[j]
        m = U64(sig[j])
        for i in range(k):
            v = perm61(xs[i], aj, bj)
            if v < m:
                m = v
        sig[j] = m


def minhash_update31(sig, xs, k, a, b, num_perm):
    """32-bit twin of :func:`minhash_update61`; ``xs`` already reduced mod P31."""
    for j in range(num_perm):
        aj = a[j]
        bj = b[j]
        m = U64(sig[j])
        for i in range(k):
            v = perm31(xs[i], aj, bj)
            if v < m:
                m = v
        sig[j] = m


def band_hash(sig, band, rows, band_base):
    """61-bit hash of band ``band`` (``rows`` consecutive values) of ``sig``."""
    h = U64(band + 1)
    start = band * rows
    for j in range(start, start + rows):
        h = poly_step(h, U64(sig[j]), band_base)
    return finalize61(h)


def exact_hash(data, start, end, base1, base2):
    """Two independent 61-bit hashes of the bytes ``data[start:end]``."""
    h1 = ZERO
    h2 = ZERO
    p = start
    while p + 4 <= end:
        t = (
            U64(data[p])
            | (U64(data[p + 1]) << U64(8))
            | (U64(data[p + 2]) << U64(16))
            | (U64(data[p + 3]) << U64(24))
        ) + ONE
        h1 = poly_step(h1, t, base1)
        h2 = poly_step(h2, t, base2)
        p += 4
    if p < end:
        t = ZERO
        s = U64(0)
        while p < end:
            t = t | (U64(data[p]) << s)
            s += U64(8)
            p += 1
        t += ONE
        h1 = poly_step(h1, t, base1)
        h2 = poly_step(h2, t, base2)
    return finalize61(h1), finalize61(h2)


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


def clean_text(data, start, end, punct, remove_punct, collapse_ws, out, o):
    """Copy ``data[start:end]`` to ``out[o:]`` dropping code points with
    ``punct[cp] != 0`` (if ``remove_punct``) and, if ``collapse_ws``, turning
    each whitespace run into one space and trimming both ends.  The output is
    never longer than the input; returns the number of bytes written.

    ASCII bytes take a branch-free path: a space owed to a preceding
    whitespace run and the byte itself are always stored and the output
    position advances only by what is kept.  Every store lands at or before
    the input position, so it stays inside the document's own output room.
    """
    o0 = o
    pending = False
    pos = start
    while pos < end:
        b = data[pos]
        if b < 0x80:  # ASCII: one byte, one code point, no branches on its class
            # bitwise operators on bools: no short-circuit branches
            drop = remove_punct & (punct[b] != 0)
            space = collapse_ws & ((b == 32) | ((b >= 9) & (b <= 13)) | ((b >= 28) & (b <= 31)))
            keep = (drop | space) ^ True
            out[o] = 32
            o += I64(keep & pending)
            out[o] = b
            o += I64(keep)
            pending = (space & (o > o0)) | (pending & drop)
            pos += 1
            continue
        cp, nxt = decode_utf8(data, pos, end)
        drop = remove_punct and punct[cp] != 0
        space = collapse_ws and is_space(cp)
        if drop:
            pos = nxt
            continue
        if space:
            pending = o > o0
            pos = nxt
            continue
        if pending:
            out[o] = 32
            o += 1
            pending = False
        while pos < nxt:
            out[o] = data[pos]
            o += 1
            pos += 1
    return o - o0


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


def shingle_at(data, start, pos, end, word_mode, n, base, word_base):
    """Direct hash of the shingle whose first token starts at byte ``pos``.

    Returns (H, m, token): ``token`` is False when no token starts at ``pos``;
    otherwise ``m`` tokens were hashed into ``H`` (``m == n``: a full
    shingle; ``m < n``: fewer than ``n`` tokens remain, which is a shingle
    only when it is the document's first token, the short-document rule).
    """
    if word_mode:
        if not word_start(data, start, pos, end):
            return ZERO, 0, False
        h, m = word_shingle_at(data, pos, end, n, base, word_base)
        return h, m, True
    if not char_start(data, start, pos, end):
        return ZERO, 0, False
    h, m = char_shingle_at(data, pos, end, n, base)
    return h, m, True


# Order matters only for readability: twins are compiled lazily by name.
DEVICE_FUNCTIONS = (
    "mulmod61",
    "addmod61",
    "submod61",
    "mod31",
    "poly_step",
    "finalize61",
    "perm61",
    "perm31",
    "decode_utf8",
    "is_space",
    "next_word",
    "char_shingles",
    "word_shingles",
    "char_shingle_at",
    "word_shingle_at",
    "minhash_update61",
    "minhash_update31",
    "band_hash",
    "exact_hash",
    "sorted_intersection",
    "clean_text",
    "char_start",
    "word_start",
    "shingle_at",
)
