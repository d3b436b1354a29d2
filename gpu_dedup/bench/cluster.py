"""Clusters a run joins: Dask-CUDA (or Dask CPU) workers started once, then runs that join them by address.

``gpu-dedup bench gpu --suite dask`` (and the tier-2 ``dask`` step of ``first_contact.py``) measures, on one
corpus and one config, beside one process of the same backend:

* a cluster of each size in ``--dask-workers`` (GPU workers: all on the machine's GPUs, ``cluster.workers_per_gpu``
  sharing each; CPU workers: local processes), started once: its start, the loading of the kernels on its
  workers and a warm-up run (the first run of fresh workers) are timed apart, and so is its close;
* runs that join it by address (``cluster.scheduler``), as a run on a deployed cluster does, for each route in
  ``--dask-shuffles`` (``null``: the host-array routes; ``device``: band hashes and edges as device frames through
  Dask's p2p shuffle, and through its task shuffle should p2p fail; on a cluster of one worker, first ``whole``:
  the whole run as one task on that worker, ``cluster.whole_on_one_worker``'s default, then the host routes block
  by block), each output compared with the one-process run's, file by file (bytes, and content where
  the bytes differ; ``_SUCCESS`` holds the manifest's fingerprint, which names the cluster, so it is not
  compared), and the rows and bytes the routes moved, by stage;
* on the first cluster, device memory under pressure (GPU workers): a run whose texts may take almost nothing of
  a worker's device (``cluster.device_memory_limit``) keeps them in host memory and gives the same outputs, and
  the same run with ``cluster.spill_texts: false`` stops with the error naming the setting.  CPU workers: a run
  with every block's texts in files (``cluster.spill_texts: true``).

The one-process run is timed in a child process (warm: a small corpus first, for the kernels' compilation), so
its device memory is free again before the workers start.  ``--copies N`` adds the planted corpus's N
near-duplicate copies (10^7 documents from 10^6, built in seconds) when the deadline allows; those runs write
the removal list only (``output.shards: false``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from gpu_dedup import errors
from gpu_dedup.backends.gpu_probe import simulator_requested
from gpu_dedup.bench import child_env, scratch
from gpu_dedup.bench.corpora import compare_outputs, planted_dir, replicated_dir
from gpu_dedup.config import ClusterConfig, Config
from gpu_dedup.errors import GpuDedupError
from gpu_dedup.run.cluster.connection import gpu_cluster, local_cluster, worker_threads
from gpu_dedup.run.cluster.executor import import_dataframes, prepare_worker
from gpu_dedup.run.entry import run_dedup

UNCOMPARED = ("_SUCCESS",)  # the manifest's fingerprint: it names the run's cluster settings
# cluster.device_memory_limit of the memory probe: below one block's texts (the simulator's corpora are tiny)
PROBE_LIMIT = {"gpu": "64MiB", "simulator": "128B"}


def cluster_bench(docs=(1_000_000,), backend: str = "gpu", workers=(1, 2, 4), shuffles=(None, "device"),
                  copies: int = 0, corpus_dir=None, workdir=None, words=(60, 400), seed: int = 0,
                  warmup_docs: int = 2000, memory_probe: bool = True, rmm_async: bool = False,
                  block_rows: int | None = None, deadline: float | None = None, log=print, on_row=None) -> list:
    """Rows of the benchmark (see the module docstring): one per one-process run, per cluster (its fixed
    costs), per joined run, per memory probe.  ``block_rows``: the joined runs' ``cluster.block_rows`` (None:
    the default).  ``deadline``: a time.time() after which nothing new starts (its rows say so)."""
    for name in ("distributed", "dask_cuda"):  # the clusters' INFO lines (a LocalCUDACluster's scheduler is here)
        logging.getLogger(name).setLevel(logging.WARNING)
    rows: list = []

    def add(row):
        rows.append(row)
        log(json.dumps(row, default=str))
        if on_row is not None:
            on_row(rows)

    def late(estimate: float = 0.0) -> bool:
        """Past the deadline, or would be ``estimate`` seconds from now."""
        return deadline is not None and time.time() + estimate > deadline

    with scratch(workdir) as tmp:
        tmp = Path(tmp)
        root = Path(corpus_dir) if corpus_dir else tmp
        corpora = []  # (documents, path, text bytes, shards written)
        for n in docs:
            path, size, got = planted_dir(root, n, seed, words, log=log)
            corpora.append((got, path, size, True))
        if copies > 1 and corpora and not late():
            path, size, got = replicated_dir(corpora[-1][1], copies, log=log)
            corpora.append((got, path, size, False))  # the removal list only: 10^7 documents' shards are 16 GB
        corpora = [(n, shard_files(path), size, shards) for n, path, size, shards in corpora]
        warm = shard_files(planted_dir(root, warmup_docs, seed, words, 2, log=log)[0])  # the e2e suite's warm-up
        single: dict = {}  # documents -> (output, seconds) of the one-process runs

        def reference(n, path, size, shards, reserve: float = 0.0) -> bool:
            """The one-process run of corpus ``n``, run when first needed (a larger corpus's only when it would
            end, with ``reserve`` seconds more, before the deadline); whether there is one."""
            if n in single:
                return True
            if late(_estimate(single, n) + reserve):
                add({"config": "1 process", "docs": n, "skipped": "would not end before the deadline"})
                return False
            out = tmp / f"single-{n}"
            got = _single_process(path, out, _settings(backend, shards), warm, tmp / "warm-single")
            single[n] = (out, got["seconds"])
            add({"config": "1 process", "backend": backend, "docs": n, "text_gb": round(size / 1e9, 3),
                 "seconds": got["seconds"], "warmup_seconds": got["warmup_seconds"],
                 "stage_seconds": got["stage_seconds"], "shards_written": shards})
            return True

        took: dict = {}  # workers -> route -> {documents: seconds}; workers -> fixed seconds of a cluster
        fixed: dict = {}
        if corpora:
            reference(*corpora[0])
        for k, w in enumerate(workers):  # every cluster at the first corpus first
            if late():
                add({"config": _layout(backend, w), "skipped": "past the deadline"})
                continue
            fixed[w] = _one_cluster(w, backend, corpora[:1], single, shuffles, warm, tmp, rmm_async,
                                    memory_probe and k == 0, block_rows, add, late, took.setdefault(w, {}))
        for corpus in corpora[1:]:  # then the larger ones, each cluster started again, while they fit
            n = corpus[0]
            for w in workers:
                runs = sum(_estimate(took.get(w, {}).get(r or "host", {}), n) for r in shuffles)
                if w not in fixed or not runs or late(fixed[w] + runs) or not reference(*corpus, reserve=runs):
                    add({"config": _layout(backend, w), "docs": n, "skipped": "would not end before the deadline"})
                    continue
                _one_cluster(w, backend, [corpus], single, shuffles, warm, tmp, rmm_async, False, block_rows, add,
                             late, took[w])
    return rows


def shard_files(path) -> str:
    """The Parquet shards of a planted corpus directory, as a pattern (its marker file is no input)."""
    return str(Path(path) / "*.parquet")


def _estimate(seconds: dict, n: int) -> float:
    """Seconds a run of ``n`` documents should take, from the runs of the same configuration so far (``seconds``:
    documents -> seconds, or -> (output, seconds)), scaled by the documents, with a margin; 0 without any."""
    done = {k: (v[1] if isinstance(v, tuple) else v) for k, v in seconds.items() if k <= n}
    if not done:
        return 0.0
    k = max(done)
    return 1.5 * done[k] * n / k


def _settings(backend: str, shards: bool = True, **cluster) -> dict:
    return {"backend": backend, "input": {"id_column": "id"}, "output": {"shards": shards},
            **({"cluster": cluster} if cluster else {})}


def _layout(backend: str, workers: int) -> str:
    many = "s" if workers > 1 else ""
    return f"{workers} GPU worker{many} on 1 GPU" if backend == "gpu" else f"{workers} CPU worker{many}"


def start_cluster(backend: str, workers: int, rmm_async: bool = False):
    """A local cluster of ``workers`` workers as a run would start it: GPU workers all on the first visible GPU
    (``cluster.workers_per_gpu = workers``; one worker: a LocalCUDACluster), or CPU worker processes."""

    if backend == "gpu":
        return gpu_cluster(workers, ClusterConfig(workers=workers, workers_per_gpu=workers, rmm_async=rmm_async))
    return local_cluster(workers, "auto", {"NUMBA_NUM_THREADS": str(worker_threads(workers))})


def _one_cluster(w: int, backend: str, corpora: list, single: dict, shuffles, warm, tmp: Path, rmm_async: bool,
                 probe: bool, block_rows, add, late, took: dict) -> float:
    """One cluster's rows (see the module docstring) for ``corpora``; ``took`` (route -> {documents: seconds})
    gains its runs' seconds.  Returns its fixed seconds (start, kernels, warm-up, close)."""
    from distributed import Client  # noqa: PLC0415


    name = _layout(backend, w)
    fixed: dict = {}
    began = t0 = time.perf_counter()
    try:
        cluster = start_cluster(backend, w, rmm_async)
    except Exception as exc:  # noqa: BLE001 - a cluster that cannot start is a row, the others still run
        add({"config": name, "error": f"{type(exc).__name__}: {exc}"[:500]})
        return time.perf_counter() - began
    fixed["start_seconds"] = round(time.perf_counter() - t0, 3)
    try:
        with Client(cluster) as client:
            t0 = time.perf_counter()
            client.run(prepare_worker, Config.from_dict(_settings(backend)))
            if "device" in shuffles:  # what a run's first device route imported (Dask's DataFrame, dask_cudf)
                import_dataframes(backend)
                client.run(import_dataframes, backend)
                client.run_on_scheduler(import_dataframes, backend)
            fixed["kernel_load_seconds"] = round(time.perf_counter() - t0, 3)
        address = cluster.scheduler_address
        t0 = time.perf_counter()
        _run(warm, tmp / "warm-cluster", _settings(backend, scheduler=address))
        fixed["warmup_seconds"] = round(time.perf_counter() - t0, 3)
        for n, path, _, shards in corpora:
            # one worker: the whole run as one task there (the default), and block by block as on several workers
            routes = [("whole" if w == 1 and not s else s or "host", s) for s in shuffles]
            if w == 1 and None in shuffles:
                routes.insert(routes.index(("whole", None)) + 1, ("host", None))
            for route, shuffle in routes:
                if n not in single or late(_estimate(took.get(route, {}), n)):
                    why = "no one-process run to compare with" if n not in single else "would not end before the deadline"
                    add({"config": name, "docs": n, "shuffle": route, "skipped": why})
                    continue
                settings = _settings(backend, shards, scheduler=address, shuffle=shuffle,
                                     **({"block_rows": block_rows} if block_rows else {}),
                                     **({"whole_on_one_worker": False} if route != "whole" else {}))
                row = _joined(path, tmp / "joined", settings, single.get(n))
                if "seconds" in row:
                    took.setdefault(route, {})[n] = row["seconds"]
                add({"config": name, "workers": w, "docs": n, "shuffle": route, **row})
                if shuffle == "device" and "error" in row and not late(_estimate(took.get("host", {}), n)):
                    import dask  # noqa: PLC0415

                    with dask.config.set({"dataframe.shuffle.method": "tasks"}):  # the device frames another way
                        row = _joined(path, tmp / "joined", settings, single.get(n))
                    add({"config": name, "workers": w, "docs": n, "shuffle": "device (tasks)", **row})
            if probe and not late():  # device memory under pressure
                for row in _memory_probe(backend, path, tmp / "probe", address, shards, single.get(n), block_rows):
                    add({"config": name, "workers": w, "docs": n, **row})
    finally:
        t0 = time.perf_counter()
        cluster.close()
        fixed["close_seconds"] = round(time.perf_counter() - t0, 3)
        add({"config": name, "workers": w, "cluster": "fixed costs", **fixed})
    return sum(v for v in fixed.values())


def _joined(path, out: Path, settings: dict, single) -> dict:
    """A run that joins a running cluster: its seconds, outputs against the one process's, what it moved."""
    try:
        sec, res = _run(path, out, settings)
    except Exception as exc:  # noqa: BLE001 - one failed configuration is a row, the next still runs
        return {"error": f"{type(exc).__name__}: {exc}"[:500]}
    c = res.report.get("cluster", {})
    row = {"seconds": round(sec, 3), "stage_seconds": {k: v.get("seconds") for k, v in res.report["stages"].items()},
           "blocks": c.get("blocks"), "routes": c.get("routes"), "device_routes": c.get("device_routes"),
           "shuffled_rows": c.get("shuffled_rows"), "shuffle_mb": c.get("shuffle_mb"),
           "shuffle_mb_by_stage": c.get("shuffle_mb_by_stage"), "spilled_text_blocks": c.get("spilled_text_blocks"),
           "worker_peak_rss_mb": max((c.get("worker_peak_rss_mb") or {}).values(), default=None),
           "write_threads": sorted((c.get("write_threads") or {}).values()),
           "arrow_threads": sorted((c.get("arrow_threads") or {}).values()),
           "writers": c.get("writers"),  # which wrote the shards (cudf on the device, or pyarrow on the host)
           "text_readers": c.get("text_readers"),  # which read the blocks' texts (cudf into device memory, or pyarrow)
           "shards_from_held": c.get("shards_from_held"),  # CPU workers: written from the blocks' input batches
           "worker_transfer_mb_by_stage": c.get("worker_transfer_mb_by_stage"),
           # every stage's details (the read's and the write's parts, verify's rounds): where a joined run's seconds
           # went against the one process's
           "stages": res.report["stages"], "fixed_seconds": res.report.get("fixed_seconds")}
    if single is not None:
        row.update(compared(single[0], out))
        row["vs_one_process"] = round(sec / single[1], 3) if single[1] else None
    shutil.rmtree(out, ignore_errors=True)
    return row


def _memory_probe(backend: str, path, out: Path, address: str, shards: bool, single, block_rows=None) -> list:
    """Device memory under pressure (see the module docstring): the spilling run's row, then the failing one's."""

    address_and = {"scheduler": address, **({"block_rows": block_rows} if block_rows else {})}

    if backend != "gpu":
        row = _joined(path, out, _settings(backend, shards, **address_and, spill_texts=True), single)
        return [{"memory": "texts in files (cluster.spill_texts: true)", **row}]
    limit = PROBE_LIMIT["simulator" if simulator_requested() else "gpu"]
    row = _joined(path, out, _settings(backend, shards, **address_and, device_memory_limit=limit), single)
    rows = [{"memory": f"texts past {limit} (cluster.device_memory_limit) in host memory", **row}]
    try:
        _run(path, out, _settings(backend, shards, **address_and, device_memory_limit=limit, spill_texts=False))
        failed = None
    except Exception as exc:  # noqa: BLE001 - the error is what is measured
        failed = f"{type(exc).__name__}: {exc}"
    shutil.rmtree(out, ignore_errors=True)
    rows.append({"memory": f"cluster.spill_texts: false, cluster.device_memory_limit: {limit}",
                 "error": (failed or "")[:600],
                 "stopped_naming_the_setting": bool(failed) and "cluster.device_memory_limit" in failed
                 and failed.startswith("ResourceError")})
    return rows


def compared(a, b) -> dict:
    """Output directory ``b`` against ``a``: ``identical`` (every file the same bytes) and ``content_identical``
    (the same tables where the bytes differ), ``_SUCCESS`` left out (see UNCOMPARED)."""
    c = compare_outputs(a, b)
    differ = [n for n in c["differ"] if n not in UNCOMPARED]
    content = {n: why for n, why in c["content_differs"].items() if n not in UNCOMPARED}
    return {"identical": not differ and not c["only_in_one"],
            "content_identical": not c["only_in_one"] and not content, "files_compared": c["files"],
            "differ": differ + c["only_in_one"]}


def _run(inputs, out: Path, settings: dict):

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = run_dedup(inputs, out, Config.from_dict(settings))
    return time.perf_counter() - t0, res


def _single_process(inputs, out: Path, settings: dict, warm, warm_out: Path) -> dict:
    """One process's run in a child process (its device memory goes with it), after a warm-up run."""
    job = json.dumps({"inputs": str(inputs), "out": str(out), "settings": settings, "warm": str(warm),
                      "warm_out": str(warm_out)})
    code = "import sys; from gpu_dedup.bench.cluster import single_main; single_main(sys.argv[1])"
    proc = subprocess.run([sys.executable, "-c", code, job], capture_output=True, text=True, env=child_env(),
                          check=False)
    line = next((ln for ln in reversed(proc.stdout.splitlines()) if ln.startswith("{")), None)
    got = json.loads(line) if line is not None else {}
    if "error" in got:  # one of gpu_dedup's errors (no GPU, a bad config): the same error here
        raise getattr(errors, got["error_type"], errors.GpuDedupError)(got["error"])
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"the one-process run failed (exit status {proc.returncode}): {proc.stderr[-2000:]}")
    return got


def single_main(job: str) -> None:
    """The child of :func:`_single_process`: a warm-up run, then the timed one; prints their seconds."""

    j = json.loads(job)
    try:
        warm_s, _ = _run(j["warm"], Path(j["warm_out"]), j["settings"])
        sec, res = _run(j["inputs"], Path(j["out"]), j["settings"])
    except GpuDedupError as exc:
        print(json.dumps({"error_type": type(exc).__name__, "error": str(exc)}), flush=True)
        sys.exit(2)
    print(json.dumps({"seconds": round(sec, 3), "warmup_seconds": round(warm_s, 3),
                      "stage_seconds": {k: v.get("seconds") for k, v in res.report["stages"].items()}}), flush=True)
    os._exit(0)  # noqa: SLF001 - nothing left to flush; a GPU process's teardown takes seconds


def problems(rows: list) -> list:
    """What in the rows is wrong although the benchmark ran: outputs that differ from one process's, runs that
    failed, a memory probe that did not stop naming its setting."""
    out = []
    for r in rows:
        where = f"{r.get('config')} {r.get('docs', '')} {r.get('shuffle', '')}".strip()
        if r.get("content_identical") is False:
            out.append(f"{where}: outputs differ from one process's ({', '.join(r.get('differ', []))[:120]})")
        if "error" in r and "stopped_naming_the_setting" not in r:
            out.append(f"{where}: {r['error'][:200]}")
        if r.get("stopped_naming_the_setting") is False:
            out.append(f"{where}: spill_texts false did not stop with cluster.device_memory_limit named: "
                       f"{r.get('error')[:200] or 'it ran to the end'}")
    return out


def markdown(rows: list) -> list:
    """Markdown lines: the runs (one process, joined runs, memory probes), then each cluster's fixed costs."""
    lines = ["## Runs joining a running cluster, beside one process", "",
             ("| configuration | docs | route | seconds | x one process | same bytes | same content | shuffle MiB | "
              "device routes | texts off the device | write s | shards at once | note |"),
             "| --- | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | --- |"]
    yes = {True: "yes", False: "NO", None: ""}
    for r in rows:
        if r.get("cluster"):
            continue
        note = r.get("skipped") or r.get("error") or r.get("memory") or ""
        if r.get("memory") and r.get("error"):
            note = f"{r['memory']}: {r['error']}"
        lines.append(f"| {r.get('config')} | {r.get('docs', 0):,} | {r.get('shuffle', '')} | {r.get('seconds', '')} | "
                     f"{r.get('vs_one_process', '')} | {yes[r.get('identical')]} | {yes[r.get('content_identical')]} | "
                     f"{r.get('shuffle_mb', '')} | {r.get('device_routes', '')} | "
                     f"{r.get('spilled_text_blocks', '')} | {(r.get('stage_seconds') or {}).get('write', '')} | "
                     f"{' '.join(map(str, r.get('write_threads') or []))} | {str(note)[:160].replace('|', '/')} |")
    fixed = [r for r in rows if r.get("cluster")]
    if fixed:
        lines += ["", "Each cluster's fixed costs (seconds), paid once, not by the runs that join it:", "",
                  "| configuration | start | kernels loaded | warm-up run | close |", "| --- | ---: | ---: | ---: | ---: |"]
        lines += [f"| {r['config']} | {r.get('start_seconds', '')} | {r.get('kernel_load_seconds', '')} | "
                  f"{r.get('warmup_seconds', '')} | {r.get('close_seconds', '')} |" for r in fixed]
    moved = [r for r in rows if r.get("shuffle_mb_by_stage")]
    if moved:
        names = list(dict.fromkeys(k for r in moved for k in r["shuffle_mb_by_stage"]))
        lines += ["", "MiB the routes moved, by stage (rows in all):", "",
                  "| configuration | docs | route | " + " | ".join(names) + " | rows |",
                  "| --- | ---: | --- | " + " | ".join("---:" for _ in names) + " | ---: |"]
        lines += [f"| {r['config']} | {r['docs']:,} | {r.get('shuffle', '')} | "
                  + " | ".join(str(r["shuffle_mb_by_stage"].get(k, 0)) for k in names)
                  + f" | {r.get('shuffled_rows') or 0:,} |" for r in moved]
    copied = [r for r in rows if r.get("worker_transfer_mb_by_stage")]
    if copied:  # GPU workers: where a joined run's host<->device copies went (their stage seconds' suspects)
        names = list(dict.fromkeys(k for r in copied for k in r["worker_transfer_mb_by_stage"]))
        lines += ["", "MiB the GPU workers' tasks copied host->device / device->host, by stage:", "",
                  "| configuration | docs | route | " + " | ".join(names) + " |",
                  "| --- | ---: | --- | " + " | ".join("---:" for _ in names) + " |"]
        for r in copied:
            got = r["worker_transfer_mb_by_stage"]
            cells = [f"{got[k].get('host_to_device', 0)} / {got[k].get('device_to_host', 0)}" if k in got else ""
                     for k in names]
            lines.append(f"| {r['config']} | {r['docs']:,} | {r.get('shuffle', '')} | " + " | ".join(cells) + " |")
    return lines + [""]
