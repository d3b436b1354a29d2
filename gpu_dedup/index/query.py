"""Online queries: indexed documents similar to new texts or vectors (:meth:`Index.query`)."""

from __future__ import annotations

import logging
import math

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import distinct
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.curves import family_curve
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.stages.families import RowData, family_for
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.vectors import Vectors, from_numpy
from gpu_dedup.stages.write import ROW

log = logging.getLogger("gpu_dedup")


def query(index, texts=None, threshold: float | None = None, members: int = 8, backend="cpu",
          vectors=None) -> pa.Table:
    """Indexed documents similar to each query: one row per (query, match).

    Queries are ``texts`` (a list or array of strings; one string is one
    query) or, for a cosine index of a vector column, ``vectors`` (an
    (n, d) float array).  Candidates are exact-key
    matches and up to ``members`` documents of every index bucket a query
    falls in; matches are verified by the family's exact similarity
    (Jaccard of shingle sets, or cosine) and kept when similarity >=
    ``threshold`` (default: the index's config threshold).

    Columns: ``query`` (position in ``texts``), ``row`` (the indexed
    document's number), its id under the index's id column name (when the
    index has one), ``similarity``, ``exact`` (same normalized text, or
    same vector), ``kept`` (the document survived its own dedup),
    ``cluster_id`` (the row of its cluster's survivor) and, with ids,
    ``survivor_id``.  A query without a match has no row.
    """
    if threshold is not None and (isinstance(threshold, bool) or not isinstance(threshold, (int, float))
                                  or not math.isfinite(threshold) or not 0 < threshold <= 1):
        raise ConfigError(f"query threshold = {threshold!r} must be a number in (0, 1]; e.g. 0.8 (default: the "
                          "index's)")
    if isinstance(members, bool) or not isinstance(members, (int, np.integer)) or members < 0:
        raise ConfigError(f"query members = {members!r} must be an integer >= 0 (documents compared per "
                          "matching bucket; default 8)")
    cfg = index.config()
    family = family_for(cfg)
    t = cfg.lsh.threshold if threshold is None else threshold
    if t < cfg.lsh.threshold:
        log.warning("%s", below_index_threshold(index, t))
    by_vector = index.similarity == "cosine" and index.manifest["config"]["source"] == "vectors"
    if by_vector:
        if vectors is None:
            raise InputError(f"the index in {str(index.path)!r} holds vectors (similarity cosine): query it with "
                             "vectors (Index.query(vectors=...), or gpu-dedup query --jsonl --vector-column NAME)")
        mine = from_numpy(vectors, bad_vectors="keep", name="query vectors")
        dim = index._vector_dim()
        if dim is not None and mine.dim != dim:
            raise InputError(f"query vectors have {mine.dim} dimensions; the index's have {dim}")
        rows, q = RowData(vectors=mine), len(mine)
    else:
        if texts is None:
            raise InputError(f"the index in {str(index.path)!r} indexes texts: query it with texts")
        if isinstance(texts, (str, bytes)):  # one query, not one query per character
            texts = [texts]
        if isinstance(texts, (list, tuple)):
            bad = next((t for t in texts if t is not None and not isinstance(t, (str, bytes))), None)
            if bad is not None:
                raise InputError(f"queries must be strings; query {texts.index(bad)} is a {type(bad).__name__} "
                                 f"({bad!r:.40}): convert it, e.g. [str(t) for t in texts]")
        norm = normalize(texts, cfg.normalize)
        rows, q = RowData(strings=string_buffers(norm)), len(norm)
    new = _new_doc_arrays(rows, family, backend)
    qi, di = [], []
    exact = index.exact_matches(new["keys"])
    hit = np.flatnonzero(exact >= 0)
    qi.append(hit)
    di.append(exact[hit])
    if new["cand"].shape[0]:
        bands = new["band_hashes"].shape[1]
        band = np.tile(np.arange(bands), new["cand"].shape[0])
        hq, hd = index.bucket_members(band, new["band_hashes"].ravel(), members)
        qi.append(new["cand"][hq // bands])
        di.append(hd)
    qa, da = np.concatenate(qi), np.concatenate(di)
    if qa.shape[0]:
        pairs = np.unique(np.column_stack([qa, da]), axis=0)
        qa, da = pairs[:, 0], pairs[:, 1]
    docs = distinct(da)
    if by_vector:
        theirs = index.vectors(docs).matrix if docs.shape[0] else np.zeros((0, mine.dim), np.float32)
        both = RowData(vectors=Vectors(np.concatenate([mine.matrix, theirs]), np.zeros(q + docs.shape[0], np.int8)))
    else:
        texts_all = pa.concat_arrays([norm, index.texts(docs)]) if docs.shape[0] else norm
        both = RowData(strings=string_buffers(texts_all))
    sim = family.exact_similarity(both, qa, q + np.searchsorted(docs, da), backend)
    is_exact = np.zeros(qa.shape[0], bool)
    if hit.shape[0]:
        is_exact = np.isin(qa * (index.documents + 1) + da, hit * (index.documents + 1) + exact[hit])
        sim[is_exact] = 1.0
    keep = sim >= t
    qa, da, sim, is_exact = qa[keep], da[keep], sim[keep], is_exact[keep]
    surv = index.survivors(da)
    name = index.id_column
    cols = {"query": pa.array(qa, pa.int64()), ROW: pa.array(da, pa.int64())}
    if name:
        cols[name] = index.ids(da)
    cols.update(similarity=pa.array(sim), exact=pa.array(is_exact), kept=pa.array(index.kept(da)),
                cluster_id=pa.array(np.asarray(surv, np.int64), pa.int64()))
    if name:
        cols["survivor_id"] = index.ids(surv)
    return pa.table(cols)


def candidate_probability(index, similarity: float) -> float:
    """The probability that the index's LSH layout makes a query and an indexed document of ``similarity``
    candidates (share a band hash): its family's S-curve at its (bands, rows)."""
    layout = index.manifest["config"]
    return float(family_curve(index.similarity)(similarity, int(layout["bands"]), int(layout["rows"])))


def below_index_threshold(index, threshold: float) -> str:
    """What a query below the index's threshold misses: LSH finds a pair only where it shares a band hash, and
    the index's layout was chosen for its own threshold.  Every match returned is verified, so the answer is
    right where it is not empty; it is not complete.  (Two lines of at most 120 characters.)"""
    layout, own = index.manifest["config"], index.config().lsh.threshold
    p, p_own = candidate_probability(index, threshold), candidate_probability(index, own)
    missed = "most such pairs are missed" if p < 0.5 else f"{1 - p:.0%} of such pairs are missed"
    return (f"query threshold {threshold} is below the index's {own}: with its {layout['bands']} bands x "
            f"{layout['rows']} rows a pair at similarity {threshold}\n  is found with probability {p:.2g} "
            f"({p_own:.2f} at {own}), so {missed}; to find them, index at --threshold {threshold}")


def _new_doc_arrays(rows: RowData, family, backend) -> dict:
    """Exact keys of all queries; signatures and band hashes of those that have one."""
    keys = family.exact_keys(rows, backend)
    sig = family.signatures(rows, np.arange(len(rows), dtype=np.int64), backend=backend)
    cand = np.flatnonzero(sig.usable)
    bh = family.band_hashes(sig.values[cand], backend)
    return {"keys": keys, "cand": cand, "band_hashes": bh, "signatures": sig.values}

