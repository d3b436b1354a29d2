"""Evaluation against the exact similarity: ``gpu-dedup evaluate`` and its building blocks.

The truth is exact all-pairs Jaccard of shingle sets (``similarity: jaccard``)
or exact all-pairs cosine (``similarity: cosine``: of the vectors, or of the
tf / tf-idf vectors of the text) on a sample; the S-curve the candidate rates
are compared with is the family's.

- ``cluster_pairs``, ``sample_cluster_pairs``, ``pair_recall``, ``pair_precision``:
  pairs from cluster labels (enumerated per distinct cluster size, never per
  document; sampled to a bound where clusters are large; precision counted
  from the contingency table, without enumerating pairs).
- ``all_pairs_jaccard``: every pair of shingle sets with exact Jaccard >= a
  floor, from sparse incidence-matrix products in row blocks;
  ``all_pairs_cosine`` / ``all_pairs_sparse_cosine``: every pair of dense or
  sparse vectors with exact cosine >= a floor, from blocked products.
- ``adjusted_rand_index``: from the contingency table of two labelings.
- ``Evaluation`` / ``evaluate``: sample a corpus, run the real pipeline on the
  sample, and score the run (``score_run``) against the exact pairs: recall
  and precision, where each missed pair was lost, the candidate rate per
  similarity bin against the S-curve, cluster quality and chaining.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup import storage
from gpu_dedup.version import __version__
from gpu_dedup.backends import get_backend, to_host
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import Config
from gpu_dedup.curves import curve_section, family_curve
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.kernels.cosine_cpu import sparse_cosine_pairs
from gpu_dedup.kernels.params import hash_params
from gpu_dedup.report.build import wrap
from gpu_dedup.report.plots import plot_evaluation
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.outdir import check_report_files
from gpu_dedup.stages import vectors as vec
from gpu_dedup.stages.exact import exact_groups
from gpu_dedup.stages.families import RowData, family_for
from gpu_dedup.stages.normalize import normalize, repair_utf8
from gpu_dedup.stages.projections import OK
from gpu_dedup.stages.read import read
from gpu_dedup.stages.verify import cosine_similarity, vector_norms
from gpu_dedup.storage import atomic_write_bytes

log = logging.getLogger("gpu_dedup")


def cluster_pairs(labels, ignore=None, max_pairs: int = 50_000_000):
    """All (i, j), i < j, with labels[i] == labels[j]; rows labelled ``ignore`` are skipped."""
    labels = np.asarray(labels)
    idx = np.arange(labels.shape[0]) if ignore is None else np.flatnonzero(labels != ignore)
    if idx.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = idx[np.argsort(labels[idx], kind="stable")]
    sl = labels[order]
    start = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]])
    size = np.diff(np.r_[start, order.shape[0]])
    total = int((size * (size - 1) // 2).sum())
    if total > max_pairs:
        raise ValueError(f"{total:,} pairs exceed max_pairs = {max_pairs:,}; evaluate on a sample")
    lefts, rights = [], []
    for m in np.unique(size[size > 1]):  # one step per distinct cluster size
        groups = order[start[size == m][:, None] + np.arange(m)[None, :]]
        a, b = np.triu_indices(int(m), 1)
        lefts.append(groups[:, a].ravel())
        rights.append(groups[:, b].ravel())
    if not lefts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    left, right = np.concatenate(lefts), np.concatenate(rights)
    swap = left > right
    left[swap], right[swap] = right[swap], left[swap]
    return left.astype(np.int64), right.astype(np.int64)


def pair_recall(pred_labels, left, right) -> float:
    """Fraction of the pairs (left, right) that share a predicted label."""
    pred_labels = np.asarray(pred_labels)
    if len(left) == 0:
        return 1.0
    return float(np.mean(pred_labels[left] == pred_labels[right]))


def _pairs_per_cluster(sizes: np.ndarray) -> np.ndarray:
    sizes = sizes.astype(np.int64)
    return sizes * (sizes - 1) // 2


def sample_cluster_pairs(labels, max_pairs: int, ignore=None, seed: int = 0):
    """Pairs (i, j), i < j, of rows with equal labels, at most ``max_pairs`` of them, whatever the clusters:
    every pair (:func:`cluster_pairs`) when there are no more; otherwise each cluster of more than ``m``
    members contributes every pair of ``m`` of its members drawn at random (each of its pairs equally likely),
    ``m`` the largest that keeps the total within ``max_pairs``, so that every cluster is represented and one
    cluster of thousands does not fill the sample (or the memory: a 5,000-document cluster has 12.5 million
    pairs).  Where even one pair per cluster is too many, ``max_pairs`` clusters drawn at random give one
    pair each.  Deterministic for a ``seed``; rows labelled ``ignore`` are skipped."""
    if max_pairs < 1:
        raise ValueError(f"max_pairs = {max_pairs} must be at least 1")
    labels = np.asarray(labels)
    idx = np.arange(labels.shape[0]) if ignore is None else np.flatnonzero(labels != ignore)
    if idx.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    _, code, sizes = np.unique(labels[idx], return_inverse=True, return_counts=True)
    code = code.ravel()
    if int(_pairs_per_cluster(sizes).sum()) <= max_pairs:
        return cluster_pairs(labels, ignore=ignore)
    rng = np.random.default_rng(seed)
    lo, hi = 2, int(sizes.max())  # the largest member cap m whose pairs fit (bisection over m)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if int(_pairs_per_cluster(np.minimum(sizes, mid)).sum()) <= max_pairs:
            lo = mid
        else:
            hi = mid - 1
    cap = lo
    order = np.lexsort((rng.random(idx.shape[0]), code))  # by cluster, members in random order
    first = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    rank = np.arange(order.shape[0]) - first[code[order]]
    chosen = order[rank < cap]
    if int(_pairs_per_cluster(np.minimum(sizes, cap)).sum()) > max_pairs:  # cap 2: too many clusters
        multi = np.flatnonzero(sizes > 1)
        keep = np.zeros(sizes.shape[0], bool)
        keep[rng.choice(multi, size=max_pairs, replace=False)] = True
        chosen = chosen[keep[code[chosen]]]
    relabel = np.full(labels.shape[0], -1, np.int64)
    relabel[idx[chosen]] = code[chosen]
    return cluster_pairs(relabel, ignore=-1)


def pair_precision(pred_labels, true_labels, ignore=None) -> float:
    """Fraction of predicted same-cluster pairs that share a true label (``ignore``: no true cluster).
    Counted from the (predicted, true) contingency table: no pair is enumerated, so a predicted cluster
    of any size costs its members only."""
    pred = np.asarray(pred_labels)
    if pred.shape[0] == 0:
        return 1.0
    _, pcode, psize = np.unique(pred, return_inverse=True, return_counts=True)
    total = int(_pairs_per_cluster(psize).sum())
    if total == 0:
        return 1.0
    t = np.asarray(true_labels)
    real = np.ones(t.shape[0], bool) if ignore is None else t != ignore
    _, tcode = np.unique(t[real], return_inverse=True)
    cell = pcode.ravel()[real].astype(np.int64) * (int(tcode.max()) + 1 if tcode.size else 1) + tcode.ravel()
    _, both = np.unique(cell, return_counts=True)
    return float(int(_pairs_per_cluster(both).sum()) / total)


# ---------------------------------------------------------------- exact all-pairs Jaccard


def incidence_matrix(set_offsets, set_values):
    """Documents x distinct shingles CSR matrix of ones (int32), and the set sizes."""
    from scipy.sparse import csr_matrix

    set_offsets = np.asarray(set_offsets, np.int64)
    n = set_offsets.shape[0] - 1
    _, col = np.unique(np.asarray(set_values), return_inverse=True)
    m = int(col.max()) + 1 if col.shape[0] else 0
    data = np.ones(col.shape[0], np.int32)
    x = csr_matrix((data, col.astype(np.int32 if m < 2**31 else np.int64), set_offsets), shape=(n, m))
    return x, np.diff(set_offsets)


def all_pairs_jaccard(set_offsets, set_values, floor: float = 0.3, chunk_entries: int = 20_000_000,
                      max_pairs: int = 200_000_000):
    """Every pair (i < j) of sets with exact Jaccard >= ``floor``, by sparse products.

    ``set_offsets``/``set_values`` are CSR sorted distinct shingle values per
    document (the backend's ``shingle_sets``).  Intersections are ``X @ X.T``
    of the documents x shingles incidence matrix, computed for a block of rows
    at a time against the rows after the block's start (upper triangle only);
    blocks hold about ``chunk_entries`` entries of the product.  Empty sets
    pair with nothing.  Returns (left, right, jaccard) sorted by (left, right).
    """
    if not 0.0 < floor <= 1.0:
        raise ValueError(f"floor = {floor} must be in (0, 1]; e.g. 0.3")
    x, size = incidence_matrix(set_offsets, set_values)
    n = x.shape[0]
    xt = x.T.tocsr()
    # entries of row i's product = number of docs sharing a shingle with i <= sum of its columns' doc counts
    df = np.bincount(x.indices, minlength=x.shape[1]).astype(np.int64)
    row_work = np.bincount(np.repeat(np.arange(n), size), weights=df[x.indices], minlength=n)
    row_work = np.minimum(row_work, n).astype(np.int64)
    lefts, rights, sims = [], [], []
    total = 0
    lo = 0
    cum = np.cumsum(row_work)
    while lo < n:  # one sparse product per block of rows (few blocks), not per document
        hi = int(np.searchsorted(cum, (cum[lo - 1] if lo else 0) + chunk_entries, side="right"))
        hi = min(max(hi, lo + 1), n)
        prod = (x[lo:hi] @ xt[:, lo:]).tocoo()
        i = prod.row.astype(np.int64) + lo
        j = prod.col.astype(np.int64) + lo
        inter = prod.data.astype(np.int64)
        upper = j > i
        i, j, inter = i[upper], j[upper], inter[upper]
        jac = inter / (size[i] + size[j] - inter)
        keep = jac >= floor
        lefts.append(i[keep])
        rights.append(j[keep])
        sims.append(jac[keep])
        total += int(keep.sum())
        if total > max_pairs:
            raise ValueError(
                f"more than max_pairs = {max_pairs:,} pairs have Jaccard >= {floor}; raise the floor or evaluate "
                "a smaller sample"
            )
        lo = hi
    if not lefts:
        e = np.zeros(0, np.int64)
        return e, e.copy(), np.zeros(0, np.float64)
    left, right, sim = np.concatenate(lefts), np.concatenate(rights), np.concatenate(sims)
    order = np.lexsort((right, left))
    return left[order], right[order], sim[order]


def all_pairs_cosine(x, floor: float, block: int = 4096):
    """Every pair (i < j) of rows of ``x`` ((n, d) float32) with exact cosine >= ``floor``: blocked
    float32 products of the normalized rows (a margin of 1e-3 for their rounding), re-scored by
    the exact float64 cosine (``verify.cosine_similarity``).  Rows of norm 0 pair with nothing.
    Returns (left, right, cosine) sorted by (left, right)."""
    norms = vector_norms(x)
    safe = np.where(norms > 0, norms, np.inf).astype(np.float32)
    xn = x / safe[:, None]
    n = x.shape[0]
    lefts, rights = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo in range(0, n, block):  # n / block blocks, each one matrix product
        hi = min(lo + block, n)
        i, j = np.nonzero(xn[lo:hi] @ xn[lo:].T >= floor - 1e-3)
        i, j = i + lo, j + lo  # j counts from lo: the upper triangle and the diagonal block
        keep = j > i
        lefts.append(i[keep])
        rights.append(j[keep])
    left = np.concatenate(lefts).astype(np.int64)
    right = np.concatenate(rights).astype(np.int64)
    cos = cosine_similarity(left, right, x, norms)
    keep = cos >= floor
    return _sorted_pairs(left[keep], right[keep], cos[keep])


def all_pairs_sparse_cosine(tv, floor: float, block: int = 1000):
    """Every pair with exact cosine >= ``floor`` of sparse term vectors ``tv`` (:class:`vectors.TermVectors`):
    blocked sparse products of the normalized rows, re-scored by the exact sparse cosine."""
    from scipy.sparse import csr_matrix

    n = len(tv)
    if tv.features.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.float64)
    _, col = np.unique(tv.features, return_inverse=True)
    rows = np.repeat(np.arange(n), np.diff(tv.offsets))
    norms = np.where(tv.norms > 0, tv.norms, 1.0)
    x = csr_matrix((tv.weights / norms[rows], col.astype(np.int64), tv.offsets), shape=(n, int(col.max()) + 1))
    xt = x.T.tocsr()
    lefts, rights = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for lo in range(0, n, block):  # n / block sparse products
        s = (x[lo:lo + block] @ xt).tocoo()
        i, j = s.row + lo, s.col
        keep = (j > i) & (s.data >= floor - 1e-9)
        lefts.append(i[keep])
        rights.append(j[keep])
    left = np.concatenate(lefts).astype(np.int64)
    right = np.concatenate(rights).astype(np.int64)
    cos = np.empty(left.shape[0], np.float64)
    sparse_cosine_pairs(tv.offsets, tv.features, tv.weights, tv.norms, left, right, cos)
    keep = cos >= floor
    return _sorted_pairs(left[keep], right[keep], cos[keep])


def _sorted_pairs(left, right, sim):
    order = np.lexsort((right, left))
    return left[order], right[order], sim[order]


def adjusted_rand_index(a, b) -> float:
    """Adjusted Rand index of two labelings of the same items (Hubert & Arabie), vectorized.

    Two labelings that put every item alone (or every item together) agree
    perfectly: 1.0.
    """
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape:
        raise ValueError(f"labelings have different lengths: {a.shape[0]} and {b.shape[0]}")
    n = a.shape[0]
    if n < 2:
        return 1.0
    _, ai = np.unique(a, return_inverse=True)
    _, bi = np.unique(b, return_inverse=True)
    _, nij = np.unique(ai.astype(np.int64) * (int(bi.max()) + 1) + bi, return_counts=True)
    comb = lambda v: (v.astype(np.float64) * (v - 1) / 2.0).sum()  # noqa: E731
    sum_ij = comb(nij)
    sum_a = comb(np.bincount(ai))
    sum_b = comb(np.bincount(bi))
    expected = sum_a * sum_b / (n * (n - 1) / 2.0)
    maximum = (sum_a + sum_b) / 2.0
    if maximum == expected:
        return 1.0
    return float((sum_ij - expected) / (maximum - expected))


def shared_band(band_hashes, left, right, chunk: int = 1_000_000) -> np.ndarray:
    """Whether rows ``left[k]`` and ``right[k]`` of a band-hash matrix share a bucket (any equal band)."""
    left = np.asarray(left, np.int64)
    right = np.asarray(right, np.int64)
    out = np.zeros(left.shape[0], bool)
    for lo in range(0, left.shape[0], chunk):  # bounded memory: a few chunks
        hi = lo + chunk
        out[lo:hi] = np.any(band_hashes[left[lo:hi]] == band_hashes[right[lo:hi]], axis=1)
    return out


def pair_keys(left, right, n: int) -> np.ndarray:
    """One int64 key per pair (i < j): i * n + j (sortable, searchable)."""
    lo = np.minimum(left, right).astype(np.int64)
    hi = np.maximum(left, right).astype(np.int64)
    return lo * n + hi


# ---------------------------------------------------------------- evaluation of a run on a sample

BIN_STEP = 0.05


@dataclass
class Truth:
    """The exact answer on a sample: every pair with similarity >= ``floor``, and the exact-copy groups.

    ``jaccard`` holds the exact similarity of each pair: Jaccard, or cosine under ``similarity: cosine``."""

    n: int
    floor: float
    left: np.ndarray
    right: np.ndarray
    jaccard: np.ndarray
    set_sizes: np.ndarray  # distinct shingles per document (0: null, empty or no shingle); cosine: 1 if signed
    null: np.ndarray  # null texts (never deduplicated)
    exact_rep: np.ndarray  # smallest row with the same normalized text (null texts: themselves)
    strings: object  # normalized StringBuffers
    labels: np.ndarray | None = None  # user labels (for ARI), None if not given
    seconds: dict = field(default_factory=dict)
    rows: RowData | None = None  # what the family computes on (texts and/or vectors)

    def components(self, threshold: float) -> np.ndarray:
        """Ideal clusters: connected components of the pairs with J >= threshold and of exact copies."""
        from scipy.sparse import coo_matrix
        from scipy.sparse.csgraph import connected_components

        sel = self.jaccard >= threshold
        copies = np.flatnonzero(self.exact_rep != np.arange(self.n))
        src = np.concatenate((self.left[sel], copies))
        dst = np.concatenate((self.right[sel], self.exact_rep[copies]))
        graph = coo_matrix((np.ones(src.shape[0], np.int8), (src, dst)), shape=(self.n, self.n))
        return connected_components(graph, directed=False)[1]


def _jaccard_pairs(family, rows: RowData, null, floor, be):
    cfg = family.cfg
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm)
    offsets, values = map(_host, be.shingle_sets(rows.strings, params, cfg.minhash.shingle, cfg.minhash.ngram))
    if null.any():  # null texts never pair (the pipeline keeps them untouched)
        keep = np.repeat(~null, np.diff(offsets))
        values = values[keep]
        offsets = np.concatenate(([0], np.cumsum(np.where(null, 0, np.diff(offsets)))))
    t1 = time.perf_counter()
    left, right, jac = all_pairs_jaccard(offsets, values, floor)
    return left, right, jac, np.diff(offsets), t1


def _cosine_pairs(family, rows: RowData, null, floor, be):
    if rows.vectors is not None:
        v = rows.vectors
        signed = (v.status == OK) & ~null
        x = np.where(signed[:, None], v.matrix, 0.0).astype(np.float32)
        t1 = time.perf_counter()
        left, right, cos = all_pairs_cosine(x, floor)
    else:
        fam = family.prepare([family.stats(rows)] if family.stats(rows) is not None else [])
        t = family.cfg.cosine.text
        tv = vec.term_vectors(rows.strings, t.shingle, t.ngram, fam.idf)
        signed = (tv.norms > 0) & ~null
        t1 = time.perf_counter()
        left, right, cos = all_pairs_sparse_cosine(tv, floor)
        ok = signed[left] & signed[right]
        left, right, cos = left[ok], right[ok], cos[ok]
    return left, right, cos, signed.astype(np.int64), t1


ALL_PAIRS = {"jaccard": _jaccard_pairs, "cosine": _cosine_pairs}


def exact_truth(texts, cfg: Config, floor: float = 0.3, labels=None, backend="cpu", vectors=None) -> Truth:
    """Normalize ``texts`` like the pipeline does and compute every pair with similarity >= ``floor``
    (exact Jaccard, or exact cosine of ``vectors`` (:class:`gpu_dedup.stages.vectors.Vectors`) or of the
    texts' term vectors under ``similarity: cosine``)."""
    be = get_backend(backend)
    t0 = time.perf_counter()
    repaired, _ = repair_utf8(texts)
    family = family_for(cfg, len(repaired))
    strings = string_buffers(normalize(repaired, cfg.normalize)) if family.uses_text else None
    rows = RowData(strings=strings, vectors=vectors)
    null = family.null_rows(pa.table({"text": repaired}), vectors)
    n = null.shape[0]
    left, right, sim, sizes, t1 = ALL_PAIRS[family.name](family, rows, null, floor, be)
    t2 = time.perf_counter()
    rep = exact_groups(_host(family.exact_keys(rows, be)), np.arange(n), eligible=~null)
    return Truth(n, floor, left, right, sim, sizes, null, rep, strings,
                 None if labels is None else np.asarray(labels),
                 {"shingle_sets" if family.name == "jaccard" else "vectors": round(t1 - t0, 3),
                  "all_pairs": round(t2 - t1, 3)}, rows)


def _label_message(text: str) -> str:
    """An error of reading the label column as the id column, in the label column's words: the options it
    names are --label-column's (the id column's fixes, --id-column and --no-id-column, do not apply)."""
    for old, new in ((", or pass --no-id-column to name documents by row number", ""),
                     (", or --no-id-column to name documents by row", ""), (", or --no-id-column", ""),
                     ("input.id_column (--id-column)", "--label-column"), ("--id-column", "--label-column"),
                     ("the id column", "the label column"), ("id column", "label column"), ("ids must", "labels must")):
        text = text.replace(old, new)
    return text


def label_codes(labels) -> np.ndarray:
    """Integer codes of a label column; nulls (and NaN) become singletons."""
    arr = pa.chunked_array([labels]) if isinstance(labels, pa.Array) else labels
    if not isinstance(arr, pa.ChunkedArray):
        arr = pa.chunked_array([pa.array(list(labels) if not isinstance(labels, np.ndarray) else labels)])
    arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    n = len(arr)
    valid = ~np.asarray(arr.is_null(), dtype=bool)
    if pa.types.is_floating(arr.type):
        valid &= ~np.isnan(np.asarray(arr.fill_null(0.0), dtype=np.float64))
    codes = np.asarray(pc.dictionary_encode(arr).indices.fill_null(-1), dtype=np.int64)
    return np.where(valid, codes, -np.arange(1, n + 1))


def _band_hash_matrix(truth: Truth, cfg: Config, docs, backend):
    """Band hashes of rows ``docs`` of the sample, as the run on the sample computes them."""
    family = family_for(cfg, truth.n)
    rows = truth.rows if truth.rows is not None else RowData(strings=truth.strings)
    st = family.stats(rows)
    family = family.prepare([st] if st is not None else [])
    sig = family.signatures(rows, docs, backend=backend)
    return _host(family.band_hashes(_host(sig.values), backend))


SEED_KEYS = {"jaccard": "minhash.seed", "cosine": "cosine.seed"}


def _bins(floor: float):
    edges = np.round(np.arange(floor, 1.0 - 1e-9, BIN_STEP), 6)
    return np.append(edges, 1.0)


def _bin_index(jac, edges_b):
    return np.clip(np.searchsorted(edges_b, jac, side="right") - 1, 0, edges_b.shape[0] - 1)


def candidate_rate_over_seeds(truth: Truth, cfg: Config, seeds, backend="cpu") -> dict:
    """Candidate rate per similarity bin for several LSH seeds (``minhash.seed``, or ``cosine.seed``
    under cosine; pairs of distinct texts, each once).

    Pairs in a real corpus are not independent trials (a family of near-identical
    documents shares one outcome), so one seed's rate can sit many naive standard
    errors away from the S-curve; the spread over seeds shows the real uncertainty
    and the mean over seeds what the hash family does on average.
    """
    n = truth.n
    bands, rows = family_for(cfg, n).layout
    s_curve = family_curve(cfg.similarity)
    edges_b = _bins(truth.floor)
    er = truth.exact_rep
    _, once = np.unique(pair_keys(er[truth.left], er[truth.right], n), return_index=True)
    left, right, jac = truth.left[once], truth.right[once], truth.jaccard[once]
    k = _bin_index(jac, edges_b)
    count = np.bincount(k, minlength=edges_b.shape[0])
    nonempty = np.flatnonzero(truth.set_sizes > 0)
    row_of = np.full(n, -1, np.int64)
    row_of[nonempty] = np.arange(nonempty.shape[0])
    rates = []
    for seed in seeds:  # one signature pass per seed (a handful)
        bh = _band_hash_matrix(truth, cfg.with_overrides({SEED_KEYS[cfg.similarity]: int(seed)}), nonempty, backend)
        cand = shared_band(bh, row_of[left], row_of[right])
        rates.append(np.bincount(k, weights=cand, minlength=edges_b.shape[0]) / np.maximum(count, 1))
    rates = np.array(rates)
    expect = np.bincount(k, weights=s_curve(jac, bands, rows), minlength=edges_b.shape[0]) / np.maximum(count, 1)
    has = count > 0
    r6 = lambda a: [round(float(x), 6) if h else None for x, h in zip(a, has)]  # noqa: E731
    return {
        "bands": bands,
        "rows": rows,
        "seeds": [int(x) for x in seeds],
        "bin_lo": edges_b.tolist(),
        "distinct_text_pairs": count.astype(int).tolist(),
        "s_curve_mean": r6(expect),
        "mean": r6(rates.mean(axis=0)),
        "min": r6(rates.min(axis=0)),
        "max": r6(rates.max(axis=0)),
        "per_seed": [r6(x) for x in rates],
    }


def _rate(k, m):
    return round(float(k) / int(m), 6) if m else None


def score_run(truth: Truth, cluster, edges, cfg: Config, *, scored, rep=None, backend="cpu") -> dict:
    """Recall, precision, misses, per-bin candidate rates and cluster quality of one run on the sample.

    ``cluster``: survivor row per sample row (``RunResult.cluster``); ``edges``:
    the run's verified edges; ``scored``: every candidate pair the run scored
    (``RunResult.scored``: its star edges over all rounds); ``rep``: its
    exact-copy representative per row (``RunResult.rep``; default: none).
    The misses are explained from what the run itself did, never from a
    re-derivation of it.
    """
    t0 = time.perf_counter()
    n = truth.n
    t = cfg.verify_threshold
    bands, rows = family_for(cfg, n).layout
    s_curve = family_curve(cfg.similarity)
    left, right, jac = truth.left, truth.right, truth.jaccard
    cluster = np.asarray(cluster, np.int64)
    co = cluster[left] == cluster[right]

    # LSH candidates: pairs that share a band bucket (same band hash in at least one band)
    nonempty = np.flatnonzero(truth.set_sizes > 0)
    row_of = np.full(n, -1, np.int64)
    row_of[nonempty] = np.arange(nonempty.shape[0])
    bh = _band_hash_matrix(truth, cfg, nonempty, backend)
    cand = shared_band(bh, row_of[left], row_of[right])

    # the run's representatives and scored candidate pairs, for the account of misses
    rep = np.arange(n) if rep is None else np.asarray(rep, np.int64)
    star_keys = np.sort(pair_keys(np.asarray(scored.src, np.int64), np.asarray(scored.dst, np.int64), n))
    e_src, e_dst = np.asarray(edges.src, np.int64), np.asarray(edges.dst, np.int64)
    connected = _components(np.concatenate((e_src, np.flatnonzero(rep != np.arange(n)))),
                            np.concatenate((e_dst, rep[rep != np.arange(n)])), n, backend)

    # verified edges against the exact answer
    truth_keys = pair_keys(left, right, n)  # sorted: truth pairs are sorted by (left, right)
    ek = pair_keys(e_src, e_dst, n)
    pos = np.minimum(np.searchsorted(truth_keys, ek), max(truth_keys.shape[0] - 1, 0))
    found = truth_keys[pos] == ek if truth_keys.shape[0] else np.zeros(ek.shape[0], bool)
    edge_j = np.where(found, jac[pos] if jac.shape[0] else 0.0, -1.0)  # -1: below the floor
    edge_ok = edge_j >= t - 1e-12
    sim_err = (np.abs(edge_j[found] - np.asarray(edges.similarity)[found]).max()
               if edges.similarity is not None and found.any() else 0.0)

    # pairs put in one cluster: all of them counted from cluster sizes, the similar ones from the truth
    sizes = np.bincount(cluster, minlength=n).astype(np.float64)
    co_total = int((sizes * (sizes - 1) / 2).sum())
    # identical normalized texts with no shingle (e.g. empty after normalization) are exact copies:
    # correct pairs, though outside the Jaccard truth
    blank = (truth.set_sizes == 0) & ~truth.null
    _, same = np.unique(truth.exact_rep[blank] * (n + 1) + cluster[blank], return_counts=True)
    blank_pairs = int((same.astype(np.float64) * (same - 1) / 2).sum())
    true = jac >= t
    plus = jac >= t + 0.05 - 1e-12

    # where the misses come from
    miss = true & ~co
    rl, rr = rep[left[miss]], rep[right[miss]]
    is_star = np.isin(pair_keys(rl, rr, n), star_keys)
    conn = connected[left[miss]] == connected[right[miss]]
    c_miss = cand[miss]
    is_edge_verified = np.isin(pair_keys(left[miss], right[miss], n), np.sort(ek))
    misses = {
        "pairs_missed": int(miss.sum()),
        "never_candidate": int((~c_miss & ~conn).sum()),
        "candidate_edge_rejected_by_verification": int((c_miss & is_star & ~conn).sum()),
        "candidate_not_connected_through_bucket_centre": int((c_miss & ~is_star & ~conn).sum()),
        "connected_but_split_by_split_chains": int(conn.sum()),
        # must be 0: components join every verified edge (only split_chains may separate one)
        "verified_edge_not_coclustered": int((is_edge_verified & ~(conn & cfg.select.split_chains)).sum()),
        "note": "a missed pair (J >= threshold, not in one cluster) is 'never_candidate' when it shares no band "
                "bucket; a candidate is lost when its own star edge fails verification, or when it is no star edge "
                "(the run scores star edges around each bucket's centres, lsh.star_rounds rounds) and the edges through "
                "the centres fail; "
                "'connected_but_split_by_split_chains' counts pairs joined by verified edges but separated by "
                "select.split_chains (checked first); "
                "'verified_edge_not_coclustered' must be 0",
    }
    misses["never_candidate_at_or_above_threshold_plus_0.05"] = int((~c_miss & ~conn & plus[miss]).sum())

    # per similarity bin
    edges_b = _bins(truth.floor)
    k = _bin_index(jac, edges_b)
    count = np.bincount(k, minlength=edges_b.shape[0])
    ncand = np.bincount(k, weights=cand, minlength=edges_b.shape[0])
    nco = np.bincount(k, weights=co, minlength=edges_b.shape[0])
    expect = np.bincount(k, weights=s_curve(jac, bands, rows), minlength=edges_b.shape[0])
    # exact copies repeat one trial many times: count each pair of distinct texts once as well
    er = truth.exact_rep
    _, once = np.unique(pair_keys(er[left], er[right], n), return_index=True)
    d_count = np.bincount(k[once], minlength=edges_b.shape[0])
    d_cand = np.bincount(k[once], weights=cand[once], minlength=edges_b.shape[0])
    d_expect = np.bincount(k[once], weights=s_curve(jac[once], bands, rows), minlength=edges_b.shape[0])
    bins = []
    for b in range(edges_b.shape[0]):  # one row per bin (~15 bins)
        lo = float(edges_b[b])
        hi = float(edges_b[b + 1]) if b + 1 < edges_b.shape[0] else 1.0
        m = int(count[b])
        centre = lo if b + 1 == edges_b.shape[0] else (lo + hi) / 2
        p = ncand[b] / m if m else None
        md = int(d_count[b])
        pd_ = d_cand[b] / md if md else None
        bins.append({
            "lo": lo, "hi": hi, "label": "1.0 (identical sets)" if b + 1 == edges_b.shape[0] else f"[{lo:.2f}, {hi:.2f})",
            "pairs": m,
            "candidate_rate": _rate(ncand[b], m),
            "candidate_rate_stderr": round(float(np.sqrt(p * (1 - p) / m)), 6) if m else None,
            "s_curve_at_centre": round(float(s_curve(centre, bands, rows)), 6),
            "s_curve_mean_over_pairs": _rate(expect[b], m),
            "coclustered_rate": _rate(nco[b], m),
            "distinct_text_pairs": md,
            "distinct_candidate_rate": _rate(d_cand[b], md),
            "distinct_candidate_rate_stderr": round(float(np.sqrt(pd_ * (1 - pd_) / md)), 6) if md else None,
            "distinct_s_curve_mean": _rate(d_expect[b], md),
        })

    # cluster quality
    ideal = truth.components(t)
    clusters = {
        "pipeline_clusters": int(np.count_nonzero(sizes > 1)),
        "ideal_clusters": int(np.count_nonzero(np.bincount(ideal) > 1)),
        "ari_vs_ideal_components": round(adjusted_rand_index(cluster, ideal), 6),
        "note": "ideal components: connected components of every pair with exact J >= threshold and of exact copies",
    }
    if truth.labels is not None:
        lab = truth.labels
        ll, lr = cluster_pairs(lab)
        clusters.update({
            "ari_vs_labels": round(adjusted_rand_index(cluster, lab), 6),
            "ari_ideal_components_vs_labels": round(adjusted_rand_index(ideal, lab), 6),
            "labelled_clusters": int(np.count_nonzero(np.bincount(np.unique(lab, return_inverse=True)[1]) > 1)),
            "label_pair_recall": round(pair_recall(cluster, ll, lr), 6),
            "label_pair_precision": round(pair_precision(cluster, lab), 6),
        })

    # chaining: similarity of every clustered document to its survivor (exact Jaccard)
    member = (cluster != np.arange(n)) & (rep != rep[cluster])  # removed, not an exact copy of the survivor
    mm = np.flatnonzero(member)
    to_surv = _lookup(truth, mm, cluster[mm])
    hist_edges = np.round(np.arange(0.0, 1.0 + 1e-9, BIN_STEP), 6)
    hist = np.histogram(np.clip(to_surv, 0, 1), bins=hist_edges)[0]
    chaining = {
        "near_duplicates_removed": int(mm.shape[0]),
        "below_threshold_to_survivor": int((to_surv < t - 1e-12).sum()),
        "below_floor_to_survivor": int((to_surv < truth.floor).sum()),
        "similarity_to_survivor_quantiles": _quantiles(np.maximum(to_surv, 0.0)),
        "similarity_to_survivor_histogram": {"edges": hist_edges.tolist(), "counts": hist.astype(int).tolist()},
        "note": "exact Jaccard of each removed near duplicate to its survivor (values below the floor count as 0)",
    }

    # the deduplicated output: duplicates left in it, documents removed without resembling their survivor
    kept = cluster == np.arange(n)
    left_in = true & kept[left] & kept[right]
    output = {
        "kept": int(kept.sum()),
        "removed": int(n - kept.sum()),
        "duplicate_pairs_left_in_output": int(left_in.sum()),
        "documents_in_output_with_a_duplicate": int(np.unique(np.concatenate((left[left_in], right[left_in]))).shape[0]),
        "removed_below_threshold_to_survivor": chaining["below_threshold_to_survivor"],
        # pairs of which at most one document is kept: the recall of the output (pairs in one cluster count too)
        "removal_recall_at_threshold": _rate((true & ~(kept[left] & kept[right])).sum(), true.sum()),
        "removal_recall_at_threshold_plus_0.05": _rate((plus & ~(kept[left] & kept[right])).sum(), plus.sum()),
        "note": "pairs with exact J >= threshold whose two documents are both kept; this, not pair recall, is what "
                "select.split_chains trades against removing documents unlike their survivor",
    }

    ncoj = int((co & (jac >= truth.floor)).sum())
    section = {
        "pairs": {
            "threshold": t,
            "pairs_at_or_above_threshold": int(true.sum()),
            "pairs_at_or_above_threshold_plus_0.05": int(plus.sum()),
            "recall_at_threshold": _rate((co & true).sum(), true.sum()),
            "recall_at_threshold_plus_0.05": _rate((co & plus).sum(), plus.sum()),
            "coclustered_pairs": co_total,
            "coclustered_pairs_at_or_above_threshold": int((co & true).sum()),
            "coclustered_pairs_below_floor": co_total - ncoj,
            "cluster_pair_precision": _rate((co & true).sum() + blank_pairs, co_total) if co_total else 1.0,
            "candidate_recall_at_threshold": _rate((cand & true).sum(), true.sum()),
            "candidate_pairs_at_or_above_floor": int(cand.sum()),
        },
        "verified_edges": {
            "edges": int(ek.shape[0]),
            "at_or_above_threshold": int(edge_ok.sum()),
            "precision": _rate(edge_ok.sum(), ek.shape[0]) if ek.shape[0] else 1.0,
            "max_abs_difference_pipeline_vs_exact": round(float(sim_err), 12),
        },
        "misses": misses,
        "output": output,
        "bins": bins,
        "clusters": clusters,
        "chaining": chaining,
        "seconds_scoring": round(time.perf_counter() - t0, 3),
    }
    section["targets"] = targets(section, cfg)
    return section


def targets(section: dict, cfg: Config) -> dict:
    """The issue's targets at the default config, checked on one run."""
    p = section["pairs"]
    # split_chains separates similar pairs on purpose: its recall is that of the output (at most one of the
    # two documents kept), plain components' that of the clusters (both in one cluster)
    split = cfg.select.split_chains
    r5 = section["output"]["removal_recall_at_threshold_plus_0.05"] if split else p["recall_at_threshold_plus_0.05"]
    prec = section["verified_edges"]["precision"]
    return {
        "verified_edge_precision_is_1": {"value": prec, "met": prec == 1.0,
                                         "applies": cfg.verify.method == "exact"},
        "recall_at_threshold_plus_0.05_at_least_0.99": {
            "value": r5, "met": bool(r5 is None or r5 >= 0.99), "pairs": p["pairs_at_or_above_threshold_plus_0.05"],
            "measure": "pairs not both kept" if split else "pairs in one cluster"},
    }


def _lookup(truth: Truth, a, b) -> np.ndarray:
    """Exact Jaccard of pairs (a[k], b[k]) from the truth; -1 where below the floor."""
    keys = pair_keys(truth.left, truth.right, truth.n)
    q = pair_keys(np.asarray(a, np.int64), np.asarray(b, np.int64), truth.n)
    if keys.shape[0] == 0:
        return np.full(q.shape[0], -1.0)
    pos = np.minimum(np.searchsorted(keys, q), keys.shape[0] - 1)
    same_set = truth.exact_rep[np.asarray(a, np.int64)] == truth.exact_rep[np.asarray(b, np.int64)]
    return np.where(keys[pos] == q, truth.jaccard[pos], np.where(same_set, 1.0, -1.0))


def _components(src, dst, n, backend):
    return _host(get_backend(backend).components(np.asarray(src, np.int64), np.asarray(dst, np.int64), n))


def _host(x):
    """A NumPy array from a backend's result (CuPy arrays are copied to the host)."""
    return to_host(x)


def _quantiles(values) -> dict:
    values = np.asarray(values, np.float64)
    if values.shape[0] == 0:
        return {}
    qs = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 1.0)
    return {f"p{int(q * 100)}": round(float(v), 4) for q, v in zip(qs, np.quantile(values, qs))}


# ---------------------------------------------------------------- the evaluate command

DEFAULT_SAMPLE = 10_000
EVAL_JSON = "evaluation.json"
EVAL_PNG = "evaluation.png"
EVAL_KEYS = ("gpu_dedup_version", "corpus", "runs")  # what marks an evaluation.json gpu_dedup wrote


class Evaluation:
    """A sample of a corpus, its exact answer, and pipeline runs scored against it.

    The sample (``sample`` documents drawn without replacement with ``seed``,
    kept in input order; all of them when the corpus is smaller or ``sample``
    is 0) is written as one Parquet shard in ``workdir`` and deduplicated with
    the real pipeline, so the pipeline's pairs and the exact pairs are over the
    same documents.  Sampling keeps a pair with probability ~(sample/N)^2, so a
    sample holds fewer duplicates than the corpus; the rates (recall,
    precision, candidate rate per bin) are what it measures.
    """

    def __init__(self, inputs, cfg: Config, workdir, *, sample: int = DEFAULT_SAMPLE, seed: int = 0,
                 floor: float = 0.3, label_column: str | None = None):

        if sample < 0:
            raise ConfigError(f"sample = {sample} must be >= 0 (0: the whole corpus); e.g. --sample 10000")
        if not 0.0 < floor <= cfg.verify_threshold:
            raise ConfigError(f"floor = {floor} must be in (0, threshold = {cfg.verify_threshold}]; e.g. --floor 0.3")
        t0 = time.perf_counter()
        self.cfg = cfg
        self.workdir = Path(workdir)
        self.backend = get_backend(cfg.backend)
        score = cfg.select.score_read
        shards = storage.discover(inputs, cfg.input.format)
        corpus = read(shards, cfg.input, score)
        total = len(corpus)
        if total == 0:
            raise InputError(f"the corpus {inputs!r} has no documents; nothing to evaluate")
        if sample and total > sample:
            rows = np.sort(np.random.default_rng(seed).choice(total, sample, replace=False))
        else:
            rows = np.arange(total)
        table = corpus.table.take(pa.array(rows))
        vectors = None
        if corpus.vectors is not None:  # the sample's vectors, as a list<float32> column "vector"
            column = pa.chunked_array([c.cast(pa.list_(pa.float32())) for _, _, c in corpus.vectors],
                                      pa.list_(pa.float32())).take(pa.array(rows))
            table = table.append_column("vector", column)
            vectors = vec.from_arrow(column, bad_vectors="keep")
        labels = None
        if label_column:
            try:
                lab = read(shards, replace(cfg.input, id_column=label_column)).table.column("id")
            except InputError as exc:  # read as the id column: name the option the user gave
                raise InputError(_label_message(str(exc))) from None
            labels = label_codes(lab.take(pa.array(rows)))
        self.sample_dir = self.workdir / "sample"
        self.sample_dir.mkdir(parents=True, exist_ok=True)
        cols = ["id", "text"] + (["score"] if score else []) + (["vector"] if vectors is not None else [])
        storage.atomic_write_parquet(self.sample_dir / "sample.parquet", table.select(cols), "zstd")
        self.ids = table.column("id")
        self.truth = exact_truth(table.column("text"), cfg, floor, labels, self.backend, vectors)
        self.info = {
            "inputs": [s.path for s in shards],
            "documents": total,
            "sample": int(rows.shape[0]),
            "sample_fraction": round(rows.shape[0] / total, 6),
            "seed": seed,
            "label_column": label_column,
            "floor": floor,
            "exact_pairs_at_or_above_floor": int(self.truth.left.shape[0]),
            "documents_with_shingles": int((self.truth.set_sizes > 0).sum()),
            "distinct_shingles": int(self.truth.set_sizes.sum()),
            "seconds": {"sample": round(time.perf_counter() - t0 - sum(self.truth.seconds.values()), 3),
                        **self.truth.seconds},
        }

    def sample_config(self, cfg: Config | None = None) -> Config:
        cfg = cfg or self.cfg
        over = {"input.format": "parquet", "input.text_column": "text", "input.id_column": "id"}
        if cfg.input.vector_column:
            over["input.vector_column"] = "vector"
        if cfg.select.keep == "score":
            over["select.score_column"] = "score"
        if cfg.cluster.workers is not None or cfg.cluster.scheduler:
            # scoring needs the run's scored edges, which only one process keeps; a Dask run gives the same
            # outputs (byte-identical), so the sample runs in this process whatever the config says
            if not getattr(self, "_said_one_process", False):
                self._said_one_process = True
                log.info("the evaluation runs the sample in one process (cluster.workers / cluster.scheduler are "
                         "not used: a cluster run gives the same result)")
            over |= {"cluster.workers": None, "cluster.scheduler": None, "cluster.workers_per_gpu": 1}
        return cfg.with_overrides(over)

    def run(self, cfg: Config | None = None, name: str = "run") -> dict:
        """Run the pipeline on the sample with ``cfg`` (default: the evaluation's) and score it."""
        cfg = self.sample_config(cfg)
        t0 = time.perf_counter()
        result = run_dedup(self.sample_dir / "sample.parquet", self.workdir / name, cfg)
        seconds = time.perf_counter() - t0
        section = score_run(self.truth, result.cluster, result.edges, cfg, scored=result.scored, rep=result.rep,
                            backend=self.backend)
        bands, rows = result.report["lsh"]["bands"], result.report["lsh"]["rows"]
        c = result.report["counts"]
        section["run"] = {
            "name": name,
            "bands": bands,
            "rows": rows,
            "split_chains": cfg.select.split_chains,
            "verify": cfg.verify.method,
            "seconds": round(seconds, 3),
            "counts": {k: c[k] for k in ("documents_read", "kept", "removed", "exact_duplicates", "near_duplicates",
                                         "clusters", "candidate_edges", "verified_edges", "accounted")
                       if k in c} | ({"chain_split_ejected": c["chain_split_ejected"]}
                                     if "chain_split_ejected" in c else {}),
        }
        return section


def evaluate(inputs, cfg: Config = Config(), *, output_dir=None, sample: int = DEFAULT_SAMPLE, seed: int = 0,
             floor: float | None = None, label_column: str | None = None, compare_split_chains: bool = False,
             plot: bool = True, keep_runs: bool = False, lsh_seeds: int = 1) -> dict:
    """Evaluate the pipeline against exact all-pairs Jaccard on a sample of ``inputs``.

    Returns the report (see ``score_run``); with ``output_dir`` writes
    ``evaluation.json`` and, when matplotlib is installed and ``plot``,
    ``evaluation.png``.  ``compare_split_chains`` scores a second run with
    ``select.split_chains`` flipped.  ``lsh_seeds`` > 1 adds the candidate rate
    per bin for that many MinHash seeds (see ``candidate_rate_over_seeds``).
    ``floor`` (default min(0.3, threshold)):
    the lowest exact similarity enumerated and binned.  Pipeline outputs on the sample go to a
    temporary directory (``keep_runs``: to ``output_dir/runs``).
    """
    import tempfile

    t0 = time.perf_counter()
    floor = min(0.3, cfg.verify_threshold) if floor is None else floor
    if lsh_seeds < 1:
        raise ConfigError(f"lsh_seeds = {lsh_seeds} must be >= 1 (1: the configured seed only); e.g. --lsh-seeds 8")
    if output_dir is not None:  # before the work: never overwrite a file of the user's, nor write into the inputs
        check_report_files(output_dir, EVAL_JSON, EVAL_PNG, EVAL_KEYS, inputs)
    with tempfile.TemporaryDirectory(prefix="gpu-dedup-eval-") as tmp:
        work = Path(output_dir) / "runs" if (keep_runs and output_dir) else Path(tmp)
        ev = Evaluation(inputs, cfg, work, sample=sample, seed=seed, floor=floor, label_column=label_column)
        mode = "split_chains" if cfg.select.split_chains else "components"
        runs = {mode: ev.run(cfg, mode)}
        if compare_split_chains:
            other = "components" if cfg.select.split_chains else "split_chains"
            runs[other] = ev.run(cfg.with_overrides({"select.split_chains": not cfg.select.split_chains}), other)
    over_seeds = None
    if lsh_seeds > 1:
        t1 = time.perf_counter()
        over_seeds = candidate_rate_over_seeds(ev.truth, cfg, cfg.minhash.seed + np.arange(lsh_seeds), ev.backend)
        over_seeds["seconds"] = round(time.perf_counter() - t1, 3)
    report = build_evaluation_report(ev, cfg, runs, time.perf_counter() - t0)
    if over_seeds is not None:
        report["candidate_rate_over_seeds"] = over_seeds
    if output_dir is not None:
        write_evaluation(report, output_dir, plot=plot)
    return report


def build_evaluation_report(ev: Evaluation, cfg: Config, runs: dict, wall: float) -> dict:
    import datetime as _dt
    import platform


    family = family_for(cfg, ev.truth.n)
    bands, rows = family.layout
    lsh = {k: v for k, v in curve_section(family.name, cfg.lsh.threshold, bands, rows).items() if k != "s_curve"}
    lsh.update(similarity=family.name, verify_threshold=cfg.verify_threshold)
    if family.name == "jaccard":
        lsh["num_perm"] = cfg.minhash.num_perm
    else:
        lsh["bits"] = cfg.cosine.bits
    return {
        "gpu_dedup_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform(),
                    "processor": platform.processor() or platform.machine(), "cpus": _cpus(),
                    "backend": ev.backend.mode},
        "config": cfg.to_dict(),
        "lsh": lsh,
        "corpus": ev.info,
        "runs": runs,
        "wall_seconds": round(wall, 3),
    }


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def write_evaluation(report: dict, output_dir, plot: bool = True) -> dict:
    """Write ``evaluation.json`` (and ``evaluation.png`` when matplotlib is installed); returns the paths."""
    import json


    out = Path(output_dir)
    check_report_files(out, EVAL_JSON, EVAL_PNG, EVAL_KEYS)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / EVAL_JSON}
    atomic_write_bytes(paths["json"], (json.dumps(report, indent=2, default=_json_default) + "\n").encode())
    if plot:

        png = plot_evaluation(report, out / EVAL_PNG)
        if png is not None:
            paths["png"] = png
    return paths


def _json_default(x):
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"cannot write {type(x).__name__} to JSON")


def summary(report: dict) -> str:
    """Human-readable lines about an evaluation."""
    c = report["corpus"]
    cosine = report.get("lsh", {}).get("similarity") == "cosine"
    name, J, family = ("cosine", "cos", "cosine (random-projection)") if cosine else ("Jaccard", "J", "MinHash")
    lines = [f"sample: {c['sample']:,} of {c['documents']:,} documents (seed {c['seed']}); "
             f"{c['exact_pairs_at_or_above_floor']:,} pairs with exact {name} >= {c['floor']} "
             f"(all-pairs {c['seconds']['all_pairs']:.1f}s)"]
    over = report.get("candidate_rate_over_seeds")
    if over:
        dev = [(abs(m - e), lo) for m, e, lo, c in zip(over["mean"], over["s_curve_mean"], over["bin_lo"],
                                                       over["distinct_text_pairs"]) if m is not None and c >= 100]
        if dev:
            worst = max(dev)
            lines.append(f"candidate rate over {len(over['seeds'])} {family} seeds: the mean is within {worst[0]:.4f} "
                         f"of the S-curve in every bin with >= 100 pairs (largest gap in the bin from {worst[1]:.2f})")
        else:
            lines.append(f"candidate rate over {len(over['seeds'])} {family} seeds: no similarity bin has >= 100 pairs "
                         "to compare with the S-curve (each bin's rate is in evaluation.json)")
    for name, r in report["runs"].items():
        p, v, m, cl = r["pairs"], r["verified_edges"], r["misses"], r["clusters"]
        t = p["threshold"]
        lines.append(f"[{name}] {r['run']['bands']} bands x {r['run']['rows']} rows, verify {r['run']['verify']}, "
                     f"split_chains {r['run']['split_chains']}: {r['run']['counts']['removed']:,} removed")
        lines.append(f"  recall: {_fmt(p['recall_at_threshold'])} of {p['pairs_at_or_above_threshold']:,} pairs with "
                     f"{J} >= {t}; {_fmt(p['recall_at_threshold_plus_0.05'])} of "
                     f"{p['pairs_at_or_above_threshold_plus_0.05']:,} with {J} >= {t + 0.05:.2f}")
        lines.append(f"  precision: verified edges {_fmt(v['precision'])} ({v['edges']:,} edges); "
                     f"pairs in one cluster {_fmt(p['cluster_pair_precision'])} ({p['coclustered_pairs']:,} pairs)")
        lines.append(f"  misses: {m['pairs_missed']:,} = never candidate {m['never_candidate']:,} + "
                     f"edge rejected {m['candidate_edge_rejected_by_verification']:,} + not connected through "
                     f"bucket centre {m['candidate_not_connected_through_bucket_centre']:,} + split by "
                     f"split_chains {m['connected_but_split_by_split_chains']:,}")
        extra = f"; vs labels {cl['ari_vs_labels']:.4f}" if "ari_vs_labels" in cl else ""
        ch = r["chaining"]
        lines.append(f"  ARI vs ideal components {cl['ari_vs_ideal_components']:.4f}{extra}; "
                     f"{ch['below_threshold_to_survivor']:,} of {ch['near_duplicates_removed']:,} removed near "
                     f"duplicates below the threshold to their survivor")
        o = r["output"]
        lines.append(f"  output: {o['kept']:,} kept; {o['duplicate_pairs_left_in_output']:,} pairs with {J} >= {t} left "
                     f"in it ({o['documents_in_output_with_a_duplicate']:,} documents); pairs not both kept "
                     f"{_fmt(o.get('removal_recall_at_threshold'))} ({J} >= {t}), "
                     f"{_fmt(o.get('removal_recall_at_threshold_plus_0.05'))} ({J} >= {t + 0.05:.2f})")
        tg = r["targets"]
        lines.append("  targets: " + ", ".join(
            f"{k} {'met' if v['met'] else 'NOT met'}{'' if v.get('applies', True) else ' (does not apply)'}"
            for k, v in tg.items()))
    return "\n".join(wrap(line) for line in lines)


def _fmt(x) -> str:
    return "n/a" if x is None else f"{x:.4f}"
