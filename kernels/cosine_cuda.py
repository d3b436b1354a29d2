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
  little next to the ``D`` multiply-adds per feature; with ``D = 1024`` the
  32 threads of a warp are the 32 halves of one document, reading the same
  bytes (one broadcast load a warp).  A long document still runs on
  ``D / 32`` threads only (a position-parallel split like the MinHash
  kernel's segments is the next step for corpora of very long documents).
  Documents are given as byte spans (``starts``, ``ends`` into ``data``): the
  device buffers of a string column, read in place.  The uint32 output
  viewed as uint64 is the packed signature (little-endian: half ``2w`` is
  the low half of word ``w``).
* ``feature_counts`` / ``emit_features``: one thread per document, the
  feature occurrences of rule 6 counted, then written at the document's
  offset (the CSR the host sorts and counts into distinct features: document
  frequencies and sparse term vectors).
* ``cosine_pairs`` / ``row_norms`` / ``hamming_pairs`` / ``sparse_norms`` /
  ``sparse_cosine_pairs``: one thread per pair (row), rule 8's fixed
  summation order, so results equal the CPU's bits.

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
_doc_feature_count = dev.doc_feature_count
_doc_features = dev.doc_features
_dot_rows = dev.dot_rows
_sparse_dot = dev.sparse_dot
_hamming = dev.hamming_row_pair

MAX_NGRAM = 64  # local ring slots (cosine.text.ngram <= 64)
THREADS = 128


@cuda.jit(cache=True)
def simhash_docs(starts, ends, data, word_mode, n, seed_key, use_idf, idf_q, idf_shift, gauss, out, features):
    """``out[k, h]`` (uint32) = bits ``32h .. 32h + 31`` of the signature (rule 7) of the document
    ``data[starts[k]:ends[k]]``; ``features[k]`` = feature occurrences."""
    ring = cuda.local.array(MAX_NGRAM, types.uint64)
    acc = cuda.local.array(32, types.int64)
    halves = out.shape[1]
    for item in range(cuda.grid(1), starts.shape[0] * halves, cuda.gridsize(1)):
        k = item // halves
        h = item - k * halves
        m = _doc_simhash(data, starts[k], ends[k], word_mode, n, ring, seed_key, use_idf, idf_q, idf_shift, gauss,
                         acc, h * 4, acc)  # the scalar simhash_add needs no scratch
        word = np.uint32(0)
        for b in range(32):
            if acc[b] >= 0:
                word |= np.uint32(1) << np.uint32(b)
        out[k, h] = word
        if h == 0:
            features[k] = m


@cuda.jit(cache=True)
def feature_counts(starts, ends, data, word_mode, n, counts):
    """``counts[k]`` = feature occurrences (rule 6) of the document ``data[starts[k]:ends[k]]``."""
    for k in range(cuda.grid(1), starts.shape[0], cuda.gridsize(1)):
        counts[k] = _doc_feature_count(data, starts[k], ends[k], word_mode, n)


@cuda.jit(cache=True)
def emit_features(starts, ends, data, word_mode, n, offsets, out):
    """The feature hashes (rule 6, in text order) of document ``k`` into ``out[offsets[k]:offsets[k + 1]]``
    (``offsets``: the running sum of :func:`feature_counts`)."""
    ring = cuda.local.array(MAX_NGRAM, types.uint64)
    for k in range(cuda.grid(1), starts.shape[0], cuda.gridsize(1)):
        _doc_features(data, starts[k], ends[k], word_mode, n, ring, out[offsets[k]:offsets[k + 1]])


@cuda.jit(cache=True)
def sparse_norms(offsets, feat, weight, out):
    """L2 norm (rule 8, sparse) of CSR row ``k`` of distinct ``feat`` and their ``weight``."""
    for k in range(cuda.grid(1), offsets.shape[0] - 1, cuda.gridsize(1)):
        a0 = offsets[k]
        a1 = offsets[k + 1]
        out[k] = math.sqrt(_sparse_dot(feat, weight, a0, a1, a0, a1))


@cuda.jit(cache=True)
def sparse_cosine_pairs(offsets, feat, weight, norms, left, right, out):
    """Exact cosine (rule 8, sparse) of CSR rows ``left[p]`` and ``right[p]``; a zero norm scores 0."""
    for p in range(cuda.grid(1), left.shape[0], cuda.gridsize(1)):
        a = left[p]
        b = right[p]
        den = norms[a] * norms[b]
        if den > 0.0:
            out[p] = _sparse_dot(feat, weight, offsets[a], offsets[a + 1], offsets[b], offsets[b + 1]) / den
        else:
            out[p] = 0.0


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


def _some(a, xp, dtype):
    """``a`` on the device, at least one element long (no zero-size kernel arguments)."""
    return _dev(a, xp, dtype) if a.shape[0] else xp.zeros(1, dtype=dtype)


def simhash_spans_device(starts, ends, data, bits, seed_key, word_mode, ngram, use_idf, table, shift, xp,
                         threads: int = THREADS, gauss=None):
    """(signature words (len(starts), bits / 64) uint64, feature occurrences int64) as ``xp`` arrays of the
    documents ``data[starts[k]:ends[k]]`` (``gauss``: GAUSS8 already on the device, else copied here)."""
    if ngram > MAX_NGRAM:
        raise ValueError(f"ngram = {ngram} exceeds the GPU kernel's {MAX_NGRAM}")
    m = starts.shape[0]
    halves = bits // 32
    out = xp.zeros((m, halves), dtype=xp.uint32)
    count = xp.zeros(m, dtype=xp.int64)
    if m:
        simhash_docs[_grid(m * halves, threads), threads](
            _dev(starts, xp, xp.int64), _dev(ends, xp, xp.int64), _some(data, xp, xp.uint8), bool(word_mode),
            int(ngram), np.uint64(seed_key), bool(use_idf), _some(table, xp, xp.int64), np.uint64(shift),
            _dev(GAUSS8, xp) if gauss is None else gauss, out, count)
    return out.view(xp.uint64), count


def text_signatures_device(buf, docs, bits, seed_key, word_mode, ngram, use_idf, table, shift, xp,
                           threads: int = THREADS):
    """:func:`simhash_spans_device` of documents ``docs`` of the string buffers ``buf``."""
    offsets = _dev(buf.offsets, xp, xp.int64)
    docs = _dev(docs, xp, xp.int64)
    return simhash_spans_device(offsets[docs], offsets[docs + 1], buf.data, bits, seed_key, word_mode, ngram, use_idf,
                                table, shift, xp, threads)


def feature_counts_device(starts, ends, data, word_mode, ngram, xp, threads: int = THREADS):
    """Feature occurrences (int64) of the documents ``data[starts[k]:ends[k]]``."""
    m = starts.shape[0]
    counts = xp.zeros(m, dtype=xp.int64)
    if m:
        feature_counts[_grid(m, threads), threads](_dev(starts, xp, xp.int64), _dev(ends, xp, xp.int64),
                                                   _some(data, xp, xp.uint8), bool(word_mode), int(ngram), counts)
    return counts


def emit_features_device(starts, ends, data, word_mode, ngram, offsets, xp, threads: int = THREADS):
    """The feature hashes (uint64, ``offsets[-1]`` of them) of the documents, document ``k``'s at
    ``offsets[k]:offsets[k + 1]`` (``offsets``: the running sum of :func:`feature_counts_device`)."""
    if ngram > MAX_NGRAM:
        raise ValueError(f"ngram = {ngram} exceeds the GPU kernel's {MAX_NGRAM}")
    m = starts.shape[0]
    total = int(offsets[-1]) if m else 0
    out = xp.empty(max(total, 1), dtype=xp.uint64)
    if total:
        emit_features[_grid(m, threads), threads](_dev(starts, xp, xp.int64), _dev(ends, xp, xp.int64),
                                                  _some(data, xp, xp.uint8), bool(word_mode), int(ngram),
                                                  _dev(offsets, xp, xp.int64), out)
    return out[:total]


def sparse_norms_device(offsets, feat, weight, xp, threads: int = THREADS):
    m = offsets.shape[0] - 1
    out = xp.zeros(m, dtype=xp.float64)
    if m:
        sparse_norms[_grid(m, threads), threads](_dev(offsets, xp, xp.int64), _some(feat, xp, xp.uint64),
                                                 _some(weight, xp, xp.float64), out)
    return out


def sparse_cosine_pairs_device(offsets, feat, weight, norms, left, right, xp, threads: int = THREADS):
    left = _dev(left, xp, xp.int64)
    right = _dev(right, xp, xp.int64)
    out = xp.empty(left.shape[0], dtype=xp.float64)
    if left.shape[0]:
        sparse_cosine_pairs[_grid(left.shape[0], threads), threads](
            _dev(offsets, xp, xp.int64), _some(feat, xp, xp.uint64), _some(weight, xp, xp.float64),
            _dev(norms, xp, xp.float64), left, right, out)
    return out


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
