"""Skew benchmark: 10% of the corpus one boilerplate text, 10% empty documents.

Times the whole pipeline at several sizes (each in its own process, so peak
memory is per size) with exact dedup on and off, and fits the growth exponent
of wall time against the number of documents (1.0 = linear).
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

from gpu_dedup.bench import (
    growth_exponent,
    machine,
    run_cli_job,
    scratch,
    write_results,
)
from gpu_dedup.evaluation.sample import planted_corpus, write_shards


def corpus(n: int, directory: Path, seed: int = 0) -> Path:
    sample = planted_corpus(n_docs=n, n_clusters=n // 50, words=(30, 120), edit_rate=(0.0, 0.05), seed=seed,
                            boilerplate_fraction=0.1, boilerplate_identical=True, empty_fraction=0.1)
    write_shards(sample.table.select(["id", "text"]), directory, shards=max(1, n // 100_000))
    return directory


def bench_skew(sizes=(10_000, 100_000, 1_000_000), results="bench-results", workdir=None) -> dict:
    rows = []
    with scratch(workdir) as tmp:
        for n in sizes:
            inp = corpus(n, Path(tmp) / f"in-{n}")
            for exact in (True, False):
                rep = run_cli_job(inp, Path(tmp) / f"out-{n}-{exact}",
                                  ["--backend", "cpu", "--id-column", "id", "--set", f"exact_dedup={str(exact).lower()}"])
                c = rep["counts"]
                rows.append({
                    "documents": n, "exact_dedup": exact, "wall_seconds": rep["wall_seconds"],
                    "peak_rss_mb": rep["peak_rss_mb"], "candidate_edges": c["candidate_edges"],
                    "removed": c["removed"], "largest_bucket": _largest(rep["histograms"]["bucket_sizes"]),
                    "stages": {k: v["seconds"] for k, v in rep["stages"].items()},
                })
                print(f"{n:>10,} docs exact_dedup={exact!s:5} {rep['wall_seconds']:8.2f} s "
                      f"{rep['peak_rss_mb']:8.0f} MiB  edges {c['candidate_edges']:,}  removed {c['removed']:,}")
    exps = {}
    for exact in (True, False):
        sel = [r for r in rows if r["exact_dedup"] == exact]
        if len(sel) > 1:
            sizes_, secs = [r["documents"] for r in sel], [r["wall_seconds"] for r in sel]
            exps[f"exact_dedup={exact}"] = {
                "all_sizes": round(growth_exponent(sizes_, secs), 3),
                "largest_two": round(growth_exponent(sizes_[-2:], secs[-2:]), 3),
            }
            print(f"growth exponent of wall time (exact_dedup={exact}): {exps[f'exact_dedup={exact}']} "
                  "(1.0 = linear; small sizes carry ~1 s of process start)")
    payload = {"benchmark": "skew", "date": _dt.date.today().isoformat(), "machine": machine(), "rows": rows,
               "growth_exponent": exps}
    md = ["| documents | exact dedup | wall s | peak RSS MiB | candidate edges | largest bucket | removed |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    md += [f"| {r['documents']:,} | {r['exact_dedup']} | {r['wall_seconds']:.2f} | {r['peak_rss_mb']:.0f} | "
           f"{r['candidate_edges']:,} | {r['largest_bucket']} | {r['removed']:,} |" for r in rows]
    md.append("")
    md.append(f"Growth exponent of wall time vs documents: {exps} (1.0 = linear; the smallest size is dominated "
              f"by ~1 s of process start). Machine: {payload['machine']}, {payload['date']}.")
    write_results(results, "skew", payload, "\n".join(md) + "\n")
    return payload


def _largest(hist: dict) -> str:
    return max(hist, key=lambda k: int(k.split("-")[-1])) if hist else "-"
