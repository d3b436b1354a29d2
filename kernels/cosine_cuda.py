"""CUDA outer loops (``numba.cuda.jit``) around the cosine scalar twins.

The math is :mod:`.cosine_scalar`, compiled here with
``numba.cuda.jit(device=True)`` by :func:`.twin.compile_twins`; under
``NUMBA_ENABLE_CUDASIM=1`` these kernels run in Numba's simulator on NumPy
arrays, which is how the tests compare them bit for bit with
:mod:`.cosine_cpu`.  Every kernel is grid-stride.

* ``simhash_docs``: one thread per (document, 32-bit half of a signature
  word): the thread walks the document's features (rule 6) and accumulates
  its 32 hyperplane sums in a local array (32, not 64: ptxas then keeps the
  kernel at 142 registers without spills on sm_80).  Features are
  recomputed per half-word (``D / 32`` times per document), which costs
  little next to the ``D`` multiply-adds per feature, and a long document
  still runs on ``D / 32`` threads only (a position-parallel split like the
  MinHash kernel's segments is the next step for corpora of very long
  documents).  The uint32 output viewed as uint64 is the packed signature
  (little-endian: half ``2w`` is the low half of word ``w``).
* ``cosine_pairs`` / ``row_norms`` / ``hamming_pairs``: one thread per pair
  (row), rule 8's fixed summation order, so results equal the CPU's bits.

The ``*_device`` helpers launch a kernel on arrays of an array module ``xp``
(CuPy; NumPy under the simulator) and return ``xp`` arrays; host code in
``gpu_dedup.stages`` calls them.
"""

import math

import numpy as np
from . import cosine_scalar
from .cosine_scalar import GAUSS8
from .compat_cuda import restore_numpy_aliases
from .twin import compile_twins, guard_cache

restore_numpy_aliases()  # before numba-cuda's first compile reads them

from numba import cuda, types  # noqa: E402

dev = compile_twins(cuda.jit(device=True), module=cosine_scalar)

_doc_simhash = dev.doc_simhash
_dot_rows = dev.dot_rows
_hamming = dev.hamming_row_pair

MAX_NGRAM = 64  # local ring slots (cosine.text.ngram <= 64)
THREADS = 128


@cuda.jit(cache=True)
def simhash_docs(offsets, data, docs, word_mode, n, seed_key, use_idf, idf_q, idf_shift, gauss, out, features):
    """``out[k, h]`` (uint32) = bits ``32h .. 32h + 31`` of the signature of ``docs[k]`` (rule 7);
    ``features[k]`` = feature occurrences."""
    ring = cuda.local.array(MAX_NGRAM, types.uint64)
    acc = cuda.local.array(32, types.int64)
    halves = out.shape[1]
    for item in range(cuda.grid(1), docs.shape[0] * halves, cuda.gridsize(1)):
        k = item // halves
        h = item - k * halves
        d = docs[k]
        m = _doc_simhash(data, offsets[d], offsets[d + 1], word_mode, n, ring, seed_key, use_idf, idf_q, idf_shift,
                         gauss, acc, h * 4)
        word = np.uint32(0)
        for b in range(32):
            if acc[b] >= 0:
                word |= np.uint32(1) << np.uint32(b)
        out[k, h] = word
        if h == 0:
            features[k] = m


@cuda.jit(cache=True)
def cosine_pairs(x, norms, left, right, out):
    for p in range(cuda.grid(1), left.shape[0], cuda.gridsize(1)):
        a = left[p]
        b = right[p]
        den = norms[a] * norms[b]
        out[p] = _dot_rows(x, a, x, b) / den if den > 0.0 else 0.0


@cuda.jit(cache=True)
def row_norms(x, out):
    for i in range(cuda.grid(1), x.shape[0], cuda.gridsize(1)):
        out[i] = math.sqrt(_dot_rows(x, i, x, i))


@cuda.jit(cache=True)
def hamming_pairs(sig, left, right, out):
    for p in range(cuda.grid(1), left.shape[0], cuda.gridsize(1)):
        out[p] = _hamming(sig, left[p], right[p])


def _dev(a, xp, dtype=None):
    """``a`` on the device of ``xp``; a writable copy of a read-only NumPy array (the simulator
    copies every argument back after a launch)."""
    a = xp.asarray(a, dtype=dtype)
    if isinstance(a, np.ndarray) and not a.flags.writeable:
        a = a.copy()
    return a


def _grid(items: int, threads: int) -> int:
    return max(1, min((items + threads - 1) // threads, 65_535))


def text_signatures_device(buf, docs, bits, seed_key, word_mode, ngram, use_idf, table, shift, xp,
                           threads: int = THREADS):
    """(signature words (len(docs), bits / 64) uint64, feature occurrences int64) as ``xp`` arrays."""
    if ngram > MAX_NGRAM:
        raise ValueError(f"ngram = {ngram} exceeds the GPU kernel's {MAX_NGRAM}")
    halves = bits // 32
    out = xp.zeros((docs.shape[0], halves), dtype=xp.uint32)
    count = xp.zeros(docs.shape[0], dtype=xp.int64)
    if docs.shape[0]:
        data = buf.data if buf.data.shape[0] else np.zeros(1, np.uint8)  # every text empty: no zero-size argument
        simhash_docs[_grid(docs.shape[0] * halves, threads), threads](
            _dev(buf.offsets, xp), _dev(data, xp), _dev(docs, xp), bool(word_mode), int(ngram),
            np.uint64(seed_key), bool(use_idf), _dev(table, xp), np.uint64(shift), _dev(GAUSS8, xp), out, count)
    return out.view(xp.uint64), count


def cosine_pairs_device(x, norms, left, right, xp, threads: int = THREADS):
    left = _dev(left, xp, xp.int64)
    right = _dev(right, xp, xp.int64)
    out = xp.empty(left.shape[0], dtype=xp.float64)
    if left.shape[0]:
        cosine_pairs[_grid(left.shape[0], threads), threads](_dev(x, xp, xp.float32), _dev(norms, xp), left, right,
                                                             out)
    return out


def row_norms_device(x, xp, threads: int = THREADS):
    out = xp.empty(x.shape[0], dtype=xp.float64)
    if x.shape[0]:
        row_norms[_grid(x.shape[0], threads), threads](_dev(x, xp, xp.float32), out)
    return out


def hamming_pairs_device(sig, left, right, xp, threads: int = THREADS):
    left = _dev(left, xp, xp.int64)
    right = _dev(right, xp, xp.int64)
    out = xp.empty(left.shape[0], dtype=xp.int64)
    if left.shape[0]:
        hamming_pairs[_grid(left.shape[0], threads), threads](_dev(sig, xp), left, right, out)
    return out


# kernels are cached on disk (NVVM takes seconds per kernel on a device); entries compiled from older sources go
guard_cache(globals(), __file__, sources=("cosine_scalar.py", "hash_scalar.py", "twin.py", "compat_cuda.py"))
