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

import mmap
import os
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gpu_dedup.backends.arrow_arrays import null_mask
from gpu_dedup.backends.pages import small_pages
from gpu_dedup.backends.strings import StringBuffers
from gpu_dedup.backends.textnorm import (
    clean,
    normalize,
    normalize_counted,
    normalize_segments,
    raw_buffers,
    repair_utf8,
    threads_for,
)
from gpu_dedup.kernels.text_cpu import byte_tasks, gather_segments

__all__ = ["normalize", "normalize_counted", "normalize_segments", "repair_utf8", "clean", "raw_buffers",
           "BatchNormalizer"]


@dataclass
class Batch:
    """One batch of the read stage's text column, normalized (its bytes are in the
    :class:`BatchNormalizer`'s buffer, after the batches before it)."""

    length: np.ndarray  # bytes of each document normalized
    invalid: int  # documents with ill-formed UTF-8
    null: np.ndarray  # bool per row: the text is null
    lengths: pa.ChunkedArray | pa.Array | None  # ``lengths(column)`` of the original texts, when asked for
    seconds: float  # spent normalizing it


class BatchNormalizer:
    """The read stage's ``text`` hook (see :func:`gpu_dedup.stages.read.read`) of a run on the CPU:
    normalizes each batch's text column as it is read (the raw text is dropped then), noting the rows
    whose text is null and, with ``lengths``, a key of the original texts (the ``longest`` policy's
    lengths in code points).  :meth:`join` then gives every batch as one buffer set.

    Each batch is normalized into one scratch buffer, used again by every batch, and gathered (in
    parallel) from there to the end of one growing buffer that becomes the joined texts' bytes, so the
    normalized text is written to fresh memory once: with a buffer per batch, joined at the end, it was
    twice, and on Linux every fresh page is cleared by the kernel first (10^6 documents, 2 cores: the
    join took 0.5 to 1.9 s).  ``capacity``: the bytes that buffer starts with (the texts' size where it is
    known: pages never written cost nothing); past it, it grows by doubling, with a copy.

    ``spill_dir``: that buffer is a file there instead of memory, mapped (a shared mapping of a file
    removed at once, so nothing is left behind whatever ends the process): the kernel writes its pages
    to the disk and drops them when memory runs short, reading them back as they are used, so texts
    larger than the memory available do not end the run (the kernel's out-of-memory killer did, at
    10^7 documents and 16 GB of text on a 24 GB machine)."""

    def __init__(self, cfg, lengths=None, capacity: int = 0, spill_dir=None):
        self.cfg, self.key, self.spill_dir = cfg, lengths, spill_dir
        self._scratch = np.empty(0, np.uint8)
        self._data = self._buffer(max(0, int(capacity)))
        self._used = 0

    def _buffer(self, size: int) -> np.ndarray:
        """``size`` bytes for the normalized texts: memory, or a mapped file in ``spill_dir``.

        In memory, small pages (:func:`gpu_dedup.backends.pages.small_pages`): written once and read in
        order.  On a 2-core virtual machine that hands free memory back to its host, the read stage of 10^6
        documents (1.59 GB of text) took 2.7-2.9 s against 4.4-4.9 s with NumPy's huge pages."""
        if size == 0:
            return np.empty(0, np.uint8)
        if self.spill_dir is None:
            return small_pages(size)
        fd, path = tempfile.mkstemp(prefix=".gpu_dedup-texts.", suffix=".tmp", dir=self.spill_dir)
        try:
            os.unlink(path)  # the mapping keeps the file while it lives; nothing is left when it goes
            os.ftruncate(fd, size)
            return np.frombuffer(mmap.mmap(fd, size), np.uint8)
        finally:
            os.close(fd)

    @property
    def spilled(self) -> bool:
        """Whether the normalized texts are in a mapped file."""
        return self.spill_dir is not None

    def __call__(self, column: pa.ChunkedArray) -> Batch:
        t0 = time.perf_counter()
        with threads_for(column.nbytes):
            return self._add(column, t0)

    def _add(self, column: pa.ChunkedArray, t0: float) -> Batch:
        buffer, start, length, invalid = normalize_segments(column, self.cfg, scratch=self._scratch_of)
        total = int(length.sum())
        if self._used + total > self._data.shape[0]:  # past the capacity: grown, with a copy
            grown = self._buffer(max(self._used + total, 2 * self._data.shape[0]))
            grown[: self._used] = self._data[: self._used]
            self._data = grown
        dst = np.empty(length.shape[0], np.int64)
        if length.shape[0]:
            dst[0] = self._used
            np.cumsum(length[:-1], out=dst[1:])
            dst[1:] += self._used
        gather_segments(buffer, start, length, dst, self._data, byte_tasks(dst, dst + length, 64))
        self._used += total
        null = null_mask(column)
        lengths = self.key(column) if self.key is not None else None
        return Batch(length, invalid, null, lengths, time.perf_counter() - t0)

    def _scratch_of(self, n: int) -> np.ndarray:
        if self._scratch.shape[0] < n:
            self._scratch = np.empty(n, np.uint8)
        return self._scratch

    @staticmethod
    def null(parts: list) -> np.ndarray:
        """Whether each row's text is null, over every batch."""
        return np.concatenate([p.null for p in parts]) if parts else np.zeros(0, bool)

    @staticmethod
    def lengths(parts: list) -> pa.ChunkedArray:
        """The key of every batch's original texts, in order."""
        return pa.chunked_array([c for p in parts for c in pa.chunked_array(p.lengths).chunks])

    def join(self, parts: list) -> tuple:
        """(one StringBuffers of the normalized texts of ``parts``, every batch this normalized, in order;
        invalid documents; seconds spent normalizing).  ``parts`` is emptied, and the normalizer lets go of
        its buffers (the joined texts' bytes are a view of the one it filled)."""
        lengths = [p.length for p in parts]
        n = sum(x.shape[0] for x in lengths)
        offsets = np.empty(n + 1, np.int64)
        offsets[0] = 0
        if n:
            np.cumsum(np.concatenate(lengths), out=offsets[1:])
        if int(offsets[-1]) != self._used:  # pragma: no cover - guarded by tests
            raise RuntimeError(f"accounting error: {self._used} normalized bytes, the batches say {int(offsets[-1])}")
        invalid, seconds = sum(p.invalid for p in parts), sum(p.seconds for p in parts)
        parts.clear()
        data = self._data[: self._used]
        self._data, self._scratch, self._used = np.empty(0, np.uint8), np.empty(0, np.uint8), 0
        return StringBuffers(offsets, data), invalid, seconds
