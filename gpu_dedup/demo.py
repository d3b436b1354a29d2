"""``gpu-dedup demo``: generate the planted-cluster sample, deduplicate it, score it.

The sample is generated deterministically (nothing is downloaded): Parquet
shards with a string ``id`` and a ``text`` column, plus the planted truth in
``planted_truth.parquet`` beside them (the pipeline never reads it).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, OutputError
from gpu_dedup.evaluation.evaluate import cluster_pairs, pair_precision, pair_recall
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.report.build import summary
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.verify import exact_similarity
from gpu_dedup.storage import atomic_write_parquet

DEMO_SEED = 2026


MIN_DOCS = 20  # one planted cluster per 20 documents
DEMO_MARK = b"gpu_dedup_demo"  # Parquet schema metadata key of the files the demo writes (what it may overwrite)
SHARD_NAME = "part-{:05d}.parquet"
TRUTH_NAME = "planted_truth.parquet"


def make_sample(directory: Path, docs: int = 3000, shards: int = 4):
    """Write the demo sample (each file whole or not at all, marked as the demo's); returns the PlantedCorpus."""
    sample = planted_corpus(n_docs=docs, n_clusters=max(docs // 20, 1), cluster_size=(2, 6), words=(60, 400),
                            edit_rate=(0.0, 0.05), seed=DEMO_SEED)
    mark = {DEMO_MARK: str(DEMO_SEED).encode()}
    table = sample.table.select(["id", "text"]).replace_schema_metadata(mark)
    (directory / "input").mkdir(parents=True, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, shards + 1).astype(int)
    for i in range(shards):
        part = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        atomic_write_parquet(directory / "input" / SHARD_NAME.format(i), part)
    truth = sample.table.select(["id", "cluster", "variant_of"]).replace_schema_metadata(mark)
    atomic_write_parquet(directory / TRUTH_NAME, truth)
    return sample


def _ours(path: Path) -> bool:
    """Whether ``path`` is a Parquet file the demo wrote (its schema carries the demo's mark)."""
    try:
        return DEMO_MARK in (pq.read_schema(path).metadata or {})
    except Exception:  # not Parquet, unreadable, a directory: not the demo's
        return False


def check_demo_dir(out: Path) -> None:
    """Refuse (exit 4, before anything is written) an ``-o`` the demo would write over or read from wrongly: a file,
    or a directory whose ``input/`` or ``planted_truth.parquet`` holds anything the demo did not write (the run
    reads every shard in ``input/``, and the demo rewrites its files there)."""
    import os

    fix = "choose another -o (a new directory) or move it away"
    if os.path.lexists(out) and not out.is_dir():
        raise OutputError(f"demo output {str(out)!r} exists and is not a directory; -o names the demo's directory: "
                          f"{fix}")
    truth = out / TRUTH_NAME
    if os.path.lexists(truth) and not _ours(truth):
        raise OutputError(f"{str(truth)!r} was not written by the demo; it is not overwritten: {fix}")
    inp = out / "input"
    if os.path.lexists(inp) and not inp.is_dir():
        raise OutputError(f"{str(inp)!r} exists and is not a directory (the demo writes its shards there): {fix}")
    if inp.is_dir():
        for entry in sorted(inp.iterdir()):
            if not _ours(entry):
                raise OutputError(f"{str(entry)!r} was not written by the demo, which writes its shards in "
                                  f"{str(inp)!r} and deduplicates everything there: {fix}")


def run_demo(out: Path, cfg: Config, docs: int = 3000, quiet: bool = False) -> int:
    if docs < MIN_DOCS:
        raise ConfigError(f"--docs {docs} is too few: the demo plants one near-duplicate cluster per {MIN_DOCS} "
                          f"documents; give --docs {MIN_DOCS} or more (default 3000)")
    check_demo_dir(out)
    sample = make_sample(out, docs)
    if cfg.input.id_column is None:
        cfg = cfg.with_overrides({"input.id_column": "id"})
    n_clusters = int(sample.clusters.max()) + 1
    say = (lambda *a: None) if quiet else print
    say(f"gpu-dedup demo: {docs:,} documents with {n_clusters} planted near-duplicate clusters "
        f"-> {out / 'input'}/ (4 Parquet shards)")
    result = run_dedup(out / "input", out / "output", cfg)
    say(summary(result.report))

    # score against the planted truth: exact Jaccard of every planted pair
    strings = string_buffers(normalize(sample.table.column("text"), cfg.normalize))
    left, right = cluster_pairs(sample.clusters, ignore=-1)
    jac = exact_similarity(left, right, strings, cfg.minhash)
    t = cfg.verify_threshold
    pred = result.cluster
    kept = result.kept
    for lo in (t, min(t + 0.1, 1.0)):
        sel = jac >= lo
        both = int((kept[left[sel]] & kept[right[sel]]).sum())
        say(f"planted pairs with Jaccard >= {lo:.2f}: {int(sel.sum()):,}; not both kept: "
            f"{_rate(int(sel.sum()) - both, int(sel.sum())):.4f} (recall; {both:,} left in the output); "
            f"in one cluster: {pair_recall(pred, left[sel], right[sel]):.4f}")
    below = jac < t
    say(f"planted pairs below the threshold (edits too heavy for {cfg.minhash.shingle} {cfg.minhash.ngram}-grams): "
        f"{int(below.sum()):,}")
    say(f"found pairs inside one planted cluster: {pair_precision(pred, sample.clusters, ignore=-1):.4f} "
        "(precision against the planted truth)")
    if not quiet:
        _show_examples(result, sample)
    say(f"outputs in {out / 'output'}/: deduplicated shards, duplicates.parquet, report.json, report.html")
    return 0


def _rate(hits: int, total: int) -> float:
    return hits / total if total else 1.0


def _show_examples(result, sample, k: int = 2) -> None:
    dup = result.duplicates
    near = dup.filter(pa.compute.equal(dup.column("match"), "near"))
    if near.num_rows == 0:
        return
    text = sample.table.column("text")
    ids = np.asarray(sample.table.column("id").to_numpy(zero_copy_only=False))
    print("examples (removed near duplicate <- survivor):")
    for rec in near.slice(0, k).to_pylist():
        member = text[int(np.flatnonzero(ids == rec["id"])[0])].as_py()
        surv = text[int(np.flatnonzero(ids == rec["survivor_id"])[0])].as_py()
        print(f"  {rec['id']} (similarity {rec['similarity']:.2f} to {rec['survivor_id']})")
        print(f"    removed : {member[:110]}...")
        print(f"    survivor: {surv[:110]}...")
