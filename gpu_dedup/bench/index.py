"""Index benchmark: build an index of N documents, then time opening and querying it.

Reports index size on disk and open time per million documents, the latency
of single queries (median and p95 over one-at-a-time calls) and the
throughput of one batch of queries.  Half of the queries are edited copies of
indexed documents, half are new texts.
"""

from __future__ import annotations

import datetime as _dt
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from gpu_dedup.bench import machine, scratch, write_results
from gpu_dedup.evaluation.sample import planted_corpus, write_shards

_OPEN_AND_QUERY = r"""
import json, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
t0 = time.perf_counter()
from gpu_dedup.index.store import Index
t_import = time.perf_counter() - t0
t0 = time.perf_counter(); index = Index.open(sys.argv[1]); t_open = time.perf_counter() - t0
queries = pq.read_table(sys.argv[2]).column("text").combine_chunks()
single = int(sys.argv[3])
t0 = time.perf_counter(); index.query(queries.slice(0, 1)); t_first = time.perf_counter() - t0
lat = []
for i in range(1, single + 1):  # one query per call: the latency a service would see
    t0 = time.perf_counter(); r = index.query(queries.slice(i, 1)); lat.append(time.perf_counter() - t0)
t0 = time.perf_counter(); batch = index.query(queries); t_batch = time.perf_counter() - t0
print(json.dumps({"import_s": t_import, "open_s": t_open, "first_query_s": t_first,
                  "latency_ms": [x * 1000 for x in lat], "batch_s": t_batch, "batch_queries": len(queries),
                  "batch_matches": batch.num_rows, "queries_with_match": len(set(batch.column("query").to_pylist()))}))
"""


def bench_index(documents: int = 1_000_000, queries: int = 10_000, single: int = 200, results="bench-results",
                workdir=None) -> dict:
    with scratch(workdir) as tmp:
        tmp = Path(tmp)
        sample = planted_corpus(n_docs=documents + queries // 2, n_clusters=documents // 100, words=(60, 400),
                                edit_rate=(0.0, 0.05), seed=31)
        table = sample.table.select(["id", "text"])
        write_shards(table.slice(0, documents), tmp / "corpus", shards=max(1, documents // 100_000))
        # queries: edited copies of indexed documents (drawn from planted variants) and unseen texts
        rng = np.random.default_rng(0)
        seen = table.slice(0, documents).take(pa.array(rng.choice(documents, queries - queries // 2, replace=False)))
        unseen = table.slice(documents, queries // 2)
        qtable = pa.concat_tables([seen, unseen])
        import pyarrow.parquet as pq

        pq.write_table(qtable.take(pa.array(rng.permutation(qtable.num_rows))), tmp / "queries.parquet")
        del sample, table
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "index", "build", str(tmp / "corpus"), "-o",
                               str(tmp / "index"), "--id-column", "id", "--backend", "cpu", "-q"],
                              capture_output=True, text=True)
        build_s = time.perf_counter() - t0
        if proc.returncode:
            raise RuntimeError(proc.stderr[-2000:])
        size = sum(f.stat().st_size for f in (tmp / "index").rglob("*") if f.is_file())
        out = subprocess.run([sys.executable, "-c", _OPEN_AND_QUERY, str(tmp / "index"), str(tmp / "queries.parquet"),
                              str(single)], capture_output=True, text=True)
        if out.returncode:
            raise RuntimeError(out.stderr[-2000:])
        m = json.loads(out.stdout.strip().splitlines()[-1])
    lat = np.array(m["latency_ms"])
    per_m = 1_000_000 / documents
    row = {
        "documents": documents, "build_s": round(build_s, 2), "size_mb": round(size / 2**20, 1),
        "size_mb_per_million": round(size / 2**20 * per_m, 1), "open_s": round(m["open_s"], 4),
        "open_s_per_million": round(m["open_s"] * per_m, 4), "first_query_s": round(m["first_query_s"], 3),
        "single_query_ms_median": round(float(np.median(lat)), 2), "single_query_ms_p95": round(float(np.percentile(lat, 95)), 2),
        "batch_queries": m["batch_queries"], "batch_s": round(m["batch_s"], 2),
        "batch_queries_per_s": round(m["batch_queries"] / m["batch_s"], 1),
        "batch_queries_with_match": m["queries_with_match"],
    }
    print(json.dumps(row, indent=2))
    payload = {"benchmark": "index", "date": _dt.date.today().isoformat(), "machine": machine(), "result": row}
    md = "\n".join([
        "| documents | build s | size on disk | size / 1M docs | open s | first query s | single query ms (median / p95) | "
        "batch of queries | batch queries/s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
        f"| {documents:,} | {row['build_s']} | {row['size_mb']} MiB | {row['size_mb_per_million']} MiB | {row['open_s']} | "
        f"{row['first_query_s']} | {row['single_query_ms_median']} / {row['single_query_ms_p95']} | "
        f"{row['batch_queries']:,} ({row['batch_queries_with_match']:,} matched) | {row['batch_queries_per_s']} |",
        "", f"Machine: {payload['machine']}, {payload['date']}. Half the queries are indexed documents (their own "
        "copies), half are unseen texts.", ""])
    write_results(results, "index", payload, md)
    return payload
