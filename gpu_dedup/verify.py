"""Verify stage: keep only candidate edges whose similarity reaches the threshold.

``exact``: Jaccard similarity of the two documents' shingle sets (the set of
finalized 61-bit shingle values, so collisions are ~2**-61 per pair), built
on the fly for the documents a chunk of edges touches; chunks are sized so the
sets of one chunk stay within ``chunk_bytes`` of text.  ``signature``: the
fraction of equal MinHash values.  ``none``: every candidate is kept and its
similarity is the signature estimate.
"""

from __future__ import annotations

import numpy as np

from .backend import get_backend
from .buckets import Edges
from .config import MinHashConfig
from .hashing import hash_params

CHUNK_BYTES = 256 << 20  # text bytes whose shingle sets are held at once (~8x that in memory)


def exact_similarity(left, right, texts, cfg: MinHashConfig, backend="cpu", chunk_bytes: int = CHUNK_BYTES,
                     progress=None):
    """Exact Jaccard of shingle sets for pairs of rows of ``texts`` (StringBuffers);
    ``progress(k)`` is called after each chunk of ``k`` pairs."""
    be = get_backend(backend)
    left = np.asarray(left, np.int64)
    right = np.asarray(right, np.int64)
    out = np.empty(left.shape[0], np.float64)
    if left.shape[0] == 0:
        return out
    params = hash_params(cfg.seed, cfg.num_perm, cfg.hash_bits)
    lengths = texts.lengths
    order = np.argsort(left, kind="stable")
    cost = np.cumsum(lengths[left[order]] + lengths[right[order]] + 64)
    chunk_of = cost // max(chunk_bytes, 1)
    bounds = np.flatnonzero(np.diff(chunk_of)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, order.shape[0]]):  # few chunks, not per document
        sel = order[lo:hi]
        l, r = left[sel], right[sel]
        nodes = np.unique(np.concatenate((l, r)))
        set_offsets, set_values = be.shingle_sets(texts, params, cfg.shingle, cfg.ngram, docs=nodes)
        out[sel] = be.jaccard_pairs(set_offsets, set_values, np.searchsorted(nodes, l), np.searchsorted(nodes, r))
        if progress is not None:
            progress(sel.shape[0])
    return out


def signature_similarity(left, right, signatures, backend="cpu"):
    """Fraction of equal values between signature rows ``left`` and ``right``."""
    return get_backend(backend).signature_similarity(signatures, left, right)


def verify(edges: Edges, threshold: float, method: str, *, texts=None, cfg: MinHashConfig | None = None,
           signatures=None, backend="cpu", progress=None) -> Edges:
    """Edges with their similarity; under ``exact``/``signature`` only those >= threshold."""
    if method == "exact":
        sim = exact_similarity(edges.src, edges.dst, texts, cfg, backend, progress=progress)
    elif method in ("signature", "none"):
        sim = signature_similarity(edges.src, edges.dst, signatures, backend)
    else:
        raise ValueError(f"unknown verify method {method!r}")
    if method == "none":
        return Edges(edges.src, edges.dst, sim)
    keep = sim >= threshold
    return Edges(edges.src[keep], edges.dst[keep], sim[keep])
