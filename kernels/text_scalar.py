"""Text normalization written once, compiled twice (``numba.njit`` and ``numba.cuda.jit(device=True)``).

Definition (``gpu_dedup.config.NormalizeConfig``; pyarrow/utf8proc is the oracle)
----------------------------------------------------------------------------------
1. ill-formed UTF-8 becomes U+FFFD per maximal subpart (``scalar.decode_utf8``);
2. the Unicode form (NFKC, NFC, NFKD, NFD or none): ``pyarrow.compute.utf8_normalize``;
3. lowercase: ``pyarrow.compute.utf8_lower`` (utf8proc's simple, per-code-point mapping);
4. punctuation removal: code points of general category P in Unicode 14.0.0
   (``unicode_tables.PUNCTUATION_RANGES``), looked up on the lowercased code point;
5. whitespace collapse: every run of ``str.isspace`` code points becomes one
   space, and both ends are trimmed.

:func:`normalize_text` does all five in one pass over a document's bytes when
every code point of it is *stable* for the configured form (a per-code-point
table, :func:`property_table`, from the generated ``unicode_props.py``; see
``tools/gen_unicode_props.py`` for the definition and why a string of stable code
points is its own normal form).  Then step 2 is the identity and step 3 a
table look-up.  Runs of letters, digits and single spaces are copied eight bytes at a
time (:func:`plain_word`: most of plain text; 2.5x byte by byte on planted text,
1.4x on manual pages); other ASCII bytes take a branch-free path.  A document with an
unstable code point is reported, not written: the caller sends those (only
those) through utf8proc and then through this same function with the Unicode
steps off.  A document whose U+FFFD replacements would not fit in its input
length is reported too (the caller repairs it first).

Table (one per form): ``stage1[cp >> 7]`` is a block number, ``stage2[block * 128 +
(cp & 127)]`` a uint64: bits 0-7 the flags below, bits 8-31 the lowercase delta plus
2**23, bits 32-55 the delta to the code point the form maps it to, plus 2**23.
Block 0 is ASCII, so ``stage2[b]`` is byte ``b``'s entry.
"""

from functools import lru_cache

import numpy as np
from .hash_scalar import (BYTE_SHIFTS, BYTES_HIGH, I64, ONE, REPLACEMENT, U64, decode_utf8,  # noqa: F401
                          first_flag_shift, is_space, load8)  # (compiled here, with the constants they use)

STABLE_NFC = 1
STABLE_NFKC = 2
STABLE_NFD = 4
STABLE_NFKD = 8
STABLE_LOWER = 16
PUNCT = 32
SPACE = 64
MAPPED = 128  # the form maps the code point to one stable code point (bits 32-55: delta + 2**23)
FORM_BITS = {"NFC": STABLE_NFC, "NFKC": STABLE_NFKC, "NFD": STABLE_NFD, "NFKD": STABLE_NFKD, "none": 0}
DELTA_BIAS = 1 << 23

BYTES_01 = U64(0x0101010101010101)


# status bits returned by normalize_text
UNSTABLE = 1  # a code point needs utf8proc: nothing was written
OVERFLOW = 2  # U+FFFD replacements would not fit: repair the document first
INVALID = 4  # ill-formed UTF-8 was replaced (the output is complete)


def need_mask(unicode_form: str, lowercase: bool) -> int:
    """Flags every code point of a document must carry for the kernel to normalize it alone."""
    return FORM_BITS[unicode_form] | (STABLE_LOWER if lowercase else 0)


_TABLES: dict = {}


@lru_cache(maxsize=None)
def ascii_actions(lowercase: bool, remove_punct: bool, collapse_ws: bool) -> np.ndarray:
    """int64[128] per ASCII byte: its output byte (lowercased if asked; a space for whitespace collapsed) | drop << 8
    | space << 9."""
    _, stage2 = property_table()
    act = np.zeros(128, np.int64)
    for b in range(128):
        e = int(stage2[b])
        low = b + (((e >> 8) & 0xFFFFFF) - DELTA_BIAS if lowercase else 0)
        e = int(stage2[low])
        space = collapse_ws and e & SPACE != 0
        act[b] = (32 if space else low) | (int(remove_punct and e & PUNCT != 0) << 8) | (int(space) << 9)
    act.flags.writeable = False
    return act


def _unique_blocks(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(rows, axis=0, return_inverse=True)`` (the same sorted blocks and inverse) without sorting all
    8,704 rows of 1 KiB: equal rows are found by their bytes first, and only the few hundred distinct ones sorted."""
    first: dict[bytes, int] = {}
    ids = np.fromiter((first.setdefault(r.tobytes(), len(first)) for r in rows), np.int64, rows.shape[0])
    reps = np.zeros(len(first), np.int64)
    reps[ids[::-1]] = np.arange(rows.shape[0] - 1, -1, -1)  # the first row of each distinct block
    blocks, inverse = np.unique(rows[reps], axis=0, return_inverse=True)
    return blocks, inverse.reshape(-1).astype(np.int64)[ids]


def property_table(unicode_form: str = "none"):
    """(stage1 uint16[0x2200], stage2 uint64[blocks * 128]) with the singleton mappings of
    ``unicode_form`` (none: no mapping), built once per process and form."""
    if unicode_form not in _TABLES:
        from . import unicode_props as up
        from .unicode_tables import PUNCTUATION_RANGES

        flags = np.zeros(0x110000, np.uint64)
        for bit, ranges in ((STABLE_NFC, up.NFC_STABLE), (STABLE_NFKC, up.NFKC_STABLE), (STABLE_NFD, up.NFD_STABLE),
                            (STABLE_NFKD, up.NFKD_STABLE), (STABLE_LOWER, up.LOWER_STABLE),
                            (PUNCT, PUNCTUATION_RANGES)):
            for lo, hi in ranges:
                flags[lo : hi + 1] |= np.uint64(bit)
        for cp in (0x20, 0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000):
            flags[cp] |= np.uint64(SPACE)
        for lo, hi in ((0x09, 0x0D), (0x1C, 0x1F), (0x2000, 0x200A)):
            flags[lo : hi + 1] |= np.uint64(SPACE)
        lower = np.zeros(0x110000, np.int64)
        pairs = np.array(up.LOWER_PAIRS, np.int64)
        lower[pairs[:, 0]] = pairs[:, 1] - pairs[:, 0]
        mapped = np.zeros(0x110000, np.int64)
        if unicode_form != "none":
            pairs = np.array(getattr(up, f"{unicode_form}_MAP"), np.int64).reshape(-1, 2)
            mapped[pairs[:, 0]] = pairs[:, 1] - pairs[:, 0]
            flags[pairs[:, 0]] |= np.uint64(MAPPED)
        entry = (flags | ((lower + DELTA_BIAS).astype(np.uint64) << np.uint64(8))
                 | ((mapped + DELTA_BIAS).astype(np.uint64) << np.uint64(32)))
        blocks, stage1 = _unique_blocks(entry.reshape(-1, 128))
        a = stage1[0]  # swap block numbers so that ASCII's block is block 0: stage2[b] is byte b's entry
        blocks[[0, a]] = blocks[[a, 0]]
        stage1 = np.where(stage1 == a, 0, np.where(stage1 == 0, a, stage1))
        _TABLES[unicode_form] = (stage1.astype(np.uint16), np.ascontiguousarray(blocks.reshape(-1)))
    return _TABLES[unicode_form]


def props(stage1, stage2, cp):
    """The table entry of code point ``cp`` (as int64: entries are below 2**56)."""
    return I64(stage2[I64(stage1[cp >> 7]) * 128 + (cp & 127)])


def encode_utf8(out, o, cp):
    """Write ``cp`` as UTF-8 at ``out[o:]``; return the next position."""
    if cp < 0x80:
        out[o] = cp
        return o + 1
    if cp < 0x800:
        out[o] = 0xC0 | (cp >> 6)
        out[o + 1] = 0x80 | (cp & 0x3F)
        return o + 2
    if cp < 0x10000:
        out[o] = 0xE0 | (cp >> 12)
        out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[o + 2] = 0x80 | (cp & 0x3F)
        return o + 3
    out[o] = 0xF0 | (cp >> 18)
    out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[o + 3] = 0x80 | (cp & 0x3F)
    return o + 4


def byte_range(w, lo, hi):
    """Bit 7 of each byte of ``w`` (every byte below 0x80) that lies in ``[lo, hi]``; no carry crosses a byte."""
    return (w + BYTES_01 * U64(0x80 - lo)) & ~(w + BYTES_01 * U64(0x7F - hi)) & BYTES_HIGH


def plain_word(w, last_space, collapse_ws):
    """(``up``, ``stop``) of the eight bytes of ``w``: bit 7 of each byte that is A-Z in ``up``; in ``stop``,
    bit 7 of each byte that does not normalize to itself (but for A-Z lowercased), of which only the lowest is
    exact: a byte that is not a letter, a digit or a space (0x20) and, with whitespace collapsed, a space after
    a space (or first when ``last_space``).  The bytes below the lowest flag in ``stop`` (all eight when it is
    0) are the ones that can be copied.  A byte of 0x80 or more may carry into the sums of the bytes above it,
    never below.  These are ASCII facts ``ascii_actions`` holds for every setting: letters and digits are
    neither punctuation nor whitespace."""
    up = byte_range(w, 0x41, 0x5A)
    sp = byte_range(w, 0x20, 0x20)
    stop = (w | ~(up | sp | byte_range(w, 0x61, 0x7A) | byte_range(w, 0x30, 0x39))) & BYTES_HIGH
    if collapse_ws:
        stop |= (sp & (sp << U64(8))) | (sp & U64(0x80) & (U64(0) - U64(last_space)))
    return up, stop


def store8(out, o, w):
    """``out[o:o+8]`` = the 8 bytes of ``w``, little-endian."""
    for i in range(8):
        out[o + i] = (w >> U64(8 * i)) & U64(0xFF)


def normalize_text(data, start, end, stage1, stage2, ascii_action, need, lowercase, remove_punct, collapse_ws, out, o):
    """Normalize ``data[start:end]`` into ``out[o:o + (end - start)]``; return (bytes written, status).

    ``need`` = :func:`need_mask`, ``ascii_action`` = :func:`ascii_actions` of the same
    settings; status 0 or ``INVALID``: the output is complete;
    ``UNSTABLE`` or ``OVERFLOW``: the document needs the caller's slow path.
    Every store lands at an output offset no larger than the input offset it
    came from (the U+FFFD case checks this), so a document never writes past
    its own room: documents can be written in parallel at their input offsets.
    ``out`` must not overlap ``data``: bytes past the ones written may change.
    """
    o0 = o
    last_space = 1  # 1: nothing is written yet, or the last byte written is the space of a whitespace run
    status = 0
    pos = start
    while pos < end:
        stop = end
        if pos + 8 <= end:  # the plain ASCII bytes of the next eight at once, then one by one what ends them
            w = load8(data, pos)
            up, flags = plain_word(w, last_space, collapse_ws)
            k = I64(8) if flags == U64(0) else I64(first_flag_shift(flags) >> U64(3))
            if k > 0:
                if lowercase:
                    w += up >> U64(2)  # A-Z + 0x20: a-z (bytes above the first k may change: they are not kept)
                store8(out, o, w)  # all eight bytes: those past the first k are overwritten or past the end
                o += k
                pos += k
                last_space = I64(collapse_ws and ((w >> U64(8 * k - 8)) & U64(0xFF)) == U64(32))
                if k == 8:
                    continue
                stop = pos + 1  # the byte that ended the run (a code point starting there is taken whole)
            else:
                stop = pos + 8  # eight (or more) bytes one by one: text that is not plain goes on cheaply
        while pos < stop:
            b = I64(data[pos])
            if b < 0x80:  # ASCII: stable, one byte in and at most one out; no branches on its class
                a = ascii_action[b]
                drop = (a >> 8) & 1
                space = (a >> 9) & 1
                out[o] = a & 0xFF  # a whitespace byte's action writes a space
                o += (1 - (drop | space)) | (space & (1 - last_space))
                last_space = space | (last_space & drop)
                pos += 1
                continue
            cp, nxt = decode_utf8(data, pos, end)
            if cp == REPLACEMENT and not (nxt - pos == 3 and data[pos] == 0xEF):
                status |= INVALID
                if (o - o0) + 3 > (nxt - start):  # U+FFFD must fit in what was read
                    return o - o0, OVERFLOW
            e = props(stage1, stage2, cp)
            if (e & need) != need:
                if (e & MAPPED) == 0:
                    return o - o0, UNSTABLE
                cp = cp + (I64((e >> 32) & 0xFFFFFF) - DELTA_BIAS)  # the one stable code point the form maps it to
                e = props(stage1, stage2, cp)
                if (e & need) != need:
                    return o - o0, UNSTABLE
            if lowercase:
                d = I64((e >> 8) & 0xFFFFFF) - DELTA_BIAS
                if d != 0:
                    cp = cp + d
                    e = props(stage1, stage2, cp)
            pos = nxt
            if remove_punct and (e & PUNCT) != 0:
                continue
            if collapse_ws and (e & SPACE) != 0:
                if last_space == 0:
                    out[o] = 32
                    o += 1
                    last_space = 1
                continue
            o = encode_utf8(out, o, cp)
            last_space = 0
    return o - o0 - (last_space & I64(o > o0)), status  # a trailing space is trimmed


DEVICE_FUNCTIONS = ("decode_utf8", "is_space", "load8", "first_flag_shift", "byte_range", "plain_word", "store8", "props",
                    "encode_utf8", "normalize_text")
