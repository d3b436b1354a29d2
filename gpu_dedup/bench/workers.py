"""Scale-out benchmark: one process vs N Dask workers on the same corpus.

Each configuration runs as ``gpu-dedup run`` in a child process; outputs must
be byte-identical to the single-process run.  ``--memory-limit`` runs the
workers under a per-worker memory limit (Dask spills beyond it), to show a
corpus larger than one worker's memory completes.
"""

from __future__ import annotations

import datetime as _dt
import filecmp
import tempfile
import time
from pathlib import Path

from gpu_dedup.bench import machine, run_cli_job, write_results
from gpu_dedup.evaluation.sample import planted_corpus, write_shards


def make_corpus(directory: Path, documents: int, chunk: int = 500_000, words=(60, 400),
                row_group_rows: int | None = None) -> int:
    """Planted corpus written in chunks (bounded generator memory); returns text bytes."""
    import pyarrow.compute as pc

    total, part = 0, 0
    for lo in range(0, documents, chunk):  # one generator call per chunk of documents
        n = min(chunk, documents - lo)
        s = planted_corpus(n_docs=n, n_clusters=n // 50, words=words, edit_rate=(0.0, 0.05), seed=100 + part)
        table = s.table.select(["id", "text"])
        table = table.set_column(0, "id", pc.binary_join_element_wise(f"c{part}-", table.column("id"), ""))
        write_shards(table, directory, shards=max(1, n // 100_000), prefix=f"part{part:03d}",
                     row_group_rows=row_group_rows)
        total += pc.sum(pc.binary_length(table.column("text"))).as_py()
        part += 1
    return total


def run(documents: int = 200_000, workers=(1, 2), memory_limit: str | None = None, block_rows: int = 100_000,
        results="bench-results", workdir=None) -> dict:
    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        # row groups no larger than a block: a block holds whole row groups
        text_bytes = make_corpus(tmp / "in", documents, row_group_rows=block_rows)
        base = ["--backend", "cpu", "--id-column", "id", "--set", f"cluster.block_rows={block_rows}"]
        configs = [("1 process", [])] + [(f"{w} workers", ["--workers", str(w)]) for w in workers]
        if memory_limit:
            configs = [(f"{w} workers x {memory_limit}", ["--workers", str(w), "--set",
                                                          f"cluster.memory_limit={memory_limit}"]) for w in workers]
        first = None
        for name, extra in configs:
            out = tmp / f"out-{len(rows)}"
            t0 = time.perf_counter()
            rep = run_cli_job(tmp / "in", out, base + extra)
            wall = time.perf_counter() - t0
            names = sorted(p.name for p in out.iterdir() if p.suffix == ".parquet")
            same = None
            if first is None:
                first = out
            else:
                same = all(filecmp.cmp(first / n, out / n, shallow=False) for n in names)
            cluster = rep.get("cluster", {})
            rows.append({
                "config": name, "wall_seconds": round(wall, 2), "pipeline_seconds": rep["wall_seconds"],
                "client_peak_rss_mb": rep["peak_rss_mb"],
                "worker_peak_rss_mb": max(cluster.get("worker_peak_rss_mb", {}).values(), default=None),
                "shuffle_mb": cluster.get("shuffle_mb"), "removed": rep["counts"]["removed"],
                "identical_to_first": same,
            })
            print(rows[-1], flush=True)
    payload = {"benchmark": "workers", "date": _dt.date.today().isoformat(), "machine": machine(),
               "documents": documents, "text_mb": round(text_bytes / 2**20, 1), "rows": rows}
    md = [f"{documents:,} planted documents, {payload['text_mb']:,} MiB of text; machine {payload['machine']}, "
          f"{payload['date']}.", "",
          "| configuration | wall s | client peak MiB | max worker peak MiB | shuffle MiB | removed | identical outputs |",
          "| --- | --- | --- | --- | --- | --- | --- |"]
    md += [f"| {r['config']} | {r['wall_seconds']} | {r['client_peak_rss_mb']:.0f} | {r['worker_peak_rss_mb'] or '-'} | "
           f"{r['shuffle_mb'] or '-'} | {r['removed']:,} | {'-' if r['identical_to_first'] is None else r['identical_to_first']} |"
           for r in rows]
    name = "workers-memory" if memory_limit else "workers"
    write_results(results, name, payload, "\n".join(md) + "\n")
    return payload
