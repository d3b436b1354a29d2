"""Scale-out benchmark: how the client, the workers and the wall time grow with the corpus on Dask.

For each corpus size (planted near duplicates; ``--boilerplate`` adds a variant
where a share of the documents are copies and near copies of a few boilerplate
texts, the buckets real crawls are full of) it runs ``gpu-dedup run`` with N
local Dask workers in a child process, and once in one process, and reports
the client's peak RSS (the driver process: it must stay flat as the corpus
grows), each worker's peak, the rows and bytes the shuffles moved and the wall
time.  Outputs must be byte-identical to the one-process run.  ``--memory-limit``
runs the workers under a per-worker memory limit (Dask spills beyond it).

A third configuration joins a cluster of as many workers (``--scheduler``) that
the benchmark started, and loaded the kernels on, before the clock started, as
a run on a deployed cluster does: its wall time leaves out the start and close
of a local cluster and the workers' first loading of the kernels, which
``--workers`` pays on every run.  The cluster closes after the run, so no idle
worker runs beside the other configurations.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import filecmp
import shutil
import time
from pathlib import Path

import numpy as np

from gpu_dedup.bench import machine, run_cli_job, scratch, write_results
from gpu_dedup.config import ClusterConfig, Config
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.cluster.connection import local_cluster, worker_threads
from gpu_dedup.run.cluster.executor import prepare_worker


def make_corpus(directory: Path, documents: int, chunk: int = 500_000, words=(30, 120),
                row_group_rows: int | None = None, boilerplate: float = 0.0) -> int:
    """Planted corpus written in chunks (bounded generator memory); returns text bytes.  ``boilerplate``: that
    share of each chunk's documents replaced by one of 20 boilerplate texts, exact or with a word changed."""
    import pyarrow as pa
    import pyarrow.compute as pc

    total, part = 0, 0
    for lo in range(0, documents, chunk):  # one generator call per chunk of documents
        n = min(chunk, documents - lo)
        s = planted_corpus(n_docs=n, n_clusters=max(1, n // 50), words=words, edit_rate=(0.0, 0.05),
                           seed=100 + part)
        table = s.table.select(["id", "text"])
        table = table.set_column(0, "id", pc.binary_join_element_wise(f"c{part}-", table.column("id"), ""))
        if boilerplate:
            rng = np.random.default_rng(7 + part)
            pick = np.flatnonzero(rng.random(n) < boilerplate)
            base = [" ".join(f"boiler{k}word{j}" for j in range(80)) for k in range(20)]
            texts = np.array(table.column("text").to_pylist(), dtype=object)
            which = rng.integers(0, 20, pick.shape[0])
            edit = rng.random(pick.shape[0]) < 0.5
            texts[pick] = [base[w] + (f" edit{i}" if e else "") for i, w, e in zip(pick, which, edit)]
            table = table.set_column(1, "text", pa.array(texts, pa.large_string()))
        write_shards(table, directory, shards=max(1, n // 100_000), prefix=f"part{part:03d}",
                     row_group_rows=row_group_rows)
        total += pc.sum(pc.binary_length(table.column("text"))).as_py()
        part += 1
    return total


def bench_workers(documents=(100_000,), workers: int = 2, memory_limit: str | None = None,
                  block_rows: int = ClusterConfig.block_rows,
                  results="bench-results", workdir=None, boilerplate: float = 0.0, single_up_to: int = 1_000_000,
                  running: bool = True, repeat: int = 1) -> dict:
    """``documents``: corpus sizes; one process runs for sizes up to ``single_up_to`` (the reference);
    ``running``: also a run joining a cluster started before it (see the module docstring); ``repeat``: runs of
    each configuration, one of each in turn (the machine's drift hits them alike), reported by their median."""
    if repeat < 1:
        raise ValueError(f"repeat = {repeat} must be >= 1")
    rows = []
    variants = [("planted", 0.0)] + ([("boilerplate", boilerplate)] if boilerplate else [])
    for n in documents:
        for variant, share in variants:
            with scratch(workdir) as tmp:
                tmp = Path(tmp)
                # row groups no larger than a block: a block holds whole row groups
                text_bytes = make_corpus(tmp / "in", n, row_group_rows=block_rows, boilerplate=share)
                base = ["--backend", "cpu", "--id-column", "id", "--no-shards", "--set",
                        f"cluster.block_rows={block_rows}"]
                dask = ["--workers", str(workers)] + (["--set", f"cluster.memory_limit={memory_limit}"]
                                                      if memory_limit else [])
                configs = [(f"{workers} workers", dask)] + ([(f"{workers} workers, running", [])] if running else [])
                if n <= single_up_to:
                    configs.insert(0, ("1 process", []))
                runs: dict = {name: [] for name, _ in configs}  # (report, wall, identical) of each repeat
                failed: dict = {}
                first = None
                for r in range(repeat):
                    for name, extra in configs:
                        if name in failed:
                            continue
                        out = tmp / f"out-{name.replace(' ', '-').replace(',', '')}-{r}"
                        rep, wall, exc = _timed(tmp / "in", out, base + extra, workers, memory_limit,
                                                name.endswith("running"))
                        if exc is not None:  # e.g. workers out of memory: a row that says so, and on
                            failed[name] = _failed(n, variant, text_bytes, name, wall, exc)
                            continue
                        same = None
                        if first is None:
                            first = out
                        else:
                            same = filecmp.cmp(first / "duplicates.parquet", out / "duplicates.parquet", shallow=False)
                            shutil.rmtree(out)
                        runs[name].append((rep, wall, same))
                        print({"documents": n, "variant": variant, "config": name, "run": r + 1,
                               "wall_seconds": round(wall, 2), "identical_to_one_process": same}, flush=True)
                single = _median([w for _, w, _ in runs[configs[0][0]]]) if configs[0][0] == "1 process" else None
                for name, _ in configs:
                    rows.append(failed[name] if name in failed else
                                _row(n, variant, text_bytes, name, runs[name], None if name == "1 process" else single))
                    print(rows[-1], flush=True)
    payload = summary(rows, workers, block_rows, memory_limit, repeat)
    write_results(results, "workers-memory" if memory_limit else "workers", payload, markdown(payload))
    return payload


def _median(values: list) -> float | None:
    return float(np.median(values)) if values else None


def _row(n: int, variant: str, text_bytes: int, name: str, got: list, single: float | None) -> dict:
    """One configuration's row from its runs: median wall time, the largest peaks, identical in every run."""
    reps = [rep for rep, _, _ in got]
    walls = [w for _, w, _ in got]
    wall = _median(walls)
    cluster = [rep.get("cluster", {}) for rep in reps]
    last = cluster[-1]
    same = [s for _, _, s in got if s is not None]  # the reference's first run is compared with nothing

    def peak(values):
        values = [v for v in values if v is not None]
        return round(max(values), 1) if values else None

    return {
        "documents": n, "variant": variant, "text_mb": round(text_bytes / 2**20, 1), "config": name,
        "wall_seconds": round(wall, 2), "wall_seconds_runs": [round(w, 2) for w in walls],
        "pipeline_seconds": round(_median([rep["wall_seconds"] for rep in reps]), 3),
        "client_peak_rss_mb": peak([rep["peak_rss_mb"] for rep in reps]),
        "scheduler_peak_rss_mb": peak([c.get("scheduler_peak_rss_mb") for c in cluster]),
        "worker_peak_rss_mb": peak([max(c.get("worker_peak_rss_mb", {}).values(), default=None) for c in cluster]),
        "blocks": last.get("blocks"), "routes": last.get("routes"),
        "shuffled_rows": last.get("shuffled_rows"), "shuffle_mb": last.get("shuffle_mb"),
        "shuffle_mb_by_stage": last.get("shuffle_mb_by_stage"),
        "removed": reps[-1]["counts"]["removed"],
        "identical_to_one_process": all(same) if same else None,
        "wall_vs_one_process": round(wall / single, 2) if single else None,
    }


def _timed(inputs, out, extra, workers: int, memory_limit, running: bool) -> tuple:
    """(report, wall seconds, None) of one ``gpu-dedup run``, or (None, seconds to the failure, error).
    ``running``: the run joins a cluster started (and its kernels loaded) before the clock starts, and closed
    after it stops: no other process runs beside the other configurations' runs."""
    with _running_cluster(workers, memory_limit) if running else contextlib.nullcontext() as address:
        extra = extra + (["--scheduler", address] if address else [])
        t0 = time.perf_counter()
        try:
            return run_cli_job(inputs, out, extra), time.perf_counter() - t0, None
        except RuntimeError as exc:
            return None, time.perf_counter() - t0, exc


@contextlib.contextmanager
def _running_cluster(workers: int, memory_limit):
    """The scheduler address of a local cluster like the one ``--workers`` starts, its workers' kernels
    loaded as a deployed cluster's are after its first run."""
    from distributed import Client  # noqa: PLC0415  the Dask extra: only this configuration needs it

    cluster = local_cluster(workers, memory_limit or ClusterConfig.memory_limit,
                            {"NUMBA_NUM_THREADS": str(worker_threads(workers))})
    try:
        with Client(cluster) as client:
            client.run(prepare_worker, Config.from_dict({"backend": "cpu"}))
        yield cluster.scheduler_address
    finally:
        cluster.close()


def _failed(n: int, variant: str, text_bytes: int, config: str, wall: float, exc: Exception) -> dict:
    """A row for a configuration whose run failed: its wall time to the failure and the error's last line."""
    last = [line for line in str(exc).splitlines() if line.strip()][-1]
    return {"documents": n, "variant": variant, "text_mb": round(text_bytes / 2**20, 1), "config": config,
            "wall_seconds": round(wall, 2), "failed": last.removeprefix("gpu-dedup: error: ")}


def summary(rows: list, workers: int, block_rows: int, memory_limit, repeat: int = 1) -> dict:
    """The results file's payload: the rows, the machine and the client's growth over the planted corpora."""
    done = [r for r in rows if r["config"] == f"{workers} workers" and r["variant"] == "planted" and "failed" not in r]
    growth = round(done[-1]["client_peak_rss_mb"] - done[0]["client_peak_rss_mb"], 1) if len(done) > 1 else None
    return {"benchmark": "workers", "date": _dt.date.today().isoformat(), "machine": machine(), "workers": workers,
            "block_rows": block_rows, "memory_limit": memory_limit, "repeat": repeat, "rows": rows,
            "client_growth_mb": growth}


def _repeat_note(repeat: int) -> str:
    return "" if repeat == 1 else (f" Each configuration ran {repeat} times, one of each in turn: wall s is the median "
                                   "(the runs in brackets), peaks the largest of the runs.")


def _wall(r: dict) -> str:
    runs = r.get("wall_seconds_runs") or []
    return str(r["wall_seconds"]) if len(runs) < 2 else f"{r['wall_seconds']} ({', '.join(map(str, runs))})"


def markdown(payload: dict) -> str:
    md = [f"{payload['workers']} local Dask workers, cluster.block_rows = {payload['block_rows']:,}, `--no-shards`; "
          f"machine {payload['machine']}, {payload['date']}. Client growth from the smallest to the largest planted "
          f"corpus: {payload['client_growth_mb']} MiB." + _repeat_note(payload.get("repeat", 1)), "",
          "| documents | variant | text MiB | configuration | wall s | vs 1 process | client peak MiB | "
          "scheduler peak MiB | max worker peak MiB | blocks | routes | shuffled rows | shuffle MiB | removed | "
          "identical |",
          "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in payload["rows"]:
        if "failed" in r:
            after = f" after {r['wall_seconds']} s" if r.get("wall_seconds") is not None else ""
            text = "-" if r.get("text_mb") is None else f"{r['text_mb']:,}"
            md.append(f"| {r['documents']:,} | {r['variant']} | {text} | {r['config']} | "
                      f"failed{after}: {r['failed']} ||||||||||")
            continue
        md.append(f"| {r['documents']:,} | {r['variant']} | {r['text_mb']:,} | {r['config']} | {_wall(r)} | "
                  f"{r['wall_vs_one_process'] or '-'} | {r['client_peak_rss_mb']:.0f} | "
                  f"{r.get('scheduler_peak_rss_mb') or '-'} | {r['worker_peak_rss_mb'] or '-'} | "
                  f"{r['blocks'] or '-'} | {r['routes'] or '-'} | "
                  f"{r['shuffled_rows'] or '-'} | {r['shuffle_mb'] or '-'} | {r['removed']:,} | "
                  f"{'-' if r['identical_to_one_process'] is None else r['identical_to_one_process']} |")
    # a running cluster's runs move what the --workers runs move: their rows once
    stages = [r for r in payload["rows"] if r.get("shuffle_mb_by_stage") and not r["config"].endswith("running")]
    if stages:
        names = list(dict.fromkeys(k for r in stages for k in r["shuffle_mb_by_stage"]))
        md += ["", "Shuffled MiB per stage:", "", "| documents | variant | " + " | ".join(names) + " |",
               "| --- | --- | " + " | ".join("---" for _ in names) + " |"]
        md += [f"| {r['documents']:,} | {r['variant']} | " + " | ".join(str(r["shuffle_mb_by_stage"].get(k, 0))
                                                                     for k in names) + " |" for r in stages]
    return "\n".join(md) + "\n"
