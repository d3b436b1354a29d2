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
* ``gpu-block``: the block kernel (``GPU_DEDUP_SIGNATURE_KERNEL=block``, the first GPU
  kernel) on device text, row ``gpu-block-kernel``; the ``gpu`` rows run the backend's
  default, the warp kernel (their ``kernel`` field says which).
* ``cudf``: ``cudf.Series.str.minhash(seed, a, b, width)`` on a cuDF column
  already on the device (word n-grams: ``str.split()`` then the list form,
  split included).  cuDF hashes with MurmurHash3, not this project's
  polynomial, so its values differ by design: only its speed is compared.

``--cases char:24x260 char:5x128 word:5x128`` measures those (shingles, permutations)
pairs instead of every shingle with every ``--perms``.  Each run also reports the warp
kernel's speed over cuDF's and over the block kernel's (``ratios``) and, on a device, the
registers, shared memory and theoretical occupancy of the kernels it loaded
(``kernel_resources``; ``python -m gpu_dedup.bench.occupancy`` gives the same from ptxas
without a device).

Results go to stdout and, with ``--out``, to a JSON file with the device,
CPU, library versions and date, to commit beside the README's numbers.

``--suite`` picks more measurements (``all`` runs every one, in one process):

* ``signatures`` (the default): the kernel benchmark above.
* ``end-to-end``: Parquet shards to deduplicated shards, GPU backend against the
  CPU backend on all host cores, same corpus, same config: documents/s, GB/s of
  text, and the host<->device bytes of every stage (from ``report.json``);
  outputs are checked to be identical.
* ``dask``: clusters started once and joined by address (``gpu_dedup.bench.cluster``): 1, 2 and 4
  Dask-CUDA workers on one GPU (``--dask-workers``), the host-array and the device routes
  (``--dask-shuffles``), device memory under pressure, beside the one-process run; start-up, kernel
  loading, warm-up and close apart; ``--dask-backend cpu`` measures CPU workers the same way.
* ``smoke``: a minute's check that the GPU answers at all and agrees with the CPU
  on a small planted corpus (``--smoke-docs``): a plain ``@cuda.jit`` kernel on the
  backend's arrays, normalization, signatures (char 5 x 260, word 5 x 128; a tenth of the
  permutations under the simulator), shingle sets, Jaccard pairs, band and exact hashes,
  components, and the cosine kernels
  (projections, text SimHash, row norms, cosine and Hamming pairs); each check says
  ok / differs / failed and the seconds of its first (compiling) and second call.
* ``corpus``: only write the planted shards of ``--e2e-docs`` under ``--corpus-dir``
  (text, and vectors when a cosine-vectors config is asked for), for later calls to reuse.

``--configs`` runs end-to-end over several configurations (``default``,
``fineweb``, ``nemo_curator``: the presets, Jaccard of word 5-grams, word
5-grams and char 24-grams; ``cosine-vectors``: cosine of planted embeddings;
``cosine-text``: cosine of tf-idf vectors of the text), each compared file by
file, byte for byte, between the backends.  ``--corpus-dir`` keeps the planted
shards between calls; ``--deadline-seconds`` skips (and says so) what would
start too late; ``--warmup-docs`` runs each configuration once on a small corpus
first, so compilation (Numba, CuPy) stays out of the timed run.  With ``--out``
the JSON is rewritten after every row, so a run stopped from outside leaves what
it measured.

With ``--out X.json`` a Markdown summary is written beside it (``X.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import sys
import time

import numpy as np

from gpu_dedup.bench.corpora import UNCOMPARED, VECTOR_DIM, compare_outputs, planted_dir, replicated_dir  # noqa: F401
from gpu_dedup.bench.occupancy import parse_case
from gpu_dedup.bench.argtypes import at_least, non_negative_int, positive_int

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


def planted_text(n_docs: int, seed: int = 0, words=(60, 400), corpus_dir=None, log=print):
    """:func:`make_corpus`'s normalized text; read from the planted shards under ``corpus_dir`` (written
    there first if missing) when given, so the end-to-end runs and this benchmark share one corpus."""
    if corpus_dir is None:
        return make_corpus(n_docs, seed, words)
    import pyarrow.parquet as pq

    from gpu_dedup.stages.normalize import normalize

    path, _, _ = planted_dir(corpus_dir, n_docs, seed, words, log=log)
    files = sorted(path.glob("*.parquet"))
    import pyarrow as pa

    text = pa.chunked_array([c for f in files for c in pq.read_table(f, columns=["text"]).column("text").chunks])
    return normalize(text)


def _block_kernel_row(gpu, strings, warm, params, kind: str, n: int, ref_sig, timer) -> tuple:
    """("gpu-block-kernel", seconds, same as the CPU) of the block kernel on text already on the device."""
    from gpu_dedup.backends import to_host

    kept = gpu.signature_kernel
    gpu.signature_kernel = "block"
    try:
        gpu.minhash(warm, params, kind, n)  # compiled (or loaded) before the timing
        on_card = _device_strings(strings, gpu)
        sec, (sig, _) = timer(lambda: gpu.minhash(on_card, params, kind, n))
        same = None if ref_sig is None else bool(np.array_equal(to_host(sig), ref_sig))
    finally:
        gpu.signature_kernel = kept
    return "gpu-block-kernel", sec, same


def _kernel_resources(gpu, kind: str, n: int, num_perm: int, log=print) -> list:
    """Registers, shared memory and occupancy of the signature kernels a device loaded for one case
    (none under the simulator, which compiles nothing)."""
    if gpu is None or gpu.simulator:
        return []
    from gpu_dedup.bench.occupancy import _line, device_resources

    try:
        rows = device_resources(gpu, kind, n, num_perm)
    except Exception as exc:  # noqa: BLE001 - a driver query must not end the measurements
        log(f"kernel resources of {kind}:{n} x {num_perm} not read: {type(exc).__name__}: {exc}")
        return []
    for row in rows:
        log(_line(row))
    return rows


def kernel_ratios(rows: list) -> list:
    """Per (docs, shingles, permutations): the warp kernel's speed on device text (``gpu-kernel``) over cuDF's
    ``str.minhash`` and over the block kernel's (their seconds over its seconds), where both were measured."""
    timed = {(r["docs"], r["shingle"], r["num_perm"], r["backend"]): r for r in rows if r.get("seconds")}
    out = []
    for (d, sh, p, backend), r in timed.items():
        if backend != "gpu-kernel":
            continue
        row = {"docs": d, "shingle": sh, "num_perm": p, "gpu_kernel_mb_per_s": r["mb_per_s"]}
        for name, other in (("vs_cudf", "cudf"), ("vs_block_kernel", "gpu-block-kernel")):
            if (d, sh, p, other) in timed:
                row[name] = round(timed[(d, sh, p, other)]["seconds"] / r["seconds"], 2)
        out.append(row)
    return out


def run_benchmark(docs=(100_000, 1_000_000), perms=(128, 260), shingles=SHINGLES, bits=32, backends=("auto",),
                  seed=0, out=None, log=print, words=(60, 400), corpus_dir=None, deadline: float | None = None,
                  cases=None) -> dict:
    from gpu_dedup.backends import get_backend
    from gpu_dedup.backends.strings import string_buffers
    from gpu_dedup.errors import BackendError
    from gpu_dedup.kernels.params import hash_params

    want = set(backends)
    auto = "auto" in want
    if cases:  # (kind, n, num_perm) pairs instead of every shingle with every permutation count
        cases = [tuple(c) for c in cases]
        shingles = list(dict.fromkeys((kind, n) for kind, n, _ in cases))
        perms = list(dict.fromkeys(p for _, _, p in cases))
    cpu = get_backend("cpu") if auto or "cpu" in want else None
    gpu, gpu_reason = None, None
    if auto or want & {"gpu", "gpu-block", "cudf"}:
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
    corpus = planted_text(max(docs), seed, words, corpus_dir, log)
    log(f"corpus: {max(docs):,} documents, {corpus.nbytes / 2**20:,.0f} MiB generated and normalized in "
        f"{time.perf_counter() - t0:.1f}s")
    rows = []
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
        "kernel_resources": [],
    }
    header = f"{'docs':>9} {'shingle':>8} {'perm':>5} {'backend':>11} {'seconds':>9} {'MB/s':>9} {'docs/s':>12} same"
    log(header)
    for n_docs in docs:
        texts = corpus.slice(0, n_docs)
        strings = string_buffers(texts)
        mb = strings.nbytes / 1e6
        for spec in shingles:
            kind, n = parse_shingle(spec) if isinstance(spec, str) else spec
            for num_perm in perms:
                if cases and (kind, n, num_perm) not in cases:
                    continue
                if deadline is not None and time.time() + 10 > deadline:
                    rows.append({"docs": n_docs, "shingle": f"{kind}:{n}", "num_perm": num_perm, "backend": "all",
                                 "skipped": f"{max(0.0, deadline - time.time()):.0f}s left before the deadline"})
                    log(f"{n_docs:>9,} {kind + ':' + str(n):>8} {num_perm:>5}: skipped (deadline)")
                    continue
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
                if gpu is not None and "gpu-block" in want:
                    measured.append(_block_kernel_row(gpu, strings, warm, params, kind, n, ref_sig, timer))
                result["kernel_resources"] += _kernel_resources(gpu, kind, n, num_perm, log)
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
                    if name.startswith("gpu"):
                        row["kernel"] = "block" if name == "gpu-block-kernel" else gpu.signature_kernel
                    rows.append(row)
                    flag = "" if same is None else ("yes" if same else "NO")
                    log(f"{n_docs:>9,} {kind + ':' + str(n):>8} {num_perm:>5} {name:>11} {sec:>9.3f} "
                        f"{mb / sec:>9.1f} {n_docs / sec:>12,.0f} {flag}")
                if out:  # after every measurement: a run stopped from outside keeps what it measured
                    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
                    _write_json(out, result)
    result["ratios"] = kernel_ratios(rows)
    for r in result["ratios"]:
        log(f"{r['shingle']} x {r['num_perm']}: the warp kernel at {r['gpu_kernel_mb_per_s']:,.0f} MB/s, "
            + ", ".join(f"{r[k]}x {what}" for k, what in (("vs_cudf", "cuDF"), ("vs_block_kernel", "the block kernel"))
                        if k in r))
    log("")
    log(markdown_table(result))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        _write_json(out, result)
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


# end-to-end configurations: settings on top of the default config, and the corpus they read
CONFIGS = {
    "default": ({}, "text"),  # Jaccard, word 5-grams, 128 permutations, 16 x 8
    "fineweb": ("fineweb", "text"),  # word 5-grams, 112 permutations, 14 x 8
    "nemo_curator": ("nemo_curator", "text"),  # char 24-grams, 260 permutations, 20 x 13
    "cosine-vectors": ({"similarity": "cosine", "lsh": {"threshold": 0.9}, "input": {"vector_column": "emb"}},
                       "vectors"),
    "cosine-text": ({"similarity": "cosine", "lsh": {"threshold": 0.9}}, "text"),
}


def config_settings(name: str) -> tuple[dict, str]:
    """(settings, corpus kind) of an end-to-end configuration: a name of CONFIGS or a preset name."""
    from gpu_dedup.config import Config

    base, kind = CONFIGS.get(name, (name, "text"))
    if isinstance(base, str):  # a preset
        base = Config.from_yaml(base).to_dict()
    inp = {**base.get("input", {}), "id_column": "id"}
    return {**base, "input": inp}, kind


def _write_json(path, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def _planted_shards(path, n_docs: int, seed: int, words, shards: int):
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    sample = planted_corpus(n_docs=n_docs, n_clusters=max(1, n_docs // 40), words=words, seed=seed)
    import pyarrow.compute as pc

    write_shards(sample.table.select(["id", "text"]), path, shards=shards)
    return int(pc.sum(pc.binary_length(sample.table.column("text"))).as_py() or 0), sample.table.num_rows


@contextlib.contextmanager
def _kernels_first(first: bool):
    """With ``first``: the GPU backend loads its kernels before the read stage instead of on a thread beside it
    (``Backend.loads_beside_read``; the ``gpu-kernels-first`` arm, run first in a fresh process to compare the two)."""
    if not first:
        yield
        return
    from gpu_dedup.backends.gpu import GPUBackend

    GPUBackend.loads_beside_read = False
    try:
        yield
    finally:
        GPUBackend.loads_beside_read = True


def _timed_run(inputs, out, settings: dict, profile=None):
    """(seconds, result) of one run; with ``profile`` (a path) under cProfile, its costliest calls
    written there."""
    import cProfile
    import io
    import pstats
    import shutil

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    shutil.rmtree(out, ignore_errors=True)
    cfg = Config.from_dict(settings)
    prof = cProfile.Profile() if profile is not None else None
    t0 = time.perf_counter()
    res = prof.runcall(run_dedup, inputs, out, cfg) if prof is not None else run_dedup(inputs, out, cfg)
    sec = time.perf_counter() - t0
    if prof is None:
        return sec, res
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(60)
    os.makedirs(os.path.dirname(os.path.abspath(profile)), exist_ok=True)
    with open(profile, "w") as f:
        f.write(f"# {sec:.2f}s under cProfile\n" + text.getvalue())
    return sec, res


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
               shards: int = 16, workdir=None, log=print, configs=None, corpus_dir=None, warmup_docs: int = 0,
               deadline: float | None = None, on_row=None, profile_dir=None, modes=("shards",),
               copies: int = 1) -> list:
    """Parquet shards to deduplicated shards on each backend (CPU: every host core), same corpus and
    config: seconds (and seconds per stage), documents/s, GB/s of text, host<->device bytes per stage, and
    every output file compared byte for byte with the first backend's.

    ``configs``: names of :data:`CONFIGS` or presets (default: ``preset``, else ``default``).
    ``corpus_dir``: where the planted shards are written and reused (default: a temporary directory).
    ``warmup_docs``: each backend first runs the config on that many documents (untimed), so that
    compilation stays out of the timed run.  ``deadline`` (``time.time()`` seconds): a run that would
    start too late is skipped, with a row saying so.  ``on_row(rows)`` is called after every row.
    ``profile_dir``: each timed GPU run also runs under cProfile (little overhead: the GPU path makes few
    Python calls), and its 60 costliest functions go to ``profile-<config>-<backend>.txt`` there.
    ``copies``: above 1, the corpus is that many near-duplicate copies of the planted one (:func:`replicated_dir`:
    10^7 documents from the planted 10^6 in seconds).
    ``modes``: ``shards`` (deduplicated shards written) and ``list`` (``output.shards: false``: the removal
    list alone, what NeMo Curator's identification step produces), each its own group of backends.
    Each row books the run's seconds as its report does (stages, named fixed costs, unbooked glue) plus
    ``publish_seconds``, what follows the report (the files' publication).
    A run that raises gives a row with its error; the next runs go on."""
    import tempfile
    from pathlib import Path

    configs = list(configs or [preset or "default"])
    rows, took = [], {}

    def add(row):
        rows.append(row)
        if on_row is not None:
            on_row(rows)

    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        root = Path(corpus_dir) if corpus_dir else tmp
        for n_docs in docs:
            for name in configs:
                settings, kind = config_settings(name)
                inputs, payload, n = planted_dir(root, n_docs, seed, words, shards, kind, log)
                if copies > 1:
                    inputs, payload, n = replicated_dir(inputs, copies, log)
                warm_in = planted_dir(root, warmup_docs, seed, words, 2, kind, log)[0] if warmup_docs else None
                for mode in modes:  # shards, then the removal list (output.shards: false) where asked
                    _end_to_end_group(name, n, payload, kind, settings, mode, backends, inputs, warm_in, tmp,
                                      took, deadline, add, log, warmup_docs, profile_dir)
    return rows


def _end_to_end_group(name, n, payload, kind, settings, mode, backends, inputs, warm_in, tmp, took, deadline, add,
                      log, warmup_docs, profile_dir) -> None:
    """The runs of one configuration and output mode on each backend, each compared with the first's outputs
    (bytes and content); a row each (see :func:`end_to_end`)."""
    import shutil
    import traceback
    from pathlib import Path

    import numba

    first, group = None, []
    for backend in backends:
        key = (backend, mode)
        base = {"suite": "end-to-end", "config": name, "preset": name, "docs": n, "backend": backend, "mode": mode,
                "payload": kind, "text_gb": round(payload / 1e9, 3)}
        run_settings = {**settings, "backend": backend}
        if backend == "gpu-kernels-first":  # the GPU backend with its kernels loaded before the read, not beside it
            run_settings = {**settings, "backend": "gpu"}
        if backend == "gpu-pyarrow":  # the GPU backend with its shards read and written on the host
            run_settings = {**settings, "backend": "gpu",
                            "gpu": {**settings.get("gpu", {}), "reader": "pyarrow", "writer": "pyarrow"}}
        if mode == "list":  # NeMo Curator's identification step: which rows to remove, no shards written
            run_settings["output"] = {**run_settings.get("output", {}), "shards": False}
        expect = took.get(key, 0.0) * 0.8
        if deadline is not None and time.time() + expect + 5 > deadline:
            add({**base, "skipped": f"{max(0.0, deadline - time.time()):.0f}s left before the "
                                    f"deadline; the last {backend} run took {took.get(key, 0):.0f}s"})
            log(f"end-to-end {name} {backend} {mode}: skipped (deadline)")
            continue
        out = tmp / f"out-{n}-{name}-{backend}-{mode}"
        try:
            warm = _timed_run(warm_in, tmp / "warm", run_settings)[0] if warm_in is not None else None
            profile = (Path(profile_dir) / f"profile-{name}-{backend}-{mode}.txt"
                       if profile_dir and backend.startswith("gpu") else None)
            with _kernels_first(backend == "gpu-kernels-first"):
                sec, res = _timed_run(inputs, out, run_settings, profile)
        except Exception as exc:  # one failing run must not stop the others
            add({**base, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            log(f"end-to-end {name} {backend} {mode}: FAILED {type(exc).__name__}: {exc}")
            log(traceback.format_exc())
            continue
        took[key] = sec
        rep = res.report
        stages = rep["stages"]
        row = {**base, "seconds": round(sec, 3), "docs_per_s": round(n / sec),
               "gb_per_s": round(payload / 1e9 / sec, 4),
               "tb_per_hour": round(payload / 1e12 / sec * 3600, 3),
               "stage_seconds": {k: v["seconds"] for k, v in stages.items()},
               # the run's books (report.json): named fixed costs, the glue, and what follows the report
               "fixed_seconds": rep.get("fixed_seconds", {}), "unbooked_seconds": rep.get("unbooked_seconds"),
               "publish_seconds": round(sec - rep.get("wall_seconds", sec), 3),
               "kernel_prepare_seconds": rep.get("kernel_prepare_seconds", 0.0),
               "transfers": _moved(rep), "removed": rep["counts"]["removed"], "counts": rep["counts"]}
        if stages.get("verify", {}).get("round_seconds"):  # where verify's time went: each star round's parts
            row["verify_rounds"] = stages["verify"]["round_seconds"]
        write_parts = {k: v for k, v in stages.get("write", {}).items() if k.endswith("_seconds") and k != "seconds"}
        if write_parts:  # where the write stage's time went: the device's write, the files' checks, syncs, digests
            row["write_parts"] = write_parts
        if warm is not None:
            row["warmup_seconds"] = round(warm, 3)
            row["warmup_docs"] = warmup_docs
        if backend == "cpu":
            row["cpu_threads"] = numba.get_num_threads()
        if "gpu" in rep:
            row["gpu_memory"] = rep["gpu"]
            row["reader"] = rep["gpu"].get("reader")
            row["writer"] = rep["gpu"].get("writer")
        if first is None:
            first = (out, backend)
        else:
            cmp = compare_outputs(first[0], out)
            row["identical_to"] = first[1]
            row["identical"] = cmp["identical"]
            row["content_identical"] = cmp["content_identical"]
            row["compared"] = cmp
            shutil.rmtree(out, ignore_errors=True)
        add(row)
        group.append(row)
        log(f"end-to-end {name} {n:>10,} docs {backend:>4} {mode:>6}: {sec:8.2f}s {n / sec:>12,.0f} docs/s "
            f"{payload / 1e9 / sec:8.3f} GB/s" + (f"; outputs byte-identical to {first[1]}: {row['identical']}, "
                                                   f"content-identical: {row['content_identical']}"
                                                   if "identical" in row else ""))
    if first is not None:
        shutil.rmtree(first[0], ignore_errors=True)
    for r in group[1:]:
        log(f"end-to-end {name} {n:,} docs {mode}: {r['backend']} takes {r['seconds'] / group[0]['seconds']:.2f}x "
            f"the time of {group[0]['backend']} (speed-up {group[0]['seconds'] / r['seconds']:.2f}x)")


def differs(row: dict) -> bool:
    """A run whose outputs differ from the first backend's: in content where the row says (cuDF writes the
    same tables with other bytes, which is the rule across backends), else byte for byte."""
    if "content_identical" in row:
        return row["content_identical"] is False
    return row.get("identical") is False


def _check(checks: list, name: str, fn, log=print, repeat: bool = True) -> None:
    """Run ``fn`` twice (the first call compiles; once without ``repeat``): it returns (ok, detail); record
    ok / differs / failed."""
    import traceback

    entry = {"check": name}
    try:
        t0 = time.perf_counter()
        ok, detail = fn()
        entry["first_seconds"] = round(time.perf_counter() - t0, 3)
        if repeat:
            t0 = time.perf_counter()
            ok, detail = fn()
            entry["seconds"] = round(time.perf_counter() - t0, 3)
        entry["status"] = "ok" if ok else "differs"
        if detail:
            entry["detail"] = detail
    except Exception as exc:
        entry["status"] = "failed"
        entry["error"] = f"{type(exc).__name__}: {exc}"[:1500]
        log(traceback.format_exc())
    checks.append(entry)
    log(f"smoke {name:34s} {entry['status']:8s} first {entry.get('first_seconds', '-')}s, then "
        f"{entry.get('seconds', '-')}s {entry.get('detail', '') or entry.get('error', '')}")


cuda = None  # numba.cuda, bound on first use of :func:`_plain_kernel` (a CPU run never imports it)


def _add_one(x):
    i = cuda.grid(1)
    if i < x.shape[0]:
        x[i] += 1


def _plain_kernel():
    """``_add_one`` compiled by ``numba.cuda.jit``: the plainest kernel, to tell a broken CuPy/numba-cuda
    handoff from a broken gpu_dedup kernel.  (A module-level function: the CUDA simulator swaps the
    ``cuda`` global of the kernels it runs.)"""
    global cuda
    if cuda is None:
        from numba import cuda as numba_cuda

        cuda = numba_cuda
    return cuda.jit(_add_one)


def smoke(docs: int = 5000, seed: int = 0, words=(60, 400), log=print, repeat: bool = True) -> dict:
    """The GPU answers and agrees with the CPU on ``docs`` planted documents (see the module docstring)."""
    import pyarrow as pa

    from gpu_dedup.backends import get_backend, to_device, to_host
    from gpu_dedup.backends.strings import StringBuffers
    from gpu_dedup.config import NormalizeConfig
    from gpu_dedup.evaluation.sample import planted_corpus, planted_embeddings
    from gpu_dedup.kernels.params import hash_params
    from gpu_dedup.stages import projections
    from gpu_dedup.stages.verify import cosine_similarity, hamming_distance, vector_norms

    gpu, cpu = get_backend("gpu"), get_backend("cpu")
    xp = gpu.xp
    repeat = repeat and not gpu.simulator  # the simulator compiles nothing: one call says it all
    checks: list = []
    result = {"suite": "smoke", "docs": docs, "device": gpu.device_name, "gpu_mode": gpu.mode, "checks": checks}
    log(f"smoke: {gpu.mode}")

    def same(a, b) -> bool:
        a, b = to_host(a), to_host(b)
        return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))

    def plain_kernel():
        x = xp.arange(4096, dtype=xp.int64)
        _plain_kernel()[16, 256](x)
        gpu.synchronize()
        return bool((to_host(x) == np.arange(1, 4097)).all()), None

    _check(checks, "cuda.jit kernel on the backend's arrays", plain_kernel, log, repeat)
    raw = planted_corpus(n_docs=docs, n_clusters=max(1, docs // 40), words=words, seed=seed).table.column("text")
    raw = raw.combine_chunks() if isinstance(raw, pa.ChunkedArray) else raw
    ncfg = NormalizeConfig()
    norm = {}

    def normalize():
        got, bad = gpu.normalize_column(raw, ncfg)
        want, want_bad = cpu.normalize_column(raw, ncfg)
        norm["host"] = want
        return same(got.offsets, want.offsets) and same(got.data, want.data) and bad == want_bad, \
            f"{want.nbytes / 1e6:.1f} MB"

    _check(checks, "normalize (text kernel)", normalize, log, repeat)
    host = norm.get("host") or cpu.normalize_column(raw, ncfg)[0]
    dev = StringBuffers(to_device(host.offsets, xp), to_device(host.data, xp))
    rng = np.random.default_rng(seed)
    pairs = min(20_000, 20 * docs)
    left = rng.integers(0, docs, pairs)
    right = rng.integers(0, docs, pairs)
    # the simulator runs every device thread in Python (char 5 x 260 took 144 s of a rehearsal on 2 slow
    # cores): a tenth of the permutations checks the same code
    layouts = (("char", 5, 260, (20, 13)), ("word", 5, 128, (16, 8))) if not gpu.simulator else \
        (("char", 5, 26, (2, 13)), ("word", 5, 16, (2, 8)))
    for kind, n, perms, (bands, rows) in layouts:
        params = hash_params(42, perms)
        sigs = {}

        def signatures(kind=kind, n=n, params=params, sigs=sigs):
            want, want_c = cpu.minhash(host, params, kind, n)
            got, got_c = gpu.minhash(host, params, kind, n)  # host text in
            ok = same(got, want) and same(got_c, want_c)
            if not gpu.simulator:  # device text in, left on the device (the simulator has no device side)
                on_card, on_card_c = gpu.minhash(dev, params, kind, n)
                ok = ok and same(on_card, want) and same(on_card_c, want_c)
            sigs["cpu"] = want
            return ok, f"{perms} perms"

        _check(checks, f"minhash {kind} {n} x {perms}", signatures, log, repeat)
        want_sig = sigs.get("cpu")
        if want_sig is None:
            continue

        def bands_(want_sig=want_sig, params=params, bands=bands, rows=rows):
            return same(gpu.band_hashes(want_sig, bands, rows, params.band_base),
                        cpu.band_hashes(want_sig, bands, rows, params.band_base)), f"{bands} x {rows}"

        _check(checks, f"band hashes {bands} x {rows}", bands_, log, repeat)

        def sig_sim(want_sig=want_sig):
            return same(gpu.signature_similarity(want_sig, left, right),
                        cpu.signature_similarity(want_sig, left, right)), None

        _check(checks, f"signature similarity ({kind})", sig_sim, log, repeat)

        def jaccard(kind=kind, n=n, params=params):
            go, gv = gpu.shingle_sets(host, params, kind, n)
            co, cv = cpu.shingle_sets(host, params, kind, n)
            return same(go, co) and same(gv, cv) and same(gpu.jaccard_pairs(co, cv, left, right),
                                                          cpu.jaccard_pairs(co, cv, left, right)), None

        _check(checks, f"shingle sets + Jaccard ({kind} {n})", jaccard, log, repeat)
    params = hash_params(42, 128)

    def exact():
        return same(gpu.exact_hashes(host, params.exact_seed1, params.exact_seed2),
                    cpu.exact_hashes(host, params.exact_seed1, params.exact_seed2)), None

    _check(checks, "exact hashes", exact, log, repeat)

    def components():
        m = max(10, 40 * docs)
        src, dst = rng.integers(0, m, m // 2), rng.integers(0, m, m // 2)
        return same(gpu.components(src, dst, m), cpu.components(src, dst, m)), f"{m:,} nodes"

    _check(checks, "components", components, log, repeat)
    emb = planted_embeddings(n=docs, dim=VECTOR_DIM, n_clusters=max(1, docs // 10), seed=seed).vectors
    emb_dev = to_device(emb, xp)

    def projected():
        want = projections.signatures(emb, 256, 7, np)
        got = projections.signatures(emb_dev, 256, 7, xp)
        ok = same(got.bits, want.bits) and same(got.status, want.status)
        bh = projections.band_hashes(got.bits, 16, 16, xp)
        return ok and same(bh, projections.band_hashes(want.bits, 16, 16, np)), "256 bits, 16 x 16"

    _check(checks, "cosine projections + bands", projected, log, repeat)

    def cosine_pairs():
        want = cosine_similarity(left, right, emb, backend=cpu)
        got = cosine_similarity(to_device(left, xp), to_device(right, xp), emb_dev, backend=gpu)
        norms = same(vector_norms(emb_dev, gpu), vector_norms(emb, cpu))
        return norms and same(got, want), None

    _check(checks, "cosine pairs + row norms", cosine_pairs, log, repeat)

    def hamming():
        bits = projections.signatures(emb, 256, 7, np).bits
        return same(hamming_distance(to_device(left, xp), to_device(right, xp), to_device(bits, xp), gpu),
                    hamming_distance(left, right, bits, cpu)), None

    _check(checks, "Hamming pairs", hamming, log, repeat)

    def simhash():
        want = projections.text_signatures(host, 256, 7, "word", 3, backend=cpu)
        got = projections.text_signatures(dev, 256, 7, "word", 3, backend=gpu)
        return same(got.bits, want.bits) and same(got.status, want.status), "word 3-grams, tf"

    _check(checks, "text SimHash", simhash, log, repeat)

    def text_tfidf():  # the cosine-text run's device steps: document frequencies, tf-idf SimHash, sparse cosine
        from gpu_dedup.stages.vectors import document_frequencies, idf_table
        from gpu_dedup.stages.verify import text_cosine_similarity

        df, n = document_frequencies(host, "word", 3, 16, backend=cpu)
        got_df, _ = document_frequencies(dev, "word", 3, 16, backend=gpu)
        idf = idf_table(df, n, 16)
        want = projections.text_signatures(host, 1024, 7, "word", 3, idf=idf, backend=cpu)
        got = projections.text_signatures(dev, 1024, 7, "word", 3, idf=idf, backend=gpu)
        cos = text_cosine_similarity(left, right, host, "word", 3, idf, backend=cpu)
        ok = same(got_df, df) and same(got.bits, want.bits) and same(got.status, want.status)
        return ok and same(text_cosine_similarity(to_device(left, xp), to_device(right, xp), dev, "word", 3, idf,
                                                  backend=gpu), cos), "word 3-grams, tf-idf, 1024 bits"

    _check(checks, "text tf-idf: frequencies, SimHash, sparse cosine", text_tfidf, log, repeat)
    result["passed"] = sum(c["status"] == "ok" for c in checks)
    result["failed"] = [c["check"] for c in checks if c["status"] != "ok"]
    log(f"smoke: {result['passed']} of {len(checks)} checks ok" + (f"; not ok: {result['failed']}"
                                                                      if result["failed"] else ""))
    return result


def components_bench(nodes: int = 1_000_000, edges: int = 1_000_000, seed: int = 0, log=print) -> list:
    """Connected components of a random graph: the GPU backend's (cuGraph when it imports), its CuPy
    label propagation, and the CPU's; every labelling is compared with the CPU's."""
    from gpu_dedup.backends import get_backend, to_device, to_host
    from gpu_dedup.backends.gpu import components_xp

    gpu, cpu = get_backend("gpu"), get_backend("cpu")
    rng = np.random.default_rng(seed)
    src, dst = rng.integers(0, nodes, edges), rng.integers(0, nodes, edges)
    timer = _Timer(gpu.synchronize)
    gpu.components(src[:1000], dst[:1000], nodes)  # warm-up: compile, allocate
    sec, want = timer(lambda: cpu.components(src, dst, nodes))
    rows = [{"suite": "components", "backend": "cpu", "nodes": nodes, "edges": edges, "seconds": round(sec, 4)}]
    s_dev, d_dev = to_device(src, gpu.xp), to_device(dst, gpu.xp)
    engine = "cuGraph" if gpu._cugraph() is not None and not gpu.simulator else "CuPy"
    sec, got = timer(lambda: gpu.components(s_dev, d_dev, nodes))
    rows.append({"suite": "components", "backend": f"gpu ({engine})", "nodes": nodes, "edges": edges,
                 "seconds": round(sec, 4), "identical": bool(np.array_equal(to_host(got), want))})
    if engine == "cuGraph":
        sec, got = timer(lambda: components_xp(gpu.xp, s_dev, d_dev, nodes, hook=gpu._hook))
        rows.append({"suite": "components", "backend": "gpu (CuPy)", "nodes": nodes, "edges": edges,
                     "seconds": round(sec, 4), "identical": bool(np.array_equal(to_host(got), want))})
    for r in rows:
        log(f"components {nodes:,} nodes {edges:,} edges {r['backend']:>14}: {r['seconds']:.3f}s"
            + (f", same labels as the CPU: {r['identical']}" if "identical" in r else ""))
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
    if result.get("smoke"):
        sm = result["smoke"]
        lines += ["## Smoke: GPU against CPU on a small planted corpus", "",
                  f"{sm['docs']:,} documents on {sm['device']}: {sm['passed']} of {len(sm['checks'])} checks ok.", "",
                  "| check | status | first call s | second call s | detail |", "| --- | --- | ---: | ---: | --- |"]
        for c in sm["checks"]:
            lines.append(f"| {c['check']} | {c['status']} | {c.get('first_seconds', '')} | {c.get('seconds', '')} | "
                         f"{(c.get('detail') or c.get('error') or '')[:120]} |")
        lines.append("")
    if result.get("end_to_end"):
        lines += end_to_end_markdown(result["end_to_end"])
    if result.get("components"):
        lines += ["## Connected components of a random graph", "", "| nodes | edges | backend | seconds | same labels |",
                  "| ---: | ---: | --- | ---: | --- |"]
        for r in result["components"]:
            same = {True: "yes", False: "NO", None: ""}[r.get("identical")]
            lines.append(f"| {r['nodes']:,} | {r['edges']:,} | {r['backend']} | {r['seconds']} | {same} |")
        lines.append("")
    if result.get("dask"):
        from gpu_dedup.bench import cluster

        lines += cluster.markdown(result["dask"])
    if result.get("write"):
        parts = ("read_table", "write_first", "write", "check", "digests", "files", "stage")
        lines += ["## The GPU write stage's parts (every shard from the held device table)", "",
                  "`stage`: the write, check and digests as a run's write stage does them, one after another or "
                  "(streams) a shard per stream and thread. `host-sink`: `write` encodes every file into host "
                  "memory, `files` is each file's SHA-256 from memory, write, sync and check on a thread per file.", "",
                  "| variant | codec | " + " | ".join(parts) + " | MB written | rows ok | note |",
                  "| --- | --- |" + " ---: |" * len(parts) + " ---: | --- | --- |"]
        for r in result["write"]:
            sec = r.get("seconds", {})
            lines.append(f"| {r['variant']} | {r.get('codec', '')} | " + " | ".join(str(sec.get(k, "")) for k in parts)
                         + f" | {round(r['bytes_written'] / 1e6, 1) if 'bytes_written' in r else ''} | "
                         f"{r.get('rows_ok', '')} | {r.get('error', '')} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def end_to_end_markdown(rows: list) -> list:
    """Markdown lines of end-to-end rows: one table of runs (mode: ``shards`` or the removal ``list``; ``same
    bytes`` / ``same content`` as the group's first backend), then every run's seconds: stages, named fixed
    costs, unbooked glue and the publication after the report, which add up to its wall time."""
    lines = ["## End to end (Parquet shards to deduplicated shards, or to the removal list)", "",
             "| config | docs | GB | mode | backend | reader / writer | seconds | docs/s | TB/h | x first | "
             "same bytes | same content | host->device | device->host |",
             "| --- | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | ---: | --- | --- | ---: | ---: |"]
    firsts = {}
    for r in rows:
        name = r.get("config", r.get("preset", "default"))
        mode = r.get("mode", "shards")
        if "seconds" not in r:
            why = f"failed: {r['error'][:100]}" if "error" in r else f"skipped: {r.get('skipped', '')}"
            lines.append(f"| {name} | {r['docs']:,} | {r['text_gb']} | {mode} | {r['backend']} | | {why} "
                         "| | | | | | | |")
            continue
        first = firsts.setdefault((name, r["docs"], mode), r)
        up = sum(v["host_to_device_bytes"] for v in r["transfers"].values())
        down = sum(v["device_to_host_bytes"] for v in r["transfers"].values())
        yes = {True: "yes", False: "NO", None: ""}
        same, content = yes[r.get("identical")], yes[r.get("content_identical")]
        if r.get("content_identical") is False:
            content += " (" + ", ".join(list(r["compared"].get("content_differs", {})) +
                                        r["compared"]["only_in_one"])[:80] + ")"
        io = f"{r.get('reader') or 'pyarrow'} / {_writer_cell(r.get('writer'))}"
        lines.append(f"| {name} | {r['docs']:,} | {r['text_gb']} | {mode} | {r['backend']} | {io} | {r['seconds']} "
                     f"| {r['docs_per_s']:,} | {r['tb_per_hour']} | {first['seconds'] / r['seconds']:.2f} | {same} "
                     f"| {content} | {up / 1e6:,.1f} MB | {down / 1e6:,.1f} MB |")
    timed = [r for r in rows if "stage_seconds" in r]
    stages = list(dict.fromkeys(k for r in timed for k in r["stage_seconds"]))
    fixed = list(dict.fromkeys(k for r in timed for k in r.get("fixed_seconds", {})))
    if timed:
        lines += ["", "Where each run's seconds went: stages, then named fixed costs, the unbooked glue between "
                  "them and the publication after the report (these add up to the seconds above):", "",
                  "| config | mode | backend | " + " | ".join(stages + fixed) + " | unbooked | publish |",
                  "| --- | --- | --- | " + " | ".join("---:" for _ in stages + fixed) + " | ---: | ---: |"]
        for r in timed:
            cells = [str(r["stage_seconds"].get(k, "")) for k in stages] + \
                [str(r.get("fixed_seconds", {}).get(k, "")) for k in fixed]
            lines.append(f"| {r.get('config', 'default')} | {r.get('mode', 'shards')} | {r['backend']} | "
                         f"{' | '.join(cells)} | {r.get('unbooked_seconds', '')} | {r.get('publish_seconds', '')} |")
    moved = [(r, stage, t) for r in timed for stage, t in r["transfers"].items()]
    if moved:
        lines += ["", "Host<->device bytes per stage (GPU rows):", ""]
        for r, stage, t in moved:
            lines.append(f"- {r.get('config', 'default')}, {r['docs']:,} docs, {r.get('mode', 'shards')}, {stage}: "
                         f"{t['host_to_device_bytes'] / 1e6:,.1f} MB to the device, "
                         f"{t['device_to_host_bytes'] / 1e6:,.1f} MB to the host")
    lines.append("")
    return lines


def _writer_cell(writer) -> str:
    if isinstance(writer, dict):  # shards per writer
        return ", ".join(f"{k} {v}" for k, v in writer.items() if v) or "none"
    return writer or "pyarrow"


def markdown_table(result: dict) -> str:
    """The results as a Markdown table headed by device, CPU and date (for the README)."""
    lines = [f"Signature kernel, {result['date'][:10]}: GPU {result['device'] or 'not measured'}; "
             f"CPU {result['cpu']} ({result['cores']} threads); hash_bits "
             f"{next((r['hash_bits'] for r in result['rows'] if 'hash_bits' in r), '?')}.", "",
             "| docs | MB | shingles | num_perm | backend | seconds | MB/s | docs/s | same as CPU |",
             "| ---: | ---: | --- | ---: | --- | ---: | ---: | ---: | --- |"]
    for r in result["rows"]:
        if "error" in r or "skipped" in r:
            what = f"failed: {r['error'][:60]}" if "error" in r else f"skipped: {r['skipped']}"
            lines.append(f"| {r['docs']:,} | | {r['shingle']} | {r['num_perm']} | {r['backend']} | {what} | | | |")
            continue
        same = {True: "yes", False: "NO", None: ""}[r.get("identical_to_cpu")]
        lines.append(f"| {r['docs']:,} | {r['text_mb']:,} | {r['shingle']} | {r['num_perm']} | {r['backend']} | "
                     f"{r['seconds']:.3f} | {r['mb_per_s']:,.1f} | {r['docs_per_s']:,} | {same} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="gpu-dedup bench gpu", description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=at_least(6), nargs="+", default=[100_000, 1_000_000], help="corpus sizes (documents)")
    p.add_argument("--perms", type=positive_int, nargs="+", default=[128, 260], help="num_perm values")
    p.add_argument("--shingles", nargs="+", default=list(SHINGLES), type=parse_shingle, help="e.g. char:5 word:5")
    p.add_argument("--bits", type=int, choices=(32,), default=32, help="signature bits (32 since hash family v2)")
    p.add_argument("--backends", nargs="+", default=["auto"], choices=("auto", "cpu", "gpu", "gpu-block", "cudf"),
                   help="auto: cpu, plus gpu and cudf where usable (says why not); gpu-block: the block kernel too")
    p.add_argument("--cases", nargs="+", type=parse_case,
                   help="shingles:n x permutations pairs, e.g. char:24x260 word:5x128 (instead of --shingles x --perms)")
    p.add_argument("--seed", type=int, default=0, help="corpus seed")
    p.add_argument("--words", type=positive_int, nargs=2, default=[60, 400], metavar=("MIN", "MAX"),
                   help="words per planted document (log-uniform; default 60 400, about 1.6 KB)")
    p.add_argument("--out", help="write the results as JSON here (and Markdown beside it)")
    p.add_argument("--suite", nargs="+", default=["signatures"],
                   choices=("signatures", "end-to-end", "dask", "smoke", "corpus", "components", "write", "all"),
                   help="what to measure (see above; all = signatures, end-to-end and dask)")
    p.add_argument("--e2e-docs", type=at_least(6), nargs="+", default=[1_000_000],
                   help="corpus sizes of end-to-end and dask")
    p.add_argument("--e2e-backends", nargs="+", default=["cpu", "gpu"],
                   choices=("cpu", "gpu", "gpu-pyarrow", "gpu-kernels-first"),
                   help="gpu-pyarrow: the GPU backend with the shards read and written on the host "
                        "(gpu.reader and gpu.writer: pyarrow); gpu-kernels-first: the GPU backend with its kernels "
                        "loaded before the read stage, not beside it (first, in a fresh process, to compare)")
    p.add_argument("--preset", help="config preset of the end-to-end runs (default, fineweb, nemo_curator)")
    p.add_argument("--configs", nargs="+", help=f"end-to-end configurations: {', '.join(CONFIGS)} or a preset name")
    p.add_argument("--workdir", help="where the end-to-end corpora are written (default: the system temp)")
    p.add_argument("--corpus-dir", help="keep the planted shards here and reuse them in later calls")
    p.add_argument("--e2e-modes", nargs="+", default=["shards"], choices=("shards", "list"),
                   help="end-to-end outputs: shards (deduplicated shards) and/or list (output.shards: false, the "
                        "removal list alone)")
    p.add_argument("--copies", type=positive_int, default=1,
                   help="end-to-end on this many near-duplicate copies of the planted corpus (e.g. 10: 10^7 "
                        "documents from the planted 10^6, built in seconds)")
    p.add_argument("--warmup-docs", type=non_negative_int, default=0,
                   help="run each end-to-end configuration on this many documents first, untimed (compilation)")
    p.add_argument("--profile-dir", help="profile each end-to-end GPU run (cProfile; its costliest calls written here)")
    p.add_argument("--deadline-seconds", type=float,
                   help="skip the measurements that would start later than this many seconds from now")
    p.add_argument("--smoke-docs", type=at_least(6), default=5000, help="documents of the smoke suite (default 5000)")
    p.add_argument("--graph-nodes", type=positive_int, default=1_000_000,
                   help="nodes (and edges) of the components suite's random graph (default 1000000)")
    p.add_argument("--dask-workers", type=positive_int, nargs="+", default=[1, 2, 4],
                   help="dask suite: a cluster of each size, started once (GPU workers: all on one GPU)")
    p.add_argument("--dask-shuffles", nargs="+", default=["host", "device"], choices=("host", "device"),
                   help="dask suite: the routes of the joined runs (host arrays; device frames, cluster.shuffle: device)")
    p.add_argument("--dask-backend", default="gpu", choices=("gpu", "cpu"),
                   help="dask suite: Dask-CUDA workers (gpu) or CPU workers, beside one process of the same backend")
    p.add_argument("--dask-copies", type=non_negative_int, default=0,
                   help="dask suite: also this many near-duplicate copies of the largest corpus (10: 10^7 from 10^6), "
                        "if the deadline allows")
    p.add_argument("--dask-no-memory-probe", action="store_true",
                   help="dask suite: skip the device-memory runs (a tiny cluster.device_memory_limit)")
    p.add_argument("--rmm-async", action="store_true", help="dask suite: GPU workers with RMM's async allocator")
    p.add_argument("--dask-block-rows", type=positive_int, help="dask suite: cluster.block_rows of the joined runs")
    p.add_argument("--dry-run", action="store_true", help="check the arguments and configurations, run nothing")
    args = p.parse_args(argv)
    from gpu_dedup.backends import get_backend
    from gpu_dedup.errors import BackendError, ConfigError

    deadline = time.time() + args.deadline_seconds if args.deadline_seconds else None
    words = tuple(args.words)
    suites = {"signatures", "end-to-end", "dask"} if "all" in args.suite else set(args.suite)
    result = {"benchmark": "python -m gpu_dedup.bench.gpu --suite " + " ".join(sorted(suites))}
    for name in args.configs or []:
        if name not in CONFIGS:
            try:
                config_settings(name)
            except ConfigError as exc:
                print(f"error: --configs {name}: {exc}", file=sys.stderr)
                return 2

    if args.dry_run:
        print(f"dry run: suites {sorted(suites)}, configs {args.configs or [args.preset or 'default']}: arguments ok")
        return 0

    def save():
        if args.out and suites != {"signatures"}:
            os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
            _write_json(args.out, result)

    try:
        if "corpus" in suites:
            root = args.corpus_dir or args.workdir or "."
            kinds = {config_settings(c)[1] for c in (args.configs or ["default"])}
            result["corpus"] = [dict(zip(("path", "bytes", "rows"), (str(d), b, r))) | {"kind": k}
                                for n in args.e2e_docs for k in sorted(kinds)
                                for d, b, r in [planted_dir(root, n, args.seed, words, kind=k)]]
            save()
        if "smoke" in suites:
            result["smoke"] = smoke(args.smoke_docs, args.seed, words)
            save()
        if "signatures" in suites:
            result["signatures"] = run_benchmark(args.docs, args.perms, args.shingles, args.bits, args.backends,
                                                 args.seed, None if suites != {"signatures"} else args.out,
                                                 words=words, corpus_dir=args.corpus_dir, deadline=deadline,
                                                 cases=args.cases)
        if "end-to-end" in suites:
            result["end_to_end"] = []
            result["end_to_end"] = end_to_end(args.e2e_docs, args.e2e_backends, args.preset, args.seed, words,
                                              workdir=args.workdir, configs=args.configs,
                                              corpus_dir=args.corpus_dir, warmup_docs=args.warmup_docs,
                                              deadline=deadline, profile_dir=args.profile_dir,
                                              modes=tuple(args.e2e_modes), copies=args.copies,
                                              on_row=lambda rows: (result.__setitem__("end_to_end", rows), save()))
        if "dask" in suites:
            from gpu_dedup.bench.cluster import cluster_bench

            result["dask"] = []
            result["dask"] = cluster_bench(
                args.e2e_docs, args.dask_backend, args.dask_workers,
                [None if sh == "host" else sh for sh in args.dask_shuffles], args.dask_copies,
                corpus_dir=args.corpus_dir, workdir=args.workdir, words=words, seed=args.seed,
                warmup_docs=args.warmup_docs or 2000, memory_probe=not args.dask_no_memory_probe,
                rmm_async=args.rmm_async, block_rows=args.dask_block_rows, deadline=deadline,
                on_row=lambda rows: (result.__setitem__("dask", rows), save()))
        if "components" in suites:
            result["components"] = components_bench(args.graph_nodes, args.graph_nodes, args.seed)
            save()
        if "write" in suites:  # the GPU write stage's parts, a fresh process per I/O variant (bench.write_probe)
            from pathlib import Path

            from gpu_dedup.bench.write_probe import VARIANTS as WRITE_VARIANTS
            from gpu_dedup.bench.write_probe import probe as write_probe

            root, _, _ = planted_dir(args.corpus_dir or args.workdir or ".", max(args.e2e_docs), args.seed, words)
            left = None if deadline is None else deadline - time.time()
            result["write"] = write_probe(Path(root), cap=max(10.0, min(60.0, (left or 300) / len(WRITE_VARIANTS))))
            save()
        on_gpu = any(b.startswith("gpu") for b in args.e2e_backends) or bool({"dask", "smoke", "components"} & suites)
        if "dask" in suites and args.dask_backend == "cpu" and not {"end-to-end", "smoke", "components"} & suites:
            on_gpu = False  # CPU workers only: no GPU to describe
        gpu = get_backend("gpu") if ({"end-to-end", "dask", "smoke", "components"} & suites and on_gpu) else None
    except (BackendError, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if suites == {"signatures"}:
        return 0
    result["environment"] = environment(gpu)
    print(markdown_report(result))
    if args.out:
        save()
        with open(os.path.splitext(args.out)[0] + ".md", "w") as f:
            f.write(markdown_report(result))
        print(f"written: {args.out} and {os.path.splitext(args.out)[0]}.md")
    e2e = result.get("end_to_end", [])
    from gpu_dedup.bench.cluster import problems

    bad = [r for r in e2e + result.get("components", []) if differs(r)] + \
        [r for r in e2e if "error" in r] + problems(result.get("dask", []))
    return 1 if bad or result.get("smoke", {}).get("failed") else 0


if __name__ == "__main__":
    sys.exit(main())
