"""Normalize text before hashing: Unicode form, case, punctuation, whitespace.

The definition (``kernels/text_scalar.py``): ill-formed UTF-8 becomes U+FFFD per
maximal subpart, then utf8proc's Unicode form (``pyarrow.compute.utf8_normalize``)
and lowercase (``utf8_lower``), then punctuation removal (category P, the
pinned table of ``kernels/unicode_tables.py``) and whitespace collapsing (the
code points of ``str.isspace``).

One kernel (``kernels.text_scalar.normalize_text``, the same source compiled for the
CPU by ``kernels/text_cpu.py`` and for CUDA in ``kernels/hash_cuda.py``) does all of
it in one pass for every document whose code points are all *stable* under the
configured form (ASCII and most real text; see ``tools/gen_unicode_props.py``).
Only the other documents take the slow path: repaired, sent through utf8proc,
then through the same kernel with the Unicode steps off.  The written shards
keep the original bytes.  The host code lives in ``gpu_dedup.backends.textnorm``
(the GPU backend's ``normalize`` falls back on it); this module is the stage's
public face.

A run normalizes its text batch by batch as the read stage reads it (:class:`BatchNormalizer`), so
the raw text of a batch is dropped as soon as it is normalized; the batches are then joined into
one buffer set for the kernels.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gpu_dedup.backends.strings import StringBuffers
from gpu_dedup.backends.textnorm import (
    clean,
    normalize,
    normalize_counted,
    normalize_segments,
    raw_buffers,
    repair_utf8,
)
from gpu_dedup.kernels.text_cpu import byte_tasks, gather_segments

__all__ = ["normalize", "normalize_counted", "normalize_segments", "repair_utf8", "clean", "raw_buffers",
           "BatchNormalizer"]


@dataclass
class Batch:
    """One batch of the read stage's text column, normalized: document k is
    ``buffer[start[k]:start[k] + length[k]]`` (see :func:`normalize_segments`)."""

    buffer: np.ndarray
    start: np.ndarray
    length: np.ndarray
    invalid: int  # documents with ill-formed UTF-8
    null: np.ndarray  # bool per row: the text is null
    lengths: pa.ChunkedArray | pa.Array | None  # ``lengths(column)`` of the original texts, when asked for
    seconds: float  # spent normalizing it


class BatchNormalizer:
    """The read stage's ``text`` hook (see :func:`gpu_dedup.stages.read.read`) of a run on the CPU:
    normalizes each batch's text column as it is read (the raw text is dropped then), noting the rows
    whose text is null and, with ``lengths``, a key of the original texts (the ``longest`` policy's
    lengths in code points).  :meth:`join` then packs every batch into one buffer set."""

    def __init__(self, cfg, lengths=None):
        self.cfg, self.key = cfg, lengths

    def __call__(self, column: pa.ChunkedArray) -> Batch:
        t0 = time.perf_counter()
        buffer, start, length, invalid = normalize_segments(column, self.cfg)
        null = np.asarray(column.is_null(), dtype=bool)
        lengths = self.key(column) if self.key is not None else None
        return Batch(buffer, start, length, invalid, null, lengths, time.perf_counter() - t0)

    @staticmethod
    def null(parts: list) -> np.ndarray:
        """Whether each row's text is null, over every batch."""
        return np.concatenate([p.null for p in parts]) if parts else np.zeros(0, bool)

    @staticmethod
    def lengths(parts: list) -> pa.ChunkedArray:
        """The key of every batch's original texts, in order."""
        return pa.chunked_array([c for p in parts for c in pa.chunked_array(p.lengths).chunks])

    @staticmethod
    def join(parts: list) -> tuple:
        """(one StringBuffers of every batch's normalized texts, in order; invalid documents; seconds spent
        normalizing).  Each batch is gathered (in parallel) into the joined buffer and dropped from
        ``parts``, so the memory this takes is the normalized text plus one batch (the joined buffer's
        pages are touched only as they are filled)."""
        n = sum(p.length.shape[0] for p in parts)
        offsets = np.empty(n + 1, np.int64)
        offsets[0] = 0
        data = np.empty(sum(int(p.length.sum()) for p in parts), np.uint8)
        invalid, seconds, row = 0, 0.0, 0
        while parts:  # one step per batch
            p = parts.pop(0)
            m = p.length.shape[0]
            np.cumsum(p.length, out=offsets[row + 1:row + m + 1])
            offsets[row + 1:row + m + 1] += offsets[row]
            dst = offsets[row:row + m]
            gather_segments(p.buffer, p.start, p.length, dst, data, byte_tasks(dst, dst + p.length, 64))
            invalid, seconds, row = invalid + p.invalid, seconds + p.seconds, row + m
            del p
        return StringBuffers(offsets, data), invalid, seconds
