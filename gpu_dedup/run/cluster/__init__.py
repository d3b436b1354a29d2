"""Dask (CPU workers) and Dask-CUDA (one worker per GPU): the executor that keeps blocks on the workers.

The one stage sequence (:func:`gpu_dedup.run.sequence.execute`) drives the
run; this executor places its per-block stages on the workers and moves data
between them.  A block is a shard, or consecutive Parquet row groups up to
``cluster.block_rows`` rows.

- **read / normalize / exact keys**: one task per block reads its columns,
  normalizes them and keeps them on the worker; the client gathers a few values
  per document (null flags, policy keys, ids, 24-byte exact keys).
- **signatures / bands**: per block, for the rows the sequence asks for
  (exact-group representatives); band hashes stay on the workers.
- **buckets**: the long frame (band, band hash, doc) goes through a Dask
  shuffle on (band, band hash); each shuffle partition is grouped by
  :func:`gpu_dedup.stages.buckets.group_buckets` and keeps its multi-member
  buckets, which the client gathers.
- **verify / select**: each round's pairs are scored by merging a frame of the
  candidate documents' normalized texts (or signatures) onto both ends (Dask
  merges) and running the similarity family's ``pair_similarity`` per
  merged partition; star edges, components and survivors run on the client
  over the gathered edge list.
- **write**: workers filter and write the shards in parallel.

Memory: text, signatures and band hashes live on the workers (bounded by the
block size; Dask spills to disk under its memory limit).  The client holds
small per-document arrays (exact keys, ids, ranks, labels: ~80 bytes per
document), the bucket memberships and the edge list, in host memory (it
never starts a CUDA context).  Results are identical to the single-process
run for any number of workers: every tie is broken by the global row.

GPU workers (``--backend gpu``: a ``LocalCUDACluster``, one worker per visible
GPU, checked on the client through NVML or ``CUDA_VISIBLE_DEVICES`` so that no
CUDA context starts there): each block's normalized text, exact keys,
signatures and band hashes are device arrays on its worker (the GPU backend
returns results where its inputs are); the long (band, band hash, doc) frames
are cuDF frames, shuffled by Dask (task shuffle) and grouped on the device; only
the multi-member buckets and per-document values reach the client, as host
arrays.  The same functions run on CPU workers with NumPy and pandas.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_dedup import storage
from gpu_dedup.backends import array_module, get_backend, on_device, to_device, to_host
from gpu_dedup.backends.strings import arrow_strings, string_buffers
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError, ResourceError
from gpu_dedup.run.checkpoint import NoCheckpoints
from gpu_dedup.run.cluster.connection import connect
from gpu_dedup.run.sequence import CorpusCounts, Job, RunResult, execute, open_output
from gpu_dedup.run.stagelog import StageLog, peak_rss_mb
from gpu_dedup.stages.buckets import group_buckets
from gpu_dedup.stages.families import RowData, family_for
from gpu_dedup.stages.selection import text_lengths
from gpu_dedup.stages.vectors import Vectors

if TYPE_CHECKING:
    import pandas as pd

log = logging.getLogger("gpu_dedup")


# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Block:
    index: int
    shard_index: int
    row0: int  # global row of the block's first document
    shard_row0: int  # its row inside the shard
    rows: int
    row_groups: tuple | None  # Parquet row groups; None: the whole shard


def inspect_shard(shard: storage.Shard, cfg: Config) -> dict:
    """Rows, id type and row-group sizes of one shard; validates its columns."""
    score = cfg.select.score_column if cfg.select.keep == "score" else None
    if shard.format == "parquet":
        table = storage.read_columns(shard, cfg.input, score, row_groups=[])  # validates names and types, reads 0 rows
        meta = pq.ParquetFile(storage.source(shard.path)).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        id_type = table.column("id").type if cfg.input.id_column else None
        return {"rows": int(sum(groups)), "row_groups": groups, "id_type": id_type}
    table = storage.read_columns(shard, cfg.input, score)
    if table is None:
        return {"rows": 0, "row_groups": None, "id_type": None}
    return {"rows": table.num_rows, "row_groups": None,
            "id_type": table.column("id").type if cfg.input.id_column else None}


def plan_blocks(infos: list, block_rows: int) -> list:
    blocks, row0 = [], 0
    for s, info in enumerate(infos):
        if info["row_groups"] is None or not info["row_groups"]:
            if info["rows"]:
                blocks.append(Block(len(blocks), s, row0, 0, info["rows"], None))
            row0 += info["rows"]
            continue
        start, group_start, acc = 0, 0, 0
        for g, n in enumerate(info["row_groups"]):  # one step per row group (metadata only)
            acc += n
            if acc >= block_rows or g == len(info["row_groups"]) - 1:
                if acc:
                    blocks.append(Block(len(blocks), s, row0 + start, start, acc, tuple(range(group_start, g + 1))))
                start, group_start, acc = start + acc, g + 1, 0
        row0 += info["rows"]
    return blocks


# --------------------------------------------------------------------------- worker tasks


@dataclass
class BlockData:
    """A block on its worker: its columns, then its normalized texts."""

    block: Block
    table: pa.Table  # text[, id][, score]
    strings: object = None  # normalized StringBuffers (device arrays on a GPU worker)
    invalid_utf8: int = 0
    vectors: Vectors | None = None  # input.vector_column

    def rows(self) -> RowData:
        return RowData(strings=self.strings, vectors=self.vectors)

    @property
    def norm(self) -> pa.Array:
        """Normalized texts as host Arrow (verification frames; copied from the device on a GPU worker)."""
        return arrow_strings(to_host(self.strings.offsets), to_host(self.strings.data))


def load_block(block: Block, shard, cfg: Config, dim: int | None = None) -> BlockData:
    score = cfg.select.score_column if cfg.select.keep == "score" else None
    table = storage.read_columns(shard, cfg.input, score, block.row_groups)
    if table is None or table.num_rows != block.rows:
        rows = 0 if table is None else table.num_rows
        raise InputError(f"shard {shard.path!r} changed during the run ({rows} rows, expected {block.rows}); "
                         "inputs must not change during a run")
    vecs = None
    if cfg.input.vector_column:  # vectors of the block (bad rows named by shard and row, per cosine.bad_vectors)
        vecs = family_for(cfg).load_vectors(table.column("vector"), shard.path, block.shard_row0, dim)
        table = table.drop_columns(["vector"])
    return BlockData(block, table, vectors=vecs)


def block_dim(data: BlockData) -> int | None:
    """The vector length of a block (None: no vector column, or only null rows)."""
    v = data.vectors
    if v is None or not (v.status != 3).any():
        return None
    return v.dim


def block_small(data: BlockData, cfg: Config) -> dict:
    """What the client gathers after reading a block: a few values per document."""
    t = data.table
    key = None
    if cfg.select.keep == "longest":
        key = text_lengths(t.column("text"))
    elif cfg.select.keep == "lowest_id":
        key = t.column("id").combine_chunks()
    elif cfg.select.keep == "score":
        key = t.column("score").combine_chunks()
    return {"null": family_for(cfg).null_rows(t, data.vectors),
            "ids": t.column("id").combine_chunks() if cfg.input.id_column else None, "rank_key": key}


def normalize_block(data: BlockData, cfg: Config) -> BlockData:
    if not family_for(cfg).uses_text:
        return data
    strings, invalid = get_backend(cfg.backend).normalize_column(data.table.column("text"), cfg.normalize)
    return replace(data, strings=strings, invalid_utf8=invalid)


def block_norm_info(data: BlockData) -> dict:
    return {"invalid_utf8": data.invalid_utf8, "text_bytes": data.strings.nbytes if data.strings is not None else 0}


def block_keys(data: BlockData, family) -> np.ndarray:
    return to_host(family.exact_keys(data.rows(), family.cfg.backend))


def block_stats(data: BlockData, family):
    return family.stats(data.rows())


@dataclass
class BlockSignatures:
    rows: np.ndarray  # global rows
    values: np.ndarray
    features: np.ndarray
    usable: np.ndarray


def block_signatures(data: BlockData, rows: np.ndarray, family) -> BlockSignatures:
    sig = family.signatures(data.rows(), rows - data.block.row0, backend=family.cfg.backend)
    return BlockSignatures(rows, sig.values, sig.features, sig.usable)


def block_features(sig: BlockSignatures) -> tuple:
    return to_host(sig.features), to_host(sig.usable)


@dataclass
class BlockBands:
    rows: np.ndarray  # global rows that went through LSH
    band_hashes: np.ndarray
    values: np.ndarray | None  # signatures, when verification compares them


def block_bands(sig: BlockSignatures, rows: np.ndarray, family) -> BlockBands:
    """Band hashes (and, when the family keeps them, the values) of ``rows`` (those with a signature)."""
    values = sig.values[to_device(np.searchsorted(sig.rows, rows), array_module(sig.values))]
    bh = family.band_hashes(values, family.cfg.backend)
    return BlockBands(rows, bh, values if family.keep_signatures else None)


def frame_module(array):
    """The frame module of ``array``'s memory: cuDF for device arrays, pandas for host arrays."""
    if on_device(array):
        import cudf
        import dask_cudf  # noqa: F401  registers cuDF with Dask's dispatch (shuffle, concat) in this worker

        return cudf
    import pandas as pd  # the Dask executor's frames: a one-process run does not import pandas

    return pd


def long_frame(bands: BlockBands):
    """(band, hash, doc) rows of a block's LSH rows: a cuDF frame when the band hashes are on the device."""
    bh = bands.band_hashes
    xp = array_module(bh)
    nb = bh.shape[1]
    rows = to_device(bands.rows, xp)
    return frame_module(bh).DataFrame({"band": xp.tile(xp.arange(nb, dtype=xp.int32), rows.shape[0]),
                                       "hash": bh.ravel(), "doc": xp.repeat(rows, nb)})


def _column(frame, name: str, dtype):
    """A frame column as an array of its memory (NumPy for pandas, CuPy for cuDF)."""
    import pandas as pd

    col = frame[name]
    return col.to_numpy(dtype) if isinstance(frame, pd.DataFrame) else col.values.astype(dtype)


def partition_buckets(df, min_size: int) -> pd.DataFrame:
    """Memberships of the buckets of one shuffle partition with at least ``min_size`` members (pandas:
    the client gathers them), grouped where the partition lives."""
    import pandas as pd

    b = group_buckets(_column(df, "band", np.int32), _column(df, "hash", np.uint64), _column(df, "doc", np.int64),
                      min_size=min_size)
    sizes = to_host(b.sizes)
    return pd.DataFrame({"band": np.repeat(to_host(b.band), sizes), "hash": np.repeat(to_host(b.hash), sizes),
                         "doc": to_host(b.members)})


def texts_frame(data: BlockData, rows: np.ndarray) -> pd.DataFrame:
    """Normalized texts (or, with a vector column, the vectors: columns v0, v1, ...) of some rows of a block."""
    import pandas as pd  # the Dask executor's frames: a one-process run does not import pandas

    if data.vectors is not None:
        frame = pd.DataFrame(data.vectors.matrix[rows - data.block.row0],
                             columns=[f"v{j}" for j in range(data.vectors.dim)])
        frame.insert(0, "row", rows)
        return frame
    return pd.DataFrame({"row": rows, "text": pd.arrays.ArrowExtensionArray(
        data.norm.take(pa.array(rows - data.block.row0)).cast(pa.large_string()))})


def signature_frame(bands: BlockBands, rows: np.ndarray) -> pd.DataFrame:
    import pandas as pd  # the Dask executor's frames: a one-process run does not import pandas

    sig = to_host(bands.values[to_device(np.searchsorted(bands.rows, rows), array_module(bands.values))])
    frame = pd.DataFrame(sig, columns=[f"s{j}" for j in range(sig.shape[1])])
    frame.insert(0, "row", rows)
    return frame


def partition_similarity(df: pd.DataFrame, family) -> pd.DataFrame:
    """Scores of the merged pairs of one partition (both ends' texts, vectors or signatures side by side)."""
    import pandas as pd  # the Dask executor's frames: a one-process run does not import pandas

    m = len(df)
    left, right = np.arange(m), np.arange(m) + m
    be = family.cfg.backend

    def both(prefix):
        cols = [c for c in df.columns if c.startswith(prefix) and c.endswith("_a")]
        return np.ascontiguousarray(np.vstack([df[cols].to_numpy(), df[[c[:-2] + "_b" for c in cols]].to_numpy()]))

    if family.cfg.verify.method != "exact":
        sim = family.pair_similarity(None, both("s"), left, right, be)
    elif "text_a" in df.columns:
        texts = pa.concat_arrays([pa.array(df["text_a"]).cast(pa.large_string()),
                                  pa.array(df["text_b"]).cast(pa.large_string())]) if m else pa.array([], pa.large_string())
        sim = family.pair_similarity(RowData(strings=string_buffers(texts)), None, left, right, be)
    else:
        x = both("v").astype(np.float32)
        sim = family.pair_similarity(RowData(vectors=Vectors(x, np.zeros(2 * m, np.int8))), None, left, right, be)
    return pd.DataFrame({"i": df["i"].to_numpy(np.int64), "sim": sim})


def take_texts(data: BlockData, rows: np.ndarray) -> pa.Array:
    return data.table.column("text").take(pa.array(rows - data.block.row0)).combine_chunks()


def write_block_shard(shard, keep: np.ndarray, out: str, compression: str) -> int:
    return storage.write_shard(shard, keep, out, compression)


def worker_peak_rss() -> float:
    return peak_rss_mb()


# --------------------------------------------------------------------------- the executor


@dataclass
class ClusterCorpus(CorpusCounts):
    shards: list
    n: int
    null: np.ndarray
    ids: pa.ChunkedArray
    id_column: str | None
    rank_key: object
    duplicate_ids: int

    def shard_rows(self):
        sizes = [s.rows for s in self.shards]
        shard = np.repeat(np.arange(len(sizes)), sizes)
        row = np.concatenate([np.arange(s) for s in sizes]) if sizes else np.zeros(0, np.int64)
        return shard, row


class _BlockColumn:
    """``take(rows)`` of an original column, gathered from the blocks that hold the rows."""

    def __init__(self, ex, name: str):
        self.ex, self.name = ex, name

    def take(self, rows) -> pa.Array:
        rows = np.asarray(rows, np.int64)
        if self.name == "id":
            return self.ex.ids(rows)
        owner = self.ex._owner(rows)
        parts, order = [], []
        for k in np.unique(owner):  # one task per block holding a row
            sel = np.flatnonzero(owner == k)
            parts.append(self.ex.client.submit(take_texts, self.ex.loaded[k], rows[sel], pure=False))
            order.append(sel)
        if not parts:
            return pa.array([], pa.large_string())
        got = self.ex.client.gather(parts)
        binary = any(pa.types.is_binary(p.type) or pa.types.is_large_binary(p.type) for p in got)
        values = pa.concat_arrays([p.cast(pa.large_binary() if binary else pa.large_string()) for p in got])
        inverse = np.empty(rows.shape[0], np.int64)
        inverse[np.concatenate(order)] = np.arange(rows.shape[0])
        return values.take(pa.array(inverse))


class DaskExecutor:
    """Blocks on Dask workers; the client drives the sequence with host (NumPy) arrays."""

    def __init__(self, shards, cfg: Config):
        self.shards = shards
        self.cfg = cfg
        self.backend = get_backend("cpu")  # the client's arrays stay on the host (no CUDA context here)
        self.xp = np
        self.client = self.cluster = None
        self.blocks: list = []
        self.loaded: list = []
        self.normalized: list | None = None
        self.sigs: list = []
        self.shuffle_bytes = 0
        self.family = None  # the similarity family (stages/families.py), sized by read()
        self._prepared = None  # scattered family with corpus statistics, on first use

    # ---- setup ----------------------------------------------------------------
    def prepare(self, st: StageLog) -> None:
        self.st = st
        self.client, self.cluster = connect(self.cfg)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def report_extras(self) -> dict:
        peaks = self.client.run(worker_peak_rss)
        return {"cluster": {
            "workers": len(peaks),
            "scheduler": self.cfg.cluster.scheduler or "local",
            "dashboard": self.client.dashboard_link,
            "worker_peak_rss_mb": {k: round(v, 1) for k, v in peaks.items()},
            "shuffle_mb": round(self.shuffle_bytes / 2**20, 2),
            "blocks": len(self.blocks),
        }}

    def _owner(self, rows: np.ndarray) -> np.ndarray:
        starts = np.array([b.row0 for b in self.blocks], np.int64)
        return np.searchsorted(starts, rows, side="right") - 1

    def _per_block(self, rows: np.ndarray) -> list:
        owner = self._owner(rows)
        cuts = np.searchsorted(owner, np.arange(len(self.blocks) + 1))
        return [rows[cuts[k] : cuts[k + 1]] for k in range(len(self.blocks))]

    # ---- read / normalize -------------------------------------------------------
    def read(self, progress=None) -> ClusterCorpus:
        cfg, client = self.cfg, self.client
        infos = client.gather(client.map(inspect_shard, self.shards, cfg=cfg, pure=False))
        first = None
        for shard, inf in zip(self.shards, infos):
            if cfg.input.id_column and inf["id_type"] is not None:
                first = storage.check_id_type(shard, cfg.input.id_column, inf["id_type"], first)
        shards = self.shards = [s.with_rows(i["rows"]) for s, i in zip(self.shards, infos)]
        self.blocks = plan_blocks(infos, cfg.cluster.block_rows)
        n = sum(i["rows"] for i in infos)
        self.family = family_for(cfg, n)
        block_shards = [shards[b.shard_index] for b in self.blocks]
        self.loaded = client.map(load_block, self.blocks, block_shards, cfg=cfg, pure=False)
        if cfg.input.vector_column:  # one vector length for the whole corpus: the first block's with vectors
            dims = client.gather(client.map(block_dim, self.loaded, pure=False))
            dim = next((d for d in dims if d is not None), None)
            redo = [k for k, d in enumerate(dims) if d is not None and d != dim]
            for k, fut in zip(redo, client.map(load_block, [self.blocks[k] for k in redo],
                                                [block_shards[k] for k in redo], cfg=cfg, dim=dim, pure=False)):
                self.loaded[k] = fut  # rows of another length: an error, or kept as bad_length (cosine.bad_vectors)
            client.gather([self.loaded[k] for k in redo])
        small = client.gather(client.map(block_small, self.loaded, cfg=cfg, pure=False))
        if progress is not None:
            progress(len(shards))
        null = np.concatenate([s["null"] for s in small]) if small else np.zeros(0, bool)
        if cfg.input.id_column:
            ids = pa.chunked_array([s["ids"] for s in small], type=first[0] if first else pa.int64())
        else:
            ids = pa.chunked_array([pa.array(np.arange(n, dtype=np.int64))])
        key = pa.chunked_array([s["rank_key"] for s in small]) if cfg.select.keep != "first" and small else None
        dup = n - pc.count_distinct(ids, mode="all").as_py() if n else 0
        self.corpus = ClusterCorpus(shards, n, null, ids, cfg.input.id_column, key, dup)
        return self.corpus

    def _normalize(self) -> list:
        if self.normalized is None:
            with self.st.stage("normalize", self.corpus.n) as info:
                self.normalized = self.client.map(normalize_block, self.loaded, cfg=self.cfg, pure=False)
                got = self.client.gather(self.client.map(block_norm_info, self.normalized, pure=False))
                self.invalid_utf8 = sum(g["invalid_utf8"] for g in got)
                info.update(invalid_utf8=self.invalid_utf8, text_mb=round(sum(g["text_bytes"] for g in got) / 2**20, 1))
        return self.normalized

    def normalize(self) -> dict:
        if not self.family.uses_text:
            return {}
        self._normalize()
        return {"invalid_utf8": self.invalid_utf8}

    def _family(self):
        """The family with corpus statistics (summed over the blocks), scattered to the workers once."""
        if self._prepared is None and not self.family.needs_stats:
            self._prepared = (self.family, self.family)
        if self._prepared is None:
            stats = self.client.gather(self.client.map(block_stats, self._normalize(), family=self.family,
                                                       pure=False))
            fam = self.family.prepare([s for s in stats if s is not None])
            self._prepared = (fam, self.client.scatter(fam, broadcast=True))
        return self._prepared[1]

    def _family_object(self):
        self._family()
        return self._prepared[0]

    # ---- per-document stages -------------------------------------------------------
    def exact_keys(self):
        parts = self.client.gather(self.client.map(block_keys, self._normalize(), family=self.family, pure=False))
        return np.concatenate(parts) if parts else np.zeros((0, 3), np.uint64)

    def signatures(self, rows, progress=None):
        norm = self._normalize()
        per = self._per_block(np.asarray(rows, np.int64))
        self.sigs = self.client.map(block_signatures, norm, per, family=self._family(), pure=False)
        parts = self.client.gather(self.client.map(block_features, self.sigs, pure=False))
        if progress is not None:
            progress(len(rows))
        if not parts:
            return np.zeros(0, np.int64), np.zeros(0, bool)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def bands(self, lsh_rows):
        per = self._per_block(np.asarray(lsh_rows, np.int64))
        self.shuffle_bytes = int(len(lsh_rows)) * self.family.layout[0] * (4 + 8 + 8)  # band, hash, doc per row
        self.bands_ = self.client.map(block_bands, self.sigs, per, family=self.family, pure=False)
        return self

    def arrays(self) -> dict:
        return {}  # band hashes stay on the workers (no checkpoints on a cluster)

    def band_data(self, arrays: dict):
        return self

    def buckets(self, bands, min_size: int):
        import dask
        import dask.dataframe as dd
        import pandas as pd

        meta = pd.DataFrame({"band": np.zeros(0, np.int32), "hash": np.zeros(0, np.uint64), "doc": np.zeros(0, np.int64)})
        parts = [dask.delayed(long_frame)(f) for f in self.bands_]
        if not parts:
            return group_buckets(np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64))
        long = dd.from_delayed(parts, meta=meta, verify_meta=False)
        # GPU workers' partitions are cuDF frames: the task shuffle dispatches on the partitions' type
        method = "tasks" if self.cfg.backend == "gpu" else None
        shuffled = long.shuffle(on=["band", "hash"], npartitions=max(1, len(self.blocks)), shuffle_method=method)
        multi = shuffled.map_partitions(partition_buckets, min_size, meta=meta).compute()
        return group_buckets(multi["band"].to_numpy(np.int32), multi["hash"].to_numpy(np.uint64),
                             multi["doc"].to_numpy(np.int64), min_size=min_size)

    # ---- pairs ---------------------------------------------------------------------
    def similarity(self, left, right, prior_nodes=None, progress=None):
        """Similarity of row pairs: a frame of the rows' texts (or signatures) merged onto both ends."""
        import dask
        import dask.dataframe as dd
        import pandas as pd

        if prior_nodes:
            raise ConfigError("runs against an index run in one process for now; drop --workers / --scheduler")
        cfg = self.cfg
        left, right = np.asarray(left, np.int64), np.asarray(right, np.int64)
        out = np.empty(left.shape[0], np.float64)
        if left.shape[0] == 0:
            return out
        rows = np.unique(np.concatenate([left, right]))
        per = self._per_block(rows)
        exact = cfg.verify.method == "exact"
        source = self._normalize() if exact else self.bands_
        parts = [dask.delayed(texts_frame if exact else signature_frame)(source[k], sel)
                 for k, sel in enumerate(per) if sel.shape[0]]
        if exact and self.family.uses_text:
            meta = pd.DataFrame({"row": np.zeros(0, np.int64),
                                 "text": pd.arrays.ArrowExtensionArray(pa.array([], pa.large_string()))})
        elif exact:  # vectors
            dim = self.client.submit(block_dim, self.loaded[0], pure=False).result() or 1
            for k, sel in enumerate(per):  # the first block holding a row gives the width
                if sel.shape[0]:
                    dim = self.client.submit(block_dim, self.loaded[k], pure=False).result() or dim
                    break
            meta = pd.DataFrame(np.zeros((0, dim), np.float32), columns=[f"v{j}" for j in range(dim)])
            meta.insert(0, "row", np.zeros(0, np.int64))
        else:
            empty = self.family.empty_values()
            p = empty.shape[1] if empty.shape[1] else 0
            meta = pd.DataFrame(np.zeros((0, p), empty.dtype), columns=[f"s{j}" for j in range(p)])
            meta.insert(0, "row", np.zeros(0, np.int64))
        table = dd.from_delayed(parts, meta=meta, verify_meta=False)
        value_cols = [c for c in meta.columns if c != "row"]
        side_a = table.rename(columns={"row": "src", **{c: f"{c}_a" for c in value_cols}})
        side_b = table.rename(columns={"row": "dst", **{c: f"{c}_b" for c in value_cols}})
        npart = max(1, min(len(self.blocks), left.shape[0] // 50_000 + 1))
        pairs = dd.from_pandas(pd.DataFrame({"src": left, "dst": right, "i": np.arange(left.shape[0])}),
                               npartitions=npart)
        merged = pairs.merge(side_a, on="src").merge(side_b, on="dst")
        res = merged.map_partitions(partition_similarity, self._family_object(), meta={"i": np.int64, "sim": np.float64}).compute()
        out[res["i"].to_numpy(np.int64)] = res["sim"].to_numpy(np.float64)
        if res.shape[0] != left.shape[0]:  # pragma: no cover - every row of a pair exists
            raise RuntimeError(f"similarity computed for {res.shape[0]} of {left.shape[0]} pairs")
        if progress is not None:
            progress(left.shape[0])
        return out

    # ---- outputs ---------------------------------------------------------------------
    def ids(self, rows) -> pa.Array:
        rows = np.asarray(rows, np.int64)
        return self.corpus.ids.take(pa.array(rows)).combine_chunks() if rows.shape[0] else \
            pa.array([], self.corpus.ids.type)

    def column(self, name: str):
        return _BlockColumn(self, name)

    def write(self, kept: np.ndarray, out: Path, ckpt, progress=None) -> int:
        shards = self.corpus.shards
        starts = np.cumsum([0] + [s.rows for s in shards])
        written = self.client.gather(self.client.map(
            write_block_shard, shards, [kept[starts[i] : starts[i + 1]] for i in range(len(shards))],
            out=str(out), compression=self.cfg.output.compression, pure=False))
        if progress is not None:
            progress(len(shards))
        return int(sum(written))

    def write_table(self, path: Path, table: pa.Table) -> None:
        storage.atomic_write_parquet(path, table, self.cfg.output.compression)

    def index_payload(self, bands, lsh_rows) -> dict:
        raise ConfigError("--index-out / --against run in one process for now; drop --workers / --scheduler")


def run(shards, job: Job, restart: bool = False, inputs=None) -> RunResult:
    """The sequence on a Dask cluster; the same RunResult as the single-process run.

    It keeps no checkpoints (blocks live on the workers): a killed run starts over, and
    its output directory is locked, staged and published as a single-process run's."""
    cfg = job.cfg
    if job.prior is not None or job.sink is not None:
        raise ConfigError("--index-out / --against run in one process for now; drop --workers / --scheduler")
    if cfg.backend == "auto":  # decided on the client without touching CUDA: GPU workers only when asked for
        cfg = replace(cfg, backend="cpu")
    job = replace(job, cfg=cfg)
    od = None
    if job.out is not None:
        od = open_output(job.out, shards, inputs, cfg, shards_written=job.write_shards, fresh=True)
        job = replace(job, outdir=od)
    ex = DaskExecutor(shards, cfg)
    try:
        return execute(job, ex, NoCheckpoints(), StageLog())
    except Exception as exc:
        if type(exc).__name__ != "KilledWorker":
            raise
        limit = cfg.cluster.memory_limit or "the cluster's default"
        largest = max((b.rows for b in ex.blocks), default=0)
        raise ResourceError(
            f"Dask workers died running a task ({exc.args[0] if exc.args else exc}); most often a block does not "
            f"fit a worker's memory (memory limit {limit}, cluster.block_rows = {cfg.cluster.block_rows:,}, largest "
            f"block {largest:,} rows; a block holds whole Parquet row groups): lower cluster.block_rows (e.g. "
            f"--set cluster.block_rows={max(1, cfg.cluster.block_rows // 4)}), write the shards with smaller row "
            "groups, or raise cluster.memory_limit"
        ) from None
    finally:
        ex.close()
        if od is not None:
            od.close()
