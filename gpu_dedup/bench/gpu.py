"""Benchmark of the signature kernel: CPU backend vs GPU backend vs cuDF's ``Series.str.minhash``.

One command on a GPU machine (``pip install -e ".[cuda12]"`` first)::

    gpu-dedup bench gpu --out bench-results/gpu-signatures.json

runs, in one process on one planted corpus (``gpu_dedup.evaluation.sample``, normalized
as the pipeline does): 100 k and 1 M documents x num_perm 128 and 260 x char
5-grams, char 24-grams and word 5-grams, and prints MB/s and docs/s per
backend.  Each GPU measurement is also checked bit for bit against the CPU
signatures of the same run (column ``same``).

* ``cpu``: ``CPUBackend.minhash`` (Numba, all cores).
* ``gpu``: ``GPUBackend.minhash`` from host text to host signatures (the text
  copy to the device included), and ``gpu-kernel``: text already on the
  device, signatures left there (the pipeline's device-resident future).
* ``cudf``: ``cudf.Series.str.minhash(seed, a, b, width)`` on a cuDF column
  already on the device (word n-grams: ``str.split()`` then the list form,
  split included).  cuDF hashes with MurmurHash3, not this project's
  polynomial, so its values differ by design: only its speed is compared.

Results go to stdout and, with ``--out``, to a JSON file with the device,
CPU, library versions and date, to commit beside the README's numbers.

``--suite`` picks more measurements (``all`` runs every one, in one process):

* ``signatures`` (the default): the kernel benchmark above.
* ``end-to-end``: Parquet shards to deduplicated shards, GPU backend against the
  CPU backend on all host cores, same corpus, same config: documents/s, GB/s of
  text, and the host<->device bytes of every stage (from ``report.json``);
  outputs are checked to be identical.
* ``dask``: ``--workers 1 --backend gpu`` (Dask-CUDA, one GPU worker) against the
  single-process GPU run: identical outputs, and the overhead in seconds and %.

With ``--out X.json`` a Markdown summary is written beside it (``X.md``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import numpy as np

SHINGLES = ("char:5", "char:24", "word:5")


def parse_shingle(spec: str) -> tuple[str, int]:
    kind, _, n = spec.partition(":")
    if kind not in ("char", "word") or not n.isdigit() or int(n) < 1:
        raise argparse.ArgumentTypeError(f"shingle {spec!r} must look like char:5 or word:5")
    return kind, int(n)


def make_corpus(n_docs: int, seed: int = 0, words=(60, 400)):
    """Normalized planted-cluster text (large_string Arrow array) of ``n_docs`` documents
    of ``words`` words (log-uniform; about 1.6 KB on average with the default)."""
    from gpu_dedup.evaluation.sample import planted_corpus
    from gpu_dedup.stages.normalize import normalize

    sample = planted_corpus(n_docs=n_docs, n_clusters=max(1, n_docs // 40), words=words, seed=seed)
    return normalize(sample.table.column("text"))


def _versions() -> dict:
    out = {"python": platform.python_version()}
    for mod in ("numpy", "numba", "numba_cuda", "cupy", "cudf", "pyarrow"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:
            pass
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


class _Timer:
    def __init__(self, sync=None):
        self.sync = sync or (lambda: None)

    def __call__(self, fn):
        self.sync()
        t0 = time.perf_counter()
        result = fn()
        self.sync()
        return time.perf_counter() - t0, result


def _cudf_minhash(texts, params, kind, n, num_perm):
    import cudf

    dtype = np.uint64 if params.hash_bits == 64 else np.uint32
    a = cudf.Series(params.a[:num_perm].astype(dtype))
    b = cudf.Series(params.b[:num_perm].astype(dtype))
    col = cudf.Series.from_arrow(texts)

    def run():
        if kind == "char":
            return col.str.minhash(params.seed, a=a, b=b, width=n)
        return col.str.split().str.minhash(params.seed, a=a, b=b, width=n)

    return run


def _device_strings(strings, gpu):
    from gpu_dedup.backends import to_device
    from gpu_dedup.backends.strings import StringBuffers

    return StringBuffers(to_device(strings.offsets, gpu.xp), to_device(strings.data, gpu.xp))


def run_benchmark(docs=(100_000, 1_000_000), perms=(128, 260), shingles=SHINGLES, bits=32, backends=("auto",),
                  seed=0, out=None, log=print, words=(60, 400)) -> dict:
    from gpu_dedup.backends import get_backend
    from gpu_dedup.backends.strings import string_buffers
    from gpu_dedup.errors import BackendError
    from gpu_dedup.kernels.params import hash_params

    want = set(backends)
    auto = "auto" in want
    cpu = get_backend("cpu") if auto or "cpu" in want else None
    gpu, gpu_reason = None, None
    if auto or "gpu" in want or "cudf" in want:
        try:
            gpu = get_backend("gpu")
        except BackendError as exc:
            if not auto:
                raise
            gpu_reason = str(exc)
            log(f"GPU not measured: {exc}")
    use_cudf = False
    if gpu is not None and (auto or "cudf" in want):
        try:
            import cudf  # noqa: F401

            use_cudf = True
        except Exception as exc:
            if "cudf" in want:
                raise BackendError(f"cuDF is not importable ({exc}); pip install -e '.[cuda12]' in the gpu_dedup "
                                   "checkout") from None
            log(f"cuDF not measured: {exc}")
    timer = _Timer(gpu.synchronize if gpu is not None else None)

    t0 = time.perf_counter()
    corpus = make_corpus(max(docs), seed, words)
    log(f"corpus: {max(docs):,} documents, {corpus.nbytes / 2**20:,.0f} MiB generated and normalized in "
        f"{time.perf_counter() - t0:.1f}s")
    rows = []
    header = f"{'docs':>9} {'shingle':>8} {'perm':>5} {'backend':>11} {'seconds':>9} {'MB/s':>9} {'docs/s':>12} same"
    log(header)
    for n_docs in docs:
        texts = corpus.slice(0, n_docs)
        strings = string_buffers(texts)
        mb = strings.nbytes / 1e6
        for spec in shingles:
            kind, n = parse_shingle(spec) if isinstance(spec, str) else spec
            for num_perm in perms:
                params = hash_params(42, num_perm, bits)
                warm = string_buffers(texts.slice(0, min(n_docs, 200)))
                ref_sig = None
                measured = []
                if cpu is not None:
                    cpu.minhash(warm, params, kind, n)
                    sec, (ref_sig, _) = timer(lambda: cpu.minhash(strings, params, kind, n))
                    measured.append(("cpu", sec, None))
                if gpu is not None and (auto or "gpu" in want):
                    gpu.minhash(warm, params, kind, n)
                    gpu._span_dev = None  # end to end: the text copy to the device counts
                    sec, (sig, _) = timer(lambda: gpu.minhash(strings, params, kind, n))
                    same = None if ref_sig is None else bool(np.array_equal(sig, ref_sig))
                    measured.append(("gpu", sec, same))
                    del sig
                    on_card = _device_strings(strings, gpu)  # the pipeline's case: text already on the device
                    sec, _ = timer(lambda: gpu.minhash(on_card, params, kind, n))
                    measured.append(("gpu-kernel", sec, same))
                    del on_card
                if use_cudf:
                    try:
                        fn = _cudf_minhash(texts, params, kind, n, num_perm)
                        fn()  # warm-up (JIT-free, but the first call allocates)
                        sec, _ = timer(fn)
                        measured.append(("cudf", sec, None))
                    except Exception as exc:  # an API difference between cuDF versions must not end the run
                        log(f"cudf str.minhash failed for {spec} x {num_perm}: {type(exc).__name__}: {exc}")
                        rows.append({"docs": n_docs, "shingle": f"{kind}:{n}", "num_perm": num_perm, "backend": "cudf",
                                     "error": f"{type(exc).__name__}: {exc}"})
                del ref_sig
                for name, sec, same in measured:
                    row = {"docs": n_docs, "text_mb": round(mb, 1), "shingle": f"{kind}:{n}", "num_perm": num_perm,
                           "hash_bits": bits, "backend": name, "seconds": round(sec, 4),
                           "mb_per_s": round(mb / sec, 1), "docs_per_s": round(n_docs / sec)}
                    if same is not None:
                        row["identical_to_cpu"] = same
                    rows.append(row)
                    flag = "" if same is None else ("yes" if same else "NO")
                    log(f"{n_docs:>9,} {kind + ':' + str(n):>8} {num_perm:>5} {name:>11} {sec:>9.3f} "
                        f"{mb / sec:>9.1f} {n_docs / sec:>12,.0f} {flag}")
    result = {
        "benchmark": "gpu_dedup signature kernel (gpu-dedup bench gpu)",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": getattr(gpu, "device_name", None),
        "gpu_mode": getattr(gpu, "mode", None),
        "gpu_not_measured": gpu_reason,
        "cpu": _cpu_model(),
        "cpu_threads": cpu.mode if cpu is not None else None,
        "cores": os.cpu_count(),
        "versions": _versions(),
        "corpus": f"gpu_dedup.evaluation.sample.planted_corpus(n_docs={max(docs)}, seed={seed}), normalized (default config)",
        "rows": rows,
    }
    log("")
    log(markdown_table(result))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "w") as f:
            json.dump(result, f, indent=1)
        log(f"written: {out}")
    if any(r.get("identical_to_cpu") is False for r in rows):
        raise SystemExit("GPU signatures differ from the CPU's: see the rows marked NO")
    return result


def environment(gpu=None) -> dict:
    """Device, driver, CUDA, CPU, library versions and date of a measurement."""
    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "cpu": _cpu_model(), "cores": os.cpu_count(), "versions": _versions()}
    for mod in ("rmm", "dask", "distributed", "dask_cuda", "dask_cudf"):
        try:
            env["versions"][mod] = __import__(mod).__version__
        except Exception:
            pass
    if gpu is not None:
        env["device"] = gpu.device_name
        env["gpu_mode"] = gpu.mode
        try:
            rt = gpu.xp.cuda.runtime

            def version(v):
                return f"{v // 1000}.{v % 1000 // 10}"

            env["driver_cuda"], env["runtime_cuda"] = version(rt.driverGetVersion()), version(rt.runtimeGetVersion())
        except Exception:
            pass
        try:
            import pynvml

            pynvml.nvmlInit()
            env["driver"] = pynvml.nvmlSystemGetDriverVersion()
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return env


def _planted_shards(path, n_docs: int, seed: int, words, shards: int):
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    sample = planted_corpus(n_docs=n_docs, n_clusters=max(1, n_docs // 40), words=words, seed=seed)
    import pyarrow.compute as pc

    write_shards(sample.table.select(["id", "text"]), path, shards=shards)
    return int(pc.sum(pc.binary_length(sample.table.column("text"))).as_py() or 0), sample.table.num_rows


def _timed_run(inputs, out, settings: dict):
    import shutil

    from gpu_dedup.config import Config
    from gpu_dedup.run.local import run

    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    res = run(inputs, out, Config.from_dict(settings))
    return time.perf_counter() - t0, res


def _same_outputs(a, b, res) -> bool:
    import pyarrow.parquet as pq

    if (a / "duplicates.parquet").read_bytes() != (b / "duplicates.parquet").read_bytes():
        return False
    return all(pq.read_table(a / s.name).equals(pq.read_table(b / s.name)) for s in res.shards)


def _moved(report: dict) -> dict:
    """Host<->device bytes per stage of a run's report (stages that moved none are left out)."""
    out = {}
    for name, stage in report["stages"].items():
        up, down = stage.get("host_to_device_bytes", 0), stage.get("device_to_host_bytes", 0)
        if up or down:
            out[name] = {"host_to_device_bytes": up, "device_to_host_bytes": down}
    return out


def end_to_end(docs=(1_000_000,), backends=("cpu", "gpu"), preset: str | None = None, seed=0, words=(60, 400),
               shards: int = 16, workdir=None, log=print) -> list:
    """Parquet shards to deduplicated shards on each backend (CPU: every host core), same corpus and
    config: seconds, documents/s, GB/s of text, host<->device bytes per stage, identical outputs."""
    import tempfile
    from pathlib import Path

    import numba

    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        for n_docs in docs:
            text_bytes, n = _planted_shards(tmp / f"in-{n_docs}", n_docs, seed, words, shards)
            settings = {"input": {"id_column": "id"}}
            if preset:
                from gpu_dedup.config import Config

                settings = {**Config.from_yaml(preset).to_dict(), **settings}
            first = None
            for backend in backends:
                out = tmp / f"out-{n_docs}-{backend}"
                run_settings = {**settings, "backend": backend}
                if backend == "gpu-pyarrow":  # the GPU backend with its text read on the host by pyarrow
                    run_settings = {**settings, "backend": "gpu", "gpu": {**settings.get("gpu", {}), "reader": "pyarrow"}}
                sec, res = _timed_run(tmp / f"in-{n_docs}", out, run_settings)
                row = {"suite": "end-to-end", "docs": n, "text_gb": round(text_bytes / 1e9, 3), "backend": backend,
                       "preset": preset or "default", "seconds": round(sec, 3), "docs_per_s": round(n / sec),
                       "gb_per_s": round(text_bytes / 1e9 / sec, 4), "tb_per_hour": round(text_bytes / 1e12 / sec * 3600, 3),
                       "stage_seconds": {k: v["seconds"] for k, v in res.report["stages"].items()},
                       "transfers": _moved(res.report), "removed": res.report["counts"]["removed"]}
                if backend == "cpu":
                    row["cpu_threads"] = numba.get_num_threads()
                if "gpu" in res.report:
                    row["gpu_memory"] = res.report["gpu"]
                    row["reader"] = res.report["gpu"].get("reader")
                if first is None:
                    first = (out, backend)
                else:
                    row["identical_to"] = first[1]
                    row["identical"] = _same_outputs(first[0], out, res)
                rows.append(row)
                log(f"end-to-end {n:>10,} docs {backend:>4}: {sec:8.2f}s {n / sec:>12,.0f} docs/s "
                    f"{text_bytes / 1e9 / sec:8.3f} GB/s" + (f" identical to {first[1]}: {row['identical']}"
                                                              if "identical" in row else ""))
            group = rows[-len(backends):]
            for r in group[1:]:
                log(f"end-to-end {n:,} docs: {r['backend']} / {group[0]['backend']} = "
                    f"{group[0]['seconds'] / r['seconds']:.2f}x")
    return rows


def dask_overhead(docs=(1_000_000,), seed=0, words=(60, 400), shards: int = 16, workdir=None, log=print) -> list:
    """``--workers 1 --backend gpu`` (Dask-CUDA) against the single-process GPU run: identical outputs,
    overhead in seconds and percent."""
    import tempfile
    from pathlib import Path

    rows = []
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        for n_docs in docs:
            text_bytes, n = _planted_shards(tmp / f"in-{n_docs}", n_docs, seed, words, shards)
            base = {"backend": "gpu", "input": {"id_column": "id"}}
            single_s, res = _timed_run(tmp / f"in-{n_docs}", tmp / "single", base)
            dask_s, _ = _timed_run(tmp / f"in-{n_docs}", tmp / "dask", {**base, "cluster": {"workers": 1}})
            same = _same_outputs(tmp / "single", tmp / "dask", res)
            rows.append({"suite": "dask", "docs": n, "text_gb": round(text_bytes / 1e9, 3),
                         "single_process_seconds": round(single_s, 3), "dask_cuda_1_worker_seconds": round(dask_s, 3),
                         "overhead_seconds": round(dask_s - single_s, 3),
                         "overhead_percent": round(100 * (dask_s - single_s) / single_s, 1), "identical": same})
            log(f"dask-cuda 1 worker vs single process, {n:,} docs: {dask_s:.2f}s vs {single_s:.2f}s "
                f"({100 * (dask_s - single_s) / single_s:+.1f}%), identical outputs: {same}")
    return rows


def markdown_report(result: dict) -> str:
    """Every suite of a run as Markdown (environment, then one table per suite)."""
    env = result["environment"]
    lines = [f"# GPU benchmarks, {env['date'][:10]}", "",
             f"- device: {env.get('device') or 'none'}; driver {env.get('driver', '?')} (CUDA "
             f"{env.get('driver_cuda', '?')}), runtime CUDA {env.get('runtime_cuda', '?')}",
             f"- CPU: {env['cpu']} ({env['cores']} threads)",
             "- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(env["versions"].items())), ""]
    if result.get("signatures"):
        lines += ["## Signature kernel", "", markdown_table(result["signatures"]), ""]
    if result.get("end_to_end"):
        lines += ["## End to end (Parquet shards to deduplicated shards)", "",
                  "| docs | GB text | backend | text reader | seconds | docs/s | GB/s | TB/h | identical | host->device | "
                  "device->host |",
                  "| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"]
        for r in result["end_to_end"]:
            up = sum(v["host_to_device_bytes"] for v in r["transfers"].values())
            down = sum(v["device_to_host_bytes"] for v in r["transfers"].values())
            same = {True: "yes", False: "NO", None: ""}[r.get("identical")]
            lines.append(f"| {r['docs']:,} | {r['text_gb']} | {r['backend']} | {r.get('reader') or 'pyarrow'} | "
                         f"{r['seconds']} | {r['docs_per_s']:,} | "
                         f"{r['gb_per_s']} | {r['tb_per_hour']} | {same} | {up / 1e6:,.1f} MB | {down / 1e6:,.1f} MB |")
        lines += ["", "Host<->device bytes per stage (GPU rows):", ""]
        for r in result["end_to_end"]:
            for stage, t in r["transfers"].items():
                lines.append(f"- {r['docs']:,} docs, {stage}: {t['host_to_device_bytes'] / 1e6:,.1f} MB to the device, "
                             f"{t['device_to_host_bytes'] / 1e6:,.1f} MB to the host")
        lines.append("")
    if result.get("dask"):
        lines += ["## Dask-CUDA, 1 worker vs single process", "",
                  "| docs | single process s | Dask-CUDA 1 worker s | overhead | identical |",
                  "| ---: | ---: | ---: | ---: | --- |"]
        for r in result["dask"]:
            lines.append(f"| {r['docs']:,} | {r['single_process_seconds']} | {r['dask_cuda_1_worker_seconds']} | "
                         f"{r['overhead_seconds']} s ({r['overhead_percent']}%) | {'yes' if r['identical'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def markdown_table(result: dict) -> str:
    """The results as a Markdown table headed by device, CPU and date (for the README)."""
    lines = [f"Signature kernel, {result['date'][:10]}: GPU {result['device'] or 'not measured'}; "
             f"CPU {result['cpu']} ({result['cores']} threads); hash_bits "
             f"{next((r['hash_bits'] for r in result['rows'] if 'hash_bits' in r), '?')}.", "",
             "| docs | MB | shingles | num_perm | backend | seconds | MB/s | docs/s | same as CPU |",
             "| ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['docs']:,} | | {r['shingle']} | {r['num_perm']} | {r['backend']} | "
                         f"failed: {r['error'][:60]} | | | |")
            continue
        same = {True: "yes", False: "NO", None: ""}[r.get("identical_to_cpu")]
        lines.append(f"| {r['docs']:,} | {r['text_mb']:,} | {r['shingle']} | {r['num_perm']} | {r['backend']} | "
                     f"{r['seconds']:.3f} | {r['mb_per_s']:,.1f} | {r['docs_per_s']:,} | {same} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu-dedup bench gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, nargs="+", default=[100_000, 1_000_000], help="corpus sizes (documents)")
    p.add_argument("--perms", type=int, nargs="+", default=[128, 260], help="num_perm values")
    p.add_argument("--shingles", nargs="+", default=list(SHINGLES), type=parse_shingle, help="e.g. char:5 word:5")
    p.add_argument("--bits", type=int, choices=(32,), default=32, help="signature bits (32 since hash family v2)")
    p.add_argument("--backends", nargs="+", default=["auto"], choices=("auto", "cpu", "gpu", "cudf"),
                   help="auto: cpu, plus gpu and cudf where usable (says why not)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--out", help="write the results as JSON here (and Markdown beside it)")
    p.add_argument("--suite", nargs="+", default=["signatures"], choices=("signatures", "end-to-end", "dask", "all"),
                   help="what to measure (see above)")
    p.add_argument("--e2e-docs", type=int, nargs="+", default=[1_000_000], help="corpus sizes of end-to-end and dask")
    p.add_argument("--e2e-backends", nargs="+", default=["cpu", "gpu"], choices=("cpu", "gpu", "gpu-pyarrow"),
                   help="gpu-pyarrow: the GPU backend with the text read on the host (gpu.reader: pyarrow)")
    p.add_argument("--preset", help="config preset of the end-to-end runs (default, fineweb, nemo_curator)")
    p.add_argument("--workdir", help="where the end-to-end corpora are written (default: the system temp)")
    args = p.parse_args(argv)
    from gpu_dedup.backends import get_backend
    from gpu_dedup.errors import BackendError, ConfigError

    suites = {"signatures", "end-to-end", "dask"} if "all" in args.suite else set(args.suite)
    result = {"benchmark": "python -m gpu_dedup.bench.gpu --suite " + " ".join(sorted(suites))}
    try:
        if "signatures" in suites:
            result["signatures"] = run_benchmark(args.docs, args.perms, args.shingles, args.bits, args.backends,
                                                 args.seed, None if suites != {"signatures"} else args.out)
        if "end-to-end" in suites:
            result["end_to_end"] = end_to_end(args.e2e_docs, args.e2e_backends, args.preset, args.seed,
                                              workdir=args.workdir)
        if "dask" in suites:
            result["dask"] = dask_overhead(args.e2e_docs, args.seed, workdir=args.workdir)
        on_gpu = any(b.startswith("gpu") for b in args.e2e_backends) or "dask" in suites
        gpu = get_backend("gpu") if ({"end-to-end", "dask"} & suites and on_gpu) else None
    except (BackendError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if suites == {"signatures"}:
        return 0
    result["environment"] = environment(gpu)
    print(markdown_report(result))
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(markdown_report(result))
        print(f"written: {args.out} and {os.path.splitext(args.out)[0]}.md")
    bad = [r for r in result.get("end_to_end", []) + result.get("dask", []) if r.get("identical") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
