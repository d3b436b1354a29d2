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
                    gpu._strings_dev = None  # end to end: the text copy to the device counts
                    sec, (sig, _) = timer(lambda: gpu.minhash(strings, params, kind, n))
                    same = None if ref_sig is None else bool(np.array_equal(sig, ref_sig))
                    measured.append(("gpu", sec, same))
                    del sig
                    sec, _ = timer(lambda: gpu.minhash_device(strings, params, kind, n))
                    measured.append(("gpu-kernel", sec, same))
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
    p.add_argument("--out", help="write the results as JSON here")
    args = p.parse_args(argv)
    from gpu_dedup.errors import BackendError

    try:
        run_benchmark(args.docs, args.perms, args.shingles, args.bits, args.backends, args.seed, args.out)
    except BackendError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
