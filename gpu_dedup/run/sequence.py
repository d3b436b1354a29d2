"""The stage sequence, written once.

read -> normalize -> exact -> signatures -> bands -> buckets -> edges/verify ->
components -> select -> write -> (index) -> report.

:func:`execute` is the only place that chains the stages.  Every way of
running gpu_dedup calls it: the single-process run and the in-memory
DataFrame API (:mod:`gpu_dedup.run.local`), Dask and Dask-CUDA workers
(:mod:`gpu_dedup.run.cluster`), a run against a persisted index and the
evaluation.  They differ only in

- the **executor**, which decides where the corpus lives and how data moves
  (one process: host memory on the CPU backend, device memory on the GPU
  backend; a Dask cluster: blocks on the workers, a shuffle for buckets, merges
  for verification).  It holds no dedup logic: it runs the per-block stage
  functions of :mod:`gpu_dedup.stages` where the data is;
- the **job**: output directory (or none: in memory), a ``prior`` (documents
  already indexed: they take part in matching and always survive) and a
  ``sink`` (receives every document of the run: an index being built or
  updated).

Driver-side arrays (exact groups, buckets, edges, labels, survivors) are
arrays of the backend's module (NumPy, or CuPy on a single GPU), so on one GPU
the data stays on the device from read to write; only counts, report numbers
and a few sample texts come back to the host.

**Nodes.** Without a prior, node ``r`` is input row ``r``.  With a prior,
the indexed documents involved (exact-key matches and the bucket centres the
index recorded) become nodes ``0..m-1``, ranked before every new document,
and input row ``r`` is node ``m + r``: buckets, star edges, components,
survivors and chain splitting then run exactly as a full dedup of index + new
documents would.  Documents are numbered across runs (``doc``): index
documents by their index number, input rows from ``first_doc`` on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import to_device, to_host
from gpu_dedup.config import Config
from gpu_dedup.report.build import build_report, examples, write_report
from gpu_dedup.report.page import write_html
from gpu_dedup.run.checkpoint import CheckpointUnreadable, maybe_crash
from gpu_dedup.run.outdir import (
    DUPLICATES_NAME,
    REPORT_HTML_NAME,
    REPORT_NAME,
    SUCCESS_NAME,
    OutputDir,
)
from gpu_dedup.run.remote_outdir import RemoteOutputDir
from gpu_dedup.run.stagelog import StageLog, peak_rss_mb
from gpu_dedup.stages.buckets import Buckets
from gpu_dedup.stages.edges import Centres, Edges, star_rounds
from gpu_dedup.stages.exact import exact_groups
from gpu_dedup.stages.selection import ranks_from_keys, split_chains, survivors
from gpu_dedup.stages.write import check_id_column, duplicates_table
from gpu_dedup.storage.filesystems import is_url

log = logging.getLogger("gpu_dedup")

__all__ = ["CorpusCounts", "Job", "RunResult", "execute", "open_output", "finish_output", "DUPLICATES_NAME", "REPORT_NAME",
           "REPORT_HTML_NAME", "SUCCESS_NAME"]


class CorpusCounts:
    """What every executor's corpus answers alike (``null``: a bool per row; ``id_column``: None when
    the ids are generated)."""

    @property
    def null_count(self) -> int:
        return int(self.null.sum())

    @property
    def id_generated(self) -> bool:
        return self.id_column is None


@dataclass(frozen=True)
class Job:
    """What a run produces; the parameters where runs differ."""

    cfg: Config
    out: Path | None = None  # None: in memory (nothing written)
    write_shards: bool = True  # False: only the index (``gpu-dedup index build``)
    prior: object | None = None  # an opened index: its documents take part and always survive
    sink: object | None = None  # receives every document of this run (``append(**payload)``): an index
    examples: bool = True  # sample texts of the largest clusters in the report
    outdir: OutputDir | None = None  # the locked output directory (see open_output); files go to its staging

    @property
    def target(self) -> Path | None:
        """Where the outputs are written during the run: the staging directory, published at the end."""
        return self.outdir.staging if self.outdir is not None else self.out


@dataclass
class RunResult:
    output_dir: Path | None  # None: an in-memory run (nothing written)
    report: dict
    duplicates: pa.Table  # every member of a cluster of two or more documents
    kept: np.ndarray  # bool per input row
    cluster: np.ndarray  # cluster id per input row: the doc number of its survivor
    edges: Edges  # verified edges between doc numbers, with their similarity
    shards: list = field(default_factory=list)
    scored: Edges | None = None  # every candidate pair scored (doc numbers), with its similarity
    rep: np.ndarray | None = None  # exact-copy representative per input row (doc number)


def execute(job: Job, ex, ckpt, st: StageLog | None = None) -> RunResult:
    """Run every stage for ``job`` on executor ``ex`` with checkpoints ``ckpt``.

    ``ex`` (see :mod:`gpu_dedup.run.local` and :mod:`gpu_dedup.run.cluster`)
    reads the shards and runs the per-block stages where the data lives;
    ``ckpt`` saves and restores the driver-side result of each stage
    (:class:`gpu_dedup.run.checkpoint.NoCheckpoints` where there are none).
    """
    return _Sequence(job, ex, ckpt, st or StageLog()).run()


class _Sequence:
    def __init__(self, job: Job, ex, ckpt, st: StageLog):
        self.t_start = time.perf_counter()
        self.job, self.ex, self.ckpt, self.st = job, ex, ckpt, st
        self.cfg = job.cfg
        self.backend = ex.backend
        self.xp = ex.xp
        self.counts: dict = {}
        self.prior = job.prior
        self.first_doc = self.prior.documents if self.prior is not None else 0

    # ------------------------------------------------------------------ helpers
    def _unit(self, unit: str, stages: tuple, compute):
        """Load checkpoint ``unit`` or run ``compute()`` (which times ``stages``) and save it."""
        xp = self.xp
        loaded = None
        if self.ckpt.has(unit):
            try:
                loaded = self.ckpt.load(unit)
            except CheckpointUnreadable:  # truncated or garbled: computed again (a warning says so)
                loaded = None
        if loaded is not None:
            arrays, meta = loaded
            for name, entry in meta["stages"].items():
                self.st.stages[name] = {**entry, "resumed": True}
            self.counts.update(meta["counts"])
            log.info("stage(s) %s: resumed from checkpoint", ", ".join(stages))
            return {k: (to_device(v, xp) if isinstance(v, np.ndarray) else v) for k, v in arrays.items()}
        arrays, counts = compute()
        self.counts.update(counts)
        self.ckpt.save(unit, {k: to_host(v) for k, v in arrays.items()},
                       {"stages": {n: self.st.stages[n] for n in stages if n in self.st.stages}, "counts": counts})
        return arrays

    def _similarity(self, left, right, progress=None):
        """Similarity of node pairs (the family's exact similarity, or its signature estimate)."""
        return self.ex.similarity(left, right, self.prior_nodes, progress=progress)

    # ------------------------------------------------------------------ stages
    def read(self):
        cfg = self.cfg
        with self.st.stage("read", len(self.ex.shards), "shards") as info:
            corpus = self.corpus = self.ex.read(progress=info.progress.update)
            self.n = corpus.n
            self.family = self.ex.family  # the similarity family, sized for this run (stages/families.py)
            info.update(documents=corpus.n, shards=len(corpus.shards), null_text=corpus.null_count,
                        duplicate_ids=corpus.duplicate_ids)
        if corpus.duplicate_ids:
            log.warning("%d rows repeat an id of another row in column %r; every row is still processed and "
                        "reported (duplicates.parquet also names shard and shard_row)", corpus.duplicate_ids,
                        cfg.input.id_column)
        self.counts.update(documents_read=corpus.n, null_text=corpus.null_count, duplicate_ids=corpus.duplicate_ids)
        check_id_column(corpus.id_column)

    def exact(self):
        """Exact copies (of each other, and with a prior of indexed documents) -> representative node."""
        cfg, xp, n = self.cfg, self.xp, self.n

        def compute():
            counts = dict(self.ex.normalize())  # its own stage; what it counts is saved with this unit
            keys = self.ex.exact_keys() if (cfg.exact_dedup or self.job.sink is not None) else None
            with self.st.stage("exact", n) as info:
                ranks = to_device(ranks_from_keys(cfg.select.keep, n, length=self.corpus.rank_key,
                                                  ids=self.corpus.rank_key, score=self.corpus.rank_key), xp)
                null = self.corpus.null
                match = xp.full(n, -1, dtype=xp.int64)  # index document each row is an exact copy of
                if self.prior is not None and cfg.exact_dedup and n:
                    match = to_device(self.prior.exact_matches(to_host(keys)), xp)
                    match[null] = -1
                if cfg.exact_dedup:
                    rep = exact_groups(keys, ranks, eligible=~null & (match < 0))
                else:
                    rep = xp.arange(n, dtype=xp.int64)
                collapsed = int((rep != xp.arange(n)).sum()) + int((match >= 0).sum())
                info.update(copies_collapsed=collapsed)  # removed as exact or (a copy of a near duplicate) near
            arrays = {"rep": rep, "ranks": ranks, "match": match}
            if keys is not None and self.job.sink is not None:
                arrays["keys"] = keys
            return arrays, {**counts, "exact_stage_collapsed": collapsed}

        a = self._unit("exact", ("exact",), compute)
        self.rep_row, self.ranks, self.match = a["rep"], a["ranks"], a["match"]
        self.keys = a.get("keys")

    def signatures_and_bands(self):
        """Signatures (the family's) of the representatives that are not copies of an indexed
        document; band hashes of those that have one."""
        xp, n = self.xp, self.n

        def compute():
            rows = xp.flatnonzero((self.rep_row == xp.arange(n)) & ~self.corpus.null & (self.match < 0))
            with self.st.stage("signatures", rows.shape[0]) as info:
                features, usable = self.ex.signatures(rows, progress=info.progress.update)
                stage_info, counts = self.family.signature_info(to_host(features), to_host(usable))
                info.update(**stage_info)
            lsh_rows = rows[usable]
            with self.st.stage("bands", lsh_rows.shape[0]) as info:
                bands = self.ex.bands(lsh_rows)
                b, r = self.family.layout
                info.update(bands=b, rows=r)
            return {"lsh_rows": lsh_rows, **bands.arrays()}, counts

        a = self._unit("bands", ("signatures", "bands"), compute)
        self.lsh_rows = a["lsh_rows"]
        self.bands = self.ex.band_data(a)

    def buckets(self):
        """Group (band, band hash) -> buckets of nodes; with a prior, the index's centres of each bucket."""
        xp, m_prior = self.xp, self.prior is not None

        def compute():
            with self.st.stage("buckets", int(self.lsh_rows.shape[0]) * self.family.layout[0], "band hashes") as info:
                # with a prior, a lone new document still meets the index's documents of its bucket
                bk = self.ex.buckets(self.bands, min_size=1 if m_prior else 2)
                arrays = {"band": bk.band, "hash": bk.hash, "offsets": bk.offsets, "members": bk.members}
                if m_prior:
                    cq, cr, cd = (to_device(x, xp) for x in self.prior.bucket_centres(to_host(bk.band),
                                                                                  to_host(bk.hash)))
                    arrays.update(centre_bucket=cq, centre_round=cr, centre_doc=cd)
                info.update(buckets=len(bk), memberships=int(bk.members.shape[0]))
            candidate = bk.sizes > 1
            if m_prior:  # a bucket with one new document counts when the index has a centre for it
                candidate |= xp.isin(xp.arange(len(bk)), cq)
            return arrays, {"candidate_buckets": int(candidate.sum()), "bucket_memberships": int(bk.members.shape[0])}

        a = self._unit("buckets", ("buckets",), compute)
        bk_rows = Buckets(a["band"], a["hash"], a["offsets"], a["members"])
        self.bucket_sizes = bk_rows.sizes
        # nodes: index documents involved (exact matches, recorded centres), then the input rows
        if m_prior:
            matched = self.match[self.match >= 0]
            involved = xp.unique(xp.concatenate((matched, a["centre_doc"])))
            # and the survivors of their index clusters: an edge to an indexed document joins its cluster,
            # whose survivor chain splitting measures new members against, as a full dedup does
            survivors_of = xp.asarray(self.prior.survivors(to_host(involved)), dtype=xp.int64)
            self.index_docs = xp.unique(xp.concatenate((involved, survivors_of)))
        else:
            self.index_docs = xp.zeros(0, dtype=xp.int64)
        m = self.m = int(self.index_docs.shape[0])
        self.N = m + self.n
        self.home = None  # node -> node of its index cluster's survivor (identity for input rows)
        if m_prior:
            home = xp.searchsorted(self.index_docs, xp.asarray(self.prior.survivors(to_host(self.index_docs)),
                                                               dtype=xp.int64))
            self.home = xp.concatenate((home, xp.arange(m, self.N, dtype=xp.int64)))
        rep = self.rep_row + m
        has = self.match >= 0
        rep[has] = xp.searchsorted(self.index_docs, self.match[has])
        self.rep = xp.concatenate((xp.arange(m, dtype=xp.int64), rep))  # per node
        self.bk = Buckets(bk_rows.band, bk_rows.hash, bk_rows.offsets, bk_rows.members + m)
        self.forced = None
        if m_prior:
            self.forced = Centres(a["centre_bucket"], a["centre_round"],
                                  xp.searchsorted(self.index_docs, a["centre_doc"]))
        self.prior_nodes = (m, self.prior, to_host(self.index_docs)) if m else None
        self.counts["index_nodes_involved"] = m if m_prior else None
        if not m_prior:
            self.counts.pop("index_nodes_involved")

    def verify(self):
        """Star edges per bucket, verified, re-starred for lsh.star_rounds rounds."""
        cfg = self.cfg

        def compute():
            method, rounds = cfg.verify.method, cfg.lsh.star_rounds
            with self.st.stage("verify", int(self.bk.members.shape[0]), "pairs") as info:
                prog = info.progress

                def similarity(left, right):
                    return self._similarity(left, right, progress=prog.update)

                res = star_rounds(self.bk, similarity, cfg.verify_threshold, rounds, keep_all=method == "none",
                                  forced=self.forced)
                v, s, c = res.verified, res.scored, res.centres
                info.update(method=method, star_rounds=rounds, candidate_edges=len(s), verified_edges=len(v))
            return ({"src": v.src, "dst": v.dst, "similarity": v.similarity, "scored_src": s.src,
                     "scored_dst": s.dst, "scored_similarity": s.similarity, "centre_bucket": c.bucket,
                     "centre_round": c.round, "centre_node": c.doc},
                    {"candidate_edges": len(s), "verified_edges": len(v)})

        a = self._unit("verify", ("verify",), compute)
        self.verified = Edges(a["src"], a["dst"], a["similarity"])
        self.scored = Edges(a["scored_src"], a["scored_dst"], a["scored_similarity"])
        self.centres = Centres(a["centre_bucket"], a["centre_round"], a["centre_node"])

    def components(self):
        xp = self.xp

        def compute():
            with self.st.stage("components", len(self.verified), "edges") as info:
                src, dst, rep = self.verified.src, self.verified.dst, self.rep
                if self.home is not None:  # indexed documents stand for their index clusters
                    src, dst, rep = self.home[src], self.home[dst], self.home[rep]
                labels = self.backend.components(src, dst, self.N)[rep]
                clusters = int((xp.bincount(labels, minlength=self.N) > 1).sum()) if self.N else 0
                info.update(clusters=clusters)
            return {"labels": labels}, {"clusters": clusters}

        self.labels = self._unit("components", ("components",), compute)["labels"]

    def select(self):
        """One survivor per cluster (indexed documents first, then the policy's ranks); similarity to it."""
        cfg, xp, m, N = self.cfg, self.xp, self.m, self.N

        def compute():
            with self.st.stage("select", self.n) as info:
                prior_ranks = xp.arange(m, dtype=xp.int64) - m  # indexed documents first, their survivors first
                if m:
                    prior_ranks = xp.where(self.home[:m] == xp.arange(m), prior_ranks - m, prior_ranks)
                ranks = xp.concatenate((prior_ranks, self.ranks))
                labels = self.labels
                survivor = survivors(labels, ranks)
                extra = {}
                if cfg.select.split_chains:  # members below the threshold to their survivor leave
                    labels, survivor, ejected, rounds = split_chains(
                        labels, self.rep, ranks, self.verified.src, self.verified.dst, self._similarity,
                        cfg.verify_threshold, self.backend.components, fixed=xp.arange(N) < m)
                    extra["chain_split_ejected"] = int(ejected.sum())
                    info.update(chain_split_ejected=int(ejected.sum()), chain_split_rounds=rounds)
                node = xp.arange(m, N, dtype=xp.int64)
                kept = survivor[m:] == node
                similarity = xp.ones(self.n, dtype=xp.float64)
                todo = xp.flatnonzero(~kept & (self.rep[m:] != survivor[m:]))
                if todo.shape[0]:
                    similarity[todo] = self._similarity(self.rep[m:][todo], survivor[m:][todo])
                removed = ~kept
                near = removed & (self.rep[m:] != survivor[m:])
                info.update(kept=int(kept.sum()), removed=int(removed.sum()))
            counts = {
                "exact_duplicates": int((removed & ~near).sum()),  # same normalized text as the survivor
                "near_duplicates": int(near.sum()),
                "removed": int(removed.sum()),
                "kept": int(kept.sum()),
                **extra,
            }
            if m or self.prior is not None:
                counts["removed_against_index"] = int((removed & (survivor[m:] < m)).sum())
            return {"survivor": survivor, "kept": kept, "similarity": similarity, "labels": labels}, counts

        a = self._unit("select", ("select",), compute)
        self.survivor, self.kept, self.similarity, self.labels = a["survivor"], a["kept"], a["similarity"], a["labels"]
        self.cluster_size = xp.bincount(self.labels, minlength=N) if N else xp.zeros(0, dtype=xp.int64)
        self.counts["clusters"] = int(xp.unique(self.labels[m:][self.cluster_size[self.labels[m:]] > 1]).shape[0])

    # ------------------------------------------------------------------ doc numbers
    def _ids(self, rows) -> pa.Array:
        """User ids of input rows (host); generated ids are doc numbers (they continue an index's)."""
        rows = np.asarray(rows, np.int64)
        if self.corpus.id_generated:
            return pa.array(self.first_doc + rows, pa.int64())
        return self.ex.ids(rows)

    def _node_doc(self):
        """Doc number of every node: index documents, then first_doc + row."""
        xp = self.xp
        return xp.concatenate((self.index_docs, self.first_doc + xp.arange(self.n, dtype=xp.int64)))

    def _cluster_ids(self, node_doc):
        """Cluster id per input row: the doc number of its survivor (for an indexed survivor, the
        index's own cluster id of it)."""
        xp, m = self.xp, self.m
        cluster = node_doc[self.survivor[m:]]
        in_index = self.survivor[m:] < m
        if self.prior is not None and bool(in_index.any()):
            cluster[in_index] = xp.asarray(self.prior.survivors(to_host(cluster[in_index])))
        return cluster

    def write(self):
        cfg, xp, m = self.cfg, self.xp, self.m
        corpus = self.corpus
        node_doc = self._node_doc()
        self.cluster = self._cluster_ids(node_doc)
        with self.st.stage("write", len(corpus.shards), "shards") as info:
            member = to_host(xp.flatnonzero(self.cluster_size[self.labels[m:]] > 1))
            surv = to_host(self.survivor[m:][member])
            surv_row = surv - m
            in_index = surv < m
            cluster = to_host(self.cluster[member])
            ids = survivor_ids = None  # generated ids: the row and cluster_id columns name the documents
            if not corpus.id_generated:
                ids = self._ids(member)
                if in_index.any():  # an indexed survivor: the id of the index's cluster id of it
                    pos = np.empty(member.shape[0], np.int64)
                    pos[~in_index] = np.arange(int((~in_index).sum()))
                    pos[in_index] = (~in_index).sum() + np.arange(int(in_index.sum()))
                    row_ids = self._ids(surv_row[~in_index])
                    index_ids = self.prior.ids(cluster[in_index])
                    survivor_ids = pa.concat_arrays([row_ids, index_ids.cast(row_ids.type)]).take(pa.array(pos))
                else:
                    survivor_ids = self._ids(surv_row)
            kept = to_host(self.kept)
            rep = to_host(self.rep[m:][member])
            starts = np.cumsum([0] + [s.rows for s in corpus.shards])
            duplicates = duplicates_table(
                ids=ids, survivor_ids=survivor_ids, rows=member, first_row=self.first_doc, shard_starts=starts,
                shard_names=[s.name for s in corpus.shards], id_column=corpus.id_column,
                kept=kept[member], cluster=cluster,
                similarity=to_host(self.similarity)[member], exact=rep == surv,
                in_index=in_index if self.prior is not None else None)
            written = 0  # rows in deduplicated shards: none in memory or with output.shards false
            target = self.job.target
            if target is not None and self.job.write_shards:
                written = self.ex.write(kept, target, self.ckpt, progress=info.progress.update)
                if written != self.counts["kept"]:  # pragma: no cover - guarded by tests
                    raise RuntimeError(f"accounting error: {written} rows written but {self.counts['kept']} kept")
            if cfg.output.duplicates_table and target is not None:
                self.ex.write_table(target / DUPLICATES_NAME, duplicates)
            info.update(rows_written=written, duplicates_rows=duplicates.num_rows)
        self.duplicates = duplicates
        self.node_doc = node_doc

    def index(self):
        """Hand every document of this run to the sink (an index being built or updated)."""
        m = self.m
        maybe_crash("index:before-append")
        with self.st.stage("index", self.n) as info:
            keys = self.keys if self.keys is not None else self.ex.exact_keys()
            centres = self.centres
            own = centres.doc >= m  # centres among this run's documents
            payload = self.ex.index_payload(self.bands, self.lsh_rows)
            ids = self._ids(np.arange(self.n))
            self.job.sink.append(
                ids=ids, kept=to_host(self.kept), survivor=to_host(self.cluster), keys=to_host(keys),
                texts=payload["texts"], band_docs=self.first_doc + to_host(self.lsh_rows),
                band_hashes=payload["band_hashes"], signatures=payload["signatures"],
                vectors=payload.get("vectors"), layout=self.family.layout,
                centres=(to_host(self.bk.band[centres.bucket[own]]), to_host(self.bk.hash[centres.bucket[own]]),
                         to_host(centres.round[own]), to_host(self.node_doc[centres.doc[own]])))
            info.update(documents=self.job.sink.documents)

    def report(self) -> dict:
        cfg, m = self.cfg, self.m
        near = ~self.kept & (self.rep[m:] != self.survivor[m:])
        shown = None
        if self.job.examples and self.prior is None:  # the largest clusters with sample texts
            shown = examples(to_host(self.survivor), to_host(self.kept), to_host(self.rep),
                             to_host(self.similarity), self.ex.column("text"),
                             None if self.corpus.id_generated else self.ex.column("id"),
                             *self.corpus.shard_rows(), [s.name for s in self.corpus.shards],
                             threshold=cfg.verify_threshold)
        sizes = self.cluster_size[self.cluster_size > 1]
        report = build_report(
            cfg=cfg, backend=self.backend, shards=self.corpus.shards, counts=self.counts, stages=self.st.stages,
            bucket_sizes=to_host(self.bucket_sizes), cluster_sizes=to_host(sizes),
            removed_similarity=to_host(self.similarity[near]), threshold=cfg.verify_threshold,
            lsh=self.family.report_section(cfg.lsh.threshold, cfg.verify_threshold),
            wall_seconds=time.perf_counter() - self.t_start, peak_rss_mb=peak_rss_mb(), examples=shown,
            kept=to_host(self.kept))
        report["resumed_from_checkpoint"] = self.ckpt.resumed
        report["run_fingerprint"] = self.ckpt.fingerprint
        report.update(self.ex.report_extras())
        if self.prior is not None:
            updated = self.job.sink is self.prior  # appended after the report is published (see run)
            report["index"] = {"path": str(self.prior.path), "documents_before": self.first_doc, "updated": updated,
                               "documents_after": self.first_doc + self.n if updated else self.prior.documents}
        elif self.job.sink is not None:
            report["index_out"] = str(self.job.sink.path)
        return report

    def _expected_rows(self) -> dict:
        """Rows each Parquet output must hold (verified before it is published)."""
        kept = to_host(self.kept)
        starts = np.cumsum([0] + [s.rows for s in self.corpus.shards])
        rows = {DUPLICATES_NAME: self.duplicates.num_rows}
        if self.job.write_shards:
            rows.update({s.name: int(kept[starts[i]:starts[i + 1]].sum()) for i, s in enumerate(self.corpus.shards)})
        return rows

    # ------------------------------------------------------------------ the sequence
    def run(self) -> RunResult:
        self.ex.prepare(self.st)
        self.read()
        self.exact()
        self.signatures_and_bands()
        self.buckets()
        self.verify()
        self.components()
        self.select()
        self.write()
        report = self.report()
        if self.job.out is not None:
            finish_output(self.job, report, self.ckpt, self._expected_rows())
        if self.job.sink is not None:
            # after the outputs are published: a run killed or failing before its commit leaves the index as it
            # was, so rerunning the same command neither appends the documents twice nor matches them against
            # their own earlier copies; one killed after its commit recomputes the same outputs and appends
            self.index()
        c = self.counts
        against = f", {c['removed_against_index']} against the index" if "removed_against_index" in c else ""
        log.info("done: read %d, kept %d, removed %d (%d exact, %d near%s)", c["documents_read"], c["kept"],
                 c["removed"], c["exact_duplicates"], c["near_duplicates"], against)
        nd = self.node_doc
        v, s = self.verified, self.scored
        return RunResult(
            output_dir=self.job.out, report=report, duplicates=self.duplicates, kept=to_host(self.kept),
            cluster=to_host(self.cluster),
            edges=Edges(to_host(nd[v.src]), to_host(nd[v.dst]), to_host(v.similarity)),
            shards=self.corpus.shards,
            scored=Edges(to_host(nd[s.src]), to_host(nd[s.dst]), to_host(s.similarity)),
            rep=to_host(nd[self.rep[self.m:]]))




# ---------------------------------------------------------------------- the output directory


def open_output(out: Path, shards, inputs=None, cfg: Config | None = None, *, shards_written: bool = True,
                fresh: bool = False) -> OutputDir:
    """Lock ``out`` for this run and refuse what would collide (see :mod:`gpu_dedup.run.outdir`);
    ``fresh``: a run that never resumes (its work directory starts empty).  The caller closes it."""
    duplicates = cfg.output.duplicates_table if cfg is not None else True
    kind = RemoteOutputDir if is_url(out) else OutputDir  # an object store: no rename, no flock (its module doc)
    return kind(out, shards, inputs, duplicates=duplicates, shards_written=shards_written).open(fresh=fresh)


def finish_output(job: Job, report: dict, ckpt, expected_rows: dict | None = None) -> None:
    """report.json and report.html staged, then every output verified and published, ``_SUCCESS`` last."""
    od = job.outdir
    if od is None:  # pragma: no cover - every file-based run opens its output directory
        raise RuntimeError("a run with an output directory must open it with open_output")
    write_report(od.staging / REPORT_NAME, report)
    write_html(od.staging / REPORT_HTML_NAME, report)
    maybe_crash("report:before-success")
    recorded = {}
    for i, shard in enumerate(od.shards):  # digests taken when a resumable run staged its shards
        rec = ckpt.marked(f"shard-{i}") if od.names else None
        if rec and rec.get("name") == shard.name:
            recorded[shard.name] = {"size": rec["size"], "sha256": rec["sha256"]}
    od.commit(ckpt.fingerprint or report["fingerprint"], expected_rows or {}, recorded)
    ckpt.remove()
