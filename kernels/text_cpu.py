"""CPU outer loops (Numba ``njit(parallel=True)``) around :mod:`.text_scalar`.

Documents are ``data[doc_start[k]:doc_end[k]]``; ``tasks`` splits the
documents into byte-balanced runs that ``prange`` hands to threads.
"""

import numba
import numpy as np
from . import text_scalar as text
from .twin import compile_twins, guard_cache
from numba import prange

dev = compile_twins(numba.njit(cache=True), module=text)
_normalize_text = dev.normalize_text


@numba.njit(parallel=True, cache=True, nogil=True)
def normalize_texts(data, doc_start, doc_end, tasks, stage1, stage2, ascii_action, need, lowercase, remove_punct, collapse_ws,
                    out, out_start, lengths, status):
    """Normalize every document k into ``out[out_start[k]:]`` (room: its input length);
    ``lengths[k]`` bytes written, ``status[k]`` as :func:`.text.normalize_text` returns it."""
    for t in prange(tasks.shape[0] - 1):
        for k in range(tasks[t], tasks[t + 1]):
            n, s = _normalize_text(data, doc_start[k], doc_end[k], stage1, stage2, ascii_action, need, lowercase, remove_punct,
                                   collapse_ws, out, out_start[k])
            lengths[k] = n
            status[k] = s


@numba.njit(cache=True)
def compact_left(values, src, lengths, dst):
    """Move segment k from ``src[k]`` down to ``dst[k] <= src[k]``, in order (a segment may
    land where an earlier one was read, so this is serial; forward copies are overlap-safe)."""
    for k in range(lengths.shape[0]):
        s = src[k]
        d = dst[k]
        if d != s:
            for i in range(lengths[k]):
                values[d + i] = values[s + i]


@numba.njit(parallel=True, cache=True, nogil=True)
def gather_segments(src_values, src, lengths, dst, dst_values, tasks):
    """dst_values[dst[k]:dst[k] + lengths[k]] = src_values[src[k]:...] (parallel)."""
    for t in prange(tasks.shape[0] - 1):
        for k in range(tasks[t], tasks[t + 1]):
            dst_values[dst[k] : dst[k] + lengths[k]] = src_values[src[k] : src[k] + lengths[k]]


def byte_tasks(doc_start: np.ndarray, doc_end: np.ndarray, parts: int) -> np.ndarray:
    """Boundaries (int64, ``parts`` + 1 at most) of document runs with about equal bytes."""
    n = doc_start.shape[0]
    if n == 0:
        return np.zeros(1, np.int64)
    cum = np.cumsum(doc_end - doc_start + 16)  # +16: a document costs something even when empty
    cuts = np.searchsorted(cum, np.linspace(0, cum[-1], parts + 1)[1:-1], side="right")
    return np.unique(np.concatenate(([0], cuts, [n]))).astype(np.int64)


guard_cache(globals(), __file__, sources=("hash_scalar.py", "text_scalar.py", "twin.py"))
