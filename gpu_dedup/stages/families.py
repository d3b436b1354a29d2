"""Similarity families: what differs between Jaccard (MinHash) and cosine (random projections).

The stage sequence (:mod:`gpu_dedup.run.sequence`) and its executors are
written once; the family chosen from the config (:func:`family_for`) answers
the few questions where the two LSH families differ:

============================  =================================  ==========================================
question                      ``jaccard``                        ``cosine``
============================  =================================  ==========================================
what a row is                 normalized text                    a vector (``input.vector_column``), or the
                                                                 hashed tf / tf-idf vector of the text
exact copies                  same normalized text               same vector bytes (or same normalized text)
signature                     MinHash values (uint32)            packed sign bits of ``cosine.bits``
                                                                 hyperplanes (uint64 words)
row without a signature       no shingle                         zero / NaN / other-length vector, empty text
(bands, rows)                 ``cfg.layout``                     ``cfg.cosine_layout_for(rows of the run)``
band hashes                   ``stages.bands.band_hashes``         ``stages.projections.band_hashes``
exact similarity              Jaccard of shingle sets            exact cosine (dense, or sparse tf-idf)
signature similarity          fraction of equal values           ``cos(pi * hamming / D)``
S-curve                       ``1-(1-s^r)^b``                    ``1-(1-(1-arccos(s)/pi)^r)^b``
============================  =================================  ==========================================

A family works on a :class:`RowData` (the rows of a block, or of the whole
corpus in one process) and returns host or backend arrays; it holds no
corpus.  Buckets, star edges, components, survivors, outputs, checkpoints
and the report are the same code for both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import (
    array_module,
    get_backend,
    texts_for,
    to_device,
    to_host,
    to_module,
)
from gpu_dedup.backends.arrow_arrays import null_mask
from gpu_dedup.config import Config
from gpu_dedup.curves import curve_section
from gpu_dedup.kernels.cosine_scalar import FM1, GOLDEN
from gpu_dedup.kernels.params import hash_params
from gpu_dedup.stages import projections, vectors
from gpu_dedup.stages.bands import band_hashes as minhash_band_hashes
from gpu_dedup.stages.exact import NO_KEY, exact_keys
from gpu_dedup.stages.minhash import signatures as minhash_signatures
from gpu_dedup.stages.verify import (
    exact_similarity,
    hamming_cosine,
    pair_rows,
    signature_similarity,
    text_cosine_similarity,
    vector_norms,
)


@dataclass
class RowData:
    """The rows a family computes on: normalized texts and/or vectors of one block (or the corpus)."""

    strings: Any = None  # StringBuffers of the normalized texts (jaccard, cosine from text)
    vectors: vectors.Vectors | None = None  # cosine with input.vector_column
    norms: np.ndarray | None = field(default=None, repr=False)  # cached vector norms

    def __len__(self) -> int:
        return len(self.vectors) if self.vectors is not None else len(self.strings)

    def vector_norms(self, backend="cpu"):
        """Norms of the vectors (every backend computes the same bits), where the vectors are."""
        if self.norms is None:
            assert self.vectors is not None  # a vector family's rows
            self.norms = vector_norms(self.vectors.matrix, backend)
        return self.norms


@dataclass(frozen=True)
class RowSignatures:
    """Signatures of some rows: ``values`` (one row per signed row) and whether each row has one."""

    values: np.ndarray  # MinHash values (n, perms) uint32, or packed bits (n, bits / 64) uint64
    usable: np.ndarray  # bool: the row has a signature (shingles / a direction) and is bucketed
    features: np.ndarray  # int64 per row: shingles (jaccard), or the status code (cosine)


class Family(ABC):
    """Base: see the module docstring.  ``layout`` is (bands, rows) for this run."""

    name = ""
    uses_text = True  # the normalized text is computed (exact keys, signatures or verification read it)
    # a pair's similarity is the same bits either way round, so a pair the verify stage scored is not scored
    # again by the select stage (ratios of counts: Jaccard of sets, equal signature values)
    symmetric = False

    def __init__(self, cfg: Config, rows_in_run: int | None = None):
        self.cfg = cfg
        self.rows_in_run = rows_in_run
        self._layout: tuple[int, int] | None = None

    @property
    def layout(self) -> tuple[int, int]:
        """(bands, rows) of this run (derived on first use)."""
        layout = self._layout
        if layout is None:
            layout = self._layout = self._derive_layout()
        return layout

    # ---- rows --------------------------------------------------------------------------------
    def null_rows(self, table: pa.Table, vecs=None) -> np.ndarray:
        """Rows that take no part: null text, or (with ``vecs``, the rows' Vectors) a null vector."""
        if vecs is not None:
            return np.asarray(vecs.status == projections.NULL_ROW)
        return null_mask(table.column("text")) if table.num_rows else np.zeros(0, bool)

    needs_stats = False  # corpus-wide statistics (``stats`` of every block, then ``prepare``) are needed

    def prepare(self, parts: list) -> "Family":
        """The family with corpus-wide statistics (``stats`` of every block, in block order)."""
        return self

    def stats(self, data: RowData, backend="cpu"):
        return None

    def exact_keys(self, data: RowData, backend="cpu"):
        return exact_keys(data.strings, self.cfg.minhash.seed, backend)

    # ---- signatures and bands ------------------------------------------------------------------
    @property
    def keep_signatures(self) -> bool:
        """Band data keeps the signature values (signature verification, an index)."""
        return False

    @abstractmethod
    def _derive_layout(self) -> tuple[int, int]:
        """(bands, rows) for ``rows_in_run`` rows."""

    @abstractmethod
    def signatures(self, data: RowData, docs, backend="cpu") -> RowSignatures:
        """Signatures of rows ``docs`` of ``data``."""

    @abstractmethod
    def empty_values(self, xp=np):
        """A (0, width) signature matrix of the family's dtype."""

    @abstractmethod
    def band_hashes(self, values, backend="cpu"):
        """(n, bands) uint64 band hashes of signature rows ``values``."""

    @abstractmethod
    def signature_info(self, sig_features, usable) -> tuple[dict, dict]:
        """(stage info, run counts) of the signatures stage."""

    CONSTANT_INFO = ("permutations", "bits", "source")  # the same in every block's signature_info

    def combine_signature_info(self, parts: list) -> tuple[dict, dict]:
        """The signature_info of the whole corpus from that of its blocks (in block order)."""
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return self.signature_info(np.zeros(0, np.int64), np.zeros(0, bool))
        out = []
        for j in range(2):
            merged: dict = {}
            for p in parts:
                for k, v in p[j].items():
                    merged[k] = v if k in self.CONSTANT_INFO or k not in merged else merged[k] + v
            out.append(merged)
        return out[0], out[1]

    # ---- verification ---------------------------------------------------------------------------
    @abstractmethod
    def exact_similarity(self, data: RowData, left, right, backend="cpu", progress=None, clock=None):
        """Exact similarity of row pairs of ``data``; ``clock``: a dict given the seconds of its steps (see
        :func:`gpu_dedup.stages.verify._by_chunks`), where the family's pairs are scored in chunks."""

    @abstractmethod
    def signature_similarity(self, values, left, right, backend="cpu"):
        """The similarity estimated from signature rows ``values``."""

    def pair_similarity(self, data: RowData | None, values, left, right, backend="cpu", progress=None, clock=None):
        """Similarity of row pairs by ``verify.method``: exact (``data``) or from signatures (``values``)."""
        if self.cfg.verify.method == "exact":
            assert data is not None  # the rows' texts or vectors
            return self.exact_similarity(data, left, right, backend, progress, clock)
        if progress is not None:
            progress(len(left))
        return self.signature_similarity(values, left, right, backend)

    # ---- the report ---------------------------------------------------------------------------
    def report_section(self, threshold: float, verify_threshold: float) -> dict:
        b, r = self.layout
        return {"similarity": self.name, **curve_section(self.name, threshold, b, r), "verify_threshold": verify_threshold}


class Jaccard(Family):
    name = "jaccard"
    symmetric = True

    def _derive_layout(self):
        return self.cfg.layout

    @property
    def keep_signatures(self):
        return self.cfg.verify.method != "exact"

    def signatures(self, data, docs, backend="cpu"):
        cfg = self.cfg
        sig = minhash_signatures(data.strings, cfg.minhash, num_perm=cfg.signature_perms, docs=docs, backend=backend)
        shingles = sig.shingles
        return RowSignatures(sig.values, shingles > 0, shingles)

    def band_hashes(self, values, backend="cpu"):
        b, r = self.layout
        return minhash_band_hashes(values, b, r, hash_params(self.cfg.minhash.seed, self.cfg.minhash.num_perm), backend)

    def empty_values(self, xp=np):
        dtype = hash_params(self.cfg.minhash.seed, self.cfg.minhash.num_perm).signature_dtype
        return xp.empty((0, self.cfg.signature_perms), dtype=dtype)

    def signature_info(self, features, usable):
        n = int(features.shape[0])
        no = int((~usable).sum())
        return ({"documents": n, "permutations": self.cfg.signature_perms, "shingles": int(features.sum()),
                 "no_shingles": no}, {"minhash_documents": n, "no_shingles": no})

    def exact_similarity(self, data, left, right, backend="cpu", progress=None, clock=None):
        return exact_similarity(left, right, data.strings, self.cfg.minhash, backend, progress=progress, clock=clock)

    def signature_similarity(self, values, left, right, backend="cpu"):
        return signature_similarity(left, right, values, backend)

    def report_section(self, threshold, verify_threshold):
        out = super().report_section(threshold, verify_threshold)
        computed, n = self.cfg.signature_perms, self.cfg.minhash.num_perm
        b, r = self.layout
        out.update({
            "num_perm": n, "permutations_computed": computed, "permutations_not_computed": n - computed,
            "permutations_computed_but_unused_by_bands": computed - b * r,
            "note": ("only the bands*rows permutations the bands use are computed (verification reads the texts)"
                     if computed < n else
                     "all permutations are computed; those beyond bands*rows serve the similarity estimate")})
        return out


class Cosine(Family):
    """Random-projection signatures of vectors (``input.vector_column``) or of hashed term vectors of the text."""

    name = "cosine"

    def __init__(self, cfg: Config, rows_in_run: int | None = None, idf=None):
        super().__init__(cfg, rows_in_run)
        self.idf = idf
        self.from_text = cfg.input.vector_column is None
        self.uses_text = self.from_text
        self.needs_stats = self.from_text and cfg.cosine.text.weighting == "tfidf" and idf is None

    def _derive_layout(self):
        return self.cfg.cosine_layout_for(self.rows_in_run)

    @property
    def keep_signatures(self) -> bool:
        return True  # packed bits are small (bits / 8 bytes a row): kept for the index and estimates

    # ---- rows
    def load_vectors(self, column, shard: str | None, row_offset: int, dim: int | None = None,
                     dim_source: str | None = None) -> vectors.Vectors:
        """Vectors of one shard's ``vector`` column (bad rows per ``cosine.bad_vectors``, named by shard and row);
        ``dim_source`` says where a given ``dim`` comes from (messages)."""
        return vectors.from_arrow(column, shard=shard, row_offset=row_offset, bad_vectors=self.cfg.cosine.bad_vectors,
                                  name=f"vector column {self.cfg.input.vector_column!r}", dim=dim,
                                  dim_source=dim_source)

    def stats(self, data, backend="cpu"):
        """Document frequencies of the hashed features of a block (tf-idf weighting only), counted where
        ``backend`` computes (device texts: on the device); the table (``2**idf_bits`` counts) comes back to
        the host, where the blocks' tables are summed and the idf computed."""
        t = self.cfg.cosine.text
        if not self.from_text or t.weighting != "tfidf":
            return None
        be = get_backend(backend)
        df, n = vectors.document_frequencies(texts_for(data.strings, be), t.shingle, t.ngram, t.idf_bits, backend=be)
        return to_host(df), n

    def prepare(self, parts):
        t = self.cfg.cosine.text
        if not self.from_text or t.weighting != "tfidf" or self.idf is not None:
            return self
        df = np.zeros(1 << t.idf_bits, np.int64)
        docs = 0
        for p_df, p_n in parts:  # one step per block
            df += p_df
            docs += p_n
        return Cosine(self.cfg, self.rows_in_run, vectors.idf_table(df, docs, t.idf_bits))

    def exact_keys(self, data, backend="cpu"):
        if self.from_text:
            return super().exact_keys(data, backend)
        return vector_keys(data.vectors)

    # ---- signatures and bands
    def signatures(self, data, docs, backend="cpu"):
        c = self.cfg.cosine
        if self.from_text:  # SimHash where the backend computes: device texts stay on the device, as the bits
            t = c.text
            be = get_backend(backend)
            sig = projections.text_signatures(texts_for(data.strings, be), c.bits, c.seed, t.shingle, t.ngram,
                                              idf=self.idf, docs=docs, backend=be)
            return RowSignatures(sig.bits, sig.status == projections.OK, sig.status.astype(np.int64))
        docs = np.asarray(to_host(docs), np.int64)
        v = data.vectors
        if docs.shape[0] and int(docs[-1]) - int(docs[0]) + 1 == docs.shape[0]:  # a run of rows: a view
            matrix, status = v.matrix[docs[0]:docs[-1] + 1], v.status[docs[0]:docs[-1] + 1]
        else:
            matrix, status = v.matrix[docs], v.status[docs]
        sig = projections.signatures(matrix, c.bits, c.seed, status=status)
        return RowSignatures(sig.bits, sig.status == projections.OK, sig.status.astype(np.int64))

    def band_hashes(self, values, backend="cpu"):
        """Band hashes where the signature bits are (the array-module lines on the device, the kernel on the
        host: the same bits)."""
        b, r = self.layout
        xp = array_module(values)
        return projections.band_hashes(xp.ascontiguousarray(values), b, r, xp)

    def empty_values(self, xp=np):
        return xp.zeros((0, self.cfg.cosine.bits // 64), dtype=xp.uint64)

    def signature_info(self, features, usable):
        counts = vectors.status_counts(features)
        n = int(features.shape[0])
        b, r = self.layout
        info = {"documents": n, "bits": self.cfg.cosine.bits, "source": "text" if self.from_text else "vectors",
                **{k: v for k, v in counts.items() if k != "ok"}}
        run_counts = {"signed_documents": n, "unsigned": int((~usable).sum()),
                      **{f"unsigned_{k}": v for k, v in counts.items() if k != "ok"}}
        return info, run_counts

    # ---- verification
    def exact_similarity(self, data, left, right, backend="cpu", progress=None, clock=None):
        if self.from_text:  # sparse dot products where the backend computes (device texts: on the device)
            t = self.cfg.cosine.text
            be = get_backend(backend)
            return text_cosine_similarity(left, right, texts_for(data.strings, be), t.shingle, t.ngram, self.idf,
                                          progress=progress, backend=be, clock=clock)
        out = vector_cosine(data, left, right, get_backend(backend))
        if progress is not None:
            progress(len(left))
        return out

    def signature_similarity(self, values, left, right, backend="cpu"):
        """``cos(pi * hamming / bits)`` of packed signature rows (on the host: a popcount per word)."""
        return hamming_cosine(np.asarray(to_host(left), np.int64), np.asarray(to_host(right), np.int64),
                              np.ascontiguousarray(to_host(values)))

    def report_section(self, threshold, verify_threshold):
        out = super().report_section(threshold, verify_threshold)
        c = self.cfg.cosine
        out.update({"bits": c.bits, "source": "text" if self.from_text else f"vector column {self.cfg.input.vector_column!r}",
                    "note": "a pair becomes a candidate when all rows bits of one band of its random-projection "
                            "signatures agree; verification: "
                            + ("exact cosine" if self.cfg.verify.method == "exact" else "cos(pi * hamming / bits)")})
        if self.from_text:
            out["text_vectors"] = {"shingle": c.text.shingle, "ngram": c.text.ngram, "weighting": c.text.weighting}
        return out



def vector_cosine(data: RowData, left, right, be):
    """Exact cosine (rule 8 of kernels/cosine_scalar.py) of row pairs of ``data.vectors`` on backend ``be``.

    Where ``be`` computes in the memory the vectors are in, the pairs are scored in place.  Vectors on the
    host with a device backend: only the rows the pairs name are copied to the device, once, and scored
    there.  The results are where the pairs (or the vectors) were; the bits are the same on every backend
    (one scalar source, a fixed summation order).
    """
    assert data.vectors is not None  # a vector family's rows
    matrix = data.vectors.matrix
    if be.holds(matrix):  # in the backend's memory: nothing is copied, else only the rows the pairs name
        return be.cosine_pairs(matrix, data.vector_norms(be), left, right)
    pxp = array_module(left, right)  # the pairs' array module: the distinct rows are found where the pairs are
    nodes, a, b = pair_rows(to_device(left, pxp).astype(pxp.int64, copy=False),
                            to_device(right, pxp).astype(pxp.int64, copy=False), pxp)
    rows = to_device(np.ascontiguousarray(matrix[to_host(nodes)], np.float32), be.xp)
    out = be.cosine_pairs(rows, be.row_norms(rows), a, b)
    return to_module(out, pxp)  # where the pairs were


def vector_keys(v: vectors.Vectors) -> np.ndarray:
    """(n, 3) uint64 exact keys of vectors: (dimension, two hashes of the float32 bytes).

    Rows without a direction (status not ok) get keys unique to the row, so
    they never form an exact group.  One array step per 8 bytes of a row.
    """
    m = np.ascontiguousarray(v.matrix, dtype=np.float32)
    n, d = m.shape
    if d % 2:
        m = np.concatenate([m, np.zeros((n, 1), np.float32)], axis=1)
    words = m.view(np.uint64)  # (n, ceil(d / 2))
    h1 = np.full(n, np.uint64(0x243F6A8885A308D3))
    h2 = np.full(n, np.uint64(0x13198A2E03707344))
    with np.errstate(over="ignore"):
        for j in range(words.shape[1]):  # over the dimensions, each step a whole column of rows
            w = words[:, j]
            h1 = projections.fmix64(h1 ^ (w + np.uint64(GOLDEN)))
            h2 = projections.fmix64((h2 + w) * np.uint64(FM1) + np.uint64(j + 1))
    keys = np.column_stack([np.full(n, d, np.uint64), h1, h2])
    bad = np.flatnonzero(v.status != projections.OK)
    keys[bad, 0] = NO_KEY
    keys[bad, 1] = bad.astype(np.uint64)
    keys[bad, 2] = bad.astype(np.uint64)
    return keys


def family_for(cfg: Config, rows_in_run: int | None = None) -> Family:
    """The family of ``cfg.similarity``, with the (bands, rows) of a run over ``rows_in_run`` rows."""
    if cfg.similarity == "cosine":
        return Cosine(cfg, rows_in_run)
    return Jaccard(cfg, rows_in_run)


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def part_signature_info(sig, family) -> tuple:
    """A block's signature_info, counted where its signatures are (on a device: a few numbers cross)."""
    return family.signature_info(sig["features"], sig["usable"])


def lsh_count(sig) -> dict:
    return {"rows": int(sig["usable"].sum())}
