"""The pipeline: read -> normalize -> exact -> signatures -> bands -> buckets ->
edges -> verify -> components -> select -> write -> report.

Every stage is a plain function (see the modules named after them); ``run``
chains them, times them and accounts for every input row: each row is either
kept (written to its deduplicated shard) or removed (listed in
``duplicates.parquet`` with ``kept = false``).

Stages checkpoint their results into the output directory (see
:mod:`gpu_dedup.checkpoint`); a killed run resumes where it stopped.
``report.json``, ``report.html`` and then ``_SUCCESS`` are written last; all
three are deleted when a run starts, so ``_SUCCESS`` marks a complete run.

``output_dir=None`` runs in memory (the DataFrame API, :mod:`gpu_dedup.api`):
no shard, table, report file or checkpoint is written; the RunResult carries
everything.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from . import io
from .backend import get_backend
from .buckets import Buckets, Centres, Edges, buckets, star_rounds
from .checkpoint import Checkpoints, NoCheckpoints, maybe_crash, run_fingerprint
from .components import components
from .config import Config
from .errors import ConfigError, InputError
from .exact import exact_groups, exact_keys
from .hashing import hash_params
from .lsh import band_hashes
from .minhash import signatures
from .normalize import normalize, repair_utf8
from .progress import Progress, chunks
from .report import build_report, largest_clusters, write_report
from .report_html import write_html
from .select import policy_ranks, split_chains, survivors
from .strings import string_buffers
from .verify import exact_similarity, signature_similarity

log = logging.getLogger("gpu_dedup")

REPORT_NAME = "report.json"
REPORT_HTML_NAME = "report.html"
SIGNATURE_CHUNK = 65536  # documents per signature kernel call (progress granularity)
DUPLICATES_NAME = "duplicates.parquet"


def rss_mb() -> float:
    """Current resident memory of this process in MiB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - non-Linux
        return float("nan")


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB.

    Reads VmHWM (the high-water mark of this address space): ``ru_maxrss``
    survives fork + exec on Linux, so a child started by a large parent would
    report the parent's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - non-Linux
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class StageInfo(dict):
    """What a stage reports (a dict of details for report.json) and its :class:`Progress` (``.progress``)."""

    progress: Progress


@dataclass
class StageLog:
    """Times stages and shows their progress (see :mod:`gpu_dedup.progress`).

    Each stage gets a progress line on a terminal; elsewhere a ``stage NAME ...``
    line when it starts and ``stage NAME done in S: DONE/TOTAL UNIT, RATE UNIT/s;
    details`` when it ends (both at INFO: ``--quiet`` hides them).
    """

    stages: dict = field(default_factory=dict)
    stream: object = None  # where terminal progress lines go (default: sys.stderr)

    @contextmanager
    def stage(self, name: str, total: int | None = None, unit: str = "docs"):
        """Time stage ``name`` over ``total`` items of ``unit``; the body advances
        ``info.progress`` per chunk (or not at all: a stage that ends counts every item done)."""
        t0 = time.perf_counter()
        info = StageInfo()
        prog = info.progress = Progress(name, total, unit, stream=self.stream, log_close=False)
        if not prog.tty:
            log.info("stage %s ...", name)
        prog.start()
        try:
            yield info
        except BaseException:
            prog.abort()
            raise
        maybe_crash(name)  # fault injection (tests): killed after the work, before its checkpoint
        prog.finish()
        prog.close()
        seconds = time.perf_counter() - t0
        self.stages[name] = {"seconds": round(seconds, 4), "rss_mb": round(rss_mb(), 1), **info}
        details = " ".join(f"{k}={v}" for k, v in info.items())
        counts = prog.counts()
        # on a terminal the progress line said it all; the details stay one -v away
        log.log(logging.DEBUG if prog.tty else logging.INFO, "stage %s done in %.2fs%s%s", name, seconds,
                f": {counts}" if counts else "", f"; {details}" if details else "")


@dataclass
class RunResult:
    output_dir: Path | None  # None: an in-memory run (nothing written)
    report: dict
    duplicates: pa.Table  # every document of a cluster with two or more members
    kept: np.ndarray  # bool per input row (global row order)
    cluster: np.ndarray  # cluster id (survivor's row) per input row
    edges: Edges  # verified edges between input rows, with their similarity
    shards: list = field(default_factory=list)


SUCCESS_NAME = "_SUCCESS"


def _prepare_output(out: Path, shards) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        target = (out / shard.name).resolve()
        if target == Path(shard.path).resolve():
            raise InputError(
                f"output {str(target)!r} would overwrite input shard {shard.path!r}; choose another output directory"
            )
    for marker in (out / SUCCESS_NAME, out / REPORT_NAME, out / REPORT_HTML_NAME):  # must not vouch for this run yet
        if marker.exists():
            marker.unlink()
    for dirpath, _, files in os.walk(out):  # temporary files a killed run left behind
        for f in files:
            if f.startswith(".") and f.endswith(".tmp"):
                os.unlink(os.path.join(dirpath, f))


def run(inputs, output_dir, cfg: Config = Config(), *, restart: bool = False, index_out=None, against=None,
        update_index: bool = False, write_shards: bool = True) -> RunResult:
    """Deduplicate the shards ``inputs`` into ``output_dir``; see the module docstring.

    A run killed at any point resumes from its last checkpoint when called
    again with the same inputs and config; ``restart=True`` starts over.
    With ``cluster.workers`` or ``cluster.scheduler`` set, the run goes to a
    Dask cluster (:mod:`gpu_dedup.distributed`; no checkpoints there).

    ``index_out``: also write a persisted index of the corpus there.
    ``against``: an index path (or an opened :class:`gpu_dedup.index.Index`,
    updated in place); deduplicate the inputs against it (indexed documents
    always survive; no checkpoints in this mode), and with ``update_index``
    append the inputs to it.  See :mod:`gpu_dedup.index`.

    ``output_dir=None``: an in-memory run (``inputs`` are usually
    :func:`gpu_dedup.io.memory_shard` shards): nothing is written, no
    checkpoints; the result holds the kept mask, clusters, duplicates and report.
    """
    if output_dir is None and (cfg.cluster.enabled or index_out):
        raise ConfigError("a run without an output directory (in memory) runs in one process and writes no new "
                          "index; drop cluster.workers / cluster.scheduler and index_out, or give an output_dir")
    if cfg.cluster.enabled:
        if index_out or against:
            raise ConfigError("--index-out / --against run in one process for now; drop --workers / --scheduler")
        from . import distributed

        return distributed.run(inputs, output_dir, cfg)
    r = _Run(inputs, None if output_dir is None else Path(output_dir), cfg, restart)
    r.index_out, r.write_shards = index_out, write_shards
    if against is not None:
        from .index import Index

        if isinstance(against, Index):
            against.check(cfg)
            r.index = against
        else:
            r.index = Index.open(against, cfg)
        r.update_index = update_index
    return r.execute()


class _Run:
    """One pipeline run: stages in order, each checkpointed unit loaded or computed."""

    def __init__(self, inputs, out: Path | None, cfg: Config, restart: bool):
        self.t_start = time.perf_counter()
        self.cfg = cfg
        self.out = out
        self.backend = get_backend(cfg.backend)
        self.bands, self.rows = cfg.layout
        self.params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm, cfg.minhash.hash_bits)
        self.threshold = cfg.verify_threshold
        self.method = cfg.verify.method
        self.st = StageLog()
        self.counts: dict = {}
        self.shards = io.discover(inputs, cfg.input.format)
        if out is None:  # in memory: nothing to prepare, nothing to resume
            self.ckpt = NoCheckpoints()
        else:
            _prepare_output(out, self.shards)
            self.ckpt = Checkpoints(out, run_fingerprint(cfg, self.shards), restart)
        self._strings = None
        self._norm = None
        self.index = None  # an Index to deduplicate against
        self.update_index = False
        self.index_out = None
        self.write_shards = True

    # ---- helpers ----------------------------------------------------------
    def _unit(self, unit: str, stages: tuple, compute):
        """Load checkpoint ``unit`` or run ``compute()`` (which times ``stages``) and save it."""
        if self.ckpt.has(unit):
            arrays, meta = self.ckpt.load(unit)
            for name, entry in meta["stages"].items():
                self.st.stages[name] = {**entry, "resumed": True}
            self.counts.update(meta["counts"])
            log.info("stage(s) %s: resumed from checkpoint", ", ".join(stages))
            return arrays
        arrays, counts = compute()
        self.counts.update(counts)
        self.ckpt.save(unit, arrays, {"stages": {n: self.st.stages[n] for n in stages}, "counts": counts})
        return arrays

    @property
    def strings(self):
        """Normalized texts as kernel buffers (computed on first use)."""
        if self._strings is None:
            with self.st.stage("normalize", len(self.corpus.text)) as info:
                repaired, invalid = repair_utf8(self.corpus.text)
                self._norm = normalize(repaired, self.cfg.normalize)
                self._strings = string_buffers(self._norm)
                info.update(invalid_utf8=invalid, text_mb=round(self._strings.nbytes / 2**20, 1))
            self.counts["invalid_utf8"] = invalid
        return self._strings

    # ---- stages -------------------------------------------------------------
    def read(self):
        cfg = self.cfg
        with self.st.stage("read", len(self.shards), "shards") as info:
            self.corpus = io.read(self.shards, cfg.input, cfg.select.score_column if cfg.select.keep == "score" else None,
                                  progress=info.progress.update)
            n = self.n = len(self.corpus)
            self.null = np.asarray(self.corpus.text.is_null(), dtype=bool) if n else np.zeros(0, bool)
            dup_ids = n - pa.compute.count_distinct(self.corpus.ids, mode="all").as_py() if n else 0
            info.update(documents=n, shards=len(self.corpus.shards), null_text=int(self.null.sum()),
                        duplicate_ids=dup_ids)
        if dup_ids:
            log.warning("%d rows repeat an id of another row in column %r; every row is still processed and "
                        "reported (duplicates.parquet also names shard and shard_row)", dup_ids, cfg.input.id_column)
        self.counts.update(documents_read=n, null_text=int(self.null.sum()), duplicate_ids=dup_ids)

    def exact(self):
        def compute():
            strings = self.strings if self.cfg.exact_dedup else None  # normalize is its own stage, not inside exact
            with self.st.stage("exact", self.n) as info:
                ranks = policy_ranks(self.corpus.table, self.cfg.select)
                if self.cfg.exact_dedup:
                    keys = exact_keys(strings, self.cfg.minhash.seed, self.backend)
                    rep = exact_groups(keys, ranks, eligible=~self.null)
                else:
                    rep = np.arange(self.n, dtype=np.int64)
                collapsed = int(np.count_nonzero(rep != np.arange(self.n)))
                info.update(exact_copies=collapsed)
            return {"rep": rep, "ranks": ranks}, {"exact_stage_collapsed": collapsed}

        a = self._unit("exact", ("exact",), compute)
        self.rep, self.ranks = a["rep"], a["ranks"]

    def signatures_and_bands(self):
        cfg = self.cfg

        def compute():
            cand = np.flatnonzero((self.rep == np.arange(self.n)) & ~self.null)
            strings = self.strings
            with self.st.stage("signatures", cand.shape[0]) as info:
                params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm, cfg.minhash.hash_bits)
                values = np.empty((cand.shape[0], cfg.signature_perms), params.signature_dtype)
                shingles = np.empty(cand.shape[0], np.int64)
                for lo, hi in chunks(cand.shape[0], SIGNATURE_CHUNK):  # a few dozen kernel calls
                    sig = signatures(strings, cfg.minhash, num_perm=cfg.signature_perms, docs=cand[lo:hi],
                                     backend=self.backend)
                    values[lo:hi], shingles[lo:hi] = sig.values, sig.shingles
                    info.progress.update(hi - lo)
                nonempty = shingles > 0
                info.update(documents=int(cand.shape[0]), permutations=cfg.signature_perms,
                            shingles=int(shingles.sum()), no_shingles=int((~nonempty).sum()))
            counts = {"minhash_documents": int(cand.shape[0]), "no_shingles": int((~nonempty).sum())}
            cand = cand[nonempty]
            values = values[nonempty]
            with self.st.stage("bands", cand.shape[0]) as info:
                bh = band_hashes(values, self.bands, self.rows, self.params, self.backend)
                info.update(bands=self.bands, rows=self.rows)
            arrays = {"cand": cand, "band_hashes": bh}
            if self.method != "exact":  # signature estimates need the values later
                arrays["signatures"] = values
            return arrays, counts

        a = self._unit("bands", ("signatures", "bands"), compute)
        self.cand, self.band_hashes = a["cand"], a["band_hashes"]
        self.sig_values = a.get("signatures")

    def buckets(self):
        def compute_buckets():
            with self.st.stage("buckets", self.band_hashes.size, "band hashes") as info:
                bk = buckets(self.band_hashes)
                info.update(buckets=len(bk), memberships=int(bk.members.shape[0]))
            return ({"band": bk.band, "hash": bk.hash, "offsets": bk.offsets, "members": bk.members},
                    {"candidate_buckets": len(bk), "bucket_memberships": int(bk.members.shape[0])})

        a = self._unit("buckets", ("buckets",), compute_buckets)
        self.bk = Buckets(a["band"], a["hash"], a["offsets"], a["members"])
        if not self.index_out:
            self.band_hashes = None  # the index keeps them

    def verify(self):
        """Star edges per bucket, verified, re-starred for lsh.star_rounds rounds (buckets.star_rounds)."""

        def compute():
            cand, method = self.cand, self.method
            rounds = self.cfg.lsh.star_rounds
            with self.st.stage("verify", int(self.bk.members.shape[0]), "pairs") as info:
                prog = info.progress
                if method == "exact":
                    strings = self.strings

                    def similarity(left, right):
                        return exact_similarity(cand[left], cand[right], strings, self.cfg.minhash, self.backend,
                                                progress=prog.update)
                else:
                    def similarity(left, right):
                        prog.update(left.shape[0])
                        return signature_similarity(left, right, self.sig_values, self.backend)

                local, scored, centres = star_rounds(self.bk, similarity, self.threshold, rounds,
                                                     keep_all=method == "none")
                v = Edges(cand[local.src], cand[local.dst], local.similarity)
                info.update(method=method, star_rounds=rounds, candidate_edges=scored, verified_edges=len(v))
            return ({"src": v.src, "dst": v.dst, "similarity": v.similarity, "centre_bucket": centres.bucket,
                     "centre_round": centres.round, "centre_doc": cand[centres.doc]},
                    {"candidate_edges": scored, "verified_edges": len(v)})

        a = self._unit("verify", ("verify",), compute)
        self.verified = Edges(a["src"], a["dst"], a["similarity"])
        self.centres = Centres(a["centre_bucket"], a["centre_round"], a["centre_doc"])  # rounds >= 1, for the index

    def components(self):
        def compute():
            with self.st.stage("components", len(self.verified), "edges") as info:
                labels = components(self.verified, self.n, self.backend)[self.rep]  # copies join their rep
                size = np.bincount(labels, minlength=self.n) if self.n else np.zeros(0, np.int64)
                info.update(clusters=int(np.count_nonzero(size > 1)))
            return {"labels": labels}, {"clusters": int(np.count_nonzero(size > 1))}

        self.labels = self._unit("components", ("components",), compute)["labels"]
        self.cluster_size = np.bincount(self.labels, minlength=self.n) if self.n else np.zeros(0, np.int64)

    def select(self):
        def compute():
            with self.st.stage("select", self.n) as info:
                labels = self.labels
                survivor = survivors(labels, self.ranks)
                extra = {}
                if self.cfg.select.split_chains:  # members below the threshold to their survivor leave
                    labels, survivor, ejected, rounds = split_chains(
                        labels, self.rep, self.ranks, self.verified.src, self.verified.dst,
                        lambda a, b: _pair_similarity(a, b, self.method, self.strings, self.cfg, self.cand,
                                                      self.sig_values, self.backend),
                        self.threshold, self.backend)
                    extra["chain_split_ejected"] = int(ejected.sum())
                    info.update(chain_split_ejected=int(ejected.sum()), chain_split_rounds=rounds)
                kept = survivor == np.arange(self.n)
                sim = _similarity_to_survivor(self.rep, survivor, kept, self.method, self.strings, self.cfg,
                                              self.cand, self.sig_values, self.backend) if self.n else np.ones(0)
                removed = ~kept
                near = removed & (self.rep != survivor)
                info.update(kept=int(kept.sum()), removed=int(removed.sum()))
            counts = {
                "exact_duplicates": int((removed & ~near).sum()),  # same normalized text as the survivor
                "near_duplicates": int(near.sum()),
                "removed": int(removed.sum()),
                "kept": int(kept.sum()),
                **extra,
            }
            return {"survivor": survivor, "kept": kept, "similarity": sim, "labels": labels}, counts

        a = self._unit("select", ("select",), compute)
        self.survivor, self.kept, self.similarity = a["survivor"], a["kept"], a["similarity"]
        self.labels = a["labels"]
        self.cluster_size = np.bincount(self.labels, minlength=self.n) if self.n else np.zeros(0, np.int64)
        self.counts["clusters"] = int(np.count_nonzero(self.cluster_size > 1))

    def write(self, duplicates=None):
        corpus, kept = self.corpus, self.kept
        with self.st.stage("write", len(corpus.shards), "shards") as info:
            if duplicates is None:
                member = self.cluster_size[self.labels] > 1 if self.n else np.zeros(0, bool)
                duplicates = _duplicates_table(corpus, member, kept, self.survivor, self.similarity, self.rep)
            starts = np.cumsum([0] + [s.rows for s in corpus.shards])
            written = 0
            for i, shard in enumerate(corpus.shards):  # one step per shard file
                keep = kept[starts[i] : starts[i + 1]]
                if self.write_shards and self.out is not None and not self.ckpt.marked(f"shard-{i}"):
                    io.write_shard(shard, keep, self.out, self.cfg.output.compression)
                    self.ckpt.mark(f"shard-{i}")
                    maybe_crash("write:first-shard")
                written += int(keep.sum())
                info.progress.update(1)
            if self.cfg.output.duplicates_table and self.out is not None:
                io.atomic_write_parquet(self.out / DUPLICATES_NAME, duplicates, self.cfg.output.compression)
            info.update(rows_written=written, duplicates_rows=duplicates.num_rows)
        if written != self.counts["kept"]:  # pragma: no cover - guarded by tests
            raise RuntimeError(f"accounting error: {written} rows written but {self.counts['kept']} kept")
        self.duplicates = duplicates

    def report(self, examples: bool = True) -> dict:
        near = ~self.kept & (self.rep != self.survivor)
        shown = None
        if examples:  # the largest clusters with sample texts (report.html shows them)
            table = self.corpus.table
            shown = largest_clusters(self.survivor, self.kept, self.rep, self.similarity, self.corpus.text,
                                     self.corpus.ids, np.asarray(table.column("shard")),
                                     np.asarray(table.column("shard_row")), [s.name for s in self.corpus.shards])
        report = build_report(
            cfg=self.cfg,
            backend=self.backend,
            shards=self.corpus.shards,
            counts=self.counts,
            stages=self.st.stages,
            bucket_sizes=self.bk.sizes,
            cluster_sizes=self.cluster_size[self.cluster_size > 1],
            removed_similarity=self.similarity[near],
            threshold=self.threshold,
            wall_seconds=time.perf_counter() - self.t_start,
            peak_rss_mb=peak_rss_mb(),
            largest_clusters=shown,
        )
        report["resumed_from_checkpoint"] = self.ckpt.resumed
        report["run_fingerprint"] = self.ckpt.fingerprint
        if self.index is not None:
            report["index"] = {"path": str(self.index.path), "documents_before": self.counts["index_documents"],
                               "updated": self.update_index, "documents_after": self.index.documents}
        if self.index_out:
            report["index_out"] = str(self.index_out)
        if self.out is None:
            return report
        write_report(self.out / REPORT_NAME, report)
        write_html(self.out / REPORT_HTML_NAME, report)
        maybe_crash("report:before-success")
        self.ckpt.remove()
        io.atomic_write_bytes(self.out / SUCCESS_NAME, f"{self.ckpt.fingerprint}\n".encode())
        return report

    def _write_index(self):
        """Persist every document of this run as a new index (see gpu_dedup.index)."""
        from .index import Index

        with self.st.stage("index", self.n) as info:
            self.strings  # normalized texts (recomputed after a resume)
            index = Index.create(self.index_out, self.cfg)
            full = None
            if self.sig_values is not None:
                full = np.zeros((self.n, self.sig_values.shape[1]), self.sig_values.dtype)
                full[self.cand] = self.sig_values
            c = self.centres
            index.append(ids=self.corpus.ids.combine_chunks(), kept=self.kept, survivor=self.survivor,
                         keys=exact_keys(self.strings, self.cfg.minhash.seed, self.backend), texts=self._norm,
                         band_docs=self.cand, band_hashes=self.band_hashes, signatures=full,
                         centres=(self.bk.band[c.bucket], self.bk.hash[c.bucket], c.round, c.doc))
            info.update(documents=index.documents, path=str(self.index_out))

    def _execute_against(self) -> RunResult:
        """Dedup the inputs against an index (no checkpoints); optionally append them to it."""
        from .index import dedup_against

        idx, n = self.index, self.n
        before = idx.documents
        with self.st.stage("exact", n):
            ranks = policy_ranks(self.corpus.table, self.cfg.select)
        self.strings  # normalize
        with self.st.stage("against_index", n) as info:
            res = dedup_against(idx, self._norm, self.null, ranks, self.cfg, self.backend)
            info.update(index_documents=before, index_nodes=int(res.index_docs.shape[0]),
                        verified_edges=len(res.verified), removed_against_index=res.counts["removed_against_index"])
        self.counts.update(res.counts)
        m = res.index_docs.shape[0]
        ids = self.corpus.ids.combine_chunks()
        if self.corpus.id_generated:  # generated ids continue the index's numbering
            ids = pa.array(np.arange(before, before + n, dtype=np.int64))
        in_index = res.survivor_node < m
        cluster = before + res.survivor_node - m  # doc number of the survivor in index + new numbering
        cluster[in_index] = idx.survivors(res.index_docs[res.survivor_node[in_index]])
        pos = res.survivor_node - m  # survivor's row among the new documents, or after them: its index id
        pos[in_index] = n + np.arange(int(in_index.sum()))
        survivor_ids = pa.concat_arrays([ids, idx.ids(cluster[in_index]).cast(ids.type)]).take(pa.array(pos))
        labels_new = np.bincount(res.labels, minlength=int(res.labels.max(initial=0)) + 1)[res.labels]
        member = ~res.kept | (labels_new > 1)
        idx_rows = np.flatnonzero(member)
        match = np.where(res.kept, "kept", np.where(res.rep == res.survivor_node, "exact", "near"))
        names = np.array([s.name for s in self.corpus.shards] or [""], dtype=object)
        shard = np.asarray(self.corpus.table.column("shard"))
        duplicates = pa.table({
            self.corpus.id_column or "id": ids.take(pa.array(idx_rows)),
            "cluster_id": pa.array(cluster[idx_rows], pa.int64()),
            "kept": pa.array(res.kept[idx_rows]),
            "similarity": pa.array(res.similarity[idx_rows].astype(np.float32)),
            "match": pa.array(match[idx_rows], pa.string()),
            "survivor_id": survivor_ids.take(pa.array(idx_rows)),
            "in_index": pa.array(in_index[idx_rows]),
            "shard": pa.array(names[shard[idx_rows]] if idx_rows.shape[0] else [], pa.string()),
            "shard_row": self.corpus.table.column("shard_row").take(pa.array(idx_rows)),
        })
        self.kept, self.similarity, self.rep, self.survivor = res.kept, res.similarity, res.rep, res.survivor_node
        self.cluster_size = np.bincount(res.labels, minlength=int(res.labels.max(initial=0)) + 1)
        self.labels = res.labels
        self.bk = Buckets(np.zeros(0, np.int32), np.zeros(0, np.uint64),
                          np.concatenate([[0], np.cumsum(res.bucket_sizes)]).astype(np.int64),
                          np.zeros(int(res.bucket_sizes.sum()), np.int64))
        self.write(duplicates)
        if self.update_index:
            with self.st.stage("index", n) as info:
                full = None
                if res.signatures is not None:
                    full = np.zeros((n, res.signatures.shape[1]), res.signatures.dtype)
                    full[res.band_rows] = res.signatures
                cb, ch, cr, crow = res.centres
                idx.append(ids=ids, kept=res.kept, survivor=cluster, keys=res.keys, texts=self._norm,
                           band_docs=before + res.band_rows, band_hashes=res.band_hashes, signatures=full,
                           centres=(cb, ch, cr, before + crow))
                info.update(documents=idx.documents)
        report = self.report(examples=False)  # survivors may be indexed documents, whose texts are not here
        c = self.counts
        log.info("done: read %d, kept %d, removed %d (%d against the index) in %.1fs", c["documents_read"],
                 c["kept"], c["removed"], c["removed_against_index"], report["wall_seconds"])
        node_doc = np.concatenate([res.index_docs, before + np.arange(n)])  # combined node -> index doc number
        edges = Edges(node_doc[res.verified.src], node_doc[res.verified.dst], res.verified.similarity)
        return RunResult(self.out, report, duplicates, res.kept, cluster, edges, self.corpus.shards)

    def execute(self) -> RunResult:
        self.read()
        if self.index is not None:
            return self._execute_against()
        self.exact()
        self.signatures_and_bands()
        self.buckets()
        self.verify()
        self.components()
        self.select()
        self.write()
        if self.index_out:
            self._write_index()
        report = self.report()
        c = self.counts
        log.info("done: read %d, kept %d, removed %d (%d exact, %d near) in %.1fs", c["documents_read"], c["kept"],
                 c["removed"], c["exact_duplicates"], c["near_duplicates"], report["wall_seconds"])
        return RunResult(self.out, report, self.duplicates, self.kept, self.survivor, self.verified,
                         self.corpus.shards)


def _similarity_to_survivor(rep, survivor, kept, method, strings, cfg, cand, sig_values, backend):
    """Similarity of each document to its cluster's survivor (1.0 for survivors and exact copies)."""
    n = rep.shape[0]
    sim = np.ones(n, np.float64)
    todo = np.flatnonzero(~kept & (rep != survivor))
    if todo.shape[0] == 0:
        return sim
    sim[todo] = _pair_similarity(rep[todo], survivor[todo], method, strings, cfg, cand, sig_values, backend)
    return sim


def _pair_similarity(left, right, method, strings, cfg, cand, sig_values, backend):
    """Similarity of representative rows ``left[k]`` and ``right[k]`` (exact Jaccard or signature estimate)."""
    if method == "exact":
        return exact_similarity(left, right, strings, cfg.minhash, backend)
    row_of = np.full(strings.offsets.shape[0] - 1, -1, np.int64)
    row_of[cand] = np.arange(cand.shape[0])
    return signature_similarity(row_of[left], row_of[right], sig_values, backend)


def _duplicates_table(corpus, member, kept, survivor, similarity, rep) -> pa.Table:
    return duplicates_table(corpus.ids, np.asarray(corpus.table.column("shard")),
                            np.asarray(corpus.table.column("shard_row")), [s.name for s in corpus.shards],
                            corpus.id_column, member, kept, survivor, similarity, rep)


def duplicates_table(ids, shard, shard_row, shard_names, id_column, member, kept, survivor, similarity,
                     rep) -> pa.Table:
    """Every member of a cluster with two or more documents, in row order."""
    idx = np.flatnonzero(member)
    take = pa.array(idx)
    match = np.where(kept[idx], "kept", np.where(rep[idx] == survivor[idx], "exact", "near"))
    names = np.array(shard_names or [""], dtype=object)
    return pa.table(
        {
            id_column or "id": ids.take(take),
            "cluster_id": pa.array(survivor[idx], pa.int64()),
            "kept": pa.array(kept[idx]),
            "similarity": pa.array(similarity[idx].astype(np.float32)),
            "match": pa.array(match, pa.string()),
            "survivor_id": ids.take(pa.array(survivor[idx])),
            "shard": pa.array(names[shard[idx]] if idx.shape[0] else [], pa.string()),
            "shard_row": pa.array(shard_row[idx], pa.int64()),
        }
    )
