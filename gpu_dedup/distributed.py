"""Scale-out on Dask (CPU workers) and Dask-CUDA (one worker per GPU).

The same stage functions as the single-process pipeline run per partition;
Dask moves the data between them:

1. **map** (one task per block: a shard, or consecutive Parquet row groups up
   to ``cluster.block_rows`` rows): read, normalize, exact keys, signatures,
   band hashes.  Results stay on the workers.
2. **exact**: the client gathers the exact keys (24 bytes per document) and
   runs :func:`gpu_dedup.exact.exact_groups`.
3. **buckets**: the long frame (band, band hash, row) of the MinHash
   candidates goes through a Dask shuffle on (band, band hash); each shuffle
   partition is grouped by :func:`gpu_dedup.buckets.group_buckets` and keeps
   its multi-member buckets, which the client gathers.
4. **verify**: :func:`gpu_dedup.buckets.star_rounds` as in one process; each
   round's pairs are scored by merging a frame of the candidate documents'
   normalized texts (or signatures) onto both ends (Dask merges) and running
   the same kernels per merged partition.
5. **components / select** on the gathered edge list (SciPy), survivors by the
   same policy ranks; similarity to the survivor (and, with
   ``select.split_chains``, :func:`gpu_dedup.select.split_chains`' checks of
   members against their survivors) through the same merge path.
6. **write**: workers filter and write the shards in parallel.

Memory: text, signatures and band hashes live on the workers (bounded by the
block size; Dask spills to disk under its memory limit).  The client holds
small per-document arrays (exact keys, ids, ranks, labels: ~80 bytes per
document) and the edge list.  Results are identical to the single-process
pipeline for any number of workers: every tie is broken by the global row.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from . import io
from .buckets import group_buckets, star_rounds
from .components import components
from .config import Config
from .errors import BackendError, ResourceError
from .exact import exact_groups, exact_keys
from .hashing import hash_params
from .lsh import band_hashes
from .minhash import signatures
from .normalize import normalize, repair_utf8
from .select import ranks_from_keys, split_chains, survivors, text_lengths
from .strings import string_buffers
from .verify import exact_similarity, signature_similarity

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


def inspect_shard(shard: io.Shard, cfg: Config) -> dict:
    """Rows, id type and row-group sizes of one shard; validates its columns."""
    score = cfg.select.score_column if cfg.select.keep == "score" else None
    if shard.format == "parquet":
        table = io.read_columns(shard, cfg.input, score, row_groups=[])  # validates names and types, reads 0 rows
        meta = pq.ParquetFile(shard.path).metadata
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        id_type = table.column("id").type if cfg.input.id_column else None
        return {"rows": int(sum(groups)), "row_groups": groups, "id_type": id_type}
    table = io.read_columns(shard, cfg.input, score)
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
class BlockResult:
    rows: np.ndarray  # global rows
    null: np.ndarray
    keys: np.ndarray | None  # (m, 3) exact keys
    shingles: np.ndarray
    band_hashes: np.ndarray  # (m, bands)
    signatures: np.ndarray | None  # (m, perms) when verification needs them
    rank_key: object  # Arrow array of the policy's key, or None
    ids: object  # Arrow array of user ids, or None (generated)
    invalid_utf8: int
    text_bytes: int


def _block_texts(block: Block, shard: io.Shard, cfg: Config):
    score = cfg.select.score_column if cfg.select.keep == "score" else None
    table = io.read_columns(shard, cfg.input, score, block.row_groups)
    if table.num_rows != block.rows:
        raise io.InputError(f"shard {shard.path!r} changed during the run ({table.num_rows} rows, expected {block.rows})")
    return table


def _normalized(table, cfg: Config):
    repaired, invalid = repair_utf8(table.column("text"))
    return string_buffers(normalize(repaired, cfg.normalize)), invalid


def map_block(block: Block, shard: io.Shard, cfg: Config) -> BlockResult:
    """Stage code of the single-process pipeline, on one block."""
    table = _block_texts(block, shard, cfg)
    m = table.num_rows
    null = np.asarray(table.column("text").is_null(), dtype=bool)
    strings, invalid = _normalized(table, cfg)
    keys = exact_keys(strings, cfg.minhash.seed, cfg.backend) if cfg.exact_dedup else None
    docs = np.flatnonzero(~null)
    sig = signatures(strings, cfg.minhash, num_perm=cfg.signature_perms, docs=docs, backend=cfg.backend)
    bands, rows = cfg.layout
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm, cfg.minhash.hash_bits)
    shingles = np.zeros(m, np.int64)
    shingles[docs] = sig.shingles
    bh = np.zeros((m, bands), np.uint64)
    bh[docs] = band_hashes(sig.values, bands, rows, params, cfg.backend)
    full_sig = None
    if cfg.verify.method != "exact":
        full_sig = np.zeros((m, sig.values.shape[1]), sig.values.dtype)
        full_sig[docs] = sig.values
    rank_key = None
    if cfg.select.keep == "longest":
        rank_key = text_lengths(table.column("text"))
    elif cfg.select.keep == "score":
        rank_key = table.column("score").combine_chunks()
    ids = table.column("id").combine_chunks() if cfg.input.id_column else None
    return BlockResult(np.arange(block.row0, block.row0 + m, dtype=np.int64), null, keys, shingles, bh, full_sig,
                       rank_key, ids, invalid, strings.nbytes)


def _small(result: BlockResult) -> dict:
    """What the client gathers from a block: a few values per document."""
    return {"null": result.null, "keys": result.keys, "shingles": result.shingles, "rank_key": result.rank_key,
            "ids": result.ids, "invalid_utf8": result.invalid_utf8, "text_bytes": result.text_bytes}


def _long_frame(result: BlockResult, candidate: np.ndarray) -> pd.DataFrame:
    """(band, hash, doc) rows of this block's MinHash candidates."""
    idx = np.flatnonzero(candidate)
    bands = result.band_hashes.shape[1]
    return pd.DataFrame({
        "band": np.tile(np.arange(bands, dtype=np.int32), idx.shape[0]),
        "hash": result.band_hashes[idx].ravel(),
        "doc": np.repeat(result.rows[idx], bands),
    })


def _partition_buckets(df: pd.DataFrame) -> pd.DataFrame:
    """Memberships of the multi-member buckets of one shuffle partition (singletons dropped here)."""
    b = group_buckets(df["band"].to_numpy(np.int32), df["hash"].to_numpy(np.uint64), df["doc"].to_numpy(np.int64))
    return pd.DataFrame({"band": np.repeat(b.band, b.sizes), "hash": np.repeat(b.hash, b.sizes), "doc": b.members})


def _texts_frame(block: Block, shard: io.Shard, cfg: Config, rows: np.ndarray) -> pd.DataFrame:
    """Normalized texts of some rows of a block (re-read on the worker)."""
    table = _block_texts(block, shard, cfg)
    norm = normalize(repair_utf8(table.column("text"))[0], cfg.normalize)
    return pd.DataFrame({"row": rows, "text": pd.arrays.ArrowExtensionArray(norm.take(pa.array(rows - block.row0)))})


def _signature_frame(result: BlockResult, rows: np.ndarray) -> pd.DataFrame:
    sig = result.signatures[rows - result.rows[0]]
    frame = pd.DataFrame(sig, columns=[f"s{j}" for j in range(sig.shape[1])])
    frame.insert(0, "row", rows)
    return frame


def _partition_similarity(df: pd.DataFrame, cfg: Config) -> pd.DataFrame:
    m = len(df)
    left, right = np.arange(m), np.arange(m) + m
    if cfg.verify.method == "exact":
        texts = pa.concat_arrays([pa.array(df["text_a"]).cast(pa.large_string()),
                                  pa.array(df["text_b"]).cast(pa.large_string())]) if m else pa.array([], pa.large_string())
        sim = exact_similarity(left, right, string_buffers(texts), cfg.minhash, cfg.backend)
    else:
        cols = [c for c in df.columns if c.startswith("s") and c.endswith("_a")]
        a = df[cols].to_numpy()
        b = df[[c[:-2] + "_b" for c in cols]].to_numpy()
        sim = signature_similarity(left, right, np.ascontiguousarray(np.vstack([a, b])), cfg.backend)
    return pd.DataFrame({"i": df["i"].to_numpy(np.int64), "sim": sim})


def _write_shard(shard: io.Shard, keep: np.ndarray, out: str, compression: str) -> int:
    return io.write_shard(shard, keep, out, compression)


def _peak_rss() -> float:
    from .pipeline import peak_rss_mb

    return peak_rss_mb()


# --------------------------------------------------------------------------- the driver


def connect(cfg: Config):
    """A client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise BackendError("--workers / --scheduler need Dask: pip install 'gpu_dedup[dask]'") from None
    c = cfg.cluster
    if c.scheduler:
        client = Client(c.scheduler)
        cluster = None
    elif cfg.backend == "gpu":
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise BackendError("GPU workers need dask-cuda: pip install 'gpu_dedup[cuda12]' (or [cuda13])") from None
        cluster = LocalCUDACluster(n_workers=c.workers, memory_limit=c.memory_limit, dashboard_address=":0")
        client = Client(cluster)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // c.workers)
        cluster = LocalCluster(n_workers=c.workers, threads_per_worker=1, processes=True,
                               memory_limit=c.memory_limit, dashboard_address=":0",
                               env={"NUMBA_NUM_THREADS": str(threads)})
        client = Client(cluster)
    log.info("Dask dashboard: %s (%d workers)", client.dashboard_link, len(client.scheduler_info()["workers"]))
    print(f"Dask dashboard: {client.dashboard_link}", flush=True)
    return client, cluster


def run(inputs, output_dir, cfg: Config):
    """The pipeline on a Dask cluster; returns the same RunResult as the single-process run."""
    import dask
    import dask.dataframe as dd

    from .backend import get_backend
    from .pipeline import (DUPLICATES_NAME, REPORT_HTML_NAME, REPORT_NAME, SUCCESS_NAME, RunResult, StageLog,
                           _prepare_output, duplicates_table, peak_rss_mb)
    from .report import build_report, write_report
    from .report_html import write_html

    t_start = time.perf_counter()
    out = Path(output_dir)
    backend = get_backend(cfg.backend)
    cfg = replace(cfg, backend=backend.name)  # workers use what the client resolved
    st = StageLog()
    counts: dict = {}
    shards = io.discover(inputs, cfg.input.format)
    _prepare_output(out, shards)
    client, cluster = connect(cfg)
    blocks: list = []
    try:
        with st.stage("read") as info:
            infos = client.gather(client.map(inspect_shard, shards, cfg=cfg, pure=False))
            first = None
            for shard, inf in zip(shards, infos):
                if cfg.input.id_column and inf["id_type"] is not None:
                    first = io.check_id_type(shard, cfg.input.id_column, inf["id_type"], first)
            shards = [s.with_rows(i["rows"]) for s, i in zip(shards, infos)]
            blocks = plan_blocks(infos, cfg.cluster.block_rows)
            n = sum(i["rows"] for i in infos)
            info.update(documents=n, shards=len(shards), blocks=len(blocks))

        with st.stage("map") as info:  # normalize, exact keys, signatures, bands per block
            futures = client.map(map_block, blocks, [shards[b.shard_index] for b in blocks], cfg=cfg, pure=False)
            small = client.gather(client.map(_small, futures))
            info.update(blocks=len(blocks))

        null = np.concatenate([s["null"] for s in small]) if small else np.zeros(0, bool)
        shingles = np.concatenate([s["shingles"] for s in small]) if small else np.zeros(0, np.int64)
        if cfg.input.id_column:
            ids = pa.chunked_array([s["ids"] for s in small], type=first[0] if first else pa.int64())
        else:
            ids = pa.chunked_array([pa.array(np.arange(n, dtype=np.int64))])
        invalid = sum(s["invalid_utf8"] for s in small)
        dup_ids = n - pa.compute.count_distinct(ids, mode="all").as_py() if n else 0
        counts.update(documents_read=n, null_text=int(null.sum()), duplicate_ids=dup_ids, invalid_utf8=invalid)

        with st.stage("exact") as info:
            rank_key = None
            if cfg.select.keep in ("longest", "score") and small:
                rank_key = pa.chunked_array([s["rank_key"] for s in small])
            ranks = ranks_from_keys(cfg.select.keep, n, length=rank_key, ids=ids, score=rank_key)
            if cfg.exact_dedup and n:
                keys = np.concatenate([s["keys"] for s in small])
                rep = exact_groups(keys, ranks, eligible=~null)
            else:
                rep = np.arange(n, dtype=np.int64)
            info.update(exact_copies=int(np.count_nonzero(rep != np.arange(n))))
        counts["exact_stage_collapsed"] = int(np.count_nonzero(rep != np.arange(n)))
        is_rep = (rep == np.arange(n)) & ~null
        counts.update(minhash_documents=int(is_rep.sum()), no_shingles=int((is_rep & (shingles == 0)).sum()))
        candidate = is_rep & (shingles > 0)

        with st.stage("buckets") as info:
            meta = pd.DataFrame({"band": np.zeros(0, np.int32), "hash": np.zeros(0, np.uint64),
                                 "doc": np.zeros(0, np.int64)})
            parts = [dask.delayed(_long_frame)(f, candidate[b.row0 : b.row0 + b.rows]) for f, b in zip(futures, blocks)]
            if parts:  # the (band, band hash) grouping is a Dask shuffle; singletons die per partition
                long = dd.from_delayed(parts, meta=meta, verify_meta=False)
                shuffled = long.shuffle(on=["band", "hash"], npartitions=max(1, len(blocks)))
                multi = shuffled.map_partitions(_partition_buckets, meta=meta).compute()
                bk = group_buckets(multi["band"].to_numpy(np.int32), multi["hash"].to_numpy(np.uint64),
                                   multi["doc"].to_numpy(np.int64))
            else:
                bk = group_buckets(np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64))
            sizes = bk.sizes
            shuffle_bytes = int(candidate.sum()) * cfg.layout[0] * (4 + 8 + 8)
            info.update(buckets=len(bk), memberships=int(sizes.sum()), shuffle_mb=round(shuffle_bytes / 2**20, 1))
        counts.update(candidate_buckets=len(bk), bucket_memberships=int(sizes.sum()))

        def similarity(left, right):
            return _distributed_similarity(client, futures, blocks, shards, left, right, cfg)

        with st.stage("verify") as info:  # star edges per bucket, re-starred; each round one merge job
            verified, scored, _ = star_rounds(bk, similarity, cfg.verify_threshold, cfg.lsh.star_rounds,
                                           keep_all=cfg.verify.method == "none")
            info.update(method=cfg.verify.method, star_rounds=cfg.lsh.star_rounds, candidate_edges=scored,
                        verified_edges=len(verified))
        counts.update(candidate_edges=scored, verified_edges=len(verified))

        with st.stage("components") as info:
            labels = components(verified, n, backend)[rep]
            size = np.bincount(labels, minlength=n) if n else np.zeros(0, np.int64)
            info.update(clusters=int(np.count_nonzero(size > 1)))

        with st.stage("select") as info:
            survivor = survivors(labels, ranks)
            if cfg.select.split_chains:  # members below the threshold to their survivor leave (as in one process)
                labels, survivor, ejected, rounds = split_chains(labels, rep, ranks, verified.src, verified.dst,
                                                                 similarity, cfg.verify_threshold, backend)
                size = np.bincount(labels, minlength=n) if n else np.zeros(0, np.int64)
                counts["chain_split_ejected"] = int(ejected.sum())
                info.update(chain_split_ejected=int(ejected.sum()), chain_split_rounds=rounds)
            kept = survivor == np.arange(n)
            sim_s = np.ones(n, np.float64)
            todo = np.flatnonzero(~kept & (rep != survivor))
            if todo.shape[0]:
                sim_s[todo] = similarity(rep[todo], survivor[todo])
            removed = ~kept
            near = removed & (rep != survivor)
            info.update(kept=int(kept.sum()), removed=int(removed.sum()))
        counts.update(clusters=int(np.count_nonzero(size > 1)), exact_duplicates=int((removed & ~near).sum()),
                      near_duplicates=int(near.sum()), removed=int(removed.sum()), kept=int(kept.sum()))

        with st.stage("write") as info:
            starts = np.cumsum([0] + [s.rows for s in shards])
            written = client.gather(client.map(
                _write_shard, shards, [kept[starts[i] : starts[i + 1]] for i in range(len(shards))],
                out=str(out), compression=cfg.output.compression, pure=False))
            shard_idx = np.repeat(np.arange(len(shards)), [s.rows for s in shards])
            shard_row = np.concatenate([np.arange(s.rows) for s in shards]) if shards else np.zeros(0, np.int64)
            dup = duplicates_table(ids, shard_idx, shard_row, [s.name for s in shards], cfg.input.id_column,
                                   size[labels] > 1 if n else np.zeros(0, bool), kept, survivor, sim_s, rep)
            if cfg.output.duplicates_table:
                io.atomic_write_parquet(out / DUPLICATES_NAME, dup, cfg.output.compression)
            info.update(rows_written=int(sum(written)), duplicates_rows=dup.num_rows)
        if sum(written) != counts["kept"]:  # pragma: no cover
            raise RuntimeError(f"accounting error: {sum(written)} rows written but {counts['kept']} kept")

        worker_peaks = client.run(_peak_rss)
        report = build_report(cfg=cfg, backend=backend, shards=shards, counts=counts, stages=st.stages,
                              bucket_sizes=sizes, cluster_sizes=size[size > 1], removed_similarity=sim_s[near],
                              threshold=cfg.verify_threshold, wall_seconds=time.perf_counter() - t_start,
                              peak_rss_mb=peak_rss_mb())
        report["cluster"] = {
            "workers": len(worker_peaks),
            "scheduler": cfg.cluster.scheduler or "local",
            "dashboard": client.dashboard_link,
            "worker_peak_rss_mb": {k: round(v, 1) for k, v in worker_peaks.items()},
            "shuffle_mb": round(shuffle_bytes / 2**20, 2),
            "blocks": len(blocks),
        }
        write_report(out / REPORT_NAME, report)
        write_html(out / REPORT_HTML_NAME, report)  # no sample texts: they stay on the workers
        io.atomic_write_bytes(out / SUCCESS_NAME, b"distributed\n")
    except Exception as exc:
        if type(exc).__name__ != "KilledWorker":
            raise
        limit = cfg.cluster.memory_limit or "the cluster's default"
        largest = max((b.rows for b in blocks), default=0)
        raise ResourceError(
            f"Dask workers died running a task ({exc.args[0] if exc.args else exc}); most often a block does not "
            f"fit a worker's memory (memory limit {limit}, cluster.block_rows = {cfg.cluster.block_rows:,}, largest "
            f"block {largest:,} rows; a block holds whole Parquet row groups): lower cluster.block_rows (e.g. "
            f"--set cluster.block_rows={max(1, cfg.cluster.block_rows // 4)}), write the shards with smaller row "
            "groups, or raise cluster.memory_limit"
        ) from None
    finally:
        client.close()
        if cluster is not None:
            cluster.close()
    return RunResult(out, report, dup, kept, survivor, verified, shards)


def _distributed_similarity(client, futures, blocks, shards, left, right, cfg: Config) -> np.ndarray:
    """Similarity of row pairs: a frame of the rows' texts (or signatures) merged onto both ends."""
    import dask
    import dask.dataframe as dd

    out = np.empty(left.shape[0], np.float64)
    if left.shape[0] == 0:
        return out
    rows = np.unique(np.concatenate([left, right]))
    starts = np.array([b.row0 for b in blocks])
    owner = np.searchsorted(starts, rows, side="right") - 1
    parts = []
    for k in np.unique(owner):  # one task per block that holds a row of a pair
        b = blocks[k]
        sel = rows[owner == k]
        if cfg.verify.method == "exact":
            parts.append(dask.delayed(_texts_frame)(b, shards[b.shard_index], cfg, sel))
        else:
            parts.append(dask.delayed(_signature_frame)(futures[k], sel))
    if cfg.verify.method == "exact":
        meta = pd.DataFrame({"row": np.zeros(0, np.int64),
                             "text": pd.arrays.ArrowExtensionArray(pa.array([], pa.large_string()))})
    else:
        p = cfg.signature_perms
        meta = pd.DataFrame(np.zeros((0, p), np.uint64 if cfg.minhash.hash_bits == 64 else np.uint32),
                            columns=[f"s{j}" for j in range(p)])
        meta.insert(0, "row", np.zeros(0, np.int64))
    table = dd.from_delayed(parts, meta=meta, verify_meta=False)
    value_cols = [c for c in meta.columns if c != "row"]
    side_a = table.rename(columns={"row": "src", **{c: f"{c}_a" for c in value_cols}})
    side_b = table.rename(columns={"row": "dst", **{c: f"{c}_b" for c in value_cols}})
    npart = max(1, min(len(blocks), left.shape[0] // 50_000 + 1))
    pairs = dd.from_pandas(pd.DataFrame({"src": left, "dst": right, "i": np.arange(left.shape[0])}), npartitions=npart)
    merged = pairs.merge(side_a, on="src").merge(side_b, on="dst")
    res = merged.map_partitions(_partition_similarity, cfg, meta={"i": np.int64, "sim": np.float64}).compute()
    out[res["i"].to_numpy(np.int64)] = res["sim"].to_numpy(np.float64)
    if res.shape[0] != left.shape[0]:  # pragma: no cover - every row of a pair exists
        raise RuntimeError(f"similarity computed for {res.shape[0]} of {left.shape[0]} pairs")
    return out
