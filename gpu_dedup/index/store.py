"""A persisted index for incremental dedup and online queries.

Layout of an index directory (format ``gpu_dedup-index``, version 1)::

    manifest.json          format, format_version, fingerprint, config, documents, segments
    seg-00000/docs.arrow   doc, id, kept, survivor, key_len, key_h1, key_h2, text[, signature]
    seg-00000/bands.arrow  band, hash, doc   (sorted by band, hash, doc)
    seg-00000/centers.arrow band, hash, round, doc  (sorted; see below)
    seg-00001/...          one segment per build or append; old segments never change

``*.arrow`` files are Arrow IPC files (uncompressed, memory-mapped on open, so
opening costs almost nothing and rows are fetched by position).  ``doc``
numbers documents across segments in the order they were added; ``survivor``
is the doc number of the survivor of a document's cluster; ``text`` is the
normalized text (for exact verification and similarity); the key columns are
the exact-duplicate keys.  Bands hold the documents that went through LSH
(exact-group representatives with at least one shingle).  ``centers`` hold
the centre :func:`gpu_dedup.stages.edges.star_rounds` chose for a bucket at each
round >= 1 (round 0's centre is the bucket's smallest document): new
documents meet exactly this sequence of centres in a full dedup, so an
incremental run replays it instead of re-verifying the indexed members.  The manifest is
replaced atomically after a segment is complete, so a crash never leaves a
half-added segment visible.

Every document is kept in the index, removed ones included: a new document
that resembles only a document removed earlier must still be removed, exactly
as a full dedup of everything would (see ``tests/test_index.py``).

The fingerprint covers what changes hash values and matching (normalize,
minhash, bands x rows); an index opened with another config fails at once.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup import api
from gpu_dedup.api import DedupResult
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.kernels.params import HASH_FAMILY_NAME, hash_params
from gpu_dedup.run.local import run
from gpu_dedup.stages.exact import exact_keys
from gpu_dedup.stages.lsh import band_hashes
from gpu_dedup.stages.minhash import signatures
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.read_shards import memory_shard
from gpu_dedup.stages.verify import exact_similarity
from gpu_dedup.stages.write_shards import ROW, atomic_write_bytes

FORMAT = "gpu_dedup-index"
FORMAT_VERSION = 2  # 2: hash family v2 (kernels/params.py HASH_FAMILY); the manifest names the family
MANIFEST = "manifest.json"


def index_config(cfg: Config) -> dict:
    bands, rows = cfg.layout
    d = cfg.to_dict()
    return {"normalize": d["normalize"], "minhash": d["minhash"], "bands": bands, "rows": rows}


def index_fingerprint(cfg: Config) -> str:
    return hashlib.sha256(json.dumps(index_config(cfg), sort_keys=True).encode()).hexdigest()[:16]


class IndexMismatchError(ConfigError):
    """The configuration does not match the one the index was built with."""


@dataclass
class _Segment:
    name: str
    docs: pa.Table
    band_hash: np.ndarray
    band_doc: np.ndarray
    band_start: np.ndarray  # offsets of each band's run, length bands + 1
    centre_hash: np.ndarray
    centre_round: np.ndarray
    centre_doc: np.ndarray
    centre_start: np.ndarray
    first_doc: int

    @property
    def n(self) -> int:
        return self.docs.num_rows


def _write_ipc(path: Path, table: pa.Table) -> None:
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table, max_chunksize=1 << 16)


def _read_ipc(path: Path) -> pa.Table:
    return pa.ipc.open_file(pa.memory_map(str(path), "r")).read_all()


class Index:
    """An opened index; see the module docstring for the format."""

    def __init__(self, path: Path, manifest: dict, segments: list):
        self.path = Path(path)
        self.manifest = manifest
        self.segments = segments
        self._keys = None

    # ---- lifecycle ----------------------------------------------------------
    @classmethod
    def create(cls, path, cfg: Config) -> "Index":
        p = Path(path)
        if (p / MANIFEST).exists():
            raise InputError(f"an index already exists in {str(p)!r}; open it, or remove it to build a new one")
        p.mkdir(parents=True, exist_ok=True)
        manifest = {"format": FORMAT, "format_version": FORMAT_VERSION, "hash_family": HASH_FAMILY_NAME,
                    "fingerprint": index_fingerprint(cfg),
                    "config": index_config(cfg), "id_column": cfg.input.id_column, "documents": 0, "segments": [],
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
        cls._write_manifest(p, manifest)
        return cls(p, manifest, [])

    @classmethod
    def open(cls, path, cfg: Config | None = None) -> "Index":
        p = Path(path)
        if not (p / MANIFEST).is_file():
            raise InputError(f"{str(p)!r} is not a gpu_dedup index (no {MANIFEST}); build one with "
                             "`gpu-dedup index build` or `gpu-dedup run ... --index-out DIR`")
        try:
            manifest = json.loads((p / MANIFEST).read_text())
        except ValueError as exc:
            raise InputError(f"index manifest {str(p / MANIFEST)!r} is not valid JSON ({exc})") from None
        if manifest.get("format") != FORMAT:
            raise InputError(f"{str(p)!r} holds {manifest.get('format')!r}, not a {FORMAT!r} index; give an index "
                             "directory built by `gpu-dedup index build` or `gpu-dedup run ... --index-out DIR`")
        family = manifest.get("hash_family", "v1 (exact arithmetic mod 2^61-1)")
        if manifest.get("format_version") != FORMAT_VERSION or family != HASH_FAMILY_NAME:
            raise InputError(
                f"the index in {str(p)!r} was built with hash family {family} (index format version "
                f"{manifest.get('format_version')}); this gpu_dedup hashes with family {HASH_FAMILY_NAME} (format "
                f"version {FORMAT_VERSION}), so its signatures and band hashes cannot be compared: rebuild the index "
                f"from its corpus (gpu-dedup index build CORPUS -o NEW_INDEX_DIR)")
        segments, first = [], 0
        for name in manifest["segments"]:  # one step per segment
            docs = _read_ipc(p / name / "docs.arrow")
            bands = _read_ipc(p / name / "bands.arrow")
            centres = _read_ipc(p / name / "centers.arrow")
            nb = manifest["config"]["bands"]
            start = np.searchsorted(np.asarray(bands.column("band")), np.arange(nb + 1)).astype(np.int64)
            cstart = np.searchsorted(np.asarray(centres.column("band")), np.arange(nb + 1)).astype(np.int64)
            segments.append(_Segment(name, docs, np.asarray(bands.column("hash")), np.asarray(bands.column("doc")),
                                     start, np.asarray(centres.column("hash")), np.asarray(centres.column("round")),
                                     np.asarray(centres.column("doc")), cstart, first))
            first += docs.num_rows
        index = cls(p, manifest, segments)
        if cfg is not None:
            index.check(cfg)
        return index

    @staticmethod
    def _write_manifest(p: Path, manifest: dict) -> None:

        atomic_write_bytes(p / MANIFEST, (json.dumps(manifest, indent=2) + "\n").encode())

    def check(self, cfg: Config) -> None:
        if index_fingerprint(cfg) == self.manifest["fingerprint"]:
            return
        mine, theirs = index_config(cfg), self.manifest["config"]
        diffs = []
        for section in ("normalize", "minhash"):
            for k, v in theirs[section].items():
                if mine[section].get(k) != v:
                    diffs.append(f"{section}.{k}: index {v!r}, this run {mine[section].get(k)!r}")
        for k in ("bands", "rows"):
            if mine[k] != theirs[k]:
                diffs.append(f"lsh.{k}: index {theirs[k]}, this run {mine[k]}")
        raise IndexMismatchError(
            f"the config does not match the index in {str(self.path)!r} ({'; '.join(diffs)}); "
            f"run with the index's settings (`gpu-dedup index info {self.path}` prints them) or build a new index"
        )

    def config(self, base: Config = Config()) -> Config:
        """``base`` with the index's normalize, minhash and (bands, rows) settings."""
        c = self.manifest["config"]
        d = base.to_dict()
        d["normalize"], d["minhash"] = c["normalize"], c["minhash"]
        d["lsh"]["bands"], d["lsh"]["rows"] = c["bands"], c["rows"]
        return Config.from_dict(d)

    @property
    def documents(self) -> int:
        return int(self.manifest["documents"])

    @property
    def id_column(self) -> str | None:
        """The input column the indexed documents' ids came from; None: they have none (generated row
        numbers, equal to ``row``).  Indexes written before this was recorded say ``id``."""
        return self.manifest.get("id_column", "id")

    def __len__(self) -> int:
        return self.documents

    # ---- lookups --------------------------------------------------------------
    def _column(self, name: str, docs: np.ndarray):
        """Values of a docs column for index doc numbers ``docs`` (any order)."""
        docs = np.asarray(docs, np.int64)
        if not self.segments or docs.shape[0] == 0:
            kind = self.segments[0].docs.schema.field(name).type if self.segments else pa.int64()
            return pa.array([], kind)
        chunks, starts = [], []
        for s in self.segments:  # every Arrow chunk of every segment, with its first doc number
            col = s.docs.column(name)
            for c, off in zip(col.chunks, np.cumsum([0] + [len(c) for c in col.chunks])):
                chunks.append(c)
                starts.append(s.first_doc + int(off))
        return _take(chunks, np.asarray(starts, np.int64), docs)

    def texts(self, docs) -> pa.Array:
        return self._column("text", docs)

    def ids(self, docs):
        return self._column("id", docs)

    def survivors(self, docs) -> np.ndarray:
        return np.asarray(self._column("survivor", docs))

    def kept(self, docs) -> np.ndarray:
        return np.asarray(self._column("kept", docs))

    def signatures(self, docs) -> np.ndarray:
        col = self._column("signature", docs)
        return np.asarray(col.flatten()).reshape(len(col), -1)

    def exact_matches(self, keys: np.ndarray) -> np.ndarray:
        """Index doc with each key (len, h1, h2), or -1: the kept one (the survivor of the others,
        whatever the keep policy) where one is kept, else the smallest."""
        import pandas as pd  # only runs against an index use it: a plain run does not import pandas

        out = np.full(keys.shape[0], -1, np.int64)
        if not self.segments or keys.shape[0] == 0:
            return out
        if self._keys is None:
            frame = pd.concat([pd.DataFrame({
                "l": np.asarray(s.docs.column("key_len")), "a": np.asarray(s.docs.column("key_h1")),
                "b": np.asarray(s.docs.column("key_h2")), "doc": np.asarray(s.docs.column("doc")),
                "removed": ~np.asarray(s.docs.column("kept"), bool)})
                for s in self.segments])
            first = frame.sort_values(["removed", "doc"], kind="stable").drop_duplicates(["l", "a", "b"])
            self._keys = first.set_index(["l", "a", "b"])["doc"]

        idx = pd.MultiIndex.from_arrays([keys[:, 0], keys[:, 1], keys[:, 2]], names=["l", "a", "b"])
        found = self._keys.reindex(idx)
        hit = found.notna().to_numpy()
        out[hit] = found.to_numpy()[hit].astype(np.int64)
        return out

    @staticmethod
    def _ranges(band_start, sorted_hash, band, hashes):
        """[pos, end) of each (band, hash) query in a segment's (band, hash)-sorted arrays."""
        pos = np.empty(band.shape[0], np.int64)
        end = np.empty(band.shape[0], np.int64)
        for b in np.unique(band):  # one searchsorted per band
            sel = np.flatnonzero(band == b)
            lo, hi = band_start[b], band_start[b + 1]
            seg_h = sorted_hash[lo:hi]
            pos[sel] = np.searchsorted(seg_h, hashes[sel], side="left") + lo
            end[sel] = np.searchsorted(seg_h, hashes[sel], side="right") + lo
        return pos, end

    @staticmethod
    def _expand(pos, count):
        """(query, position) for ``count[q]`` consecutive positions from ``pos[q]``."""
        hit = np.flatnonzero(count > 0)
        reps = count[hit]
        q = np.repeat(hit, reps)
        within = np.arange(int(reps.sum())) - np.repeat(np.cumsum(reps) - reps, reps)
        return q, pos[q] + within

    def bucket_members(self, band: np.ndarray, hashes: np.ndarray, limit: int = 1):
        """For each (band, hash) query: up to ``limit`` index docs of that bucket, smallest first.

        Returns (query position, doc) arrays.  ``limit=1`` gives the bucket's
        first document, the centre a full dedup would connect to.
        """
        qs, ds = [], []
        for s in self.segments:  # one vectorised lookup per segment
            pos, end = self._ranges(s.band_start, s.band_hash, band, hashes)
            q, at = self._expand(pos, np.minimum(end - pos, limit))
            qs.append(q)
            ds.append(s.band_doc[at])
        if not qs:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        q, d = np.concatenate(qs), np.concatenate(ds)
        # keep the `limit` smallest docs per query across segments
        order = np.lexsort((d, q))
        q, d = q[order], d[order]
        first = np.r_[0, np.flatnonzero(np.diff(q)) + 1]
        rank = np.arange(q.shape[0]) - np.repeat(first, np.diff(np.r_[first, q.shape[0]]))
        keep = rank < limit
        return q[keep], d[keep]

    def bucket_centres(self, band: np.ndarray, hashes: np.ndarray):
        """The centre sequence of each (band, hash) bucket: (query position, round, doc).

        Round 0 is the bucket's smallest indexed document; later rounds come
        from the segments' centre records (see the module docstring).
        """
        q0, d0 = self.bucket_members(band, hashes, limit=1)
        qs, rs, ds = [q0], [np.zeros(q0.shape[0], np.int64)], [d0]
        for s in self.segments:
            pos, end = self._ranges(s.centre_start, s.centre_hash, band, hashes)
            q, at = self._expand(pos, end - pos)
            qs.append(q)
            rs.append(s.centre_round[at].astype(np.int64))
            ds.append(s.centre_doc[at])
        return np.concatenate(qs), np.concatenate(rs), np.concatenate(ds)

    # ---- writing --------------------------------------------------------------
    def append(self, *, ids, kept, survivor, keys, texts, band_docs, band_hashes, centres, signatures=None) -> int:
        """Add documents as a new segment; ``survivor``, ``band_docs`` and the centres' docs are index
        doc numbers; ``centres`` = (band, hash, round, doc) arrays of rounds >= 1.

        Returns the doc number of the first added document.
        """
        n = len(texts)
        first = self.documents
        name = f"seg-{len(self.segments):05d}"
        cols = {
            "doc": pa.array(np.arange(first, first + n, dtype=np.int64)),
            "id": ids,
            "kept": pa.array(np.asarray(kept, bool)),
            "survivor": pa.array(np.asarray(survivor, np.int64)),
            "key_len": pa.array(keys[:, 0]),
            "key_h1": pa.array(keys[:, 1]),
            "key_h2": pa.array(keys[:, 2]),
            "text": pc.cast(texts, pa.large_string()),
        }
        if signatures is not None:
            cols["signature"] = pa.FixedSizeListArray.from_arrays(pa.array(signatures.ravel()), signatures.shape[1])
        want = self.segments[0].docs.schema.field("id").type if self.segments else cols["id"].type
        if cols["id"].type != want and _same_kind(cols["id"].type, want):  # e.g. large_string from pandas
            try:
                cols["id"] = pc.cast(cols["id"], want)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass  # does not fit: reported below
        if cols["id"].type != want:
            raise InputError(f"ids of type {cols['id'].type} cannot join an index whose ids are "
                             f"{self.segments[0].docs.schema.field('id').type}; use the same id column type")
        bands = self.manifest["config"]["bands"]
        band = np.tile(np.arange(bands, dtype=np.int32), band_docs.shape[0])
        doc = np.repeat(np.asarray(band_docs, np.int64), bands)
        h = np.asarray(band_hashes, np.uint64).ravel()
        order = np.lexsort((doc, h, band))
        tmp = self.path / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        _write_ipc(tmp / "docs.arrow", pa.table(cols))
        _write_ipc(tmp / "bands.arrow", pa.table({"band": band[order], "hash": h[order], "doc": doc[order]}))
        cb, ch, cr, cd = (np.asarray(x) for x in centres)
        corder = np.lexsort((cd, cr, ch, cb))
        _write_ipc(tmp / "centers.arrow", pa.table({
            "band": pa.array(cb[corder].astype(np.int32)), "hash": pa.array(ch[corder].astype(np.uint64)),
            "round": pa.array(cr[corder].astype(np.int32)), "doc": pa.array(cd[corder].astype(np.int64))}))
        os.replace(tmp, self.path / name)
        manifest = dict(self.manifest)
        manifest["segments"] = list(self.manifest["segments"]) + [name]
        manifest["documents"] = first + n
        manifest["updated"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self._write_manifest(self.path, manifest)
        fresh = Index.open(self.path)
        self.manifest, self.segments, self._keys = fresh.manifest, fresh.segments, None
        return first

    def add(self, frame, text: str = "text", id: str | None = None, config=None, **overrides) -> "AddResult":
        """Deduplicate the rows of ``frame`` against the index, then append all of them.

        What ``gpu-dedup run NEW --against INDEX --update-index`` does, for a
        pandas DataFrame, a pyarrow Table or a cuDF DataFrame, with the
        conventions of :func:`gpu_dedup.dedup` (``text``, ``id``, ``config``,
        ``overrides``).  Without ``config`` the index's own settings are used;
        a config that changes hashes or matching fails with
        :class:`IndexMismatchError`.  Indexed documents always survive; every
        row is appended, removed ones included.  Returns an :class:`AddResult`.
        """

        kind = api.frame_kind(frame)
        cfg = api.config_of(self.config() if config is None else config, text, id, overrides)
        if cfg.cluster.enabled:
            raise ConfigError("Index.add() runs in one process; drop cluster.workers / cluster.scheduler")
        self.check(cfg)
        table = api.frame_table(frame, kind, text, id, cfg)
        first = self.documents
        if first == 0:  # the first documents name the index's id column
            self.manifest = {**self.manifest, "id_column": id}
        result = run([memory_shard(table, name=f"{kind} frame")], None, cfg, prior=self, sink=self)
        dup = api.frame_duplicates(result.duplicates, id)
        return AddResult(deduplicated=api.take_rows(frame, kind, result.kept), duplicates=api.like(dup, kind),
                         clusters=result.cluster, kept=result.kept, report=result.report, edges=result.edges,
                         first_doc=first)

    def info(self) -> dict:
        size = sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return {"path": str(self.path), "documents": self.documents, "id_column": self.id_column,
                "segments": len(self.segments),
                "bytes": size, "kept": int(sum(pc.sum(s.docs.column("kept")).as_py() or 0 for s in self.segments)),
                "fingerprint": self.manifest["fingerprint"], "config": self.manifest["config"]}

    # ---- online use ---------------------------------------------------------
    def query(self, texts, threshold: float | None = None, members: int = 8, backend="cpu") -> pa.Table:
        """Indexed documents similar to each text: one row per (query, match).

        Candidates are exact-key matches and up to ``members`` documents of
        every index bucket a query falls in; matches are verified by exact
        Jaccard (signature estimate when the index has no texts) and kept
        when similarity >= ``threshold`` (default: the index's config threshold 0.8).

        Columns: ``query`` (position in ``texts``), ``row`` (the indexed
        document's number), its id under the index's id column name (when the
        index has one), ``similarity``, ``exact`` (same normalized text),
        ``kept`` (the document survived its own dedup), ``cluster_id`` (the
        row of its cluster's survivor) and, with ids, ``survivor_id``.  A
        query without a match has no row.
        """

        cfg = self.config()
        t = cfg.lsh.threshold if threshold is None else threshold
        norm = normalize(texts, cfg.normalize)
        q = len(norm)
        new = _new_doc_arrays(string_buffers(norm), cfg, backend)
        qi, di = [], []
        exact = self.exact_matches(new["keys"])
        hit = np.flatnonzero(exact >= 0)
        qi.append(hit)
        di.append(exact[hit])
        if new["cand"].shape[0]:
            bands = new["band_hashes"].shape[1]
            band = np.tile(np.arange(bands), new["cand"].shape[0])
            hq, hd = self.bucket_members(band, new["band_hashes"].ravel(), members)
            qi.append(new["cand"][hq // bands])
            di.append(hd)
        qa, da = np.concatenate(qi), np.concatenate(di)
        if qa.shape[0]:
            pairs = np.unique(np.column_stack([qa, da]), axis=0)
            qa, da = pairs[:, 0], pairs[:, 1]
        docs = np.unique(da)
        texts_all = pa.concat_arrays([norm, self.texts(docs)]) if docs.shape[0] else norm
        sim = exact_similarity(qa, q + np.searchsorted(docs, da), string_buffers(texts_all), cfg.minhash, backend)
        is_exact = np.zeros(qa.shape[0], bool)
        if hit.shape[0]:
            is_exact = np.isin(qa * (self.documents + 1) + da, hit * (self.documents + 1) + exact[hit])
            sim[is_exact] = 1.0
        keep = sim >= t
        qa, da, sim, is_exact = qa[keep], da[keep], sim[keep], is_exact[keep]
        surv = self.survivors(da)
        name = self.id_column
        cols = {"query": pa.array(qa, pa.int64()), ROW: pa.array(da, pa.int64())}
        if name:
            cols[name] = self.ids(da)
        cols.update(similarity=pa.array(sim), exact=pa.array(is_exact), kept=pa.array(self.kept(da)),
                    cluster_id=pa.array(np.asarray(surv, np.int64), pa.int64()))
        if name:
            cols["survivor_id"] = self.ids(surv)
        return pa.table(cols)


def _take(chunks: list, starts: np.ndarray, rows: np.ndarray) -> pa.Array:
    """Rows ``rows`` (any order) of the Arrow arrays ``chunks``, chunk k holding rows
    ``starts[k]`` onwards: one take per chunk touched.  (Arrow's ChunkedArray.take
    concatenates every chunk first, which made one query copy a whole segment's texts.)"""
    which = np.searchsorted(starts, rows, side="right") - 1
    parts, order = [], []
    for k in np.unique(which):  # one take per chunk touched
        sel = np.flatnonzero(which == k)
        parts.append(chunks[k].take(pa.array(rows[sel] - starts[k], pa.int64())))
        order.append(sel)
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[np.concatenate(order)] = np.arange(rows.shape[0])
    return pa.concat_arrays(parts).take(pa.array(inverse))


def _same_kind(a: pa.DataType, b: pa.DataType) -> bool:
    """Both string, both binary or both integer types (ids that differ only in width)."""
    kinds = (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t),
             lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), pa.types.is_integer)
    return any(k(a) and k(b) for k in kinds)


def _new_doc_arrays(strings, cfg: Config, backend) -> dict:
    """Exact keys of all documents; signatures and band hashes of those with shingles."""


    keys = exact_keys(strings, cfg.minhash.seed, backend)
    sig = signatures(strings, cfg.minhash, num_perm=cfg.signature_perms, backend=backend)
    cand = np.flatnonzero(sig.shingles > 0)
    bands, rows = cfg.layout
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm)
    bh = band_hashes(sig.values[cand], bands, rows, params, backend)
    return {"keys": keys, "cand": cand, "band_hashes": bh, "signatures": sig.values}


@dataclass(repr=False)
class AddResult(DedupResult):
    """What :meth:`Index.add` returns: :class:`gpu_dedup.api.DedupResult`'s fields, in index terms.

    ``kept`` / ``removed``: per row of the frame; ``deduplicated``: the kept
    rows; ``duplicates``: one row per frame row that was removed or has
    copies (``row``: position in the frame, ``cluster_id`` = the survivor's index doc number,
    ``survivor_id`` with an id column, ``in_index``: the survivor is an earlier indexed
    document); ``clusters``: the index doc number of each row's survivor;
    ``edges``: verified edges between index doc numbers.  The frame's rows
    are index documents ``first_doc .. first_doc + len(frame) - 1``.
    """

    first_doc: int = 0


class IndexBuilder:
    """The sink of ``run --index-out DIR``: creates the index at ``path`` when the run hands it its
    documents (a run that fails earlier leaves no index behind)."""

    def __init__(self, path, cfg: Config):
        self.path = Path(path)
        self.cfg = cfg
        if (self.path / MANIFEST).exists():
            raise InputError(f"an index already exists in {str(self.path)!r}; open it with --against "
                             "(and --update-index), or remove it to build a new one")
        self.index = None

    @property
    def documents(self) -> int:
        return 0 if self.index is None else self.index.documents

    def append(self, **payload) -> int:
        self.index = Index.create(self.path, self.cfg)
        return self.index.append(**payload)
