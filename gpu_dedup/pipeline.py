"""The pipeline: read -> normalize -> exact -> signatures -> bands -> buckets ->
edges -> verify -> components -> select -> write -> report.

Every stage is a plain function (see the modules named after them); ``run``
chains them, times them and accounts for every input row: each row is either
kept (written to its deduplicated shard) or removed (listed in
``duplicates.parquet`` with ``kept = false``).  ``report.json`` is written
last and is the run's completion marker: it is deleted when a run starts.
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
from .buckets import Edges, buckets, edges
from .components import components
from .config import Config
from .errors import InputError
from .exact import exact_groups, exact_keys
from .hashing import hash_params
from .lsh import band_hashes
from .minhash import signatures
from .normalize import normalize, repair_utf8
from .report import build_report, write_report
from .select import policy_ranks, split_chains, survivors
from .strings import string_buffers
from .verify import exact_similarity, signature_similarity, verify

log = logging.getLogger("gpu_dedup")

REPORT_NAME = "report.json"
DUPLICATES_NAME = "duplicates.parquet"


def rss_mb() -> float:
    """Current resident memory of this process in MiB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - non-Linux
        return float("nan")


def peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


@dataclass
class StageLog:
    stages: dict = field(default_factory=dict)

    @contextmanager
    def stage(self, name: str):
        t0 = time.perf_counter()
        info: dict = {}
        log.info("stage %s ...", name)
        yield info
        seconds = time.perf_counter() - t0
        self.stages[name] = {"seconds": round(seconds, 4), "rss_mb": round(rss_mb(), 1), **info}
        details = " ".join(f"{k}={v}" for k, v in info.items())
        log.info("stage %s done in %.2fs %s", name, seconds, details)


@dataclass
class RunResult:
    output_dir: Path
    report: dict
    duplicates: pa.Table  # every document of a cluster with two or more members
    kept: np.ndarray  # bool per input row (global row order)
    cluster: np.ndarray  # cluster id (survivor's row) per input row
    edges: Edges  # verified edges between input rows, with their similarity
    shards: list = field(default_factory=list)


def _prepare_output(out: Path, shards) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for shard in shards:
        target = (out / shard.name).resolve()
        if target == Path(shard.path).resolve():
            raise InputError(
                f"output {str(target)!r} would overwrite input shard {shard.path!r}; choose another output directory"
            )
    marker = out / REPORT_NAME
    if marker.exists():  # the previous run's completion marker must not vouch for this one
        marker.unlink()


def run(inputs, output_dir, cfg: Config = Config()) -> RunResult:
    """Deduplicate the shards ``inputs`` into ``output_dir``; see the module docstring."""
    t_start = time.perf_counter()
    out = Path(output_dir)
    backend = get_backend(cfg.backend)
    bands, rows = cfg.layout
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm, cfg.minhash.hash_bits)
    threshold = cfg.verify_threshold
    method = cfg.verify.method
    st = StageLog()
    counts: dict = {}

    with st.stage("read") as info:
        shards = io.discover(inputs, cfg.input.format)
        _prepare_output(out, shards)
        corpus = io.read(shards, cfg.input, cfg.select.score_column if cfg.select.keep == "score" else None)
        n = len(corpus)
        null = np.asarray(corpus.text.is_null(), dtype=bool) if n else np.zeros(0, bool)
        info.update(documents=n, shards=len(corpus.shards), null_text=int(null.sum()))
    counts.update(documents_read=n, null_text=int(null.sum()))

    with st.stage("normalize") as info:
        repaired, invalid = repair_utf8(corpus.text)
        norm = normalize(repaired, cfg.normalize)
        strings = string_buffers(norm)
        info.update(invalid_utf8=invalid, text_mb=round(strings.nbytes / 2**20, 1))
    counts["invalid_utf8"] = invalid

    with st.stage("exact") as info:
        ranks = policy_ranks(corpus.table, cfg.select)
        if cfg.exact_dedup:
            rep = exact_groups(exact_keys(strings, cfg.minhash.seed, backend), ranks, eligible=~null)
        else:
            rep = np.arange(n, dtype=np.int64)
        exact_copies = int(np.count_nonzero(rep != np.arange(n)))
        info.update(exact_copies=exact_copies)
    counts["exact_stage_collapsed"] = exact_copies

    cand = np.flatnonzero((rep == np.arange(n)) & ~null)
    with st.stage("signatures") as info:
        sig = signatures(strings, cfg.minhash, num_perm=cfg.signature_perms, docs=cand, backend=backend)
        nonempty = sig.shingles > 0
        info.update(documents=int(cand.shape[0]), permutations=cfg.signature_perms,
                    shingles=int(sig.shingles.sum()), no_shingles=int((~nonempty).sum()))
    counts.update(minhash_documents=int(cand.shape[0]), no_shingles=int((~nonempty).sum()))
    cand = cand[nonempty]
    sig_values = sig.values[nonempty]
    del sig

    with st.stage("bands") as info:
        bh = band_hashes(sig_values, bands, rows, params, backend)
        info.update(bands=bands, rows=rows)
        if method == "exact":
            sig_values = None  # not needed any more: exact verification reads the texts

    with st.stage("buckets") as info:
        bk = buckets(bh)
        del bh
        info.update(buckets=len(bk), memberships=int(bk.members.shape[0]))
    counts.update(candidate_buckets=len(bk), bucket_memberships=int(bk.members.shape[0]))

    with st.stage("edges") as info:
        cand_edges = edges(bk)
        info.update(edges=len(cand_edges))
    counts["candidate_edges"] = len(cand_edges)

    with st.stage("verify") as info:
        if method == "exact":
            verified = verify(Edges(cand[cand_edges.src], cand[cand_edges.dst]), threshold, method,
                              texts=strings, cfg=cfg.minhash, backend=backend)
        else:
            local = verify(cand_edges, threshold, method, signatures=sig_values, backend=backend)
            verified = Edges(cand[local.src], cand[local.dst], local.similarity)
        info.update(method=method, verified_edges=len(verified))
    counts["verified_edges"] = len(verified)

    with st.stage("components") as info:
        labels = components(verified, n, backend)[rep]  # exact copies join their representative
        cluster_size = np.bincount(labels, minlength=n) if n else np.zeros(0, np.int64)
        info.update(clusters=int(np.count_nonzero(cluster_size > 1)))

    with st.stage("select") as info:
        survivor = survivors(labels, ranks)
        if cfg.select.split_chains:  # members below the threshold to their survivor leave the cluster
            labels, survivor, ejected, rounds = split_chains(
                labels, rep, ranks, verified.src, verified.dst,
                lambda a, b: _pair_similarity(a, b, method, strings, cfg, cand, sig_values, backend),
                threshold, backend)
            cluster_size = np.bincount(labels, minlength=n) if n else np.zeros(0, np.int64)
            counts["chain_split_ejected"] = int(ejected.sum())
            info.update(chain_split_ejected=int(ejected.sum()), chain_split_rounds=rounds)
        kept = survivor == np.arange(n)
        similarity = _similarity_to_survivor(rep, survivor, kept, method, strings, cfg, cand, sig_values, backend)
        member = cluster_size[labels] > 1 if n else np.zeros(0, bool)
        removed = ~kept
        near = removed & (rep != survivor)
        info.update(kept=int(kept.sum()), removed=int(removed.sum()))
    counts.update(
        clusters=int(np.count_nonzero(cluster_size > 1)),
        exact_duplicates=int((removed & ~near).sum()),  # same normalized text as the survivor
        near_duplicates=int(near.sum()),
        removed=int(removed.sum()),
        kept=int(kept.sum()),
    )

    with st.stage("write") as info:
        duplicates = _duplicates_table(corpus, member, kept, survivor, similarity, rep)
        starts = np.cumsum([0] + [s.rows for s in corpus.shards])
        written = 0
        for i, shard in enumerate(corpus.shards):  # one step per shard file
            written += io.write_shard(shard, kept[starts[i] : starts[i + 1]], out, cfg.output.compression)
        if cfg.output.duplicates_table:
            io.atomic_write_parquet(out / DUPLICATES_NAME, duplicates, cfg.output.compression)
        info.update(rows_written=written, duplicates_rows=duplicates.num_rows)
    if written != counts["kept"]:  # pragma: no cover - guarded by tests
        raise RuntimeError(f"accounting error: {written} rows written but {counts['kept']} kept")

    report = build_report(
        cfg=cfg,
        backend=backend,
        shards=corpus.shards,
        counts=counts,
        stages=st.stages,
        bucket_sizes=bk.sizes,
        cluster_sizes=cluster_size[cluster_size > 1],
        removed_similarity=similarity[near],
        threshold=threshold,
        wall_seconds=time.perf_counter() - t_start,
        peak_rss_mb=peak_rss_mb(),
    )
    write_report(out / REPORT_NAME, report)
    log.info("done: read %d, kept %d, removed %d (%d exact, %d near) in %.1fs", n, counts["kept"],
             counts["removed"], counts["exact_duplicates"], counts["near_duplicates"], report["wall_seconds"])
    return RunResult(out, report, duplicates, kept, survivor, verified, corpus.shards)


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
    idx = np.flatnonzero(member)
    ids = corpus.ids.take(pa.array(idx))
    match = np.where(kept[idx], "kept", np.where(rep[idx] == survivor[idx], "exact", "near"))
    shard_names = np.array([s.name for s in corpus.shards] or [""], dtype=object)
    table = corpus.table
    shard_idx = np.asarray(table.column("shard").take(pa.array(idx))) if idx.shape[0] else np.zeros(0, np.int32)
    return pa.table(
        {
            corpus.id_column or "id": ids,
            "cluster_id": pa.array(survivor[idx], pa.int64()),
            "kept": pa.array(kept[idx]),
            "similarity": pa.array(similarity[idx].astype(np.float32)),
            "match": pa.array(match, pa.string()),
            "survivor_id": corpus.ids.take(pa.array(survivor[idx])),
            "shard": pa.array(shard_names[shard_idx] if idx.shape[0] else [], pa.string()),
            "shard_row": table.column("shard_row").take(pa.array(idx)),
        }
    )
