"""CPU outer loops (Numba ``njit(parallel=True)``) around the scalar twins.

Strings arrive as Arrow buffers: ``offsets`` (int64, n + 1, absolute byte
positions into ``data``) and ``data`` (uint8).  ``docs`` selects which
documents to process; ``tasks`` splits ``docs`` into byte-balanced chunks that
``prange`` distributes over threads, so one long document does not hold a
whole thread's share of short ones.
"""

import numba
import numpy as np
from numba import prange

from .scalar import P31, P61, ZERO
from .twin import compile_twins, guard_cache

dev = compile_twins(numba.njit(cache=True))

_char_shingles = dev.char_shingles
_word_shingles = dev.word_shingles
_update61 = dev.minhash_update61
_update31 = dev.minhash_update31
_mod31 = dev.mod31
_band_hash = dev.band_hash
_exact_hash = dev.exact_hash
_intersection = dev.sorted_intersection

BATCH = 128  # shingles hashed per permutation sweep (the SIMD dimension)


@numba.njit(cache=True)
def _start_tail(word_mode, start):
    """Initial ``tail``: a ring slot (word mode) or a byte position (char mode)."""
    return 0 if word_mode else start


@numba.njit(cache=True)
def _shingle_batch(data, end, word_mode, n, base, base_n1, word_base, head, tail, h, count, buf, ring):
    """One batch of shingle values; state (head, tail, h, count) starts at
    (start, start_tail(word_mode, start), 0, 0)."""
    if word_mode:
        return _word_shingles(data, end, n, base, base_n1, word_base, head, tail, h, count, buf, buf.shape[0], ring)
    return _char_shingles(data, end, n, base, base_n1, head, tail, h, count, buf, buf.shape[0])


@numba.njit(parallel=True, cache=True)
def minhash(offsets, data, docs, tasks, word_mode, n, base, base_n1, word_base, a, b, bits64, out, counts):
    """MinHash signatures of ``docs`` into ``out[k, :]``; shingle counts into ``counts``."""
    num_perm = a.shape[0]
    sentinel = P61 if bits64 else P31
    for t in prange(tasks.shape[0] - 1):
        buf = np.empty(BATCH, np.uint64)
        ring = np.empty(max(n, 1), np.uint64)
        sig = np.empty(num_perm, np.uint64)
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            start = offsets[d]
            end = offsets[d + 1]
            sig[:] = sentinel
            head = start
            tail = _start_tail(word_mode, start)
            h = ZERO
            count = 0
            total = 0
            done = False
            while not done:
                head, tail, h, count, filled, done = _shingle_batch(
                    data, end, word_mode, n, base, base_n1, word_base, head, tail, h, count, buf, ring
                )
                if filled > 0:
                    if bits64:
                        _update61(sig, buf, filled, a, b, num_perm)
                    else:
                        for i in range(filled):
                            buf[i] = _mod31(buf[i])
                        _update31(sig, buf, filled, a, b, num_perm)
                    total += filled
            for j in range(num_perm):
                out[k, j] = sig[j]
            counts[k] = total


@numba.njit(parallel=True, cache=True)
def shingle_counts(offsets, data, docs, tasks, word_mode, n, base, base_n1, word_base, counts):
    """Number of shingles (with repeats) of each selected document."""
    for t in prange(tasks.shape[0] - 1):
        buf = np.empty(BATCH, np.uint64)
        ring = np.empty(max(n, 1), np.uint64)
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            end = offsets[d + 1]
            head = offsets[d]
            tail = _start_tail(word_mode, head)
            h = ZERO
            count = 0
            total = 0
            done = False
            while not done:
                head, tail, h, count, filled, done = _shingle_batch(
                    data, end, word_mode, n, base, base_n1, word_base, head, tail, h, count, buf, ring
                )
                total += filled
            counts[k] = total


@numba.njit(parallel=True, cache=True)
def shingle_sets(offsets, data, docs, tasks, word_mode, n, base, base_n1, word_base, set_offsets, values, unique):
    """Write each document's shingle values into ``values[set_offsets[k]:...]``,
    sort them and move the distinct ones to the front; ``unique[k]`` = count."""
    for t in prange(tasks.shape[0] - 1):
        buf = np.empty(BATCH, np.uint64)
        ring = np.empty(max(n, 1), np.uint64)
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            end = offsets[d + 1]
            head = offsets[d]
            tail = _start_tail(word_mode, head)
            h = ZERO
            count = 0
            pos = set_offsets[k]
            done = False
            while not done:
                head, tail, h, count, filled, done = _shingle_batch(
                    data, end, word_mode, n, base, base_n1, word_base, head, tail, h, count, buf, ring
                )
                for i in range(filled):
                    values[pos + i] = buf[i]
                pos += filled
            lo = set_offsets[k]
            seg = values[lo:pos]
            seg.sort()
            u = 0
            for i in range(seg.shape[0]):
                if u == 0 or seg[i] != seg[u - 1]:
                    seg[u] = seg[i]
                    u += 1
            unique[k] = u


@numba.njit(cache=True)
def compact_in_place(values, src_offsets, lengths, dst_offsets):
    """Move segment k from ``src_offsets[k]`` down to ``dst_offsets[k] <= src_offsets[k]``,
    in order (serial: a segment may land where an earlier one was read)."""
    for k in range(lengths.shape[0]):
        s = src_offsets[k]
        d = dst_offsets[k]
        if d != s:
            for i in range(lengths[k]):  # forward copy: safe for overlapping moves to the left
                values[d + i] = values[s + i]


@numba.njit(parallel=True, cache=True)
def compact_segments(src_offsets, src_values, lengths, dst_offsets, dst_values):
    """Copy the first ``lengths[k]`` values of each segment into a dense CSR."""
    for k in prange(lengths.shape[0]):
        s = src_offsets[k]
        d = dst_offsets[k]
        dst_values[d : d + lengths[k]] = src_values[s : s + lengths[k]]


@numba.njit(parallel=True, cache=True)
def jaccard_pairs(set_offsets, values, left, right, out):
    """Exact Jaccard of sorted unique shingle sets for each (left, right) pair.

    Two empty sets have similarity 0 (they carry no evidence of duplication).
    """
    for e in prange(left.shape[0]):
        i = left[e]
        j = right[e]
        xs = set_offsets[i]
        xe = set_offsets[i + 1]
        ys = set_offsets[j]
        ye = set_offsets[j + 1]
        inter = _intersection(values, xs, xe, values, ys, ye)
        union = (xe - xs) + (ye - ys) - inter
        out[e] = inter / union if union > 0 else 0.0


@numba.njit(parallel=True, cache=True)
def signature_similarity(sig, left, right, out):
    """Fraction of equal signature values for each (left, right) pair."""
    num_perm = sig.shape[1]
    for e in prange(left.shape[0]):
        i = left[e]
        j = right[e]
        same = 0
        for p in range(num_perm):
            if sig[i, p] == sig[j, p]:
                same += 1
        out[e] = same / num_perm


@numba.njit(parallel=True, cache=True)
def band_hashes(sig, bands, rows, band_base, out):
    """out[k, band] = band_hash(sig[k], band) for the first ``bands`` bands."""
    for k in prange(sig.shape[0]):
        row = sig[k]
        for band in range(bands):
            out[k, band] = _band_hash(row, band, rows, band_base)


@numba.njit(parallel=True, cache=True)
def exact_hashes(offsets, data, base1, base2, out):
    """out[k] = exact_hash of document k's bytes (two 61-bit lanes)."""
    for k in prange(offsets.shape[0] - 1):
        h1, h2 = _exact_hash(data, offsets[k], offsets[k + 1], base1, base2)
        out[k, 0] = h1
        out[k, 1] = h2


_decode = dev.decode_utf8


@numba.njit(cache=True)
def _utf8_width(cp):
    if cp < 0x80:
        return 1
    if cp < 0x800:
        return 2
    if cp < 0x10000:
        return 3
    return 4


@numba.njit(parallel=True, cache=True)
def utf8_repair_plan(offsets, data, new_lengths, had_errors):
    """Byte length of each document once ill-formed UTF-8 is replaced by U+FFFD."""
    for k in prange(offsets.shape[0] - 1):
        pos = offsets[k]
        end = offsets[k + 1]
        total = 0
        bad = False
        while pos < end:
            cp, nxt = _decode(data, pos, end)
            w = _utf8_width(cp)
            if cp == 0xFFFD and (nxt - pos != 3 or data[pos] != 0xEF):
                bad = True
            total += w
            pos = nxt
        new_lengths[k] = total
        had_errors[k] = bad


@numba.njit(parallel=True, cache=True)
def utf8_repair_fill(offsets, data, new_offsets, out):
    """Re-encode every decoded code point (U+FFFD for each ill-formed subpart)."""
    for k in prange(offsets.shape[0] - 1):
        pos = offsets[k]
        end = offsets[k + 1]
        o = new_offsets[k]
        while pos < end:
            cp, pos = _decode(data, pos, end)
            if cp < 0x80:
                out[o] = cp
                o += 1
            elif cp < 0x800:
                out[o] = 0xC0 | (cp >> 6)
                out[o + 1] = 0x80 | (cp & 0x3F)
                o += 2
            elif cp < 0x10000:
                out[o] = 0xE0 | (cp >> 12)
                out[o + 1] = 0x80 | ((cp >> 6) & 0x3F)
                out[o + 2] = 0x80 | (cp & 0x3F)
                o += 3
            else:
                out[o] = 0xF0 | (cp >> 18)
                out[o + 1] = 0x80 | ((cp >> 12) & 0x3F)
                out[o + 2] = 0x80 | ((cp >> 6) & 0x3F)
                out[o + 3] = 0x80 | (cp & 0x3F)
                o += 4


_clean_text = dev.clean_text


@numba.njit(parallel=True, cache=True)
def clean_texts(offsets, data, punct, remove_punct, collapse_ws, out, out_starts, new_lengths):
    """Punctuation removal / whitespace collapsing of every document; document k
    is written at ``out[out_starts[k]:]`` (room for its input length); compact after."""
    for k in prange(offsets.shape[0] - 1):
        new_lengths[k] = _clean_text(data, offsets[k], offsets[k + 1], punct, remove_punct, collapse_ws, out,
                                     out_starts[k])


guard_cache(globals(), __file__)
