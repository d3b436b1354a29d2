"""The Dask executor: every part is a future on a worker; the client holds one future per partition.

Blocks (shards, or groups of Parquet row groups up to ``cluster.block_rows``)
are read, normalized and signed where they are loaded; every per-document
table the sequence builds (ranks, exact groups, band hashes, buckets, star
edges, component labels, clusters, survivors, the duplicates table) is a list
of futures, one per block or per shuffle partition, and rows move between
them only through :func:`gpu_dedup.run.cluster.routing.route` (Dask's shuffle).
What reaches the client is per-block metadata and counts: its memory does not
grow with the corpus.

GPU workers (``--backend gpu``: Dask-CUDA, one worker per GPU): a block's
kernels (normalization, exact keys, signatures, band hashes, pair similarity)
run on the worker's GPU inside the block's task; the tables between tasks are
host arrays (:func:`gpu_dedup.backends.host_frame`), as on CPU workers.
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import socket
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import gpu_dedup.run.cluster.blocks as B
import gpu_dedup.run.cluster.routing as routing
from gpu_dedup import storage
from gpu_dedup.backends import (
    STAGE_TRANSFERS,
    array_module,
    available_memory,
    distinct,
    get_backend,
    stable_order,
    to_host,
    traits,
    transfer_totals,
)
from gpu_dedup.backends.arrow_arrays import numpy_array
from gpu_dedup.backends.placement import shard_writer
from gpu_dedup.config import Config
from gpu_dedup.run.checkpoint import (
    SUFFIX, CheckpointUnreadable, load_arrays, maybe_crash, save_arrays, staged,
)
from gpu_dedup.run.cluster.connection import connect, quiet_teardown
from gpu_dedup.run.contract import Ready, Soon, Step, shard_starts, take_in_order
from gpu_dedup.run.prior import NoPrior
from gpu_dedup.run.sequence import CorpusCounts
from gpu_dedup.run.stagelog import StageLog, peak_rss_mb
from gpu_dedup.stages import frames
from gpu_dedup.stages.buckets import long_frame
from gpu_dedup.stages.components import (
    both_directions,
    changed_pairs,
    large_star,
    local_components,
    small_star,
    small_star_orient,
    star_labels,
    unique_pairs_part,
)
from gpu_dedup.stages.edges import unique_edges
from gpu_dedup.stages.families import Family, family_for
from gpu_dedup.stages.selection import ranks_from_keys
from gpu_dedup.stages.vectors import Vectors
from gpu_dedup.stages.write import DUPLICATES_ROW_GROUP, duplicates_parquet_options
from gpu_dedup.storage.filesystems import as_path, is_url, remove_tree, source

log = logging.getLogger("gpu_dedup")

SAMPLE_PER_BLOCK = 256  # keys each block offers for the rank sort's splitters
COMPONENTS_GATHERED_EDGES = 2_000_000  # up to this many edges, one worker runs union-find over all of them
# the routes whose destinations run these steps move edges: on the device with cluster.shuffle: device
DEVICE_STEPS = (unique_edges, unique_pairs_part, large_star, small_star, star_labels)


class _ClientSide:
    """What the client says of the backend: the workers run the kernels."""

    def __init__(self, cfg: Config):
        self.name = cfg.backend
        self.mode = f"dask: {cfg.backend} workers"


class ClusterCorpus(CorpusCounts):
    def __init__(self, shards, n, null_count, id_column, duplicate_ids):
        self.shards, self.n, self.null_count, self.id_column = shards, n, null_count, id_column
        self.duplicate_ids = duplicate_ids


class DaskExecutor:
    """Blocks and every per-document table on Dask workers (see the module docstring)."""

    holds_corpus = False
    family: Family  # the similarity family, sized by read()

    def __init__(self, shards, cfg: Config, prior=None):
        self.shards = shards
        self.skipped = list(getattr(shards, "skipped", ()))  # what directory walks left out (report.json)
        self.cfg = cfg
        self.prior = prior if prior is not None else NoPrior()
        self.backend = _ClientSide(cfg)  # the client runs no kernels (and starts no CUDA context)
        self.part_backend = cfg.backend  # resolved on each worker
        self.client: Any = None  # distributed.Client (untyped)
        self.cluster: Any = None
        self.blocks: list = []
        self.loaded: list = []
        self.homes: list = []  # the worker each block is read on (B.spread_blocks)
        self.normalized: list = []  # the blocks once normalized (read() sets them)
        self.invalid_utf8: int | None = None  # counted by the normalize stage
        self.spilled_text_mb = 0.0
        self.spilled_text_blocks = 0
        self._prepared: Any = None
        self.bands: list | None = None  # the bands parts (signatures for verification by signature)
        self.routes = 0
        self.device_routes = 0  # routes that moved device frames (cluster.shuffle: device)
        self.expected_rows: int | None = None  # what later routes move at most (expect_rows); None: unknown
        self.vector_dim: int | None = None  # the corpus's vector length (input.vector_column)
        self.run_key = uuid.uuid4().hex  # the workers tally what this run's routes move under it
        self.moved_totals: dict = {}  # stage -> [rows, bytes] the routes moved (routing.take_moved)
        self.write_threads: dict = {}  # worker -> how many shards it wrote at once (write_shards)
        self.writers: dict = {}  # which wrote the shards: {"cudf": shards, "pyarrow": shards} (write_shards)
        self.text_readers: dict = {}  # which read the blocks' texts: {"cudf": blocks, "pyarrow": blocks} (read)
        self.write_busy: dict = {}  # the workers' seconds syncing and digesting the shards (write_details)
        self.writes_shards = cfg.output.shards  # the run writes the deduplicated shards (run_cluster sets it)
        self.shards_from_held = 0  # shards written from the input batches their blocks held (write_shards)
        self._held_homes: dict = {}  # block -> its workers, of the blocks holding input batches (write_shards)
        self.transfers_by_stage: dict = {}  # GPU workers: stage -> host<->device bytes copied (_stage_transfers)
        self._transfers: dict = {}

    # ---- setup ----------------------------------------------------------------
    def connect(self) -> None:
        """Start or join the cluster (before anything is written: an unreachable scheduler leaves nothing)."""
        if self.client is None:
            self.client, self.cluster = connect(self.cfg)

    def prepare(self, st: StageLog) -> None:
        self.st = st
        self.connect()
        # each worker loads (the first time after install: compiles) the kernels this config uses
        self.client.run(_forget_saved)  # a run before this one on the same workers may have left some
        seconds = self.client.run(prepare_worker, self.cfg, own=self.cluster is not None)
        self.startup_seconds = max(seconds.values(), default=0.0)
        if self.cfg.cluster.shuffle == "device":  # on the client (it builds the shuffles' graphs) and the scheduler
            import_dataframes(self.cfg.backend)
            try:  # which unpickles them: it imported Dask's DataFrame with its event loop blocked, the first time
                self.client.run_on_scheduler(import_dataframes, self.cfg.backend)
            except Exception as exc:  # noqa: BLE001 - a scheduler without gpu_dedup: the first route imports it
                log.debug("the scheduler did not import Dask's DataFrame ahead of the device routes: %s", exc)
        if traits(self.cfg.backend).workers == "cuda":  # what each stage's tasks copied to and from the devices
            self._transfers = self._worker_transfers()
            st.ends.append(self._stage_transfers)

    def _worker_transfers(self) -> dict:
        """The host<->device bytes the workers' tasks have copied so far (backends.transfer_totals), summed."""
        got = self.client.run(transfer_totals).values()
        return {k: sum(int(t.get(k, 0)) for t in got) for k in STAGE_TRANSFERS}

    def _stage_transfers(self, stage: str) -> None:
        """GPU workers: the host<->device bytes stage ``stage`` copied on them (one round trip as it ends; tasks
        still running then count in the next stage's)."""
        now = self._worker_transfers()
        self.transfers_by_stage[stage] = {k: now[k] - self._transfers.get(k, 0) for k in now}
        self._transfers = now

    def kernels_loaded(self) -> None:
        """Loaded by :meth:`prepare`: each worker loads its kernels before any block is read."""

    def close(self) -> None:
        """Leave the workers as they were found (a joined cluster) and close what this run started.  Each step
        runs whatever the one before it raised: an interrupt while closing (Ctrl-C, a scheduler's SIGTERM) still
        silences this run's workers before their scheduler goes, or each one that heartbeats meanwhile prints a
        traceback on the shared stderr; the interrupt then goes on as it came."""
        with contextlib.ExitStack() as steps:  # run last first
            if self.cluster is not None:
                steps.callback(self.cluster.close)
            if self.client is not None:
                steps.callback(self.client.close)
                if self.cluster is not None and not log.isEnabledFor(logging.DEBUG):  # -v: everything
                    steps.callback(quiet_teardown, self.client)  # a joined cluster's processes serve others after us
                steps.callback(self._forget)
            maybe_crash("cluster:closing")

    def _forget(self) -> None:
        try:  # frames no new future took (a failed stage), and the run's spilled texts, go with the client
            self.client.run(_forget_saved)
            self.client.run(B.drop_texts, self.run_key)
        except Exception:  # noqa: BLE001 - workers already gone: nothing is left on them
            pass

    def advise_pools(self) -> None:
        """On a cluster the user started (its workers' Arrow pools are theirs to set), a warning where they decode
        Parquet on fewer threads than their share of the cores (:func:`arrow_pool_advice`); one round trip."""
        if self.cluster is None:
            advice = arrow_pool_advice(self.client.run(_decode_pool))
            if advice:
                log.warning(advice)

    def report_extras(self) -> dict:
        peaks = self.client.run(peak_rss_mb)
        arrow = self.client.run(pa.cpu_count)  # each worker's Arrow pool (connection.worker_pools)
        self._settle_moved()
        moved = self.moved_totals
        return {"kernel_prepare_seconds": round(self.startup_seconds, 3), "inputs_skipped": self.skipped, "cluster": {
            "workers": len(peaks),
            "scheduler": self.cfg.cluster.scheduler or "local",
            "dashboard": self.client.dashboard_link,
            "worker_peak_rss_mb": {k: round(v, 1) for k, v in peaks.items()},
            "client_peak_rss_mb": round(peak_rss_mb(), 1),
            # the scheduler this run started (its own process on CPU workers); a joined one's is not this run's
            "scheduler_peak_rss_mb": (round(self.client.run_on_scheduler(peak_rss_mb), 1)
                                      if self.cluster is not None else None),
            "blocks": len(self.blocks),
            # normalized texts the workers keep in local files (GPU workers: in host memory, not on the device)
            "spilled_text_mb": self.spilled_text_mb,
            "spilled_text_blocks": self.spilled_text_blocks,
            "partitions": self.partitions,
            "routes": self.routes,
            "device_routes": self.device_routes,
            "shuffled_rows": int(sum(m[0] for m in moved.values())),
            "shuffle_mb": round(sum(float(m[1]) for m in moved.values()) / 2**20, 2),
            "shuffle_mb_by_stage": {k: round(float(m[1]) / 2**20, 2) for k, m in moved.items()},
            "write_threads": self.write_threads,
            "writers": self.writers,
            # blocks whose texts libcudf read into device memory (GPU workers with cuDF), and pyarrow on the host
            "text_readers": self.text_readers,
            # shards written from the input batches their blocks held on the writing worker (output.hold_inputs)
            "shards_from_held": self.shards_from_held,
            "arrow_threads": arrow,
            # GPU workers: MiB their tasks copied host->device and device->host, by stage (None on CPU workers)
            "worker_transfer_mb_by_stage": {
                stage: {k.removesuffix("_bytes"): round(v / 2**20, 2) for k, v in got.items()}
                for stage, got in self.transfers_by_stage.items()} if self._transfers else None,
        }}

    # ---- read / normalize -------------------------------------------------------
    def read(self, progress=None) -> ClusterCorpus:
        cfg, client = self.cfg, self.client
        infos = client.gather(client.map(B.inspect_shard, self.shards, cfg=cfg, pure=False))
        first = None
        for shard, inf in zip(self.shards, infos):
            if cfg.input.id_column and inf["id_type"] is not None:
                first = storage.check_id_type(shard, cfg.input.id_column, inf["id_type"], first)
        shards = self.shards = [s.with_rows(i["rows"]) for s, i in zip(self.shards, infos)]
        self.blocks = B.plan_blocks(infos, cfg.cluster.block_rows)
        n = sum(i["rows"] for i in infos)
        self.family = family_for(cfg, n)
        self.blocks_count = max(1, len(self.blocks))
        self.partitions = self.blocks_count
        self.block_starts = np.array([b.row0 for b in self.blocks] + [n], np.int64) if self.blocks else \
            np.array([0, 0], np.int64)
        block_shards = [[shards[i] for i in b.shard_indices] for b in self.blocks]
        # every worker (scheduler_info() lists only 5 in some Dask releases: dask/distributed#9045)
        self.homes = B.spread_blocks([b.rows for b in self.blocks], sorted(client.nthreads()))
        streamed = B.streams_text(cfg)  # CPU workers: each block read and normalized in one pass
        # CPU workers' blocks keep their input batches for the write stage where output.hold_inputs allows
        hold = cfg.output.hold_inputs if self.writes_shards else False
        self.loaded = [client.submit(B.read_block if streamed else B.load_block, b, shard, cfg=cfg, pure=False,
                                     **({"run": self.run_key, "hold": hold} if streamed else {}),
                                     **routing.placed([home] if home else None))
                       for b, shard, home in zip(self.blocks, block_shards, self.homes)]
        if cfg.input.vector_column:  # one vector length for the whole corpus: an index's, else the first block's
            dims = client.gather(client.map(B.block_dim, self.loaded, pure=False))
            dim = self.vector_dim = self.prior.vector_dim() or next((d for d in dims if d is not None), None)
            redo = [k for k, d in enumerate(dims) if d is not None and d != dim]
            for k, fut in zip(redo, client.map(B.load_block, [self.blocks[k] for k in redo],
                                                [block_shards[k] for k in redo], cfg=cfg, dim=dim, pure=False)):
                self.loaded[k] = fut  # rows of another length: an error, or kept as bad_length (cosine.bad_vectors)
            client.gather([self.loaded[k] for k in redo])
        if not self.loaded:  # no rows: one empty block keeps every table one partition wide
            self.loaded = [client.submit(_empty_block, cfg, first[0] if first else None, pure=False)]
            self.homes = [None]
            streamed = False  # normalized below, as a loaded block is
        if streamed:
            self.normalized = self.loaded
        elif self.family.uses_text:  # GPU workers: each block normalized as soon as it is read (the next task on
            # its worker): a worker holds the original texts of the blocks being read, not of all its blocks
            self.loaded = self.normalized = self.map(B.normalize_block, self.loaded, cfg=cfg, run=self.run_key)
        counted = self.total(_null_count, self.loaded)
        null = counted["null"]
        self.text_readers = {"cudf": counted["device_read"], "pyarrow": len(self.loaded) - counted["device_read"]}
        if progress is not None:
            progress(len(shards))
        dup = 0
        if cfg.input.id_column and n:
            hashes = self.map(B.id_hashes, self.loaded, backend=cfg.backend)
            routed = self.route(hashes, frames.hash_dest, self.partitions, on=("h1",))
            dup = n - self.total(B.distinct_pairs, routed)["distinct"]
        self.corpus = ClusterCorpus(shards, n, null, cfg.input.id_column, dup)
        return self.corpus

    def docs(self) -> list:
        return self.map(B.block_docs, self.loaded)

    def _normalize(self) -> list:
        """The normalized blocks (normalized as they were read, :meth:`read`); the normalize stage counts them
        (its time is the wait for normalizations still running, the rest is in the read stage's)."""
        if self.invalid_utf8 is None:
            with self.st.stage("normalize", self.corpus.n) as info:
                got = self.client.gather(self.client.map(B.block_norm_info, self.normalized, pure=False))
                self.invalid_utf8 = sum(g["invalid_utf8"] for g in got)
                self.spilled_text_mb = round(sum(g["spilled_bytes"] for g in got) / 2**20, 1)
                self.spilled_text_blocks = sum(g["spilled_blocks"] for g in got)
                info.update(invalid_utf8=self.invalid_utf8, text_mb=round(sum(g["text_bytes"] for g in got) / 2**20, 1))
        return self.normalized

    def normalize(self) -> dict:
        if not self.family.uses_text:
            return {}
        self._normalize()
        return {"invalid_utf8": self.invalid_utf8}

    def _blocks_data(self) -> list:
        return self._normalize() if self.family.uses_text else self.loaded

    def _family(self):
        """The family with corpus statistics (summed over the blocks), scattered to the workers once."""
        if self._prepared is None and not self.family.needs_stats:
            self._prepared = (self.family, self.family)
        if self._prepared is None:
            stats = self.client.gather(self.client.map(B.block_stats, self._normalize(), family=self.family,
                                                       pure=False))
            fam = self.family.prepare([s for s in stats if s is not None])
            self._prepared = (fam, self.client.scatter(fam, broadcast=True))
        return self._prepared[1]

    # ---- per-document stages -------------------------------------------------------
    def exact_keys(self) -> list:
        return self.map(B.block_keys, self._blocks_data(), family=self.family)

    def ranks(self) -> list:
        """Every row's rank under the keep policy: a sample sort (splitters from a sample of every block, rows
        routed by range, each range ranked as one process would, offsets from the ranges' sizes)."""
        keep = self.cfg.select.keep
        keys = self.map(_rank_frame, self.loaded, keep=keep)
        samples = self.collect(_rank_sample, keys, k=SAMPLE_PER_BLOCK, keep=keep)
        splitters = _splitters([s for s in samples if s is not None], self.partitions)
        ranged = self.route(keys, _range_dest, self.partitions, splitters=splitters, keep=keep)
        sizes = self.collect(frames.size, ranged)
        offsets = np.concatenate(([0], np.cumsum(sizes)))[:-1]
        ranked = self.client.map(_rank_range, routing.reals(ranged), [int(o) for o in offsets], keep=keep, pure=False,
                                 priority=routing.later())
        back = self.route(ranked, frames.block_dest, self.blocks_count, on="row", starts=self.block_starts)
        return self.map(_by_row, back)  # in the block's row order, as the docs frames

    def signatures(self, rows: list, progress=None) -> list:
        """Per block: what the signature stage counts, with the block's band hashes already made in the same
        task (:func:`~gpu_dedup.run.cluster.blocks.block_signed`): a worker never holds the signature values
        of all its blocks at once."""
        sigs = self.map(B.block_signed, self._blocks_data(), rows, family=self._family(),
                        device_bands=self.cfg.cluster.shuffle == "device")
        if progress is not None:
            progress(self.total(_rows_of, rows)["rows"])
        return sigs

    def band_hashes(self, sigs: list) -> list:
        return self.map(B.signed_bands, sigs)

    def keep_bands(self, bands: list) -> None:
        self.bands = bands

    # ---- moving rows ---------------------------------------------------------------
    def map(self, fn, *parts, outputs: int = 1, with_index: bool = False, fuse: bool | None = None, **kw):
        """``fn`` over the parts, one task per partition.  A route's destination still pending
        (:class:`~gpu_dedup.run.cluster.routing.Later`) is made inside that task when ``fuse`` (unless another
        task took it already), else submitted as a task of its own.  ``fuse`` None: once the routes are small
        (:meth:`_small_routes`, after the buckets): a destination a map takes may be read again later (the
        buckets, by their counts), and made again then; fused before, the buckets' own step ran twice (0.08 s
        more of the stage at 10^5 documents)."""
        if fuse is None:
            fuse = self._small_routes()
        n = len(next(p for p in parts if p is not None))
        args = [p if p is not None else [None] * n for p in parts]
        first = routing.later()  # depth first: a stage's consumers run as soon as their inputs are ready
        if with_index:
            fn, args = _call_with_index, [[fn] * n, range(n), *args]
        homes = self._block_homes(parts)
        if any(isinstance(a, routing.Later) for col in args for a in col):
            futures = self._map_made(fn, args, n, homes, first, fuse, kw)
        elif homes is None:
            # Client.map puts a keyword value over 100 kB (the shard names of 2,000 shards) in the graph under the
            # keyword's own name, a task without the priority the others get: the scheduler failed on it and the
            # run waited forever.  Such a value goes to the workers once, as a future.
            from dask.sizeof import sizeof

            kw = {k: self.client.scatter([v])[0] if sizeof(v) > 1e5 else v for k, v in kw.items()}
            futures = self.client.map(fn, *args, pure=False, priority=first, **kw)
        else:  # a task that reads a block runs where the block is: the block never travels
            futures = [self.client.submit(fn, *a, pure=False, priority=first, **routing.placed(home), **kw)
                       for a, home in zip(zip(*args), homes)]
        if outputs == 1:
            return futures
        # each output taken out of the tuple by the task that reads it (a getitem task of its own otherwise)
        return tuple([routing.Later(self.client, operator.getitem, (f, j), routing.later(), None) for f in futures]
                     for j in range(outputs))

    def _map_made(self, fn, args: list, n: int, homes, priority: int, fuse: bool, kw: dict) -> list:
        """:meth:`map`'s tasks when some of its parts are pending (route destinations, a map's outputs): each
        made in the task that takes it (``fuse``, or an output of a map, and not taken yet), on the worker it
        was to be gathered on (a task that reads a block: where the block is); the others' futures."""
        from dask.sizeof import sizeof

        kw = {k: self.client.scatter([v])[0] if sizeof(v) > 1e5 else v for k, v in kw.items()}
        futures = []
        for k in range(n):
            row, made_at, where = [], [], homes[k] if homes is not None else None
            for j, col in enumerate(args):
                a = col[k]
                # an output taken out of a map's tuple is made again at no cost: taken even by a count
                task = a.take() if isinstance(a, routing.Later) and (fuse or a.fn is operator.getitem) else None
                if task is not None:
                    made_at.append(j)
                    where = where or a.where
                row.append(task if task is not None else routing.real(a))
            call = (routing.call_made, fn, tuple(made_at)) if made_at else (fn,)
            futures.append(self.client.submit(*call, *row, pure=False, priority=priority, **routing.placed(where),
                                              **kw))
        return futures

    def _block_homes(self, parts) -> list | None:
        """The workers holding each block, when ``parts`` include the blocks (else None).  A block weighs as
        much as its texts (BlockData.__sizeof__), so Dask's placement would seldom move it anyway; the pin
        (a loose one: another worker runs the task when the holder is gone) leaves no room for the occupancy
        estimate or work stealing to copy a block next to the small frame it is paired with, which left one
        worker holding every block."""
        blocks = next((p for p in parts if p is not None and (p is self.loaded or p is self.normalized)), None)
        if blocks is None:
            return None
        held = self.client.who_has(blocks)
        return [sorted(held.get(f.key, ())) or ([home] if home else None) for f, home in zip(blocks, self.homes)]

    def route(self, parts: list, dest, n: int, explode=None, explode_kw=None, before=None, after=None,
              **kw) -> list:
        """``before`` runs in the route's source tasks (on the worker of a block it reads), ``after`` in its
        destination tasks: no task per part, and no scheduler round trip, between a route and its maps."""
        self.routes += 1
        stage = getattr(self.st, "current", None) or "report"
        device = self.part_backend if self._device_route(explode, after) else None
        self.device_routes += device is not None
        return routing.route(self.client, parts, dest, n, explode=explode, explode_kw=explode_kw,
                             shuffle_method=self.cfg.cluster.shuffle if self.cfg.cluster.shuffle != "device" else None,
                             account=(self.run_key, stage), homes=self._destination_homes(n), before=before,
                             after=after, device=device,
                             source_homes=self._block_homes(before.others) if before is not None else None,
                             whole_cuts=self._small_routes(), lazy=True, **kw)

    def _device_route(self, explode, after) -> bool:
        """Whether a route moves its rows as device frames (``cluster.shuffle: device``): the band hashes (the
        buckets shuffle) and the edges (their de-duplication, the large-star / small-star rounds), the tables
        that grow with the corpus; every other route moves host arrays as with ``null``."""
        if self.cfg.cluster.shuffle != "device":
            return False
        return explode is long_frame or (after is not None and after.fn in DEVICE_STEPS)

    def expect_rows(self, rows: int) -> None:
        self.expected_rows = rows

    def _small_routes(self) -> bool:
        """The routes from here on move few rows (``cluster.small_route_rows``): whole cuts to each worker."""
        return self.expected_rows is not None and self.expected_rows <= self.cfg.cluster.small_route_rows

    @property
    def workers(self) -> int:
        """The workers the blocks are spread over (known after :meth:`read`)."""
        return max(1, len({h for h in self.homes if h}))

    def _destination_homes(self, n: int) -> list:
        """The worker each of a route's ``n`` destinations is gathered on: destination ``k`` where block
        ``k`` is (a destination by block is next to its block; by hash, spread as the blocks are)."""
        homes = self.homes or [None]
        return [homes[k % len(homes)] for k in range(n)]

    def total(self, fn, *parts, **kw) -> dict:
        out: dict = {}
        for d in self.client.gather(self.map(fn, *parts, fuse=False, **kw)):
            for k, v in d.items():
                out[k] = out.get(k, 0) + v
        return out

    def collect(self, fn, parts: list, **kw) -> list:
        return self.client.gather(self.map(fn, parts, fuse=False, **kw))

    # ---- pairs ---------------------------------------------------------------------
    def score(self, pairs: list, progress=None, clock: dict | None = None) -> list:
        """The similarity of each pair, computed at the block of its second end: the pairs travel there (ids
        only); each partition asks the blocks of its pairs' first ends for their payloads (normalized text,
        signature or vector), each first end once, and they travel back once per asking partition, not once
        per pair (a star's centre is in as many pairs as its bucket has members, in every band: payloads per
        pair were 1.1 GB of the boilerplate corpus's shuffle at 10^6 documents, a worker's 3.7 GB peak); the
        second ends' payloads are the block's own.  Only the similarities come back.  So the end many pairs
        share goes first (the contract says so): with a cluster's survivor second, the texts of all its
        members gathered at the survivor's block (1.4 GiB above a worker's 0.8 GiB with 20 % boilerplate at
        4 x 10^6 documents)."""
        method = self.cfg.verify.method
        f = self.prior.first_doc
        source = self._blocks_data() if method == "exact" else self.bands
        payload = (B.text_payload if self.family.uses_text else B.vector_payload) if method == "exact" else \
            B.signature_payload
        # four routes; each map between two of them runs inside the route's own source or destination tasks
        at_dst = self.route(pairs, frames.block_dest, self.blocks_count, on="dst", starts=self.block_starts,
                            first_doc=f, before=Step(_tag_pairs, index=True))
        answered = self.route(at_dst, frames.block_dest, self.blocks_count, on="node", starts=self.block_starts,
                              first_doc=f, before=Step(_first_ends, index=True),
                              after=Step(_answer, source, payload=payload, column="node", first_doc=f,
                                         prior=self.prior))
        scored = self.route(answered, _asker_dest, self.blocks_count,
                            after=Step(_score_answers, source, at_dst, payload=payload, family=self._family(),
                                       method=method, first_doc=f, prior=self.prior))
        out = self.route(scored, _part_dest, len(pairs), after=Step(_sims_in_order))
        if progress is not None:
            progress(self.total(_rows_of_pairs, pairs)["rows"])
        return out

    def components(self, edges: list, count: int | None = None) -> list:
        """Connected components: union-find on one worker up to COMPONENTS_GATHERED_EDGES edges, else
        large-star / small-star rounds over shuffles (stages/components.py); labels routed by node.  ``count``:
        the edges, when the caller knows it (counted here otherwise: a round trip before any route starts)."""
        total = count if count is not None else self.total(_edges_of, edges)["edges"]
        limit = self.cfg.cluster.components_gathered_edges
        if total > limit and traits(self.cfg.backend).graph_components:  # Dask-CUDA: cuGraph's WCC where installed
            labels = _cugraph_components(self.client, routing.reals(edges), self.partitions)
            if labels is not None:
                return labels
        if total <= limit:
            labels = self.route(edges, _zero_dest, 1, after=Step(local_components, backend=self.part_backend))
            return self.route(labels, frames.hash_dest, self.partitions, on="node")
        p = self.partitions
        a = self.route(edges, frames.hash_dest, p, on=("x", "y"), before=Step(_oriented),
                       after=Step(unique_pairs_part))
        rounds = 0
        while True:
            rounds += 1
            b = self.route(a, frames.hash_dest, p, on="x", before=Step(_both_directions), after=Step(large_star))
            b = self.route(b, frames.hash_dest, p, on=("x", "y"), after=Step(unique_pairs_part))
            c = self.route(b, frames.hash_dest, p, on="x", before=Step(small_star_orient), after=Step(small_star))
            c = self.route(c, frames.hash_dest, p, on=("x", "y"), after=Step(unique_pairs_part))
            changed = self.total(changed_pairs, a, c)["changed"]
            log.info("components: large-star/small-star round %d, %d edges changed", rounds, changed)
            a = c
            if changed == 0:
                break
        labels = self.route(a, frames.hash_dest, p, on="x", after=Step(star_labels))
        labels = self.route(labels, frames.hash_dest, p, on="node", after=Step(_unique_nodes))
        self.components_rounds = rounds
        return labels

    # ---- checkpoints: every part saved by its worker ----------------------------------
    def save(self, ckpt, unit: str, parts: dict, meta: dict) -> dict:
        """Each part saved by its worker; the parts returned are new futures of the same frames with no
        history: Dask keeps every finished task that a held future descends from (to compute it again should
        a worker die), so without this cut the scheduler (in the client process on a local cluster) would
        hold every task of every stage until the run ends, a state that grows with blocks x partitions x
        routes.  The new futures reuse the frames where they are (no copy); a worker that lost one reads it
        back from its checkpoint file."""
        if not ckpt.fingerprint:  # no checkpoints (a run against an index): the history stays
            return parts
        directory = ckpt.dir / unit
        named = {name: routing.reals(p) for name, p in parts.items() if p is not None}
        paths = {name: [str(directory / f"{name}-{k:05d}{SUFFIX}") for k in range(len(p))] for name, p in named.items()}
        everything = [f for p in named.values() for f in p]
        # every part of the unit saved at once, each by a worker holding it, which says who it is: one round trip a
        # unit (asking the scheduler where the parts are took a second one)
        savers = iter(self.client.gather(self.client.map(_save_part, everything,
                                                         [x for n in named for x in paths[n]], pure=False)))
        fresh: dict[str, Any] = {name: None for name in parts}
        for name, p in named.items():
            fresh[name] = [self.client.submit(_reuse_or_load, path, self.part_backend, pure=False,
                                              **routing.placed([w] if (w := next(savers)) else []))
                           for path in paths[name]]
        ckpt.save(unit, {}, {**meta, "parts": {name: len(p) for name, p in named.items()}})
        return fresh

    def _settle_moved(self) -> None:
        """What the routes moved so far, by stage: the workers' tallies (a worker lost takes its tally)."""
        for tallies in self.client.run(routing.take_moved, self.run_key).values():
            for stage, got in tallies.items():
                self.moved_totals[stage] = self.moved_totals.get(stage, 0) + np.asarray(got, np.int64)

    def load(self, ckpt, unit: str):
        arrays, meta = ckpt.load(unit)
        directory = ckpt.dir / unit
        parts = {}
        for name, count in meta.get("parts", {}).items():
            paths = [str(directory / f"{name}-{k:05d}{SUFFIX}") for k in range(count)]
            futs = self.client.map(_load_part, paths, backend=self.part_backend, pure=False)
            try:
                self.client.gather(self.client.map(_present, futs, pure=False))
            except CheckpointUnreadable:
                raise
            except Exception as exc:  # a part file missing or garbled: the unit is computed again
                log.warning("checkpoint %s is unreadable (%s); computing its stages again", directory, exc)
                raise CheckpointUnreadable(unit) from None
            parts[name] = futs
        return parts, meta

    # ---- outputs ---------------------------------------------------------------------
    def ids(self, parts: list, column: str = "row") -> list:
        got = self.route(parts, frames.block_dest, self.blocks_count, on="_row", starts=self.block_starts,
                         before=Step(_tag_rows, column=column, index=True), after=Step(_take_ids, self.loaded))
        return self.route(got, _part_dest, len(parts), after=Step(_ids_in_order))

    def soon(self, fn, *args, **kw) -> Soon:
        """In a thread of the client: the client mostly waits on futures, so the step's tasks run on the workers
        beside the stages that follow."""
        return Soon(fn, args, kw)

    def take_soon(self, rows, column: str) -> Ready:
        """At once: :meth:`soon` already runs the report's samples beside the write stage."""
        return Ready(self.take(rows, column))

    def take(self, rows, column: str) -> pa.Array:
        """``column`` at ``rows`` (a report's few dozen documents): original texts read again from the shards
        holding them, one task per shard on whichever worker is free (a block keeps normalized texts only);
        ids from the blocks, one task per block on its worker."""
        rows = np.asarray(rows, np.int64)
        if column == "text":
            shards = self.corpus.shards
            starts = shard_starts(shards)

            def fetch(groups):
                return self.client.gather([self.client.submit(B.original_texts, shards[k], rows[sel] - starts[k],
                                                              self.cfg, pure=False) for k, sel in groups])
            return take_in_order(rows, starts, fetch, text=True)
        homes = self._block_homes([self.loaded]) or []  # where every block is: asked once, not once a block

        def fetch_ids(groups):
            return self.client.gather([self.client.submit(B.take_column, self.loaded[k], rows[sel], column,
                                                          pure=False, **routing.placed(homes[k]))
                                       for k, sel in groups])
        return take_in_order(rows, self.block_starts, fetch_ids, text=False)

    def release_texts(self) -> None:
        """Nothing to free from here: a worker's block texts go with the block's futures."""

    def write_shards(self, removed: list, out: Path, ckpt, progress=None) -> int:
        """Each shard written by a worker from the removed rows of the blocks that read it (consecutive blocks;
        a block of several small shards hands its removed rows to each of them).  One task per worker writes its
        share of the shards, several at once on its share of its host's cores (:func:`write_shares`) as its
        memory allows (``cluster.write_threads`` in the report: how many each took): a task
        per shard ran one shard at a time on a worker of one thread, so a GPU worker (Dask-CUDA gives it one)
        wrote on one core of an otherwise idle host, and a cluster joined with fewer workers than cores left
        the others idle.  Shards go to workers by rows, weighed by those threads.  With ``gpu.writer: cudf`` a
        GPU worker writes each of its shards on its device (read, filtered and written by cuDF), as one process
        does without the read stage's device table; a shard cuDF cannot write goes to pyarrow, and
        ``cluster.writers`` in the report counts each.  A shard whose pieces' input batches are all held by
        blocks on one worker (CPU workers, ``output.hold_inputs``) is written there from them, without reading
        it again (``cluster.shards_from_held``); the others are spread by rows."""
        shards = self.corpus.shards
        by_shard: dict[int, list] = {}
        for b, fut in zip(self.blocks, routing.reals(removed)):
            for i in b.shard_indices:
                by_shard.setdefault(i, []).append(fut)
        starts = shard_starts(shards)
        written = 0
        todo = []
        for i, shard in enumerate(shards):
            rec = ckpt.marked(f"shard-{i}")
            if staged(rec, shard, out, needs=("rows",)):  # written and digested by an earlier, resumed run
                written += rec["rows"]
            else:
                todo.append(i)
        threads = write_shares(self.client.run(_host_cores)) if todo else {}
        owners, sources = self._held_shards(todo, sorted(threads))
        rest = [i for i in todo if i not in owners]
        load = dict.fromkeys(threads, 0)
        for i, w in owners.items():
            load[w] += shards[i].rows
        homes = dict(zip(rest, B.spread_blocks([shards[i].rows for i in rest], sorted(threads), threads, load)))
        homes.update(owners)
        groups = []
        for w in sorted(threads):
            mine = [i for i in todo if homes[i] == w]
            if mine:
                groups.append((w, mine, self.client.submit(
                    _write_shards, [shards[i] for i in mine], [int(starts[i]) for i in mine],
                    [by_shard.get(i, []) for i in mine], str(out), self.cfg.output.compression, threads[w],
                    self.part_backend, self.cfg.gpu.writer, held=[sources.get(i) for i in mine], pure=False,
                    **routing.placed([w]))))
        for w, mine, fut in groups:  # marks in shard order within each worker's share
            got = fut.result()
            self.shards_from_held += got["from_held"]
            self.write_threads[w] = got["threads"]
            for name, count in got["writers"].items():
                self.writers[name] = self.writers.get(name, 0) + count
            for name, seconds in got["busy"].items():
                self.write_busy[name] = round(self.write_busy.get(name, 0.0) + seconds, 4)
            for i, record in zip(mine, got["records"]):
                written += record["rows"]
                ckpt.mark(f"shard-{i}", record)
                maybe_crash("write:first-shard")
                if progress is not None:
                    progress(1)
        if progress is not None and len(todo) < len(shards):
            progress(len(shards) - len(todo))
        self._drop_held()
        return written

    def _held_shards(self, todo: list, workers: list) -> tuple:
        """The shards of ``todo`` that one worker can write from held input batches: (shard -> that worker,
        shard -> [[block future, piece], ...] in row order, the blocks all on that worker, so that the write
        task's arguments are resolved where they are, never copied).  A shard qualifies when every piece of it
        is held by its block and one worker holds all those blocks; per-block metadata only reaches the client
        (which pieces each block holds, and Dask's record of where the blocks are: one round trip each)."""
        self._held_homes = {}
        if not todo or not B.streams_text(self.cfg) or self.cfg.output.hold_inputs is False or not self.blocks:
            return {}, {}
        where = self._block_homes([self.loaded]) or []
        held = self.client.gather([self.client.submit(B.block_held, f, pure=False, **routing.placed(h))
                                   for f, h in zip(self.loaded, where)])
        self._held_homes = {k: where[k] for k, pieces in enumerate(held) if pieces}  # freed there after the write
        pieces: dict[int, list] = {}  # shard -> (block, piece) of each of its pieces, in row order
        for k, b in enumerate(self.blocks):
            for j, p in enumerate(b.pieces):
                pieces.setdefault(p.shard_index, []).append((k, j))
        owners, sources = {}, {}
        for i in todo:
            mine = pieces.get(i, [])
            if not mine or any(j not in held[k] for k, j in mine):
                continue
            common = set(workers).intersection(*(where[k] or () for k, _ in mine))
            if common:
                owners[i] = min(common)
                sources[i] = [[self.loaded[k], j] for k, j in mine]
        return owners, sources

    def _drop_held(self) -> None:
        """Frees the input batches the blocks still hold after the write (pieces of shards read again, or written
        by an earlier run this one resumed): the blocks live on, for the report and an index's segments."""
        if self._held_homes:  # where _held_shards found the blocks (a lost block's task runs where it is remade)
            self.client.gather([self.client.submit(B.drop_held, self.loaded[k], pure=False, **routing.placed(home))
                                for k, home in self._held_homes.items()])
        self._held_homes = {}

    def write_details(self) -> dict:
        """The seconds the workers' threads spent syncing and digesting the shards they wrote."""
        return dict(self.write_busy)

    def append_index(self, sink, docs: list, keys: list | None, bands: list, centres: list, dup: list,
                     first_doc: int, layout) -> None:
        """One segment per block, written into the index directory by the worker holding the block (its docs,
        band hashes and the centres among its documents); the client publishes them with one manifest write
        and holds only their checksums."""
        if keys is None:
            keys = self.exact_keys()
        own = self.map(_own_centres, centres, first_doc=first_doc)
        at_blocks = self.route(own, frames.block_dest, self.blocks_count, on="doc", starts=self.block_starts,
                               first_doc=first_doc)
        data = self._blocks_data()
        counts = [b.rows for b in self.blocks] or [0]  # no rows: the one empty block, one empty segment
        id_type = sink.id_type
        if id_type is None:  # a new index: its first block's ids name the type (later blocks are cast to it)
            id_type = self.client.submit(B.block_id_type, self.loaded[0], self.corpus.id_column is not None,
                                         pure=False).result()
        bands_count = int(layout[0])

        keys, bands, dup, at_blocks = (routing.reals(p) for p in (keys, bands, dup, at_blocks))

        def write(plan, writer):
            return self.client.gather(self.client.map(
                B.write_index_segment, data, keys, bands, dup, at_blocks, plan, writer=writer, first_doc=first_doc,
                bands_count=bands_count, id_type=id_type, ids=self.corpus.id_column is not None,
                texts=self.family.uses_text, dim=self.vector_dim, pure=False))

        sink.append_segments(counts, write, layout)

    def write_table(self, parts: list, path) -> int:
        """One Parquet file from the blocks' tables, in order: each block's table is written to a part file by
        its worker, then one worker streams them into the file in row groups of the same size one process
        writes (so the file is the same), never holding more than a row group and one part."""
        path = as_path(path)
        tmp_dir = path.parent / f".{path.name}.parts"
        paths = [str(tmp_dir / f"part-{k:05d}.parquet") for k in range(len(parts))]
        rows = self.client.gather(self.client.map(_write_part, routing.reals(parts), paths, pure=False))
        self.client.submit(_merge_parts, paths, str(path), self.cfg.output.compression, pure=False).result()
        remove_tree(tmp_dir)
        return int(sum(rows))


# --------------------------------------------------------------------------- worker functions


def prepare_worker(cfg: Config, own: bool = True) -> float:
    """Loads the kernels; on workers this run started (``own``), first has Numba read again the environment
    the run gave them (NUMBA_NUM_THREADS, the machine's cores shared among the workers): a Nanny sets a
    worker's environment only after the worker process has imported the main module of the program that
    started it, and a script that imports gpu_dedup at its top imports Numba there, which then keeps the
    machine's thread count (every worker running a thread per core) and fails to compile a kernel the first
    time ("Cannot set NUMBA_NUM_THREADS to a different value once the threads have been launched").  The
    workers of a user's scheduler are left as they are: a run changes nothing it does not own."""
    if own:
        _numba_threads_from_environment()
    if traits(cfg.backend).workers == "cuda":  # Dask-CUDA weighs a block whose texts are on the device
        B.register_device_blocks()
    if cfg.cluster.shuffle == "device":
        import_dataframes(cfg.backend)
    seconds = float(get_backend(cfg.backend).prepare(cfg) or 0.0)
    if cfg.input.id_column:  # the ids' exact-key kernel (prepare loads it only for the texts' exact keys)
        t0 = time.perf_counter()
        B.warm_id_hashes(cfg.backend)
        seconds += time.perf_counter() - t0
    return seconds


def import_dataframes(backend: str) -> None:
    """Dask's DataFrame (and dask_cudf for GPU workers, where installed): what the device routes
    (``cluster.shuffle: device``) shuffle with, imported while the kernels load.  Imported by the first route
    instead, on the client (as it built the shuffle's graph, and as it unpickled the frames' meta), on the
    scheduler (as it unpickled the graph, its event loop blocked meanwhile) and on each worker, it took 3.0 s of
    the buckets stage at 10^5 documents on one CPU worker (0.20 s on the same workers once imported, 0.10 s by
    the host route); on GPU workers cuDF's import comes with it."""
    import dask.dataframe  # noqa: F401,PLC0415

    if traits(backend).workers == "cuda":
        try:
            import dask_cudf  # noqa: F401,PLC0415
        except ImportError:  # the simulator's workers: pandas frames
            pass


def _numba_threads_from_environment() -> None:
    """Numba, imported before this worker's environment was set, takes its NUMBA_NUM_THREADS now (its thread
    pool starts with the first parallel kernel: none has run here yet)."""
    numba, pool = sys.modules.get("numba"), sys.modules.get("numba.np.ufunc.parallel")
    if numba is None or pool is None or getattr(pool, "_is_initialized", True):
        return  # not imported yet (it will read the environment), or already running its threads
    numba.config.reload_config()
    pool.NUM_THREADS = numba.config.NUMBA_NUM_THREADS  # type: ignore[attr-defined]  # read at the pool's import


def _cugraph_components(client, edges: list, partitions: int):
    """Weakly connected components by cuGraph on every GPU worker (``cugraph.dask``), labelled by each
    component's smallest node like the other engines; None where cuGraph is not installed."""
    try:
        import cugraph  # noqa: PLC0415  Dask-CUDA workers only
        import cugraph.dask as dcg  # noqa: PLC0415
        import dask.dataframe as dd  # noqa: PLC0415
        from cugraph.dask.comms import comms  # noqa: PLC0415
        from dask.delayed import delayed  # noqa: PLC0415
        from distributed import wait  # noqa: PLC0415
    except Exception:  # not installed (or broken): the large-star / small-star rounds instead
        log.info("components: cuGraph is not importable; large-star / small-star rounds instead")
        return None
    frames_ = [delayed(routing.to_df)(f) for f in edges]
    meta = client.submit(routing.empty, client.submit(routing.to_df, edges[0], pure=False), pure=False).result()
    ddf = dd.from_delayed(frames_, meta=meta, verify_meta=False)
    comms.initialize(p2p=True)
    try:
        g = cugraph.Graph(directed=False)
        g.from_dask_cudf_edgelist(ddf, source="src", destination="dst")
        wcc = dcg.weakly_connected_components(g)  # vertex, labels (arbitrary ids)
        smallest = wcc.groupby("labels")["vertex"].min().rename("label").reset_index()
        labelled = wcc.merge(smallest, on="labels")[["vertex", "label"]].rename(columns={"vertex": "node"})
        parts = client.compute(labelled.to_delayed())
        wait(parts)  # the labels are computed before the comms they ran over go
    finally:
        comms.destroy()
    frames_out = client.map(routing.from_df, parts, pure=False)
    return routing.route(client, frames_out, frames.hash_dest, partitions, on="node")


def _own_centres(part: dict, first_doc: int) -> dict:
    """The centres of one partition's buckets that are documents of this run (an index records those)."""
    xp = array_module(part["doc"])
    return frames.take(part, xp.flatnonzero(part["doc"] >= first_doc))


def _call_with_index(fn, part_index: int, *args, **kw):
    return fn(*args, part_index=part_index, **kw)


def _empty_block(cfg: Config, id_type=None):
    b = B.Block(0, 0, 0, ())
    table = pa.table({"text": pa.array([], pa.large_string())})
    if cfg.input.id_column:  # the shards' id type (they have no rows; none: int64, as one process reads them)
        table = table.append_column("id", pa.array([], id_type or pa.int64()))
    if cfg.select.score_read:  # keep score ranks by it (float64, as every shard's scores are read)
        table = table.append_column("score", pa.array([], pa.float64()))
    vectors = Vectors(np.zeros((0, 1), np.float32), np.zeros(0, np.int8)) if cfg.input.vector_column else None
    data = B.BlockData(b, table, vectors=vectors)
    data.null = np.zeros(0, bool)
    return data


def _null_count(data) -> dict:
    """A block's null texts, and whether libcudf read its texts into device memory (``device_read``)."""
    return {"null": int(data.null.sum()), "device_read": int(data.text_reader == "cudf")}


def _rows_of(part) -> dict:
    return {"rows": frames.size(part)}


def _rows_of_pairs(part) -> dict:
    return {"rows": int(part["src"].shape[0])}


def _edges_of(part) -> dict:
    return {"edges": int(part["src"].shape[0])}


def _zero_dest(frame: dict, n: int):
    return np.zeros(frames.size(frame), np.int64)


def _part_dest(frame: dict, n: int):
    return frame["_part"]


def _tag_pairs(part: dict, part_index: int) -> dict:
    n = part["src"].shape[0]
    return {"src": to_host(part["src"]), "dst": to_host(part["dst"]), "_part": np.full(n, part_index, np.int64),
            "_i": np.arange(n, dtype=np.int64)}


def _first_ends(part: dict, part_index: int) -> dict:
    """The distinct first ends of a partition's pairs: what it asks their blocks for (``_to``: itself)."""
    nodes = distinct(to_host(part["src"]))
    return {"node": nodes, "_to": np.full(nodes.shape[0], part_index, np.int64)}


def _answer(asked: dict, data, payload, **kw) -> dict:
    """A block's answers to the rows ``asked`` of it (``payload``: B.text_payload, vector or signature)."""
    return payload(data, asked, **kw)


def _score_answers(answers: dict, data, part: dict, **kw) -> dict:
    """The similarities of a block's pairs ``part``, the first ends' payloads ``answers`` come (B.score_at_block)."""
    return B.score_at_block(data, part, answers, **kw)


def _take_ids(asked: dict, data) -> dict:
    return B.take_ids(data, asked, column="_row")


def _asker_dest(frame: dict, n: int):
    return frame["_to"]


def _sims_in_order(part: dict) -> dict:
    part = frames.sort_by(part, "_i")
    return {"sim": part["sim"]}


def _tag_rows(part: dict, column: str, part_index: int) -> dict:
    rows = to_host(part[column])
    n = rows.shape[0]
    return {"_row": rows, "_part": np.full(n, part_index, np.int64), "_i": np.arange(n, dtype=np.int64)}


def _ids_in_order(part: dict) -> dict:
    order = stable_order(part["_i"])
    return {"id": part["id"].take(pa.array(order))}


def _oriented(part: dict) -> dict:
    return {"x": np.minimum(to_host(part["src"]), to_host(part["dst"])),
            "y": np.maximum(to_host(part["src"]), to_host(part["dst"]))}


def _both_directions(part: dict) -> dict:
    """The pairs ``x``, ``y`` as edges in both directions (large-star's input)."""
    return both_directions({"src": part["x"], "dst": part["y"]})


def _unique_nodes(part: dict) -> dict:
    if part["node"].shape[0] == 0:
        return part
    part = frames.sort_by(part, "node")
    keep = np.ones(part["node"].shape[0], bool)
    keep[1:] = part["node"][1:] != part["node"][:-1]
    return frames.take(part, keep)


def _by_row(part: dict) -> dict:
    return frames.sort_by(part, "row")


def _rank_frame(data, keep: str) -> dict:
    """A block's rows with the policy's key (an Arrow column, as one process ranks by it)."""
    rows = np.arange(data.block.row0, data.block.row0 + data.block.rows, dtype=np.int64)
    return {"row": rows, "key": B.block_rank_key(data, keep)}


def _sortable(key: pa.Array, keep: str):
    """(values ascending in the policy's order: descending keys negated; mask of the rows that sort after
    every value: nulls and NaN, which every policy puts last)."""
    last = numpy_array(key.is_null())
    if keep in ("longest", "score"):
        v = np.asarray(key.cast(pa.float64()).fill_null(0).to_numpy(zero_copy_only=False), np.float64)
        last |= np.isnan(v)
        return -v, last
    valid = key.drop_null()
    if len(valid) == 0:
        return np.zeros(len(key)), np.ones(len(key), bool)
    v = key.fill_null(valid[0]).to_numpy(zero_copy_only=False)  # a null's place is the last range anyway
    if v.dtype.kind == "f":
        last |= np.isnan(v)
    return v, last


def _rank_sample(part: dict, k: int, keep: str):
    """Up to ``k`` evenly spaced keys of a block (sorted, nulls and NaN left out): the splitters' sample."""
    v, last = _sortable(part["key"], keep)
    v = np.sort(v[~last])
    if v.shape[0] == 0:
        return None
    return v[np.linspace(0, v.shape[0] - 1, min(k, v.shape[0])).astype(np.int64)]


def _splitters(samples: list, n: int):
    if not samples or n == 1:
        return np.zeros(0)
    allv = np.sort(np.concatenate(samples))
    return allv[np.linspace(0, allv.shape[0] - 1, n + 1)[1:-1].astype(np.int64)]


def _range_dest(frame: dict, n: int, splitters, keep: str) -> np.ndarray:
    """The range of each row's key: every row of one key in one range; nulls and NaN in the last."""
    v, last = _sortable(frame["key"], keep)
    d = np.asarray(np.searchsorted(splitters, v, side="right") if len(splitters) else np.zeros(v.shape[0]),
                   np.int64)
    d[last] = n - 1
    return d


def _rank_range(part: dict, offset: int, keep: str) -> dict:
    """Ranks of one range of keys (all rows of a key are here), ties by row, as one process ranks."""
    order = stable_order(part["row"])
    rows = part["row"][order]
    key = part["key"].take(pa.array(order))
    return {"row": rows, "rank": offset + ranks_from_keys(keep, rows.shape[0], length=key, ids=key, score=key)}


def _save_part(part, path: str) -> str | None:
    """One part of a finished stage, saved by the worker that holds it (an object in a store: one upload), which
    keeps it in memory for the part's new future (:func:`_reuse_or_load`) and returns its address (None outside a
    worker).  Not synced to the disk, as no checkpoint is (:mod:`gpu_dedup.run.checkpoint`): one that a power loss
    garbles fails its arrays' CRC when read, and its unit is computed again."""
    # a part that is None (nothing to say) is saved as one empty array
    arrays: dict[str, Any] = {k: to_host(v) for k, v in part.items()} if part is not None else {"__none__": np.zeros(0)}
    save_arrays(as_path(path), arrays)
    _SAVED[path] = part
    try:
        from distributed import get_worker  # noqa: PLC0415  the Dask executor's workers only

        return get_worker().address
    except ValueError:  # not in a worker's task
        return None


_SAVED: dict = {}  # worker-global: path -> the part its save wrote there, until the part's new future takes it


def _reuse_or_load(path: str, backend):
    """The part saved at ``path``: the frame its save left in this worker's memory, else read from the file."""
    try:
        return _SAVED.pop(path)
    except KeyError:
        return _load_part(path, backend)


def _forget_saved() -> int:
    n = len(_SAVED)
    _SAVED.clear()
    return n


def _load_part(path: str, backend) -> dict | None:
    where = as_path(path)
    part, _ = load_arrays(where.read_bytes() if is_url(where) else where)
    if "__none__" in part:
        return None
    xp = get_backend(backend).xp
    return {k: xp.asarray(v) for k, v in part.items()}


def _present(part) -> int:
    return 1


def _write_shards(shards: list, starts: list, removed: list, out: str, compression: str, threads: int,
                  backend: str = "cpu", writer_setting: str = "auto", held: list | None = None) -> dict:
    """A worker's share of the shards, up to ``threads`` at a time (pyarrow and hashlib release the GIL) as its
    memory allows (:func:`~gpu_dedup.storage.concurrent_writes`): ``records``, in order, the ``threads`` it
    took, ``writers``: how many of the Parquet shards offered to the device each writer wrote, and ``busy``: the
    seconds its threads spent syncing and digesting them (:func:`~gpu_dedup.storage.busy_into`).  The run's
    ``backend`` and its ``gpu.writer`` (``writer_setting``) say whether each Parquet shard goes to the worker's
    device writer first (:func:`~gpu_dedup.backends.placement.shard_writer`: cuDF's on a GPU worker).  ``held``:
    per shard None, or [[block, piece], ...]: the blocks on this worker whose held batches make up the whole
    shard, taken out of them as the shard is written (``from_held``: how many were)."""
    threads = storage.concurrent_writes([storage.write_memory(s) for s in shards], threads, _worker_budget())
    writer = shard_writer(get_backend(backend), writer_setting)
    busy = storage.no_busy()
    wrote: list = []  # the writer of each shard the device was offered (list.append is atomic: threads share it)

    held = held or [None] * len(shards)
    from_held: list = []  # the shards written from held batches (list.append is atomic: threads share it)

    def one(k: int) -> dict:
        batches = _held_batches(held[k]) if held[k] else None
        held[k] = None
        if batches is not None:
            from_held.append(k)
        with storage.busy_into(busy):
            return _write_shard(shards[k], starts[k], removed[k], out, compression, writer, wrote, held=batches)

    if threads <= 1:
        records = [one(k) for k in range(len(shards))]
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="gpu-dedup-write") as pool:
            records = list(pool.map(one, range(len(shards))))
    return {"threads": max(1, threads), "records": records, "busy": busy,
            "writers": {name: wrote.count(name) for name in sorted(set(wrote))}, "from_held": len(from_held)}


def _held_batches(sources: list) -> list | None:
    """One shard's batches in row order, taken out of the blocks holding its pieces (``sources``: [[block, piece],
    ...]); None where a piece is held no more (its block computed again without them): the shard is read."""
    got = [B.take_held(data, j) for data, j in sources]
    whole: list = []
    for batches in got:  # one step per piece
        if batches is None:
            return None
        whole += batches
    return whole


def _worker_budget() -> int:
    """Memory this worker may still take: what the machine has available, and within its own limit what it has
    left before Dask pauses it (``distributed.worker.memory.pause``, 80 % by default)."""
    import dask  # noqa: PLC0415  the Dask executor's workers only
    import psutil  # noqa: PLC0415  a Dask dependency: the workers have it

    free = available_memory()
    limit = B.worker_memory_limit()
    if limit:
        pause = dask.config.get("distributed.worker.memory.pause", 0.8) or 0.95
        free = min(free, int(pause * limit) - psutil.Process().memory_info().rss)
    return max(0, free)


def write_shares(seen: dict) -> dict:
    """Threads each worker may write shards on, from ``seen`` (worker -> :func:`_host_cores`): the cores it may run
    on (its CPU affinity, within its cgroup's quota), divided among the workers of its host that may run on the
    same cores (a local CPU cluster's workers share every core; a Dask-CUDA worker's are its GPU's NUMA node's,
    shared with that GPU's other workers), at least one."""
    sharing: dict = {}
    for where in seen.values():
        sharing[where] = sharing.get(where, 0) + 1
    return {w: max(1, min(len(where[1]), where[2]) // sharing[where]) for w, where in seen.items()}


def arrow_pool_advice(pools: dict) -> str | None:
    """What to tell the user whose cluster's workers decode Parquet on fewer Arrow threads than their share of
    the cores, from ``pools`` (worker -> (:func:`pa.cpu_count`, :func:`_host_cores`)), or None.  Dask starts a
    worker with OMP_NUM_THREADS=1, which Arrow sizes its pool by: a block's shards then decode one after another
    on one core (a cluster a run starts gives each worker its share: ``connection.worker_pools``)."""
    shares = write_shares({w: where for w, (_, where) in pools.items()})
    short = {w: shares[w] for w, (arrow, _) in pools.items() if arrow < shares[w]}
    if not short:
        return None
    k = min(short.values())
    n = len(pools)
    who = ("the cluster's worker decodes" if n == 1 else f"the cluster's {n} workers decode" if len(short) == n
           else f"{len(short)} of the cluster's {n} workers decode")
    its = "its" if n == 1 else "their"
    return (f"{who} Parquet on fewer Arrow threads than {its} share of the cores ({min(pools[w][0] for w in short)} "
            f"against {k} or more): Dask starts a worker with OMP_NUM_THREADS=1, and Arrow sizes its thread pool by "
            f"it; start the workers with OMP_NUM_THREADS={k} ({its} share of the cores) to decode shards side by side")


def _decode_pool() -> tuple:
    """A worker's Arrow threads and where it runs (:func:`arrow_pool_advice`)."""
    return pa.cpu_count(), _host_cores()


def _host_cores() -> tuple:
    """Where this worker runs: its host, the cores it may run on, and how many it may use (Dask's count: the
    affinity within its cgroup's CPU quota)."""
    from dask.system import cpu_count

    cores = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else \
        tuple(range(os.cpu_count() or 1))
    return socket.gethostname(), cores, cpu_count()


def _write_shard(shard, start: int, removed: list, out: str, compression: str, device_writer=None,
                 wrote: list | None = None, held: list | None = None) -> dict:
    keep = np.ones(shard.rows, bool)
    for part in removed:  # the removed rows of the blocks reading this shard (of other shards too)
        rows = to_host(part["row"]) - start
        keep[rows[(rows >= 0) & (rows < shard.rows)]] = False
    rows = storage.write_shard(shard, keep, out, compression, device_writer=device_writer, held=held, wrote=wrote)
    return {"name": shard.name, "rows": rows, **storage.written_digest(as_path(out) / shard.name)}


def _write_part(table: pa.Table, path: str) -> int:
    storage.atomic_write_parquet(as_path(path), table, "none", durable=False)  # merged, then removed
    return table.num_rows


ROW_GROUP = DUPLICATES_ROW_GROUP  # rows per row group of duplicates.parquet (pyarrow's write_table default)


def _merge_parts(paths: list, path: str, compression: str) -> None:
    """Stream the part files into one Parquet file at ``path`` (atomically), row groups of ROW_GROUP rows with the
    encodings one process writes (:func:`~gpu_dedup.stages.write.duplicates_parquet_options`), never holding
    more than a row group and one part; an object in a store is built in a local temporary file, then
    uploaded."""
    schema = pq.read_schema(source(paths[0])) if paths else None  # every part has one schema
    groups = storage.row_groups((pq.read_table(source(p)) for p in paths), ROW_GROUP, schema)
    storage.atomic_write_parquet_groups(path, groups, compression, duplicates_parquet_options)
