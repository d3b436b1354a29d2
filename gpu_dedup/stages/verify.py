"""Verify stage: keep only candidate edges whose similarity reaches the threshold.

``exact``: Jaccard similarity of the two documents' shingle sets (the set of
64-bit shingle values, so collisions are ~2**-64 per pair), built
on the fly for the documents a chunk of edges touches; chunks are sized so the
sets of one chunk stay within ``chunk_bytes`` of text.  ``signature``: the
fraction of equal MinHash values.  ``none``: every candidate is kept and its
similarity is the signature estimate.
"""

from __future__ import annotations

import time

import numpy as np

from gpu_dedup.backends import array_module, distinct, get_backend, stable_order, to_host
from gpu_dedup.config import MinHashConfig
from gpu_dedup.kernels.params import hash_params
from gpu_dedup.stages.edges import Edges

CHUNK_BYTES = 256 << 20  # text bytes whose shingle sets are held at once (~8x that in memory)


def pair_rows(left, right, xp=np):
    """The distinct rows that pairs ``(left[p], right[p])`` name, and the pairs as positions into them."""
    nodes = distinct(xp.concatenate((left, right)))
    return nodes, xp.searchsorted(nodes, left), xp.searchsorted(nodes, right)


def exact_similarity(left, right, texts, cfg: MinHashConfig, backend="cpu", chunk_bytes: int = CHUNK_BYTES,
                     progress=None, clock: dict | None = None):
    """Exact Jaccard of shingle sets for pairs of rows of ``texts`` (StringBuffers);
    ``progress(k)`` is called after each chunk of ``k`` pairs; ``clock``: see :func:`_by_chunks`.  Array code of
    the texts' module: on device buffers (GPU backend) the pairs, sets and scores stay on the device."""
    be = get_backend(backend)
    params = hash_params(cfg.seed, cfg.num_perm)

    def sets(nodes):
        return be.shingle_sets(texts, params, cfg.shingle, cfg.ngram, docs=nodes)

    def score(made, a, b):
        return be.jaccard_pairs(*made, a, b)

    return _by_chunks(left, right, texts, sets, score, chunk_bytes, progress, clock, be)


def _by_chunks(left, right, texts, sets, score, chunk_bytes: int, progress, clock: dict | None = None, be=None):
    """``score(sets(nodes), a, b)`` of the pairs ``(left[p], right[p])``, a chunk at a time: the pairs sorted
    by ``left`` are cut where the documents they name reach about ``chunk_bytes`` of text, and each chunk's
    ``nodes`` (the distinct rows it names; ``a``, ``b``: the pairs as positions into them) have their sets (or
    vectors) made once and their pairs scored at once.  ``progress(k)`` after each chunk of ``k`` pairs.
    ``clock``: a dict that is given the seconds spent making the sets (``sets``, the pairs' positions included)
    and scoring the pairs (``pairs``), and the ``chunks``, the device (backend ``be``) waited for after each
    step so that its kernels are counted where they ran.  Array code of the texts' module."""
    xp = array_module(texts.offsets)
    left = xp.asarray(left, dtype=xp.int64)
    right = xp.asarray(right, dtype=xp.int64)
    out = xp.empty(left.shape[0], dtype=xp.float64)
    if left.shape[0] == 0:
        return out
    lengths = texts.lengths
    order = stable_order(left)
    cost = xp.cumsum(lengths[left[order]] + lengths[right[order]] + 64)
    chunk_of = cost // max(chunk_bytes, 1)
    bounds = to_host(xp.flatnonzero(xp.diff(chunk_of)) + 1)  # chunk boundaries: a few numbers
    wait = getattr(be, "synchronize", None) if clock is not None else None
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, order.shape[0]]):  # few chunks, not per document
        sel = order[lo:hi]
        t0 = time.perf_counter()
        nodes, a, b = pair_rows(left[sel], right[sel], xp)
        made = sets(nodes)
        if clock is not None:
            if wait is not None:
                wait()
            t1 = time.perf_counter()
        out[sel] = score(made, a, b)
        if clock is not None:
            if wait is not None:
                wait()
            t2 = time.perf_counter()
            clock["sets"] = clock.get("sets", 0.0) + (t1 - t0)
            clock["pairs"] = clock.get("pairs", 0.0) + (t2 - t1)
            clock["chunks"] = clock.get("chunks", 0) + 1
        if progress is not None:
            progress(sel.shape[0])
    return out


def signature_similarity(left, right, signatures, backend="cpu"):
    """Fraction of equal values between signature rows ``left`` and ``right``."""
    return get_backend(backend).signature_similarity(signatures, left, right)


def pair_similarity(cfg, backend, left, right, *, texts=None, signatures=None, progress=None):
    """Similarity of row pairs by ``cfg.verify.method``: exact Jaccard of ``texts``' shingle sets
    (``exact``), or the signature estimate from ``signatures`` (``signature``, ``none``)."""
    if cfg.verify.method == "exact":
        if texts is None:
            raise ValueError("verify.method = 'exact' compares shingle sets: pass texts=string_buffers(normalized texts)")
        return exact_similarity(left, right, texts, cfg.minhash, backend, progress=progress)
    if signatures is None:
        raise ValueError(f"verify.method = {cfg.verify.method!r} compares signatures: pass signatures=sig.values")
    if progress is not None:
        progress(len(left))
    return signature_similarity(left, right, signatures, backend)


def verify(edges: Edges, threshold: float, method: str, *, texts=None, cfg: MinHashConfig | None = None,
           signatures=None, backend="cpu", progress=None) -> Edges:
    """Edges with their similarity; under ``exact``/``signature`` only those >= threshold."""
    if method == "exact":
        if cfg is None:
            raise ValueError("verify method 'exact' shingles the texts as the minhash config says: pass cfg=")
        sim = exact_similarity(edges.src, edges.dst, texts, cfg, backend, progress=progress)
    elif method in ("signature", "none"):
        sim = signature_similarity(edges.src, edges.dst, signatures, backend)
    else:
        raise ValueError(f"unknown verify method {method!r}")
    if method == "none":
        return Edges(edges.src, edges.dst, sim)
    keep = sim >= threshold
    return Edges(edges.src[keep], edges.dst[keep], sim[keep])


# ---------------------------------------------------------------- cosine (similarity: cosine)
#
# ``cosine_similarity``: the exact cosine of two rows of the (n, d) float32
# vectors, in float64 with a fixed summation order (kernels/cosine_scalar.py,
# rule 8), so every backend returns the same bits.  ``text_cosine_similarity``:
# the exact cosine of two documents' sparse term-weight vectors
# (stages/vectors.py), built for the documents a chunk of pairs touches.
# ``hamming_cosine``: the estimate cos(pi * (1 - matching_bits / D)) from
# packed signature bits (popcount).  A row without a vector (zero norm)
# scores 0 with everything.

from gpu_dedup.stages.vectors import term_vectors  # noqa: E402


def vector_norms(vectors, backend="cpu"):
    """L2 norm (float64, rule 8's fixed order) of every row of ``vectors`` (float32, (n, d))."""
    return get_backend(backend).row_norms(vectors)


def cosine_similarity(left, right, vectors, norms=None, backend="cpu"):
    """Exact cosine (float64) of row pairs ``(left[p], right[p])`` of ``vectors``: one
    pass over the pairs, no per-pair Python step; ``norms`` from :func:`vector_norms`."""
    if norms is None:
        norms = vector_norms(vectors, backend)
    return get_backend(backend).cosine_pairs(vectors, norms, left, right)


def hamming_distance(left, right, bits, backend="cpu"):
    """Differing bits between packed signature rows ``left[p]`` and ``right[p]`` (int64)."""
    return get_backend(backend).hamming_pairs(bits, left, right)


def hamming_cosine(left, right, bits, nbits: int | None = None, backend="cpu"):
    """Estimate ``cos(pi * hamming / D)`` = ``cos(pi * (1 - matching_bits / D))`` over the first
    ``nbits`` (default: all ``64 * words``) bits of the packed signatures."""
    xp = array_module(bits)
    d = bits.shape[1] * 64 if nbits is None else nbits
    if nbits is not None and nbits != bits.shape[1] * 64:
        bits = bits[:, : (nbits + 63) // 64]
        if nbits % 64:
            bits = bits.copy()
            bits[:, -1] &= xp.uint64((1 << (nbits % 64)) - 1)
    h = hamming_distance(left, right, bits, backend)
    return xp.cos(np.pi * h.astype(xp.float64) / d)


def text_cosine_similarity(left, right, texts, shingle: str = "word", ngram: int = 3, idf=None,
                           chunk_bytes: int = CHUNK_BYTES, progress=None, backend="cpu", clock: dict | None = None):
    """Exact cosine of the term-weight vectors (stages/vectors.py) of document pairs.

    Like :func:`exact_similarity`: pairs sorted by ``left`` are cut into chunks
    whose documents hold about ``chunk_bytes`` of text; each chunk builds the
    sparse vectors of the documents it touches once.  Array code of the texts'
    module: on device texts (GPU backend) the pairs, term vectors and scores
    stay on the device.
    """
    be = get_backend(backend)

    def vectors(nodes):
        return term_vectors(texts, shingle, ngram, idf, docs=nodes, backend=be)

    def score(tv, a, b):
        return be.sparse_cosine_pairs(tv.offsets, tv.features, tv.weights, tv.norms, a, b)

    return _by_chunks(left, right, texts, vectors, score, chunk_bytes, progress, clock, be)
