"""CPU outer loops (``numba.njit(parallel=True)``) around the cosine scalar twins.

The math is :mod:`.cosine_scalar` (compiled here by
:func:`.twin.compile_twins`); :mod:`.cosine_cuda` compiles the same functions
for the GPU.  Text arrives as Arrow buffers (``offsets`` int64, n + 1,
absolute positions into ``data`` uint8); ``docs`` selects the documents and
``tasks`` splits ``docs`` into byte-balanced chunks for ``prange``.

One twin is replaced on the CPU: :func:`simhash_add` (rule 7's inner loop, a
table lookup per hyperplane per feature) computes the same sums in two
passes over a scratch buffer (about 1.2x the scalar form's speed on the CPU;
the tests check the two agree).
"""

import sys

import numba
import numpy as np
from . import cosine_scalar
from .cosine_scalar import GOLDEN, ONE, ZERO
from .twin import compile_twins, kernel_digest
from numba import prange

U64 = np.uint64
_fmix64 = numba.njit(inline="always")(cosine_scalar.fmix64)


@numba.njit(inline="always")
def simhash_add(acc, z, weight, gauss, w0, scratch):
    """CPU twin of ``cosine_scalar.simhash_add`` (the same sums, bit for bit).

    First the ``acc.shape[0] / 8`` hyperplane words into ``scratch[:words]``
    and ``weight * GAUSS8`` into ``scratch[words:words + 256]``; then one
    lookup per hyperplane: on a little-endian machine byte ``j`` of the words
    is byte ``j % 8`` of word ``j // 8``, hyperplane ``8 * w0 + j``'s byte of
    rule 3.  The scalar form shifts the byte out of the word and multiplies by
    the weight at every hyperplane.  ``scratch``: uint64, at least
    ``acc.shape[0] / 8 + 256`` long.
    """
    words = acc.shape[0] >> 3
    hw = scratch[:words]
    for i in range(words):
        hw[i] = _fmix64(z + (U64(w0 + i) + ONE) * GOLDEN)
    wg = scratch[words:words + 256].view(np.int64)
    for b in range(256):
        wg[b] = weight * gauss[b]
    hb = hw.view(np.uint8)
    for j in range(acc.shape[0]):
        acc[j] += wg[hb[j]]


# the byte view above reads rule 3's bytes in order only on a little-endian machine
_REPLACE = {"simhash_add": simhash_add} if sys.byteorder == "little" else {}
# The per-token functions and the per-document loops are inlined into the kernels at the Numba IR level:
# as calls, each token paid a call and a reference count of its array arguments (feature hashing ran
# 2.5x slower); the SimHash loop is then one loop with the replacement above.  The multi-byte UTF-8
# decoder stays a call (``code_point`` inlines the one-byte case): inlined, it tripled the compile time.
_INLINE = numba.njit(cache=True, inline="always")
dev = compile_twins(numba.njit(cache=True), module=cosine_scalar, replace=_REPLACE, special={
    name: _INLINE for name in ("code_point", "is_space", "wordhash_next", "next_token", "feature_step",
                               "window_feature", "doc_feature_count", "doc_features", "doc_simhash")})


def simhash_scratch(bits: int) -> int:
    """Length (uint64 words) of the scratch buffer :func:`simhash_add` needs for ``bits`` hyperplanes."""
    return bits // 8 + 256

_features_of = dev.doc_features
_feature_count = dev.doc_feature_count
_doc_simhash = dev.doc_simhash
_dot_rows = dev.dot_rows
_sparse_dot = dev.sparse_dot
_hamming = dev.hamming_row_pair
_band_value = dev.band_value
_band_hash = dev.band_hash


@numba.njit(parallel=True, cache=True)
def quantize_rows(x, q, status):
    """Rule of :func:`gpu_dedup.stages.projections.quantize` for float32 rows ``x`` into ``q``.

    ``status[i]``: 0 ok, 1 zero vector, 2 NaN or infinity (rows 1 and 2 are
    written as zeros).
    """
    n, d = x.shape
    for i in prange(n):
        s = 0.0
        finite = True
        for j in range(d):
            v = np.float64(x[i, j])
            if not np.isfinite(v):
                finite = False
            a = abs(v)
            if a > s:
                s = a
        if not finite:
            status[i] = 2
        elif s == 0.0:
            status[i] = 1
        else:
            status[i] = 0
        if status[i] != 0:
            for j in range(d):
                q[i, j] = 0.0
            continue
        scale = 127.0 / s
        for j in range(d):
            q[i, j] = np.float32(np.rint(np.float64(x[i, j]) * scale))


@numba.njit(parallel=True, cache=True)
def check_rows(x, status):
    """``status[i]``: 0 ok, 1 zero vector, 2 NaN or infinity (one pass, no copy)."""
    n, d = x.shape
    for i in prange(n):
        finite = True
        nonzero = False
        for j in range(d):
            v = x[i, j]
            if not np.isfinite(v):
                finite = False
            elif v != 0:
                nonzero = True
        status[i] = 2 if not finite else (0 if nonzero else 1)


@numba.njit(parallel=True, cache=True)
def pack_signs(p, out):
    """``out[i, w]`` bit ``b`` = ``[p[i, 64 w + b] >= 0]``: the packed signature of projection rows
    (float32 or int64), as ``projections.pack_signs`` packs them with NumPy."""
    n = p.shape[0]
    words = out.shape[1]
    for i in prange(n):
        for w in range(words):
            acc = np.uint64(0)
            base = 64 * w
            for b in range(64):  # branch-free: the loop vectorizes
                acc |= np.uint64(p[i, base + b] >= 0) << np.uint64(b)
            out[i, w] = acc


@numba.njit(parallel=True, cache=True)
def band_hashes(sig, bands, rows, out):
    """``out[i, b]`` = rule-5 hash of band ``b`` of signature row ``i``."""
    for i in prange(sig.shape[0]):
        for b in range(bands):
            out[i, b] = _band_hash(_band_value(sig, i, b, rows), b)


@numba.njit(parallel=True, cache=True)
def row_norms(x, out):
    for i in prange(x.shape[0]):
        out[i] = np.sqrt(_dot_rows(x, i, x, i))


@numba.njit(parallel=True, cache=True)
def cosine_pairs(x, norms, left, right, out):
    """Exact cosine of row pairs (rule 8); a pair with a zero norm scores 0."""
    for p in prange(left.shape[0]):
        a = left[p]
        b = right[p]
        den = norms[a] * norms[b]
        out[p] = _dot_rows(x, a, x, b) / den if den > 0.0 else 0.0


@numba.njit(parallel=True, cache=True)
def hamming_pairs(sig, left, right, out):
    for p in prange(left.shape[0]):
        out[p] = _hamming(sig, left[p], right[p])


@numba.njit(parallel=True, cache=True)
def simhash_docs(offsets, data, docs, tasks, word_mode, n, seed_key, use_idf, idf_q, idf_shift, gauss, out,
                 features):
    """SimHash signatures (rule 7) of ``docs`` into ``out[k]`` (packed words);
    ``features[k]`` = feature occurrences (0: empty document, all bits 1).

    Weight of an occurrence: ``idf_q[f >> idf_shift]`` when ``use_idf``, else 1.
    """
    nbits = out.shape[1] * 64
    for t in prange(tasks.shape[0] - 1):
        ring = np.empty(max(n, 1), np.uint64)
        acc = np.empty(nbits, np.int64)
        scratch = np.empty(nbits // 8 + 256, np.uint64)  # simhash_scratch(nbits)
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            m = _doc_simhash(data, offsets[d], offsets[d + 1], word_mode, n, ring, seed_key, use_idf, idf_q,
                             idf_shift, gauss, acc, 0, scratch)
            for w64 in range(out.shape[1]):
                word = ZERO
                for b in range(64):
                    if acc[w64 * 64 + b] >= 0:
                        word |= ONE << U64(b)
                out[k, w64] = word
            features[k] = m


@numba.njit(parallel=True, cache=True)
def feature_occurrences(offsets, data, docs, tasks, word_mode, n, occurrences):
    """Feature occurrences (rule 6) of each of ``docs`` into ``occurrences``: tokens counted, nothing hashed."""
    for t in prange(tasks.shape[0] - 1):
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            occurrences[k] = _feature_count(data, offsets[d], offsets[d + 1], word_mode, n)


@numba.njit(parallel=True, cache=True)
def feature_sets(offsets, data, docs, tasks, word_mode, n, occ_offsets, feat, tf, distinct):
    """Sorted distinct features of each of ``docs`` with their counts, in one pass over the text.

    Document ``k``'s feature occurrences are hashed into ``feat[occ_offsets[k]:occ_offsets[k + 1]]`` (the
    running sum of :func:`feature_occurrences`), sorted there, and its distinct features with their
    counts (``tf``) written to the front of that range; ``distinct[k]`` says how many.
    :func:`compact_sets` then closes the gaps.
    """
    for t in prange(tasks.shape[0] - 1):
        ring = np.empty(max(n, 1), np.uint64)
        for k in range(tasks[t], tasks[t + 1]):
            d = docs[k]
            lo = occ_offsets[k]
            m = _features_of(data, offsets[d], offsets[d + 1], word_mode, n, ring, feat[lo:occ_offsets[k + 1]])
            run = feat[lo:lo + m]
            run.sort()
            o = lo - 1
            for i in range(lo, lo + m):
                if i == lo or feat[i] != feat[o]:
                    o += 1
                    feat[o] = feat[i]
                    tf[o] = 1
                else:
                    tf[o] += 1
            distinct[k] = o + 1 - lo


@numba.njit(cache=True)
def compact_sets(occ_offsets, set_offsets, feat, tf):
    """Move each document's distinct features (:func:`feature_sets`) from ``occ_offsets[k]`` to
    ``set_offsets[k]`` (the running sum of the distinct counts), in place: a destination never lies
    after its source, so one forward pass copies nothing before it is read."""
    for k in range(set_offsets.shape[0] - 1):
        src = occ_offsets[k]
        dst = set_offsets[k]
        if src != dst:
            for i in range(set_offsets[k + 1] - dst):
                feat[dst + i] = feat[src + i]
                tf[dst + i] = tf[src + i]


@numba.njit(parallel=True, cache=True)
def sparse_cosine_pairs(set_offsets, feat, weight, norms, left, right, out):
    """Exact cosine (rule 8, sparse) of CSR rows ``left[p]``, ``right[p]``; zero norm scores 0."""
    for p in prange(left.shape[0]):
        a = left[p]
        b = right[p]
        den = norms[a] * norms[b]
        if den > 0.0:
            out[p] = _sparse_dot(feat, weight, set_offsets[a], set_offsets[a + 1], set_offsets[b],
                                 set_offsets[b + 1]) / den
        else:
            out[p] = 0.0


@numba.njit(parallel=True, cache=True)
def sparse_norms(set_offsets, feat, weight, out):
    for k in prange(set_offsets.shape[0] - 1):
        a0 = set_offsets[k]
        a1 = set_offsets[k + 1]
        out[k] = np.sqrt(_sparse_dot(feat, weight, a0, a1, a0, a1))


def tasks_for(offsets, docs, threads: int | None = None) -> np.ndarray:
    """Split ``docs`` into byte-balanced chunks (about 16 per thread): boundaries into ``docs``."""
    n = docs.shape[0]
    if n == 0:
        return np.zeros(1, np.int64)
    threads = threads or numba.get_num_threads()
    nbytes = (offsets[docs + 1] - offsets[docs]).astype(np.int64) + 16
    cum = np.cumsum(nbytes)
    parts = min(n, 16 * threads)
    cuts = np.searchsorted(cum, np.linspace(0, cum[-1], parts + 1)[1:-1], side="right")
    return np.unique(np.concatenate(([0], cuts, [n]))).astype(np.int64)


_guarded = False


def _guard_cache() -> None:
    """Drop stale on-disk cache entries of this module when ``cosine_scalar.py`` changed.

    Numba re-validates a cached kernel against its own source file only; these
    kernels inline twins compiled from ``cosine_scalar.py``.  A stamp named
    after a digest of that file (and ``twin.py``) sits in the cache directory;
    when it is missing, this module's entries are deleted first.
    """
    import os

    tag = f"gpu_dedup-cosine_cpu-{kernel_digest(['cosine_scalar.py', 'hash_scalar.py', 'twin.py'])[:16]}.stamp"
    dirs: dict[str, list[str]] = {}
    for obj in globals().values():
        cache = getattr(obj, "_cache", None)
        index_path = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
        if index_path:
            dirs.setdefault(os.path.dirname(index_path), []).append(os.path.basename(index_path)[: -len(".nbi")])
    for path, names in dirs.items():
        stamp = os.path.join(path, tag)
        if os.path.exists(stamp):
            continue
        try:
            for entry in os.listdir(path):
                if entry.startswith("gpu_dedup-cosine_cpu-") or any(
                    entry == f"{m}.nbi" or (entry.startswith(f"{m}-") and entry.endswith(".nbc")) for m in names
                ):
                    os.unlink(os.path.join(path, entry))
            with open(stamp, "w") as f:
                f.write("kernel sources digest; see gpu_dedup/kernels/cosine_cpu.py:_guard_cache\n")
        except OSError:  # read-only or racing cache directory: numba compiles instead
            pass


_guard_cache()
