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
from gpu_dedup.evaluation.evaluate import cluster_pairs, pair_precision, pair_recall
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.report.build import summary
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.verify import exact_similarity

DEMO_SEED = 2026


def make_sample(directory: Path, docs: int = 3000, shards: int = 4):
    """Write the demo sample; returns the PlantedCorpus."""
    sample = planted_corpus(n_docs=docs, n_clusters=max(docs // 20, 1), cluster_size=(2, 6), words=(60, 400),
                            edit_rate=(0.0, 0.05), seed=DEMO_SEED)
    write_shards(sample.table.select(["id", "text"]), directory / "input", shards=shards)
    pq.write_table(sample.table.select(["id", "cluster", "variant_of"]), directory / "planted_truth.parquet")
    return sample


def run_demo(out: Path, cfg: Config, docs: int = 3000, quiet: bool = False) -> int:
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
