"""Host implementation of text normalization (the CPU path and the GPU path's fallback).

See ``gpu_dedup.stages.normalize`` for the definition and ``kernels/text_scalar.py``
for the one-pass kernel.  This module sits in the backends layer so that the
GPU backend can send its unstable documents through the very same host code.
"""

from __future__ import annotations

import functools
import logging
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array, numpy_array, string_array
from gpu_dedup.backends.strings import as_arrow_strings, string_buffers
from gpu_dedup.config import NormalizeConfig
from gpu_dedup.kernels import text_scalar as tk
from gpu_dedup.kernels import text_cpu

log = logging.getLogger(__name__)


def repair_utf8(texts) -> tuple[pa.Array, int]:
    """Return (valid large_string array, number of documents that had ill-formed UTF-8)."""
    if isinstance(texts, pa.ChunkedArray) and texts.num_chunks > 1:
        try:  # the common case, valid text: no need to combine the chunks
            for chunk in texts.chunks:
                if pa.types.is_binary(chunk.type) or pa.types.is_large_binary(chunk.type):
                    raise pa.ArrowInvalid("binary")
                chunk.validate(full=True)
            return pc.cast(texts, pa.large_string()), 0
        except pa.ArrowInvalid:
            pass
    arr = as_arrow_strings(texts)
    if pa.types.is_null(arr.type):
        arr = pa.nulls(len(arr), pa.large_string())
    if pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type):
        try:
            arr.validate(full=True)
            return pc.cast(arr, pa.large_string()), 0
        except pa.ArrowInvalid:
            pass
    else:
        try:
            return pc.cast(arr, pa.large_string()), 0
        except pa.ArrowInvalid:
            pass
    from gpu_dedup.kernels import hash_cpu as kernels

    validity = arr.is_valid()
    buffers = string_buffers(arr)
    n = len(buffers)
    new_lengths = np.empty(n, np.int64)
    had_errors = np.empty(n, np.bool_)
    kernels.utf8_repair_plan(buffers.offsets, buffers.data, new_lengths, had_errors)
    new_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(new_lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), np.uint8)
    kernels.utf8_repair_fill(buffers.offsets, buffers.data, new_offsets, out)
    repaired = pa.LargeStringArray.from_buffers(n, pa.py_buffer(new_offsets), pa.py_buffer(out))
    repaired = pc.if_else(validity, repaired, pa.scalar(None, pa.large_string()))
    return repaired, int(had_errors.sum())


def raw_buffers(arr: pa.Array):
    """(data uint8, doc_start int64, doc_end int64) of an Arrow string/binary array, zero-copy
    for the bytes; a null reads as empty (its end is moved to its start)."""
    n = len(arr)
    if pa.types.is_null(arr.type) or n == 0:
        return np.zeros(0, np.uint8), np.zeros(n, np.int64), np.zeros(n, np.int64)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    valid_buf, off_buf, data_buf = arr.buffers()
    offsets = np.frombuffer(off_buf, np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    starts, ends = offsets[:-1], offsets[1:].copy()
    if arr.null_count:
        valid = numpy_array(arr.is_valid())
        ends[~valid] = starts[~valid]
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return data, starts, ends


def _chunks(texts) -> list[pa.Array]:
    if isinstance(texts, pa.ChunkedArray):
        return list(texts.chunks) or [empty_array(pa.large_string())]
    if isinstance(texts, pa.Array) and pa.types.is_null(texts.type):
        return [texts]
    return [as_arrow_strings(texts)]


def _threads() -> int:
    return max(1, numba.get_num_threads())


SMALL_BATCH = 1 << 17  # bytes of text below which a batch's kernels run on the calling thread alone


@contextmanager
def threads_for(nbytes: int):
    """Numba's threads for the kernels of a batch of ``nbytes`` of text: the calling thread alone below
    SMALL_BATCH (a few microseconds of work), else all.  A parallel kernel wakes every thread of Numba's
    pool and waits for the last; beside the read stage's busy reader threads that took about a millisecond a
    call, so a corpus of thousands of one-document shards spent most of its read stage starting kernels.
    ``numba.set_num_threads`` holds for the calling thread only."""
    threads = numba.get_num_threads()
    if nbytes >= SMALL_BATCH or threads == 1:
        yield
        return
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(threads)


def _kernel(data, starts, ends, form, lowercase, punctuation, whitespace, out, out_start, lengths, status):
    need = tk.need_mask(form, lowercase)
    stage1, stage2 = tk.property_table(form)
    tasks = text_cpu.byte_tasks(starts, ends, 8 * _threads())
    text_cpu.normalize_texts(data, starts, ends, tasks, stage1, stage2,
                             tk.ascii_actions(lowercase, punctuation, whitespace), need, lowercase, punctuation, whitespace,
                             out, out_start, lengths, status)


COMPOSING = {"NFC": "NFD", "NFKC": "NFKD"}  # a composing form -> the decomposition it composes


@functools.cache
def pyarrow_composes() -> bool:
    """Whether ``pc.utf8_normalize`` composes for NFC and NFKC.  Up to pyarrow 25 it returns the
    decomposed text for every form (apache/arrow#51225, fixed in pyarrow 26)."""
    return pc.utf8_normalize(string_array(["A\u0300"], [0]), form="NFC").to_pylist() == ["\u00c0"]


@functools.cache
def _unicodedata():
    """unicodedata2 where installed (Unicode 17, the kernel tables' version), else the standard library's."""
    try:
        import unicodedata2 as ud
    except ImportError:
        import unicodedata as ud
    log.warning("pyarrow %s's utf8_normalize does not compose NFC/NFKC (fixed in pyarrow 26): the documents the "
                "normalization kernel hands back are decomposed by pyarrow, then composed by Python's unicodedata "
                "(Unicode %s) one by one; pip install 'pyarrow>=26' for the faster path", pa.__version__,
                ud.unidata_version)
    return ud


def _normal_form(arr: pa.Array, form: str) -> pa.Array:
    if form not in COMPOSING or pyarrow_composes():
        return pc.utf8_normalize(arr, form=form)
    # pyarrow decomposes right (NFD, NFKD); composing that decomposition canonically gives the composing form
    decomposed = pc.utf8_normalize(arr, form=COMPOSING[form])
    compose = _unicodedata().normalize
    return pa.array([None if s is None else compose("NFC", s) for s in decomposed.to_pylist()], arr.type)


def _unicode_steps(arr: pa.Array, cfg: NormalizeConfig) -> pa.Array:
    if cfg.unicode != "none":
        arr = _normal_form(arr, cfg.unicode)
    if cfg.lowercase:
        arr = pc.utf8_lower(arr)
    return arr


def _utf8proc(arr: pa.Array, cfg: NormalizeConfig) -> pa.Array:
    """utf8proc's form and lowercase; Arrow's kernels run on one thread and release the GIL: one slice per core."""
    parts = max(1, min(_threads(), len(arr) // 1000))
    if parts == 1:
        return _unicode_steps(arr, cfg)
    bounds = np.linspace(0, len(arr), parts + 1).astype(np.int64)
    slices = [arr.slice(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
    with ThreadPoolExecutor(parts) as pool:
        done = list(pool.map(lambda a: _unicode_steps(a, cfg), slices))
    return pa.concat_arrays(done)


def _gather(data, starts, lengths) -> tuple[np.ndarray, np.ndarray]:
    """Copy segments data[starts[k]:starts[k] + lengths[k]] into one buffer; returns (bytes, offsets)."""
    offsets = np.zeros(lengths.shape[0] + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    out = np.empty(int(offsets[-1]), np.uint8)
    text_cpu.gather_segments(data, starts, lengths, offsets[:-1], out,
                             text_cpu.byte_tasks(starts, starts + lengths, 4 * _threads()))
    return out, offsets


def slow_path(segments: np.ndarray, offsets: np.ndarray, cfg: NormalizeConfig):
    """Normalize the documents the kernel handed back (their raw bytes as CSR): repair, kernel
    again (a repaired document may be stable), utf8proc for what is still unstable, then the
    kernel with the Unicode steps off.  Returns (bytes, offsets, documents with ill-formed UTF-8)."""
    m = offsets.shape[0] - 1
    raw = pa.Array.from_buffers(pa.large_binary(), m, [None, pa.py_buffer(offsets), pa.py_buffer(segments)])
    repaired, invalid = repair_utf8(raw)
    data, starts, ends = raw_buffers(repaired)
    out = np.empty(data.shape[0], np.uint8)
    lengths = np.empty(m, np.int64)
    status = np.empty(m, np.int64)
    _kernel(data, starts, ends, cfg.unicode, cfg.lowercase, cfg.punctuation, cfg.whitespace, out, starts, lengths, status)
    left = np.flatnonzero(status & (tk.UNSTABLE | tk.OVERFLOW))
    if left.shape[0]:
        steps = _utf8proc(repaired.take(arrow_array(left)), cfg)
        d2, s2, e2 = raw_buffers(steps)
        out2 = np.empty(d2.shape[0], np.uint8)
        l2 = np.empty(left.shape[0], np.int64)
        st2 = np.empty(left.shape[0], np.int64)
        _kernel(d2, s2, e2, "none", False, cfg.punctuation, cfg.whitespace, out2, s2, l2, st2)
        assert not (st2 & (tk.UNSTABLE | tk.OVERFLOW)).any()
        b2, o2 = _gather(out2, s2, l2)
        lengths[left] = l2
        src = starts.copy()
        src[left] = data.shape[0] + o2[:-1]  # left documents read from b2, appended after out
        merged = np.concatenate((out, b2))
        return (*_gather(merged, src, lengths), invalid)
    return (*_gather(out, starts, lengths), invalid)


def normalize_counted(texts, cfg: NormalizeConfig = NormalizeConfig()) -> tuple[pa.LargeStringArray, int]:
    """(normalized texts as one large_string array, documents that had ill-formed UTF-8).

    Nulls become empty strings.  Accepts Arrow (chunked) string or binary arrays,
    pandas Series, NumPy arrays and lists of str.
    """
    out, out_start, lengths, invalid = normalize_segments(texts, cfg)
    n = lengths.shape[0]
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    text_cpu.compact_left(out, out_start, lengths, offsets)  # in place: no second text-sized buffer
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out[: int(offsets[-1])])), invalid


def normalize_segments(texts, cfg: NormalizeConfig = NormalizeConfig(), scratch=None):
    """(buffer, start, length, invalid): document k normalized is ``buffer[start[k]:start[k] + length[k]]``,
    in order, not yet packed together (:func:`normalize_counted` packs them in place; a caller copying
    them elsewhere anyway gathers them in parallel instead); ``invalid``: documents that had
    ill-formed UTF-8.  ``scratch(n)``: a byte buffer of at least ``n`` bytes to write into (then ``buffer``
    is usually it; ``n``: the texts' bytes), instead of a new one."""
    chunks = _chunks(texts)
    parts = [raw_buffers(c) for c in chunks]
    n = sum(p[1].shape[0] for p in parts)
    room = sum(int(p[2][-1] - p[1][0]) if p[1].shape[0] else 0 for p in parts)
    out = np.empty(room, np.uint8) if scratch is None else scratch(room)
    out_start = np.empty(n, np.int64)
    lengths = np.empty(n, np.int64)
    status = np.empty(n, np.int64)
    k = base = 0
    for data, starts, ends in parts:  # one kernel call per Arrow chunk, not per document
        m = starts.shape[0]
        if m == 0:
            continue
        _kernel(data, starts, ends, cfg.unicode, cfg.lowercase, cfg.punctuation, cfg.whitespace, out[base:],
                starts - starts[0], lengths[k : k + m], status[k : k + m])
        out_start[k : k + m] = starts - starts[0] + base
        k, base = k + m, base + int(ends[-1] - starts[0])
    slow = np.flatnonzero(status & (tk.UNSTABLE | tk.OVERFLOW))
    invalid = int(np.count_nonzero(status == tk.INVALID))
    if slow.shape[0]:
        # the documents' original bytes, chunk by chunk
        bounds = np.cumsum([0] + [p[1].shape[0] for p in parts])
        pieces, piece_offsets = [], []
        for c, (data, starts, ends) in enumerate(parts):
            sel = slow[(slow >= bounds[c]) & (slow < bounds[c + 1])] - bounds[c]
            if sel.shape[0]:
                b, o = _gather(data, starts[sel], ends[sel] - starts[sel])
                pieces.append(b)
                piece_offsets.append(o)
        seg_lengths = np.concatenate([np.diff(o) for o in piece_offsets])
        seg_offsets = np.zeros(slow.shape[0] + 1, np.int64)
        np.cumsum(seg_lengths, out=seg_offsets[1:])
        fb, fb_offsets, bad = slow_path(np.concatenate(pieces), seg_offsets, cfg)
        invalid += bad
        fb_lengths = np.diff(fb_offsets)
        lengths[slow] = fb_lengths
        if (fb_lengths <= seg_lengths).all():  # the usual case: every result fits in its document's room
            text_cpu.gather_segments(fb, fb_offsets[:-1], fb_lengths, out_start[slow], out,
                                     text_cpu.byte_tasks(fb_offsets[:-1], fb_offsets[1:], 4 * _threads()))
        else:
            src = out_start.copy()
            src[slow] = room + fb_offsets[:-1]
            merged, offsets = _gather(np.concatenate((out, fb)), src, lengths)
            return merged, offsets[:-1], lengths, invalid
    return out, out_start, lengths, invalid


def normalize(texts, cfg: NormalizeConfig = NormalizeConfig()) -> pa.LargeStringArray:
    """Normalized copy of ``texts`` as a large_string array; nulls become empty strings."""
    return normalize_counted(texts, cfg)[0]


def clean(texts, punctuation: bool = True, whitespace: bool = True) -> pa.LargeStringArray:
    """Remove punctuation and/or collapse whitespace runs to one space (trimmed); no Unicode steps."""
    return normalize(texts, NormalizeConfig("none", False, punctuation, whitespace))
