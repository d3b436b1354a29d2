"""Normalize text before hashing: Unicode form, case, punctuation, whitespace.

Whole-array work only: the Unicode form and lowercasing are Arrow compute
kernels (utf8proc); punctuation removal (general category P, from the pinned
table in ``kernels/unicode_tables.py``) and whitespace collapsing (the code
points of ``str.isspace``) are one Numba pass (``kernels.scalar.clean_text``).
Ill-formed UTF-8 is first repaired (each maximal ill-formed subpart becomes
U+FFFD, the rule the shingle decoder applies), so every later stage sees
valid text; the written shards keep the original bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import NormalizeConfig
from .strings import as_arrow_strings, string_buffers



def punctuation_table() -> np.ndarray:
    """uint8[0x110000]: 1 for Unicode punctuation (category P*)."""
    global _PUNCT
    if _PUNCT is None:
        from gpu_dedup.kernels.unicode_tables import PUNCTUATION_RANGES

        table = np.zeros(0x110000, np.uint8)
        for lo, hi in PUNCTUATION_RANGES:  # ~190 ranges, once per process
            table[lo : hi + 1] = 1
        _PUNCT = table
    return _PUNCT


_PUNCT = None


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
        arr = pa.array([None] * len(arr), pa.large_string())
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
    from gpu_dedup.kernels import cpu as kernels

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


def _unicode_steps(arr: pa.Array, cfg: NormalizeConfig) -> pa.Array:
    if cfg.unicode != "none":
        arr = pc.utf8_normalize(arr, form=cfg.unicode)
    if cfg.lowercase:
        arr = pc.utf8_lower(arr)
    return arr


def normalize(texts, cfg: NormalizeConfig = NormalizeConfig()) -> pa.Array:
    """Normalized copy of ``texts`` as a large_string array; nulls become empty strings."""
    arr, _ = repair_utf8(texts)
    arr = arr.fill_null("")
    if cfg.unicode != "none" or cfg.lowercase:
        # Arrow's string kernels run on one thread and release the GIL: one slice per core
        import numba
        from concurrent.futures import ThreadPoolExecutor

        parts = max(1, min(numba.get_num_threads(), len(arr) // 10_000))
        bounds = np.linspace(0, len(arr), parts + 1).astype(np.int64)
        slices = [arr.slice(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:])]
        with ThreadPoolExecutor(parts) as pool:
            done = list(pool.map(lambda a: _unicode_steps(a, cfg), slices))
        arr = pa.chunked_array([c for d in done for c in _chunks(d)], pa.large_string())
    if cfg.punctuation or cfg.whitespace:
        return clean(arr, cfg.punctuation, cfg.whitespace)  # writes one contiguous result
    return arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr


def _chunks(arr):
    return arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]


def clean(texts, punctuation: bool = True, whitespace: bool = True) -> pa.Array:
    """Remove punctuation and/or collapse whitespace runs to one space (trimmed).

    Reads the chunks of a ChunkedArray in place; the result is one contiguous array.
    """
    from gpu_dedup.kernels import cpu as kernels

    chunks = texts.chunks if isinstance(texts, pa.ChunkedArray) else [texts]
    parts = [string_buffers(c) for c in chunks]
    n = sum(len(b) for b in parts)
    out = np.empty(sum(b.nbytes for b in parts), np.uint8)
    starts = np.empty(n, np.int64)
    lengths = np.empty(n, np.int64)
    k = base = 0
    for b in parts:  # one kernel call per Arrow chunk (per shard), not per document
        m = len(b)
        starts[k : k + m] = b.offsets[:-1] - b.offsets[0] + base
        kernels.clean_texts(b.offsets, b.data, punctuation_table(), punctuation, whitespace, out,
                            starts[k : k + m], lengths[k : k + m])
        k, base = k + m, base + b.nbytes
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    kernels.compact_in_place(out, starts, lengths, offsets)  # no second text-sized buffer to fault in
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(out[: int(offsets[-1])]))
