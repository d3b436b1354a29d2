"""The stage sequence, written once.

read -> normalize -> exact -> signatures -> bands -> buckets -> verify ->
components -> select -> write -> report (-> index).

:func:`execute` is the only place that chains the stages.  Every way of
running gpu_dedup calls it: the single-process run and the in-memory
DataFrame API (:mod:`gpu_dedup.run.local`), Dask and Dask-CUDA workers
(:mod:`gpu_dedup.run.cluster`), a run against a persisted index and the
evaluation.  They differ only in

- the **executor** (:mod:`gpu_dedup.run.contract`), which keeps the per-document
  state in parts where it computes (one part in one process; a future per block
  or shuffle partition on a cluster) and moves rows between them.  It holds no
  dedup logic: each stage below is a map of functions of :mod:`gpu_dedup.stages`
  over parts, with rows routed between partitions by key (the seeds' map ->
  shuffle -> reduce);
- the **job**: output directory (or none: in memory), the **prior** (documents
  already indexed: they take part in matching and always survive, see
  :mod:`gpu_dedup.run.prior`) and a **sink** (receives every document of the
  run: an index being built or updated).

The sequence itself holds only counts and per-block metadata, so on a cluster
the client's memory does not grow with the corpus.  Nodes are doc numbers: a
prior's documents below ``first_doc``, input row ``r`` as ``first_doc + r``.
"""

from __future__ import annotations

import logging
import time
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup import storage
from gpu_dedup.backends import get_backend, host_frame, to_host
from gpu_dedup.backends.arrow_arrays import numpy_array
from gpu_dedup.config import Config
from gpu_dedup.errors import COMMITTED, ConfigError
from gpu_dedup.pending import Ready, Soon
from gpu_dedup.report.build import (
    build_report,
    examples_soon,
    report_bytes,
    similarity_summary,
)
from gpu_dedup.report.page import render
from gpu_dedup.run.checkpoint import CheckpointUnreadable, maybe_crash
from gpu_dedup.run.contract import Executor, Parts, Prior, Sink, Step, shard_starts
from gpu_dedup.run.index_steps import IndexSteps
from gpu_dedup.run.outdir import (
    DUPLICATES_NAME,
    REPORT_HTML_NAME,
    REPORT_NAME,
    SUCCESS_NAME,
    OutputDir,
)
from gpu_dedup.run.prior import IndexPrior, NoPrior
from gpu_dedup.run.remote_outdir import RemoteOutputDir
from gpu_dedup.run.stagelog import StageLog, peak_rss_mb
from gpu_dedup.stages import frames
from gpu_dedup.stages.buckets import (
    band_rounds,
    bucket_centres,
    bucket_counts,
    bucket_dest,
    bucket_part,
    bucket_sizes,
    concat_bucket_parts,
    long_frame,
)
from gpu_dedup.stages.components import (
    cluster_members,
    edge_labels,
    home_edges,
    member_rows,
)
from gpu_dedup.stages.edges import (
    Edges,
    edge_counts,
    pair_count,
    star_accept,
    star_open,
    star_outputs,
    star_propose,
    star_start,
    unique_edges,
)
from gpu_dedup.stages.exact import (
    copies_and_reps,
    docs_frame,
    exact_copies,
    exact_counts,
    groups_of,
    key_frame,
    no_groups,
    sign_rows,
)
from gpu_dedup.stages.families import lsh_count, part_signature_info
from gpu_dedup.stages.frames import (
    identity,
    join_values,
    merge_counts,
    part_dest,
    rows_count,
    tag_part,
    untag_part,
)
from gpu_dedup.stages.selection import (
    block_outputs,
    cluster_accept,
    cluster_before,
    cluster_finish,
    cluster_open,
    cluster_outputs,
    cluster_propose,
    cluster_start,
    near_similarity,
    removed_rows,
)
from gpu_dedup.stages.write import (
    DUPLICATES_ROW_GROUP,
    check_id_column,
    duplicates_part,
    removed_by_shard,
    survivor_id_column,
    survivor_rows,
    table_rows,
)
from gpu_dedup.storage.ahead import ahead
from gpu_dedup.storage.filesystems import is_url
from gpu_dedup.storage.atomic import atomic_write_recorded

log = logging.getLogger("gpu_dedup")

__all__ = ["CorpusCounts", "Job", "RunResult", "plan_run", "execute", "open_output", "finish_output", "DUPLICATES_NAME",
           "REPORT_NAME", "REPORT_HTML_NAME", "SUCCESS_NAME"]


class CorpusCounts:
    """What every executor's corpus answers alike (``id_column``: None when the ids are generated)."""

    id_column: str | None

    @property
    def id_generated(self) -> bool:
        return self.id_column is None


@dataclass(frozen=True)
class Job:
    """What a run produces; the parameters where runs differ."""

    cfg: Config
    out: Path | None = None  # None: in memory (nothing written)
    write_shards: bool = True  # False: only the index (``gpu-dedup index build``)
    prior: Prior = field(default_factory=NoPrior)  # documents deduplicated against (run/prior.py)
    sink: Sink | None = None  # receives every document of this run (``append(**payload)``): an index
    examples: bool = True  # sample texts of the largest clusters in the report (not against an index)
    outdir: OutputDir | None = None  # the locked output directory (see open_output); files go to its staging

    @property
    def target(self) -> Path | None:
        """Where the outputs are written during the run: the staging directory, published at the end."""
        return self.outdir.staging if self.outdir is not None else self.out


@dataclass
class RunResult:
    """What a run returns.  In one process every per-row array is here; a cluster run keeps per-document
    values on the workers and in its outputs, so ``kept`` and ``cluster`` are read back from the output
    directory when first asked for, and ``edges`` / ``scored`` / ``rep`` are None."""

    output_dir: Path | None  # None: an in-memory run (nothing written)
    report: dict
    duplicates_table: pa.Table | None  # every member of a cluster of two or more documents (None: see output_dir)
    kept_rows: np.ndarray | None = None  # bool per input row
    cluster_rows: np.ndarray | None = None  # cluster id per input row: the doc number of its survivor
    edges: Edges | None = None  # verified edges between doc numbers, with their similarity
    shards: list = field(default_factory=list)
    scored: Edges | None = None  # every candidate pair scored (doc numbers), with its similarity
    rep: np.ndarray | None = None  # exact-copy representative per input row (doc number)
    first_doc: int = 0

    @property
    def duplicates(self) -> pa.Table | None:
        """The duplicates table (a cluster run's: read back from its duplicates.parquet when first asked for)."""
        if self.duplicates_table is None and self.output_dir is not None and \
                (Path(self.output_dir) / DUPLICATES_NAME).exists():
            import pyarrow.parquet as pq

            self.duplicates_table = pq.read_table(Path(self.output_dir) / DUPLICATES_NAME)
        return self.duplicates_table

    @property
    def kept(self) -> np.ndarray:
        return self._read_back()[0] if self.kept_rows is None else self.kept_rows

    @property
    def cluster(self) -> np.ndarray:
        return self._read_back()[1] if self.cluster_rows is None else self.cluster_rows

    def _read_back(self) -> tuple[np.ndarray, np.ndarray]:
        """kept / cluster per row from duplicates.parquet (a cluster run's)."""
        n = self.report["counts"]["documents_read"]
        kept = np.ones(n, bool)
        cluster = self.first_doc + np.arange(n, dtype=np.int64)
        dup = self.duplicates
        if dup is not None and dup.num_rows:
            rows = numpy_array(dup.column("row")) - self.first_doc
            kept[rows] = numpy_array(dup.column("kept"))
            cluster[rows] = numpy_array(dup.column("cluster_id"))
        self.kept_rows, self.cluster_rows = kept, cluster
        return kept, cluster


def plan_run(inputs, output_dir, cfg: Config, *, prior=None, sink=None, write_shards: bool = True,
             st: StageLog | None = None) -> tuple[list, Job]:
    """The shards of ``inputs`` and the :class:`Job` of a run (what both executors start from): ``output_dir``
    a path, a URL or None (in memory), ``prior`` an opened index to deduplicate against, ``sink`` what receives
    every document (see :func:`gpu_dedup.run.entry.run_dedup`); ``st``: the run's stage log, whose setup
    cost counts the backend's check and the inputs' discovery."""
    st = st or StageLog()
    out = None if output_dir is None else storage.as_path(output_dir)  # a Path, or a URL (RemotePath)
    if out is None and (cfg.cluster.enabled or (sink is not None and sink is not prior)):
        raise ConfigError("a run without an output directory (in memory) runs in one process and writes no new "
                          "index; drop cluster.workers / cluster.scheduler and index_out, or give an output_dir")
    with st.cost("setup"):  # the backend, the inputs' discovery (the executor adds the output directory)
        if not cfg.cluster.enabled:
            get_backend(cfg.backend)  # a backend that cannot run here fails before anything is read
        shards = storage.discover(inputs, cfg.input.format)
    write_shards = write_shards and cfg.output.shards
    job = Job(cfg, out, write_shards=write_shards, prior=IndexPrior(prior) if prior is not None else NoPrior(),
              sink=sink, examples=prior is None)
    return shards, job


def execute(job: Job, ex: Executor, ckpt, st: StageLog | None = None) -> RunResult:
    """Run every stage for ``job`` on executor ``ex`` with checkpoints ``ckpt``.

    ``ex`` keeps the per-document state and moves it (see :mod:`gpu_dedup.run.contract`);
    ``ckpt`` says which stage units are finished (:class:`gpu_dedup.run.checkpoint.Checkpoints`,
    or :class:`~gpu_dedup.run.checkpoint.NoCheckpoints`); the executor saves and loads their parts.
    """
    try:
        return Sequence(job, ex, ckpt, st or StageLog()).run()
    except BaseException:  # what was finished before the error is on disk for the rerun (see run.checkpoint)
        ckpt.wait(raise_errors=False)
        raise


# ---------------------------------------------------------------------------- the sequence


class _Lap:
    """Seconds between successive marks since ``t0``, by name (:meth:`lap`), rounded as stage details are."""

    def __init__(self, t0: float):
        self.t = t0
        self.seconds: dict = {}

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self.t, 4)
        self.t = now


def _values(part):
    """A part that is its own values (:meth:`Sequence._near_summary`'s host arrays)."""
    return part


def _waits(items, waited: list):
    """``items``, the seconds spent waiting for each one added to ``waited[0]``."""
    it = iter(items)
    while True:
        t0 = time.perf_counter()
        try:
            item = next(it)
        except StopIteration:
            waited[0] += time.perf_counter() - t0
            return
        waited[0] += time.perf_counter() - t0
        yield item


def _seconds_of(fn, *args) -> float:
    """The seconds ``fn(*args)`` took (run on a :class:`Soon` thread: that thread's own time)."""
    t0 = time.perf_counter()
    fn(*args)
    return time.perf_counter() - t0


class Sequence:
    """The stages of one run, in order (:meth:`run`); the index's part of it is :attr:`index`
    (:class:`gpu_dedup.run.index_steps.IndexSteps`), asked at the same points with or without an index."""

    def __init__(self, job: Job, ex: Executor, ckpt, st: StageLog):
        self.job, self.ex, self.ckpt, self.st = job, ex, ckpt, st
        self.cfg = job.cfg
        self.backend = ex.backend
        self.counts: dict = {}
        self.prior = job.prior
        self.index = IndexSteps(job.prior, job.sink)
        self.first_doc = self.prior.first_doc
        self.samples = None  # the report's sample documents and similarities, started before the write stage

    # ------------------------------------------------------------------ helpers
    def _unit(self, unit: str, stages: tuple, compute):
        """Load finished unit ``unit`` (its parts, where the executor keeps them) or run ``compute()`` (which
        times ``stages``) and save it."""
        loaded = None
        if self.ckpt.has(unit):
            try:
                with self.st.cost("checkpoints"):
                    loaded = self.ex.load(self.ckpt, unit)
            except CheckpointUnreadable:  # truncated or garbled: computed again (a warning says so)
                loaded = None
        if loaded is not None:
            parts, meta = loaded
            for name, entry in meta["stages"].items():
                self.st.stages[name] = {**entry, "resumed": True}
            self.counts.update(meta["counts"])
            self.extra.update(meta.get("extra", {}))
            log.info("stage(s) %s: resumed from checkpoint", ", ".join(stages))
            return parts
        parts, counts, extra = compute()
        self.counts.update(counts)
        self.extra.update(extra)
        meta = {"stages": {n: self.st.stages[n] for n in stages if n in self.st.stages}, "counts": counts,
                "extra": extra}
        # queued: the writer's thread copies device arrays to the host and writes the file while the next stages run
        with self.st.cost("checkpoints"):
            return self.ex.save(self.ckpt, unit, parts, meta)

    def route(self, parts: Parts, dest, **kw) -> Parts:
        """``parts``' rows to the executor's partitions by ``dest``."""
        return self.ex.route(parts, dest, self.ex.partitions, **kw)

    def _to_blocks(self, parts, on: str, first_doc: int = 0, **kw):
        return self.ex.route(parts, frames.block_dest, self.ex.blocks_count, on=on, starts=self.starts,
                             first_doc=first_doc, **kw)

    def lookup(self, parts: Parts, table: Parts, out: str, key: str = "_key", value: str = "label") -> Parts:
        """Left join: each row of ``parts`` gets ``out`` = ``table[value]`` where ``table["node"]`` equals its
        ``key`` (else the key itself), in its own partition and order.  ``table`` is routed by
        ``hash_dest(node)``; the rows travel there and back."""
        there = self.route(parts, frames.hash_dest, on=key, before=Step(tag_part, index=True),
                            after=Step(join_values, table, on=key, value=value, out=out))
        return self.ex.route(there, part_dest, len(parts), after=Step(untag_part))

    def _score_rounds(self, states, propose, accept, is_open, rounds: int | None = None, progress=None,
                      times: list | None = None):
        """Rounds of ``propose`` -> score the pairs where the texts live -> ``accept`` on every partition,
        until none is open (or ``rounds`` rounds).  ``progress``: a :class:`~gpu_dedup.run.progress.Progress`
        told each round's pairs, then their scoring.  ``times``: given, each round's pairs and seconds are
        appended to it (``propose``, ``score``, ``accept``: the round's pairs made, scored, taken in; where work
        runs asynchronously, a GPU's kernels or a cluster's tasks, a part's may still run as the next part
        starts, and the round ends when the count of open states comes back), and where one process scored
        the pairs exactly in chunks, ``score_parts``: the seconds of the chunks' sets and of their pairs, the
        device waited for after each, and the chunks."""
        ex = self.ex
        r = 0
        while rounds is None or r < rounds:
            t0 = time.perf_counter()
            states, pairs = ex.map(propose, states, outputs=2)
            n = None
            if progress is not None:
                n = ex.total(pair_count, pairs)["pairs"]
                progress.expect(n)
            t1 = time.perf_counter()
            clock: dict | None = {} if times is not None else None
            sims = ex.score(pairs, progress=progress.update if progress is not None else None, clock=clock)
            t2 = time.perf_counter()
            states = ex.map(accept, states, sims)
            r += 1
            still_open = ex.total(is_open, states)["open"]
            if times is not None:
                t3 = time.perf_counter()
                times.append({"pairs": n, "propose": round(t1 - t0, 4), "score": round(t2 - t1, 4),
                              "accept": round(t3 - t2, 4)})
                if clock:  # one process's exact scoring, in chunks: its sets' and its pairs' seconds
                    times[-1]["score_parts"] = {k: round(v, 4) if isinstance(v, float) else v
                                                for k, v in clock.items()}
            if still_open == 0:
                break
        return states

    # ------------------------------------------------------------------ stages
    def read(self):
        with self.st.stage("read", len(self.ex.shards), "shards") as info:
            corpus = self.corpus = self.ex.read(progress=info.progress.update)
            self.n = corpus.n
            self.family = self.ex.family  # the similarity family, sized for this run (stages/families.py)
            info.update(documents=corpus.n, shards=len(corpus.shards), null_text=corpus.null_count)
        # duplicate_ids: one process counts them beside the stages that follow, and the report takes them (_id_count)
        self.counts.update(documents_read=corpus.n, null_text=corpus.null_count, duplicate_ids=None)
        self.starts = self.ex.block_starts  # global row of each block's first row, and the total
        check_id_column(corpus.id_column)

    def exact(self):
        """Exact copies (of each other, and of a prior's documents) -> each row's representative."""
        cfg, ex = self.cfg, self.ex

        def compute():
            counts = dict(ex.normalize())  # its own stage; what it counts is saved with this unit
            with self.st.stage("exact", self.n) as info:
                keys = ex.exact_keys() if (cfg.exact_dedup or self.index.keeps_keys) else None
                ranks = ex.ranks() if cfg.select.keep != "first" else None
                docs = ex.map(docs_frame, ex.docs(), keys, ranks, prior=self.prior, exact=cfg.exact_dedup)
                if cfg.exact_dedup:
                    copies = self.route(docs, frames.hash_dest, on=("k0", "k1", "k2"), before=Step(key_frame, keys),
                                         after=Step(exact_copies))
                    docs = self._to_blocks(copies, "row", before=Step(copies_and_reps),
                                           after=Step(groups_of, docs))
                else:
                    docs = ex.map(no_groups, docs)
                c = ex.total(exact_counts, docs)
                collapsed = c["copies"] + c["matched"]
                info.update(copies_collapsed=collapsed)  # removed as exact or (a copy of a near duplicate) near
            parts = {"docs": docs, **self.index.exact_parts(keys)}
            return parts, {**counts, "exact_stage_collapsed": collapsed}, {}

        parts = self._unit("exact", ("exact",), compute)
        self.docs, self.keys = parts["docs"], parts.get("keys")  # keys: where the index keeps them

    def signatures_and_bands(self):
        """Signatures (the family's) of the representatives that are not copies of an indexed document;
        band hashes of those that have one."""
        ex = self.ex

        def compute():
            with self.st.stage("signatures") as info:
                rows = ex.map(sign_rows, self.docs)
                info.progress.total = ex.total(rows_count, rows)["rows"]
                sigs = ex.signatures(rows, progress=info.progress.update)
                stage_info, counts = self.family.combine_signature_info(ex.collect(part_signature_info, sigs,
                                                                                   family=self.family))
                info.update(**stage_info)
            with self.st.stage("bands") as info:
                lsh = info.progress.total = ex.total(lsh_count, sigs)["rows"]
                bands = ex.band_hashes(sigs)
                b, r = self.family.layout
                info.update(bands=b, rows=r)
            return {"bands": bands}, counts, {"lsh_rows": lsh}

        self.bands = self._unit("bands", ("signatures", "bands"), compute)["bands"]
        ex.keep_bands(self.bands)  # what verification by signature reads (also after a resume)

    def buckets(self):
        """Group (band, band hash) -> buckets of doc numbers, and the prior's centres of each."""
        ex, prior = self.ex, self.prior

        def compute():
            lsh = self.extra.get("lsh_rows", 0)
            with self.st.stage("buckets", lsh * self.family.layout[0], "band hashes") as info:
                rounds = band_rounds(self.family.layout[0], ex.blocks_count, ex.workers)
                done = []
                for lo, hi in rounds:  # each round's buckets made before the next round's band hashes move
                    done.append(self.route(self.bands, bucket_dest, explode=long_frame,
                                           explode_kw={"first_doc": self.first_doc, "bands": (lo, hi)},
                                           after=Step(bucket_part, min_size=prior.min_bucket_size,
                                                      first_doc=self.first_doc)))
                    if len(rounds) > 1:
                        ex.total(bucket_counts, done[-1], None)  # the barrier: this round's buckets are made
                bk = done[0] if len(done) == 1 else ex.map(concat_bucket_parts, *done)
                centres = ex.map(bucket_centres, bk, prior=prior)
                c = ex.total(bucket_counts, bk, centres)
                info.update(buckets=c["buckets"], memberships=c["memberships"], rounds=len(rounds))
                sizes = merge_counts(ex.collect(bucket_sizes, bk))
            return ({"buckets": bk, "centres": centres},
                    {"candidate_buckets": c["candidate_buckets"], "bucket_memberships": c["memberships"]},
                    {"bucket_sizes": sizes})

        parts = self._unit("buckets", ("buckets",), compute)
        self.bk, self.centres_in = parts["buckets"], parts["centres"]
        # every later stage moves the rows of these memberships at most: star pairs, edges, cluster members
        ex.expect_rows(self.counts["bucket_memberships"])

    def verify(self):
        """Star edges per bucket, verified, re-starred for lsh.star_rounds rounds."""
        cfg, ex = self.cfg, self.ex

        def compute():
            method, rounds = cfg.verify.method, cfg.lsh.star_rounds
            # the pairs a round scores are known when it starts (a pair met in several buckets is scored once):
            # the total grows by each round's (the memberships were the total, and said "6 %" when it ended)
            with self.st.stage("verify", 0, "pairs") as info:
                states = ex.map(star_start, self.bk, self.centres_in, threshold=cfg.verify_threshold,
                                rounds=rounds, keep_all=method == "none")
                times: list = []
                states = self._score_rounds(states, star_propose, star_accept, star_open, max(rounds, 1),
                                            progress=info.progress, times=times)
                verified, scored, centres = ex.map(star_outputs, states, outputs=3)
                if ex.partitions > 1:  # a pair found in buckets of two partitions is one edge
                    verified = self.route(verified, frames.hash_dest, on=("src", "dst"), after=Step(unique_edges))
                    scored = self.route(scored, frames.hash_dest, on=("src", "dst"), after=Step(unique_edges))
                c = ex.total(edge_counts, scored, verified)  # both counts in one round trip
                s, v = c["scored"], c["verified"]
                info.update(method=method, star_rounds=rounds, candidate_edges=s, verified_edges=v, round_seconds=times)
            return ({"verified": verified, "scored": scored, "centres": centres},
                    {"candidate_edges": s, "verified_edges": v}, {})

        parts = self._unit("verify", ("verify",), compute)
        self.verified, self.scored, self.centres = parts["verified"], parts["scored"], parts["centres"]

    def components(self):
        """Connected components of the verified edges (an indexed end stands for its home), then every node
        of a cluster of two or more with its label, gathered by label: the clusters select works on."""
        cfg, ex, prior = self.cfg, self.ex, self.prior

        def compute():
            with self.st.stage("components", self.counts.get("verified_edges", 0), "edges") as info:
                # home_edges keeps every verified edge (an indexed end becomes its home): the count is known
                labels = ex.components(ex.map(home_edges, self.verified, prior=prior),
                                       count=self.counts.get("verified_edges"))
                in_edges = self._to_blocks(labels, "node", self.first_doc)
                local, copies = ex.map(member_rows, self.docs, in_edges, prior=prior, outputs=2)
                sources = [local, self.lookup(copies, labels, "label"), *self.index.members(self, labels)]
                members = ex.map(cluster_members, *[self.route(m, frames.hash_dest, on="label") for m in sources])
                edges = self.index.edges(self, ex.map(edge_labels, self.verified, prior=prior))
                edges = self.lookup(edges, labels, "label")
                edges = self.route(edges, frames.hash_dest, on="label")
                self.clusters = start(members, edges)
                n = ex.total(cluster_before, self.clusters)["clusters"]
                info.update(clusters=n)
            return {"members": members, "edges": edges}, {"clusters": n}, {}

        def start(members, edges):
            return ex.map(cluster_start, members, edges, threshold=cfg.verify_threshold,
                          split=cfg.select.split_chains, backend=ex.part_backend, first_doc=self.first_doc,
                          reuse=self.family.symmetric)

        self.clusters = None
        parts = self._unit("components", ("components",), compute)
        if self.clusters is None:  # resumed: the clusters start again from their members and edges
            self.clusters = start(parts["members"], parts["edges"])

    def select(self):
        """One survivor per cluster (indexed documents first, then the policy's ranks); chains split; each
        removed near duplicate's similarity to its survivor."""
        cfg, ex = self.cfg, self.ex

        def compute():
            with self.st.stage("select", self.n) as info:
                clusters = self.clusters
                if cfg.select.split_chains:
                    clusters = self._score_rounds(clusters, cluster_propose, cluster_accept, cluster_open)
                clusters, pairs = ex.map(cluster_finish, clusters, outputs=2)
                rows, part_counts = ex.map(cluster_outputs, clusters, ex.score(pairs), prior=self.prior, outputs=2)
                got = ex.collect(identity, part_counts)
                c = {k: sum(g[k] for g in got) for k in ("removed", "exact_duplicates", "near_duplicates",
                                                         "chain_split_ejected", "clusters",
                                                         "removed_against_index")}
                c["chain_split_rounds"] = max((g["chain_split_rounds"] for g in got), default=0)
                removed = c["removed"]
                counts = {"exact_duplicates": c["exact_duplicates"], "near_duplicates": c["near_duplicates"],
                          "removed": removed, "kept": self.n - removed}
                if cfg.select.split_chains:
                    counts["chain_split_ejected"] = c["chain_split_ejected"]
                    info.update(chain_split_ejected=c["chain_split_ejected"],
                                chain_split_rounds=c["chain_split_rounds"])
                counts.update(self.index.counts(c))
                info.update(kept=counts["kept"], removed=removed)
                counts["clusters"] = c["clusters"]
                sizes = merge_counts([g["size_counts"] for g in got])
            return {"rows": rows}, counts, {"cluster_sizes": sizes}

        self.selected = self._unit("select", ("select",), compute)["rows"]

    # ------------------------------------------------------------------ outputs
    def write(self):
        cfg, ex = self.cfg, self.ex
        corpus = self.corpus
        # the report's samples need only the select stage's rows (and a few dozen original texts): on a cluster
        # their tasks run beside the write stage's instead of after them
        with self.st.cost("samples"):  # one process takes them now; a cluster beside the write stage
            self.samples = ex.soon(self._report_samples)
        with self.st.stage("write", len(corpus.shards), "shards") as info:
            t_stage = time.perf_counter()
            # frames: where the run waited before anything was written, step by step (in one process each step's
            # own work; on a cluster the steps are submitted and the wait falls on the table's rows, the last)
            frames = _Lap(t_stage)
            dup = self._to_blocks(self.selected, "node", self.first_doc,
                                  after=Step(block_outputs, first_doc=self.first_doc))
            frames.lap("outputs")  # each block's members of clusters, in row order (a sort on the node)
            written = 0  # rows in deduplicated shards: none in memory or with output.shards false
            target = self.job.target
            shards = target is not None and self.job.write_shards
            table_file = target / DUPLICATES_NAME if cfg.output.duplicates_table and target is not None else None
            details: dict = {}  # where the stage's seconds went: frames, then the shards beside the table's thread
            # the duplicates table is written on a thread of its own beside the shards (pyarrow's writer encodes and
            # compresses on one thread: 3 s of an H200 host's 10^7-document run, while the device wrote the shards).
            # One process makes the table's frames on that thread too, since the shards need only the rows each
            # block removes (the members' ids, their survivors' ids and the Arrow columns: host work that took about
            # 3 s of the same run), a row group at a time, each one's frames made while the one before is encoded.
            # That thread works on host arrays only: on a device the blocks' columns are copied to the host first,
            # here.  A cluster submits the frames' tasks here, and the wait falls on the table's rows.
            beside = ex.holds_corpus
            if beside:
                dup_host = ex.map(host_frame, dup)
                frames.lap("to_host")
                table: Soon | None = Soon(self._table_beside, (dup_host, table_file), name="gpu-dedup-table")
            else:
                tables, rows = self._table_frames(dup, frames)
                table = Soon(_seconds_of, (ex.write_table, tables, table_file), name="gpu-dedup-table") \
                    if table_file is not None else None
            # frames_seconds: the select stage's rows routed to blocks (and, where the table's thread does not make
            # them, the duplicates table's frames), before anything is written; frames_parts_seconds: its steps,
            # which end at its last mark (starting the table's thread, a few milliseconds on a loaded host, is glue)
            details["frames_seconds"] = round(frames.t - t_stage, 4)
            details["frames_parts_seconds"] = frames.seconds
            try:  # the table's thread is done before the stage ends, whatever the shards did
                if shards:
                    if not self.index.reads_texts:  # nothing reads the normalized texts any more
                        ex.release_texts()
                    t0 = time.perf_counter()
                    written = ex.write_shards(ex.map(removed_rows, dup), target, self.ckpt,
                                              progress=info.progress.update)
                    details.update(shards_seconds=round(time.perf_counter() - t0, 4), **ex.write_details())
                    if written != self.counts["kept"]:  # pragma: no cover - guarded by tests
                        raise RuntimeError(f"accounting error: {written} rows written but {self.counts['kept']} kept")
            except BaseException:
                if table is not None:  # joined; the shards' error goes on
                    try:
                        table.result()
                    except BaseException as exc:  # noqa: BLE001 - the shards' error is the one raised
                        log.debug("the duplicates table failed too: %s", exc)
                raise
            if table is not None:
                t1 = time.perf_counter()
                got = table.result()
                details["table_wait_seconds"] = round(time.perf_counter() - t1, 4)  # after the shards were done
                # duplicates_table_seconds: the table thread's own, which overlap shards_seconds; where it made the
                # frames, table_parts_seconds: its steps (the frames' and the file's, which overlap each other)
                if beside:
                    tables, rows, steps, seconds = got
                    details.update(duplicates_table_seconds=seconds, table_parts_seconds=steps)
                else:
                    details["duplicates_table_seconds"] = round(got, 4)
            info.update(rows_written=written, duplicates_rows=rows, **details)
        self.dup, self.tables, self.duplicates_rows = dup, tables, rows

    def _table_frames(self, dup, lap: _Lap) -> tuple:
        """The duplicates table's parts and its rows, each step marked on ``lap``: the members' user ids (gathered
        from the id column), their survivors' ids, the Arrow columns."""
        ex, corpus = self.ex, self.corpus
        ids = ex.ids(dup, "row") if not corpus.id_generated else None
        lap.lap("ids")
        survivors = self._survivor_ids(dup)
        lap.lap("survivor_ids")
        tables = ex.map(duplicates_part, dup, ids, survivors, first_doc=self.first_doc,
                        starts=shard_starts(corpus.shards), names=[s.name for s in corpus.shards],
                        id_column=corpus.id_column, prior=self.prior)
        rows = ex.total(table_rows, tables)["rows"]
        lap.lap("tables")
        return tables, rows

    def _table_beside(self, dup, path) -> tuple:
        """On the table's thread (one process), from host blocks ``dup``: the duplicates table's frames a row
        group at a time, on a thread of their own, each row group written to the file at ``path`` (none where
        ``path`` is None) while the next one's frames are made (the writer encodes and compresses with the
        interpreter lock released); the same file as one write of the whole table.  Returns the table (one part),
        its rows, the seconds of each step (the frames' steps summed over the row groups, and ``file``, the
        writer's own, its waits for frames left out: they overlap) and the seconds of the whole."""
        t_start = time.perf_counter()
        steps = dict.fromkeys(("ids", "survivor_ids", "tables"), 0.0)
        made: list = []
        block = dup[0]
        n = len(block["row"])

        def groups():
            for lo in range(0, max(n, 1), DUPLICATES_ROW_GROUP):  # an empty table: one empty row group
                lap = _Lap(time.perf_counter())
                part, _ = self._table_frames([{k: v[lo:lo + DUPLICATES_ROW_GROUP] for k, v in block.items()}], lap)
                for k, v in lap.seconds.items():
                    steps[k] += v
                made.append(part[0])
                yield part[0]

        if path is None:
            for _ in groups():
                pass
        else:
            waited = [0.0]
            t0 = time.perf_counter()
            with closing(ahead(groups(), depth=1, name="gpu-dedup-table-frames")) as tables:
                self.ex.write_table(_waits(tables, waited), path)
            steps["file"] = time.perf_counter() - t0 - waited[0]
        table = pa.concat_tables(made) if len(made) > 1 else made[0]
        return [table], n, {k: round(v, 4) for k, v in steps.items()}, round(time.perf_counter() - t_start, 4)

    def _survivor_ids(self, dup):
        """Per block: the ids of each member's survivor (an indexed survivor: the index's id of its cluster
        id), or None without an id column."""
        if self.corpus.id_generated:
            return None
        ex = self.ex
        ids = ex.ids(ex.map(survivor_rows, dup, first_doc=self.first_doc), "row")
        return ex.map(survivor_id_column, dup, ids, prior=self.prior)

    def _report_samples(self) -> tuple:
        """The report's sample documents (the largest clusters, with their texts; None when not asked for: a
        ``result()`` hands them over, the texts maybe still being read beside the write stage) and the summary
        of removed near duplicates' similarities to their survivors."""
        cfg, ex = self.cfg, self.ex
        shown = None
        if self.job.examples:  # the largest clusters with sample texts
            shown = examples_soon(ex, self.selected, self.first_doc, self.corpus, cfg.verify_threshold)
        return shown, self._near_summary()

    def _near_summary(self) -> Ready | Soon:
        """The summary of removed near duplicates' similarities to their survivors (``result()``).  In one
        process the values are copied to host memory now, and summarized on a thread of their own beside the write
        stage: a histogram and a partial sort of every value (9 M values at 10^7 documents: about 0.6 s on this
        project's 2-core machine), host work that a GPU's write stage leaves the host's cores free for.  A
        cluster's tasks summarize their parts where they are (the whole step already runs beside the write)."""
        cfg, ex = self.cfg, self.ex
        if not ex.holds_corpus:
            return Ready(similarity_summary(ex, self.selected, near_similarity, cfg.verify_threshold))
        values = ex.map(near_similarity, self.selected)
        return Soon(similarity_summary, (ex, values, _values, cfg.verify_threshold), name="gpu_dedup-similarities")

    def report(self) -> dict:
        with self.st.cost("samples"):  # what the run still waits for of them
            shown, near = (self.samples or self.ex.soon(self._report_samples)).result()
            shown = None if shown is None else shown.result()
            near = near.result()
        with self.st.cost("report"):
            self._id_count()
            report = self._report(shown, near)
        report.update(self.st.accounts())  # brought up to date when the outputs are verified (finish_output)
        return report

    def _id_count(self) -> None:
        """The rows whose id another row has, into the counts and the read stage's details (one process counts
        them on a thread of its own from the read stage's end; a cluster's read stage counted them), with a
        warning where there are any."""
        dup = self.corpus.duplicate_ids
        self.counts["duplicate_ids"] = dup
        if "read" in self.st.stages:
            self.st.stages["read"]["duplicate_ids"] = dup
        if dup:
            log.warning("%d rows repeat an id of another row in column %r; every row is still processed and "
                        "reported (duplicates.parquet also names shard and shard_row)", dup, self.cfg.input.id_column)

    def _report(self, shown, near) -> dict:
        cfg, ex = self.cfg, self.ex
        starts = shard_starts(self.corpus.shards)
        removed = ex.collect(removed_by_shard, ex.map(removed_rows, self.dup), starts=starts)
        self.removed_per_shard = np.sum(removed, axis=0) if removed else np.zeros(len(self.corpus.shards), np.int64)
        report = build_report(
            cfg=cfg, backend=self.backend, shards=self.corpus.shards, counts=self.counts, stages=self.st.stages,
            bucket_sizes=self.extra.get("bucket_sizes", {}), cluster_sizes=self.extra.get("cluster_sizes", {}),
            removed_similarity=near, threshold=cfg.verify_threshold,
            lsh=self.family.report_section(cfg.lsh.threshold, cfg.verify_threshold),
            wall_seconds=self.st.accounts()["wall_seconds"], peak_rss_mb=peak_rss_mb(), examples=shown,
            removed_per_shard=self.removed_per_shard.tolist())
        report["resumed_from_checkpoint"] = self.ckpt.resumed
        report["run_fingerprint"] = self.ckpt.fingerprint
        report.update(ex.report_extras())
        report.update(self.index.report(self.n))
        return report

    def _expected_rows(self) -> dict:
        """Rows each Parquet output must hold (verified before it is published)."""
        rows = {DUPLICATES_NAME: self.duplicates_rows}
        if self.job.write_shards:
            per_shard = self.removed_per_shard
            rows.update({s.name: int(s.rows - per_shard[i]) for i, s in enumerate(self.corpus.shards)})
        return rows

    # ------------------------------------------------------------------ the sequence
    def run(self) -> RunResult:
        self.extra: dict = {}
        COMMITTED.reset()  # nothing of this run is published yet
        with self.st.cost("kernel_load"):  # the kernels this config uses (compiled the first time after install)
            self.ex.prepare(self.st)
        self.read()
        with self.st.cost("kernel_load"):  # what the run still waits for of kernels loading beside the read stage
            self.ex.kernels_loaded()
        self.exact()
        self.signatures_and_bands()
        self.buckets()
        self.verify()
        self.components()
        self.select()
        self.write()
        report = self.report()
        self.index.stage(self)  # the index's segments, before the outputs' commit (see IndexSteps.stage)
        try:
            if self.job.out is not None:
                finish_output(self.job, report, self.ckpt, self._expected_rows(), self.st)
        except BaseException:
            self.index.discard()
            raise
        self.index.publish(self.job.out)  # the index's manifest, after the outputs are published
        c = self.counts
        against = f", {c['removed_against_index']} against the index" if "removed_against_index" in c else ""
        log.debug("done: read %d, kept %d, removed %d (%d exact, %d near%s)", c["documents_read"], c["kept"],
                 c["removed"], c["exact_duplicates"], c["near_duplicates"], against)
        return self._result(report)

    def _result(self, report: dict) -> RunResult:
        """The RunResult: with every per-row array when the executor holds the corpus (one process)."""
        ex = self.ex
        base: dict[str, Any] = {"output_dir": self.job.out, "report": report, "shards": self.corpus.shards,
                "first_doc": self.first_doc}
        if not ex.holds_corpus:
            return RunResult(duplicates_table=None, **base)
        f, n = self.first_doc, self.n
        d, docs = self.dup[0], self.docs[0]
        kept = np.ones(n, bool)
        cluster = f + np.arange(n, dtype=np.int64)
        rows = to_host(d["row"])
        kept[rows] = to_host(d["kept"])
        cluster[rows] = to_host(d["cluster"])
        match = to_host(docs["match"])
        rep = np.where(match >= 0, match, f + to_host(docs["rep"]))
        v, sc = self.verified[0], self.scored[0]
        return RunResult(duplicates_table=self.tables[0], kept_rows=kept, cluster_rows=cluster,
                         edges=Edges(to_host(v["src"]), to_host(v["dst"]), to_host(v["sim"])),
                         scored=Edges(to_host(sc["src"]), to_host(sc["dst"]), to_host(sc["sim"])), rep=rep, **base)


# ---------------------------------------------------------------------- the output directory


def open_output(out: Path, shards, inputs=None, cfg: Config | None = None, *, shards_written: bool = True,
                fresh: bool = False) -> OutputDir:
    """Lock ``out`` for this run and refuse what would collide (see :mod:`gpu_dedup.run.outdir`);
    ``fresh``: a run that never resumes (its work directory starts empty).  The caller closes it."""
    duplicates = cfg.output.duplicates_table if cfg is not None else True
    kind = RemoteOutputDir if is_url(out) else OutputDir  # an object store: no rename, no flock (its module doc)
    return kind(out, shards, inputs, duplicates=duplicates, shards_written=shards_written).open(fresh=fresh)


def finish_output(job: Job, report: dict, ckpt, expected_rows: dict | None = None, st: StageLog | None = None) -> None:
    """Every staged output verified, then report.json and report.html staged with the run's accounts (its
    seconds end here: what follows, the files' publication and ``_SUCCESS``, takes milliseconds on a local
    disk), then everything published, ``_SUCCESS`` last."""
    od = job.outdir
    if od is None:  # pragma: no cover - every file-based run opens its output directory
        raise RuntimeError("a run with an output directory must open it with open_output")
    st = st or StageLog()
    with st.cost("commit"):
        recorded = {}
        for i, shard in enumerate(od.shards):  # digests taken when a resumable run staged its shards
            rec = ckpt.marked(f"shard-{i}") if od.names else None
            if rec and rec.get("name") == shard.name:
                recorded[shard.name] = rec
        od.verify(expected_rows or {}, recorded)
    report.update(st.accounts())
    # report.json written and synced on a thread while the page renders; both recorded with the digests of their
    # bytes, which the commit then need not read back
    payload = report_bytes(report)
    json_file = Soon(atomic_write_recorded, (od.staging / REPORT_NAME, payload), name="gpu_dedup-report")
    page = atomic_write_recorded(od.staging / REPORT_HTML_NAME, render(report).encode("utf-8"))
    for name, rec in ((REPORT_NAME, json_file.result()), (REPORT_HTML_NAME, page)):
        if rec is not None:
            recorded[name] = rec
    maybe_crash("report:before-success")
    ckpt.settle()  # the commit removes the checkpoint directory: nothing may still be writing into it
    od.commit(ckpt.fingerprint or report["fingerprint"], expected_rows or {}, recorded)
    ckpt.remove()
