"""CPU outer loops (Numba ``njit(parallel=True)``) around the scalar twins.

Strings arrive as Arrow buffers: ``offsets`` (int64, n + 1, absolute byte
positions into ``data``) and ``data`` (uint8).  ``docs`` selects which
documents to process; ``tasks`` splits ``docs`` into byte-balanced chunks that
``prange`` distributes over threads, so one long document does not hold a
whole thread's share of short ones.

The signature kernel exists once per shingle mode (``minhash_word``,
``minhash_char``): the mode is a constant inside, so the per-token loop has
no branch on it, and a run compiles (or loads) only the kernel it uses.

Signature loop (``minhash_word`` / ``minhash_char``, ``_signature_task``):
two documents are rolled in turn, one token each (``next_shingle``); the
32-bit key of each shingle goes to its document's small key buffer, and
every KEYS keys ``_sweep`` folds them into the running minima.
The sweep takes eight keys at a time and runs over the permutations, 32 at a
time: ``sig[j] = min(sig[j], a[j]*x0 + b[j], ..., a[j]*x7 + b[j])`` as
explicit 32-lane vector multiplies, adds and minimums (``_permute_lanes``),
with no horizontal reduction.

Arrays handed to the scalar twins are *borrowed* (``_borrow``: the same
view without its memory owner) inside the kernels: Numba reference-counts
array arguments of every call with atomic increments, which would otherwise
cost more than hashing a word.  Only the kernel's own arguments are borrowed:
they stay alive for the whole call.  A scratch array allocated inside the
kernel is passed as itself (one count per task): a borrowed view does not keep
its memory, which Numba frees after the array's last use, i.e. before the task
that writes into it would run wherever the allocation is not hoisted out of
the loop.
"""

import numba
import numpy as np
from .hash_scalar import SENTINEL
from .twin import compile_twins, guard_cache
from llvmlite import ir
from numba import prange, types
from numba.core import cgutils
from numba.cpython.unsafe.numbers import trailing_zeros
from numba.extending import intrinsic

# The rolling loop is compiled without reference counting (it allocates nothing) and the per-token
# functions are inlined into it at the Numba IR level: LLVM would leave next_word as a call per word, and an
# inlined array argument is otherwise reference-counted once per token.  The general path of a word
# (non-ASCII, long, last bytes of a document) stays one shared function: inlining it into every caller
# would only lengthen compilation.
_INLINE = numba.njit(cache=True, inline="always")


@numba.njit(cache=True, inline="always")
def _first_special_shift(f0, f1):
    """CPU twin of ``scalar.first_special_shift``: trailing-zero counts (one instruction each) instead
    of the multiply trick, which shortens the dependency chain from one word to the next."""
    t0 = trailing_zeros(f0)
    t1 = trailing_zeros(f1)
    return t0 - np.uint64(7) if t0 < np.uint64(64) else t1 + np.uint64(57)


_NO_REFCOUNT = numba.njit(cache=True, _nrt=False)
dev = compile_twins(numba.njit(cache=True), special={"next_word": _INLINE, "next_char": _INLINE, "next_shingle": _INLINE,
                                                     "word_general": _NO_REFCOUNT, "shingle_batch": _NO_REFCOUNT},
                    replace={"first_special_shift": _first_special_shift})

_shingle_batch = dev.shingle_batch
_next_shingle = dev.next_shingle
_perm_key = dev.perm_key
_permute = dev.permute
_band_hash = dev.band_hash
_exact_hash = dev.exact_hash
_intersection = dev.sorted_intersection

BATCH = 256  # shingle values rolled per call of shingle_batch (shingle-set kernels)


@intrinsic
def _borrow(typingctx, arr):
    """The same array without its memory owner: reference counting is a no-op on it."""

    def codegen(context, builder, sig, args):
        src = context.make_array(sig.args[0])(context, builder, value=args[0])
        out = context.make_array(sig.return_type)(context, builder)
        cgutils.copy_struct(out, src)
        out.meminfo = cgutils.get_null_value(out.meminfo.type)
        return out._getvalue()

    return arr(arr), codegen


LANES = 32  # permutations per explicit vector operation of the sweep (two AVX-512 or four AVX2 registers)
KEYS = 8  # keys folded per pass over the permutations


@intrinsic
def _permute_lanes(typingctx, a, b, sig, j, xs, i):
    """``sig[j:j+LANES] = min(sig[j:j+LANES], a[j:j+LANES] * x + b[j:j+LANES] for x in xs[i:i+KEYS])``
    (uint32, products mod 2**32) as explicit LANES-wide vector IR.

    LLVM's loop vectorizer stops at 256-bit registers on CPUs tuned to prefer them; an explicit
    vector type is lowered to the widest registers the CPU has (AVX-512 here, split on AVX2).  The
    arithmetic is ``scalar.permute``'s; tests compare the signatures with the oracle.
    """
    vec = ir.VectorType(ir.IntType(32), LANES)
    splat = ir.Constant(vec, [0] * LANES)

    def codegen(context, builder, signature, args):
        arr_a, arr_b, arr_sig, at, arr_xs, first = args

        def lanes(arrty, value):
            data = context.make_array(arrty)(context, builder, value=value).data
            return builder.bitcast(builder.gep(data, [at]), vec.as_pointer())

        pa, pb, ps = (lanes(t, v) for t, v in zip(signature.args[:3], (arr_a, arr_b, arr_sig)))
        va, vb, m = builder.load(pa, align=4), builder.load(pb, align=4), builder.load(ps, align=4)
        keys = context.make_array(signature.args[4])(context, builder, value=arr_xs).data
        for q in range(KEYS):
            x = builder.load(builder.gep(keys, [builder.add(first, ir.Constant(first.type, q))]))
            xv = builder.insert_element(ir.Constant(vec, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
            xv = builder.shuffle_vector(xv, ir.Constant(vec, ir.Undefined), splat)
            h = builder.add(builder.mul(va, xv), vb)
            m = builder.select(builder.icmp_unsigned("<", h, m), h, m)
        builder.store(m, ps, align=4)
        return context.get_dummy_value()

    return types.void(a, b, sig, j, xs, i), codegen


@numba.njit(cache=True, inline="always")
def _sweep(xs, k, a, b, sig):
    """sig[j] = min(sig[j], min_i permute(xs[i], a[j], b[j])) for i < k.

    ``xs`` has room for ``k`` rounded up to a multiple of KEYS: the last group is padded with copies
    of ``xs[0]`` (a repeated key changes no minimum), so every pass takes KEYS keys; ``a``, ``b``,
    ``sig`` are contiguous uint32.
    """
    num_perm = a.shape[0]
    vectors = num_perm - num_perm % LANES
    while k % KEYS != 0:
        xs[k] = xs[0]
        k += 1
    for i in range(0, k, KEYS):
        for j in range(0, vectors, LANES):
            _permute_lanes(a, b, sig, j, xs, i)
        for j in range(vectors, num_perm):
            aj = a[j]
            bj = b[j]
            m = sig[j]
            for q in range(i, i + KEYS):
                m = min(m, _permute(xs[q], aj, bj))
            sig[j] = m


@numba.njit(cache=True, _nrt=False)
def _signature_task(offsets, text, docs, lo, hi, word_mode, n, base, base_n1, word_base, word_base2, a, b,
                    rings, keys, sigs, out, counts):
    """Signatures of ``docs[lo:hi]``, two documents at a time.

    Finding where a word ends is a chain of dependent operations from one word to the next; two
    documents (lanes A and B) advanced in turn give the CPU two independent chains to overlap.  Each
    lane has its ring (``rings[i]``), key buffer (``keys[i]``) and minima (``sigs[i]``); a lane that
    finishes its document takes the next one.  A lane folds its keys into its minima every KEYS keys:
    the vector multiplies of the sweep then run beside the scalar tokenizing of the next words (the
    core executes both at once) instead of in separate bursts.  Arrays are borrowed (no reference
    counting).
    """
    num_perm = a.shape[0]
    ring_a, ring_b, keys_a, keys_b, sig_a, sig_b = rings[0], rings[1], keys[0], keys[1], sigs[0], sigs[1]
    nxt = lo
    # lane A
    live_a = nxt < hi
    doc_a = nxt
    nxt += 1
    pos_a = offsets[docs[doc_a]] if live_a else 0
    end_a = offsets[docs[doc_a] + 1] if live_a else 0
    h_a = np.uint64(0)
    count_a = 0
    tail_a = 0
    fill_a = 0
    total_a = 0
    sig_a[:] = SENTINEL
    # lane B
    live_b = nxt < hi
    doc_b = nxt
    nxt += 1
    pos_b = offsets[docs[doc_b]] if live_b else 0
    end_b = offsets[docs[doc_b] + 1] if live_b else 0
    h_b = np.uint64(0)
    count_b = 0
    tail_b = 0
    fill_b = 0
    total_b = 0
    sig_b[:] = SENTINEL
    while live_a or live_b:
        if live_a:
            pos_a, h_a, count_a, tail_a, emit, done = _next_shingle(
                text, end_a, word_mode, n, base, base_n1, word_base, word_base2, pos_a, h_a, count_a, tail_a, ring_a)
            keys_a[fill_a] = _perm_key(h_a)  # kept only when emitted: no branch per token
            fill_a += emit
            if fill_a == KEYS or done:
                _sweep(keys_a, fill_a, a, b, sig_a)
                total_a += fill_a
                fill_a = 0
            if done:
                for j in range(num_perm):
                    out[doc_a, j] = sig_a[j]
                counts[doc_a] = total_a
                live_a = nxt < hi
                if live_a:
                    doc_a = nxt
                    nxt += 1
                    pos_a = offsets[docs[doc_a]]
                    end_a = offsets[docs[doc_a] + 1]
                    h_a = np.uint64(0)
                    count_a = 0
                    tail_a = 0
                    total_a = 0
                    sig_a[:] = SENTINEL
        if live_b:
            pos_b, h_b, count_b, tail_b, emit, done = _next_shingle(
                text, end_b, word_mode, n, base, base_n1, word_base, word_base2, pos_b, h_b, count_b, tail_b, ring_b)
            keys_b[fill_b] = _perm_key(h_b)  # kept only when emitted: no branch per token
            fill_b += emit
            if fill_b == KEYS or done:
                _sweep(keys_b, fill_b, a, b, sig_b)
                total_b += fill_b
                fill_b = 0
            if done:
                for j in range(num_perm):
                    out[doc_b, j] = sig_b[j]
                counts[doc_b] = total_b
                live_b = nxt < hi
                if live_b:
                    doc_b = nxt
                    nxt += 1
                    pos_b = offsets[docs[doc_b]]
                    end_b = offsets[docs[doc_b] + 1]
                    h_b = np.uint64(0)
                    count_b = 0
                    tail_b = 0
                    total_b = 0
                    sig_b[:] = SENTINEL


@numba.njit(parallel=True, cache=True)
def minhash_word(offsets, data, docs, tasks, n, base, base_n1, word_base, word_base2, a, b, out, counts):
    """MinHash signatures (uint32) of ``docs`` into ``out[k, :]`` from word n-grams; shingle counts into ``counts``.

    (One kernel per mode: the mode is a constant in it, and a run compiles only the kernel it uses.)
    """
    num_perm = a.shape[0]
    text, mul, add, rows, shingles = _borrow(data), _borrow(a), _borrow(b), _borrow(out), _borrow(counts)
    for t in prange(tasks.shape[0] - 1):
        rings = np.empty((2, max(n, 1)), np.uint64)
        keys = np.empty((2, 2 * KEYS), np.uint32)
        sigs = np.empty((2, num_perm), np.uint32)
        _signature_task(offsets, text, docs, tasks[t], tasks[t + 1], True, n, base, base_n1, word_base, word_base2,
                        mul, add, rings, keys, sigs, rows, shingles)


@numba.njit(parallel=True, cache=True)
def minhash_char(offsets, data, docs, tasks, n, base, base_n1, word_base, word_base2, a, b, out, counts):
    """:func:`minhash_word` for character n-grams."""
    num_perm = a.shape[0]
    text, mul, add, rows, shingles = _borrow(data), _borrow(a), _borrow(b), _borrow(out), _borrow(counts)
    for t in prange(tasks.shape[0] - 1):
        rings = np.empty((2, max(n, 1)), np.uint64)
        keys = np.empty((2, 2 * KEYS), np.uint32)
        sigs = np.empty((2, num_perm), np.uint32)
        _signature_task(offsets, text, docs, tasks[t], tasks[t + 1], False, n, base, base_n1, word_base, word_base2,
                        mul, add, rings, keys, sigs, rows, shingles)


SMALL_RUN = 24  # a document with at most this many values is sorted by insertion alone
LARGE_BUCKET = 64  # a bucket with more values than this (values far from uniform) is sorted by Numba's sort
BUCKET_BITS = 16  # at most 2**BUCKET_BITS buckets per document


@numba.njit(cache=True, inline="always")
def _insertion_sort(x, lo, hi):
    """Sort ``x[lo:hi]`` in place by insertion (equal values stop the shift: runs of repeats cost one step each)."""
    for i in range(lo + 1, hi):
        v = x[i]
        j = i - 1
        while j >= lo and x[j] > v:
            x[j + 1] = x[j]
            j -= 1
        x[j + 1] = v


@numba.njit(cache=True)
def _sort_unique(values, lo, hi, tmp, starts):
    """Sort ``values[lo:hi]`` and move its distinct values to the front; returns their number.

    Shingle values are uniform 64-bit numbers (mixed tokens, rule 2), so one counting pass on their top bits
    (about two values per bucket) leaves buckets that insertion sorts in a step or two per value; a bucket
    holding more than LARGE_BUCKET values is sorted by Numba's sort instead, so skewed input stays
    O(m log m).  ``tmp`` holds at least ``hi - lo`` values, ``starts`` at least ``2**BUCKET_BITS + 1``.
    The set of distinct values is the same whatever the order of sorting: the output is the sorted set.
    """
    m = hi - lo
    if m <= SMALL_RUN:
        _insertion_sort(values, lo, hi)
        u = 0
        for i in range(lo, hi):
            if u == 0 or values[i] != values[lo + u - 1]:
                values[lo + u] = values[i]
                u += 1
        return u
    bits = 1
    while (1 << bits) < (m >> 1) and bits < BUCKET_BITS:
        bits += 1
    shift = np.uint64(64 - bits)
    nb = 1 << bits
    for b in range(nb + 1):
        starts[b] = 0
    for i in range(lo, hi):
        starts[np.int64(values[i] >> shift) + 1] += 1
    for b in range(nb):
        starts[b + 1] += starts[b]
    for i in range(lo, hi):  # scatter; starts[b] ends at the end of bucket b
        v = values[i]
        b = np.int64(v >> shift)
        tmp[starts[b]] = v
        starts[b] += 1
    first = 0
    for b in range(nb):
        last = starts[b]
        if last - first > LARGE_BUCKET:
            tmp[first:last].sort()
        else:
            _insertion_sort(tmp, first, last)
        first = last
    u = 0
    for i in range(m):
        v = tmp[i]
        if u == 0 or v != values[lo + u - 1]:
            values[lo + u] = v
            u += 1
    return u


@numba.njit(cache=True)
def _longest(set_offsets, lo, hi):
    """The longest of segments ``lo .. hi - 1``."""
    m = 0
    for k in range(lo, hi):
        m = max(m, set_offsets[k + 1] - set_offsets[k])
    return m


@numba.njit(cache=True)
def _sets_task(offsets, text, docs, lo, hi, word_mode, n, base, base_n1, word_base, word_base2, ring, buf, tmp,
               starts, at, values, counts):
    """Sorted distinct shingle values of ``docs[lo:hi]``, one document after another from ``values[at]`` on:
    each document's values (with repeats) are rolled in after the previous document's distinct ones, then
    sorted and deduplicated in place (``_sort_unique``); ``counts[k]`` = how many stay.  Returns the values
    the task wrote."""
    first = at
    for k in range(lo, hi):
        d = docs[k]
        end = offsets[d + 1]
        pos = offsets[d]
        h = np.uint64(0)
        count = np.int64(0)  # not the literal 0: one specialization of shingle_batch, not two
        tail = np.int64(0)
        start = at
        done = False
        while not done:
            pos, h, count, tail, filled, done = _shingle_batch(
                text, end, word_mode, n, base, base_n1, word_base, word_base2, pos, h, count, tail, ring, buf, BATCH)
            for i in range(filled):
                values[at + i] = buf[i]
            at += filled
        u = _sort_unique(values, start, at, tmp, starts)
        counts[k] = u
        at = start + u
    return at - first


def shingle_room(lengths, word_mode):
    """At least the number of shingle values (with repeats) of documents of ``lengths`` bytes: a code point
    takes one byte or more, so a document has at most ``length`` tokens, and two words at least one byte of
    space between them, so at most ``(length + 1) // 2`` words; a document has no more shingles than
    tokens (rule 3)."""
    return (lengths + 1) // 2 if word_mode else lengths.copy()


@numba.njit(parallel=True, cache=True)
def shingle_values_word(offsets, data, docs, tasks, n, base, base_n1, word_base, word_base2, room, values, counts,
                        written):
    """Word n-gram sets of the selected documents in one pass: task ``t`` writes the sorted distinct values
    of its documents one after another from ``values[room[tasks[t]]]`` (``room``: prefix sums of
    :func:`shingle_room`), ``counts[k]`` = document ``k``'s, ``written[t]`` = the task's.  (One kernel per
    mode, as ``minhash_word``.)"""
    text, vals = _borrow(data), _borrow(values)
    for t in prange(tasks.shape[0] - 1):
        lo, hi = tasks[t], tasks[t + 1]
        ring = np.empty(max(n, 1), np.uint64)
        buf = np.empty(BATCH, np.uint64)
        tmp = np.empty(_longest(room, lo, hi), np.uint64)
        starts = np.empty((1 << BUCKET_BITS) + 1, np.int64)
        written[t] = _sets_task(offsets, text, docs, lo, hi, True, n, base, base_n1, word_base, word_base2, ring, buf,
                                tmp, starts, room[lo], vals, counts)


@numba.njit(parallel=True, cache=True)
def shingle_values_char(offsets, data, docs, tasks, n, base, base_n1, word_base, word_base2, room, values, counts,
                        written):
    """:func:`shingle_values_word` for character n-grams."""
    text, vals = _borrow(data), _borrow(values)
    for t in prange(tasks.shape[0] - 1):
        lo, hi = tasks[t], tasks[t + 1]
        ring = np.empty(max(n, 1), np.uint64)
        buf = np.empty(BATCH, np.uint64)
        tmp = np.empty(_longest(room, lo, hi), np.uint64)
        starts = np.empty((1 << BUCKET_BITS) + 1, np.int64)
        written[t] = _sets_task(offsets, text, docs, lo, hi, False, n, base, base_n1, word_base, word_base2, ring, buf,
                                tmp, starts, room[lo], vals, counts)


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
def exact_hashes(offsets, data, seed1, seed2, out):
    """out[k] = exact_hash of document k's bytes (two 64-bit lanes)."""
    text = _borrow(data)
    for k in prange(offsets.shape[0] - 1):
        h1, h2 = _exact_hash(text, offsets[k], offsets[k + 1], seed1, seed2)
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


guard_cache(globals(), __file__)
