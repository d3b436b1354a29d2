"""First contact with a GPU: every tier-1 check in one command, inside a fixed time budget.

Run by ``bash results/gpu/first-contact.sh`` (or ``tier2.sh``) from the repository root, which runs this
file as a script (see results/gpu/README.md; the results stay there).  Standard library only, so it
reports even when gpu_dedup itself does not import.  Each step runs
as a child process with a time cap and its own log; a step that fails, or is stopped at its cap,
never stops the next one.  After every step the summary (``summary.md``, ``summary.json``) and one
tarball of all logs (``logs.tar.gz``) are rewritten under ``$OUT``: three files, nothing deeper,
so a call stopped from outside still returns what had finished.

``--rehearse`` runs the same steps on a CPU machine: the GPU backend in Numba's CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1``, ``GPU_DEDUP_SIMULATOR=1``), a tiny corpus, the packages the GPU image
lacks hidden, and the whole-suite ``--backend gpu`` step collected instead of run.  CI runs it
(tests/bench/test_first_contact.py), so the device minutes are not spent on a typo or a path.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the repository root (gpu_dedup/bench/first_contact.py)
# what the GPU image lacks (FIRST-CONTACT): hidden in a rehearsal, so a test that needs one of them and does
# not skip fails here first
IMAGE_LACKS = ("cudf", "pylibcudf", "rmm", "dask", "distributed", "dask_cuda", "dask_cudf", "cugraph", "nbformat",
               "nbclient", "ipykernel", "datasketch", "rensa")
# what tier 2's kit brings of them and a CPU machine has too: not hidden in a tier-2 rehearsal (its Dask steps
# run CPU processes as workers, with the GPU backend in the CUDA simulator)
KIT_ON_CPU = ("dask", "distributed")
# test selection by directory and marker (the files inside may move)
BACKEND_TESTS = ("tests/stages", "tests/backends", "tests/run", "tests/test_api.py")
CONFIGS = ("default", "nemo_curator", "cosine-vectors", "fineweb", "cosine-text")  # most wanted first
# tier 2's end-to-end configurations (the one-GPU targets), each with its shards and its removal list
# (FC_CUDF_CONFIGS picks others)
E2E_CUDF_CONFIGS = ("nemo_curator", "default", "fineweb", "cosine-text")
MAX_LOG_BYTES = 6 << 20  # a longer log keeps its first 1 MiB and its last 5 MiB in the tarball

# device defaults; a rehearsal uses REHEARSAL instead; FC_* variables override either
DEVICE = {"docs": 1_000_000, "sig_docs": 1_000_000, "smoke_docs": 5000, "warmup_docs": 2000, "words": "60 400",
          "sig_perms": "128 260", "configs": " ".join(CONFIGS), "deadline": 470, "graph_nodes": 1_000_000,
          "dask_docs": 1_000_000, "dask_workers": "1 2 4", "dask_copies": 10, "dask_block_rows": 0, "profile": 0,
          "copies": 10, "cudf_configs": " ".join(E2E_CUDF_CONFIGS), "scale_backends": "gpu cpu"}
REHEARSAL = {"docs": 10, "sig_docs": 10, "smoke_docs": 10, "warmup_docs": 10, "words": "5 15", "sig_perms": "16",
             "configs": "default cosine-vectors", "deadline": 480, "graph_nodes": 300, "dask_docs": 12,
             "dask_workers": "1 2", "dask_copies": 0, "dask_block_rows": 5, "profile": 0, "copies": 3,
             "cudf_configs": " ".join(E2E_CUDF_CONFIGS), "scale_backends": "gpu cpu"}
# step caps (seconds): a step is stopped there; the deadline caps them all
CAPS = {"setup": 150, "env": 60, "corpus": 240, "smoke": 150, "test-gpu": 150, "signatures": 90, "e2e": 260,
        "test-backend": 400, "kit": 240, "cudf-minhash": 120, "e2e-cudf": 240, "components": 60, "dask": 150, "write": 90,
        "scale": 150}
# a rehearsal's caps where they differ: the dask step's GPU workers run every GPU thread in Python there
REHEARSAL_CAPS = {"dask": 400, "signatures": 200}
# tier 2 needs the RAPIDS kit (cuDF, RMM, Dask-CUDA): these its wheels must pin
KIT_PINS = ("cudf-cu13", "pylibcudf-cu13", "rmm-cu13", "dask", "distributed", "dask-cuda", "dask-cudf-cu13", "numba")
MIN_SECONDS = {"test-backend": 30, "e2e": 30, "signatures": 20}  # not started with less time than this left
RESERVE = 10  # seconds kept for the last packing
# seconds one test may take (pytest-timeout): the slowest gpu-marked test took 22 s on an H200 (2026-11-28)
TEST_TIMEOUT = {"test-gpu": 60}
ALWAYS = ("kit", "setup")  # run whatever --steps says: every other step needs them
LEAVES = {"e2e": 100}  # seconds a step leaves to the step after it (e2e stops its configurations in time for ...)
LEAVES_FOR = {"e2e": "test-gpu"}  # ... this one, which then runs the gpu-marked tests
# a rehearsal's test-gpu step skips every test (24-25 s on this project's 2-core machine): it leaves that step less,
# so that e2e's configurations fit after a fresh clone's first compilation of the kernels (the signatures step took
# 125 s there against 53 s with the kernels cached, and e2e then skipped its second configuration)
REHEARSAL_LEAVES = {"e2e": 45}


@dataclass
class Step:
    name: str
    what: str
    status: str = "not run"  # passed | failed | timed out | skipped | not run
    seconds: float = 0.0
    reason: str = ""
    numbers: dict = field(default_factory=dict)
    log: str = ""

    def record(self) -> dict:
        return {"step": self.name, "what": self.what, "status": self.status, "seconds": round(self.seconds, 1),
                "reason": self.reason, "numbers": self.numbers, "log": self.log}


class Driver:
    def __init__(self, args):
        self.args = args
        self.rehearse = args.rehearse
        base = dict(REHEARSAL if self.rehearse else DEVICE)
        for key in base:
            env = os.environ.get(f"FC_{key.upper()}")
            if env:
                base[key] = env if isinstance(base[key], str) else int(float(env))
        self.p = base
        self.start = time.time()
        self.deadline = self.start + float(args.deadline or base["deadline"])
        self.python = args.python or sys.executable
        self.out = Path(args.out or os.environ.get("OUT") or Path(os.environ.get("TMPDIR", "/tmp"))
                        / "gpu-dedup-first-contact" / "out")
        self.work = Path(args.work or os.environ.get("FC_WORK") or Path(os.environ.get("TMPDIR", "/tmp"))
                         / "gpu-dedup-first-contact")
        self.logs = self.work / "logs"
        self.corpus = self.work / "corpus"
        self.links: list[Path] = []
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
        self.env.pop("PYTEST_ADDOPTS", None)
        self.caps = {**CAPS, **(REHEARSAL_CAPS if self.rehearse else {})}
        self.leaves = {**LEAVES, **(REHEARSAL_LEAVES if self.rehearse else {})}
        for item in args.cap or []:
            name, _, sec = item.partition("=")
            self.caps[name] = float(sec)
        self.background = None  # (Step, Popen, started) of the corpus step
        self.tier = int(args.tier)
        setup = Step("setup", "gpu_dedup importable (--no-deps install, else links), NVVM found (CUDA_HOME retry)")
        corpus = Step("corpus", f"planted shards, {self.p['docs']:,} documents, in the background")
        env = Step("env", "versions, device, driver, the GPU backend's mode")
        if self.tier == 1:
            self.steps = [
                setup, corpus, env,
                Step("smoke", f"GPU vs CPU on {self.p['smoke_docs']:,} planted documents, kernel by kernel"),
                Step("signatures", f"signature kernel throughput, {self.p['sig_docs']:,} documents, GPU vs CPU"),
                Step("e2e", f"end to end, {self.p['docs']:,} documents, CPU (all cores) vs GPU: seconds per stage, "
                            "outputs byte for byte"),
                Step("test-gpu", "pytest -m gpu (the gpu-marked tests; cuDF/Dask ones skip)"),
                Step("test-backend", "pytest --backend gpu over the stage, backend, run and API tests"
                     + (" (collected only in a rehearsal)" if self.rehearse else "")),
            ]
        else:
            self.steps = [
                Step("kit", "the RAPIDS wheels (cuDF, RMM, Dask-CUDA) installed into /tmp/site from the carried parts"),
                setup, corpus, env,  # then the targets first: end to end, the kernel, 10^7; then the tests
                Step("e2e-cudf", f"end to end, {self.p['docs']:,} documents, "
                                 f"{', '.join(self.p['cudf_configs'].split())}: CPU (all "
                                 "cores) vs GPU (cuDF reads and writes), shards and the removal list, every second "
                                 "booked, outputs compared by content"),
                Step("cudf-minhash", f"the warp and block signature kernels vs cuDF str.minhash (MurmurHash3), "
                                     f"{self.p['sig_docs']:,} documents: char 24 x 260 (20 x 13), char 5 and word 5 "
                                     "x 128; identical to the CPU, registers and occupancy"),
                Step("scale", f"end to end, {self.p['copies']} near-duplicate copies of the {self.p['docs']:,} "
                              "documents (built in seconds): GPU, then CPU if time allows"),
                Step("test-gpu", "pytest -m gpu with cuDF, RMM and Dask-CUDA: reader, writer, pool, one worker"),
                Step("components", f"components of a {self.p['graph_nodes']:,}-node graph: cuGraph (if in the kit), "
                                   "CuPy, CPU"),
                Step("write", f"the GPU write stage's parts, {self.p['docs']:,} documents: libcudf's write of every "
                              "shard, the files' check and digests; a write per shard on 16 streams, one KvikIO "
                              "thread, libcudf's own sink, tmpfs, no codec, writes through the page cache, "
                              "files encoded into host memory and digested there"),
                Step("dask", f"Dask-CUDA clusters started once and joined by address: {self.p['dask_workers']} "
                             f"workers on one GPU, host and device routes, device memory under pressure, vs one GPU "
                             f"process, {self.p['dask_docs']:,} documents"
                             + (f" (and {self.p['dask_copies']} copies if time allows)" if self.p["dask_copies"] else "")),
            ]
        wanted = set(args.steps.split(",")) if args.steps else None
        if wanted:
            unknown = wanted - {s.name for s in self.steps}
            if unknown:
                raise SystemExit(f"unknown step(s) {sorted(unknown)}; steps: {', '.join(s.name for s in self.steps)}")
        self.wanted = wanted

    # ------------------------------------------------------------------ plumbing

    def left(self) -> float:
        return self.deadline - time.time()

    def py(self, *args) -> list:
        return [self.python, *args]

    def run(self, step: Step, argv: list, cap: float, env: dict | None = None, log_name: str | None = None) -> int | None:
        """Run ``argv`` as ``step``'s command into its log, stopped at ``cap`` seconds; returns the exit
        status, or None when it was stopped."""
        log = self.logs / (log_name or f"{step.name}.log")
        step.log = log.name
        with open(log, "a") as f:
            f.write(f"$ {' '.join(map(str, argv))}\n# cap {cap:.0f}s, started {_now()}\n")
            f.flush()
            proc = subprocess.Popen(argv, cwd=ROOT, env=env or self.env, stdout=f, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                rc = proc.wait(timeout=max(1.0, cap))
            except subprocess.TimeoutExpired:
                stop(proc)
                f.write(f"\n# stopped at its cap of {cap:.0f}s\n")
                return None
            f.write(f"\n# exit status {rc}, {_now()}\n")
        return rc

    def cap_for(self, name: str) -> float:
        """A step's cap: its own, within the budget left, less what it leaves to the steps after it."""
        later = self.leaves.get(name, 0) if self.wanted is None or LEAVES_FOR.get(name) in self.wanted else 0
        return max(1.0, min(self.caps.get(name, 120), self.left() - RESERVE - later))

    # ------------------------------------------------------------------ steps

    def step_setup(self, step: Step):
        probe = "import gpu_dedup, gpu_dedup.kernels, gpu_dedup.configs, sys; print(gpu_dedup.__file__)"
        log = self.logs / "setup.log"

        def importable() -> bool:
            return self.run(step, self.py("-c", probe), 60) == 0

        wheels = sorted((ROOT / ".whl").glob("*.whl")) if not self.rehearse else []
        if wheels:  # carried test-only packages the image lacks (unicodedata2: the normalization oracle)
            site = self.work / "site"
            rc = self.run(step, self.py("-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                                        "--target", str(site), *map(str, wheels)), 120)
            if rc == 0:
                self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), self.env.get("PYTHONPATH")]))
                step.numbers["carried"] = ", ".join(w.name.split("-")[0] for w in wheels)
            else:
                step.numbers["carried"] = f"the wheels of .whl/ did not install (exit status {rc}; setup.log)"
        if importable():
            step.numbers["install"] = "already importable"
        else:
            rc = self.run(step, self.py("-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                                        "-e", "."), min(120, self.cap_for("setup")))
            if rc == 0 and importable():
                step.numbers["install"] = "pip install --no-deps -e ."
            else:  # no setuptools >= 77 there: the checkout on PYTHONPATH, kernels/ and configs/ linked in
                for name in ("kernels", "configs"):
                    link = ROOT / "gpu_dedup" / name
                    if not link.exists():
                        link.symlink_to(Path("..") / name)
                        self.links.append(link)
                self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), self.env.get("PYTHONPATH")]))
                if not importable():
                    return "failed", "gpu_dedup.kernels does not import (pip and links both failed: see setup.log)"
                step.numbers["install"] = "PYTHONPATH + links (gpu_dedup/kernels, gpu_dedup/configs)"
        nvvm = ("from numba.cuda.cudadrv import nvvm\n"
                "try:\n    version = nvvm.NVVM().get_version()\n"
                "except AttributeError:  # another numba-cuda layout: is it there at all?\n"
                "    version = 'found' if nvvm.is_available() else None\n"
                "assert version, 'numba-cuda does not find NVVM'\nprint('NVVM', version)")
        env = dict(self.env, NUMBA_ENABLE_CUDASIM="0")
        if self.run(step, self.py("-c", nvvm), 60, env) == 0:
            step.numbers["nvvm"] = _last_match(log, r"^NVVM (.+)$")
        else:
            homes = [h for h in (os.environ.get("FC_CUDA_HOME"), "/usr/local/cuda") if h and Path(h).is_dir()]
            for home in homes:
                if self.run(step, self.py("-c", nvvm), 60, dict(env, CUDA_HOME=home)) == 0:
                    self.env["CUDA_HOME"] = home  # for every later step
                    step.numbers["nvvm"] = _last_match(log, r"^NVVM (.+)$")
                    step.numbers["cuda_home"] = home
                    break
            else:
                return "failed", (f"numba-cuda finds no NVVM (tried CUDA_HOME unset and {homes or 'no toolkit dir'}): "
                                  "no kernel can compile; see setup.log")
        return "passed", ""

    def step_env(self, step: Step):
        out = self.logs / "env.json"
        if shutil.which("nvidia-smi"):
            self.run(step, ["nvidia-smi", "-L"], 30, log_name="nvidia-smi.log")
            self.run(step, ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                            "compute_cap", "--format=csv"], 30, log_name="nvidia-smi.log")
        rc = self.run(step, self.py("-c", ENV_SNIPPET, str(out)), self.cap_for("env"))
        step.log = "env.log"
        info = _read_json(out)
        step.numbers = {k: info[k] for k in ("device", "compute_capability", "multiprocessors", "memory_gib",
                                             "driver_cuda", "runtime_cuda", "gpu_mode", "tier2_numba_cuda",
                                             "host_memory")
                        if k in info}
        step.numbers["versions"] = info.get("versions", {})
        if rc != 0 or not info:
            return "failed", _last_error(self.logs / "env.log") or f"exit status {rc}"
        if info.get("gpu_error"):
            return "failed", f"the GPU backend is not usable: {info['gpu_error']}"
        return "passed", ""

    def words(self) -> list:
        return ["--words", *self.p["words"].split()]

    def bench(self, *args) -> list:
        return self.py("-m", "gpu_dedup.bench.gpu", *args)

    def bench_args(self, name: str, cap: float) -> tuple[list, Path]:
        """The benchmark command of step ``name`` (its JSON goes to the logs), and that JSON's path."""
        out = self.logs / f"{name}.json"
        soon = str(max(5, int(cap) - 15))  # the benchmark's own deadline: it stops cleanly before the cap
        corpus = ["--corpus-dir", str(self.corpus), *self.words()]
        # FC_PROFILE=1: each timed GPU run of the end-to-end steps also under cProfile, its costliest calls in the logs
        profile = ["--profile-dir", str(self.logs)] if self.p["profile"] else []
        args = {
            "corpus": ["--suite", "corpus", "--e2e-docs", str(self.p["docs"]), "--configs",
                       *(self.p["configs"] if self.tier == 1 else self.p["cudf_configs"]).split()],
            "smoke": ["--suite", "smoke", "--smoke-docs", str(self.p["smoke_docs"])],
            "signatures": ["--suite", "signatures", "--docs", str(self.p["sig_docs"]), "--perms",
                           *self.p["sig_perms"].split(), "--shingles", "char:5", "char:24", "word:5", "--backends",
                           "cpu", "gpu", "--deadline-seconds", soon],
            "e2e": ["--suite", "end-to-end", "--e2e-docs", str(self.p["docs"]), "--configs", *self.p["configs"].split(),
                    "--e2e-backends", "cpu", "gpu", "--e2e-modes", "shards", "list", "--warmup-docs",
                    str(self.p["warmup_docs"]), "--workdir", str(self.work), "--deadline-seconds", soon]
                   + profile,
            # tier 2: NeMo Curator's kernel (cuDF str.minhash, MurmurHash3) on the same shingles and permutations,
            # against the warp kernel (the default) and the block kernel, both checked against the CPU's signatures
            "cudf-minhash": ["--suite", "signatures", "--docs", str(self.p["sig_docs"]), "--cases", "char:24x260",
                             "char:5x128", "word:5x128", "--backends", "cpu", "gpu", "gpu-block", "cudf",
                             "--deadline-seconds", soon],
            "e2e-cudf": ["--suite", "end-to-end", "--e2e-docs", str(self.p["docs"]), "--configs",
                         *self.p["cudf_configs"].split(),
                         "--e2e-backends", "cpu", "gpu", "--e2e-modes", "shards", "list", "--warmup-docs",
                         str(self.p["warmup_docs"]), "--workdir", str(self.work), "--deadline-seconds", soon]
                        + profile,
            # 10^7: the GPU first (the target), then the CPU once if the deadline allows (FC_SCALE_BACKENDS: e.g.
            # gpu-kernels-first gpu, the kernels loaded before the read in a fresh process, then a read without a load)
            "scale": ["--suite", "end-to-end", "--e2e-docs", str(self.p["docs"]), "--copies", str(self.p["copies"]),
                      "--configs", "default", "--e2e-backends", *self.p["scale_backends"].split(),
                      "--workdir", str(self.work),
                      "--deadline-seconds", soon],
            "components": ["--suite", "components", "--graph-nodes", str(self.p["graph_nodes"])],
            "write": ["--suite", "write", "--e2e-docs", str(self.p["docs"]), "--deadline-seconds", soon],
            "dask": ["--suite", "dask", "--e2e-docs", str(self.p["dask_docs"]), "--workdir", str(self.work),
                     "--dask-workers", *str(self.p["dask_workers"]).split(), "--warmup-docs", str(self.p["warmup_docs"]),
                     "--dask-copies", str(self.p["dask_copies"]), "--deadline-seconds", soon]
                    + (["--dask-block-rows", str(self.p["dask_block_rows"])] if self.p["dask_block_rows"] else []),
        }[name]
        if name in ("corpus", "signatures", "e2e", "cudf-minhash", "e2e-cudf", "scale", "dask", "write"):
            args += corpus
        elif name == "smoke":
            args += self.words()
        return args + ["--out", str(out)], out

    def bench_step(self, step: Step, numbers, problem=None):
        """Run step's benchmark; ``numbers(json) -> dict`` for the summary, ``problem(json) -> str`` (or
        None) for a result that is wrong although the command ended well."""
        if step.name in ("signatures", "e2e", "cudf-minhash", "e2e-cudf", "scale", "dask", "write"):
            self.wait_corpus(step)
        cap = self.cap_for(step.name)
        args, out = self.bench_args(step.name, cap)
        rc = self.run(step, self.bench(*args), cap)
        res = _read_json(out)
        step.numbers = numbers(res)
        return _verdict(rc, self.logs / step.log, problem(res) if problem else None)

    def step_smoke(self, step: Step):
        def numbers(res):
            res = res.get("smoke", {})
            checks = res.get("checks", [])
            return {"checks": len(checks), "ok": res.get("passed", 0), "not_ok": res.get("failed", []),
                    "first_call_seconds": round(sum(c.get("first_seconds", 0) for c in checks), 1),
                    "table": [[c["check"], c["status"], c.get("first_seconds"), c.get("seconds"),
                               (c.get("detail") or c.get("error") or "")[:160]] for c in checks]}

        def problem(res):
            bad = res.get("smoke", {}).get("failed")
            return bad and f"not ok: {', '.join(bad)}"

        return self.bench_step(step, numbers, problem)

    def pytest(self, step: Step, args: list):
        # -v: one line per test as it ends, so a run stopped at its cap still counts what it ran; each failure's
        # traceback as it happens, and a test stopped (with every thread's stack) long before the step's cap
        base = ["-m", "pytest", "-p", "no:cacheprovider", "--continue-on-collection-errors", "-v", "-rfEs",
                "--durations=15", "--failures-at-once"]
        if _has_module(self.python, "pytest_timeout", self.env):
            base += ["--timeout", str(TEST_TIMEOUT.get(step.name, 150))]
        rc = self.run(step, self.py(*base, *args), self.cap_for(step.name))
        step.numbers = parse_pytest(self.logs / step.log)
        counts = step.numbers["counts"]
        if rc == 0 or (rc == 5 and not counts):  # 5: nothing collected (everything deselected)
            return "passed", ""
        if rc is None:
            return "timed out", (f"stopped at its cap after {sum(counts.values())} tests "
                                 f"({', '.join(f'{v} {k}' for k, v in counts.items())})")
        failed = step.numbers["failed"]
        if step.numbers["collection_errors"]:
            return "failed", "collection errors: " + ", ".join(step.numbers["collection_errors"][:5])
        return "failed", (f"{len(failed)} failed: " + ", ".join(failed[:8])) if failed else \
            (_last_error(self.logs / step.log) or f"pytest exit status {rc}")

    def step_test_gpu(self, step: Step):
        return self.pytest(step, ["-m", "gpu", "tests"])

    def step_test_backend(self, step: Step):
        paths = [p for p in BACKEND_TESTS if (ROOT / p).exists()]
        step.numbers["paths"] = paths
        missing = [p for p in BACKEND_TESTS if p not in paths]
        args = ["--backend", "gpu", "-m", "not gpu and not slow", *paths]
        if self.rehearse:  # the simulator would take hours over the whole suite: collect (imports, paths, options)
            args.append("--collect-only")
        verdict = self.pytest(step, args)
        step.numbers["paths"], step.numbers["missing_paths"] = paths, missing
        return verdict

    def wait_corpus(self, needed_by: Step):
        """Join the background corpus step (it only saves time: the benchmarks write a missing corpus)."""
        if self.background is None:
            return
        step, proc, started = self.background
        cap = max(1.0, min(self.caps["corpus"] - (time.time() - started), self.left() - RESERVE))
        try:
            rc = proc.wait(timeout=cap)
        except subprocess.TimeoutExpired:
            stop(proc)
            rc = None
        log = self.logs / "corpus.log"
        ended = log.stat().st_mtime if rc is not None and log.exists() else time.time()  # its last output
        step.seconds = max(0.0, ended - started)
        if rc is None:
            step.status, step.reason = "timed out", f"stopped at its cap ({needed_by.name} writes what is missing)"
        else:
            step.status, step.reason = _verdict(rc, self.logs / "corpus.log", None)
        step.numbers = {"bytes_and_rows": _read_markers(self.corpus)}
        self.background = None
        self.save()

    def step_signatures(self, step: Step):
        return self.bench_step(step, signature_numbers, signature_problem)

    def step_cudf_minhash(self, step: Step):
        return self.bench_step(step, signature_numbers, lambda res: signature_problem(res) or cudf_problem(res))

    def step_e2e(self, step: Step):
        return self.bench_step(step, lambda res: e2e_numbers(res.get("end_to_end", [])), e2e_problem)

    def step_e2e_cudf(self, step: Step):
        return self.bench_step(step, lambda res: e2e_numbers(res.get("end_to_end", [])), e2e_problem)

    def step_scale(self, step: Step):
        return self.bench_step(step, lambda res: e2e_numbers(res.get("end_to_end", [])), e2e_problem)

    def step_components(self, step: Step):
        def problem(res):
            bad = [r["backend"] for r in res.get("components", []) if r.get("identical") is False]
            return bad and f"labels differ from the CPU's: {bad}"

        return self.bench_step(step, lambda res: {"rows": res.get("components", [])}, problem)

    def step_write(self, step: Step):
        """Tier 2: the GPU write stage's parts (bench.write_probe), a fresh process per I/O variant."""
        def problem(res):
            rows = res.get("write", [])
            bad = [f"{r['variant']}: {r['error']}" for r in rows if "error" in r and not self.rehearse]
            return ("; ".join(bad) or None) if rows else "no variant ran"

        return self.bench_step(step, lambda res: {"rows": [
            {"variant": r["variant"], **r.get("seconds", {}), "mb": round(r.get("bytes_written", 0) / 1e6, 1),
             **({"error": r["error"][:160]} if "error" in r else {})} for r in res.get("write", [])]}, problem)

    def step_dask(self, step: Step):
        return self.bench_step(step, lambda res: dask_numbers(res.get("dask", [])),
                               lambda res: "; ".join(dask_problems(res.get("dask", []))) or None)

    def step_kit(self, step: Step):
        """Tier 2: the RAPIDS wheels carried in parts (../shared/gpu/pack.sh), joined and installed into
        /tmp/site by the kit's install script; every later step imports from there."""
        if self.rehearse:  # no kit here: what it brings that a CPU machine has is this machine's (KIT_ON_CPU)
            check = "import " + ", ".join(KIT_ON_CPU) + "; print('KIT', dask.__version__)"
            if self.run(step, self.py("-c", check), 120) != 0:
                return "failed", _last_error(self.logs / "kit.log") or f"{KIT_ON_CPU} do not import here"
            step.numbers["versions"] = f"rehearsal: this machine's Dask {_last_match(self.logs / 'kit.log', r'^KIT (.+)$')}"
            return "passed", ""
        site = Path(os.environ.get("FC_KIT_SITE", "/tmp/site"))
        script = kit_script()
        if not (site / ".installed").is_file():
            if script is None:
                return "failed", ("no kit: run ../shared/gpu/pack.sh on the development machine, carry .gpu/parts "
                                  "to /tmp/gpu-parts (README.md), then run this again")
            parts = os.environ.get("FC_KIT_PARTS", "")
            rc = self.run(step, ["bash", str(script), *([parts] if parts else [])], self.cap_for("kit"))
        else:
            rc = 0
        self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), self.env.get("PYTHONPATH")]))
        check = ("import cudf, rmm, dask, distributed, dask_cuda, dask_cudf, numba, numba_cuda\n"
                 "print('KIT', 'cudf', cudf.__version__, 'rmm', rmm.__version__, 'dask', dask.__version__, "
                 "'dask_cuda', dask_cuda.__version__, 'numba', numba.__version__, 'numba_cuda', numba_cuda.__version__)")
        if self.run(step, self.py("-c", check), 120) != 0:
            return "failed", _last_error(self.logs / "kit.log") or "the kit's packages do not import"
        step.numbers["versions"] = _last_match(self.logs / "kit.log", r"^KIT (.+)$")
        cugraph = self.run(step, self.py("-c", "import cugraph; print('CUGRAPH', cugraph.__version__)"), 60) == 0
        step.numbers["cugraph"] = _last_match(self.logs / "kit.log", r"^CUGRAPH (.+)$") if cugraph else \
            "not in the kit (components run on CuPy)"
        return ("passed", "") if rc == 0 else ("failed", f"the install script exited with {rc}")

    # ------------------------------------------------------------------ dry run

    def dry(self, step: Step):
        """Check what ``step`` needs (files, test paths, its command line) without measuring anything."""
        name = step.name
        if name == "setup":
            missing = [p for p in ("pyproject.toml", "kernels", "configs", "gpu_dedup") if not (ROOT / p).exists()]
            rc = self.run(step, self.py("-c", "import sys; print(sys.version)"), 30)
            return ("failed", f"missing in the checkout: {missing}") if missing else _verdict(rc, self.logs / step.log, None)
        if name == "kit":
            return self.dry_kit(step)
        if name == "env":
            compile(ENV_SNIPPET, "env", "exec")
            return ("passed", "") if shutil.which(self.python) or Path(self.python).exists() else \
                ("failed", f"no Python at {self.python}")
        if name in ("test-gpu", "test-backend"):
            missing = [p for p in BACKEND_TESTS if not (ROOT / p).exists()] if name == "test-backend" else []
            args = ["-m", "gpu", "tests"] if name == "test-gpu" else \
                ["--backend", "gpu", "-m", "not gpu and not slow", *[p for p in BACKEND_TESTS if (ROOT / p).exists()]]
            rc = self.run(step, self.py("-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q", *args), 120)
            step.numbers = parse_pytest(self.logs / step.log)
            problem = (missing and f"test paths missing: {missing}") or (
                step.numbers["collection_errors"] and f"collection errors: {step.numbers['collection_errors']}")
            return _verdict(rc, self.logs / step.log, problem)
        args, _ = self.bench_args(name, self.caps.get(name, 120))
        rc = self.run(step, self.bench(*args, "--dry-run"), 60)
        return _verdict(rc, self.logs / step.log, None)

    def dry_kit(self, step: Step):
        script, wheels = kit_script(), kit_dir() / "wheels.txt"
        problems = []
        if script is None:
            problems.append(f"no install script (.gpu/install-on-device.sh, {kit_dir()}/install-on-device.sh)")
        pins = {}
        if wheels.is_file():
            for line in wheels.read_text().splitlines():
                name, _, version = line.split("#")[0].strip().partition("==")
                if name:
                    pins[name.lower()] = version
            missing = [p for p in KIT_PINS if p not in pins]
            if missing:
                problems.append(f"{wheels} pins none of {missing}")
            step.numbers = {"pins": {p: pins.get(p) for p in KIT_PINS}, "cugraph": pins.get("cugraph-cu13")
                            or "not in the kit (components run on CuPy)", "numba_cuda": "the image's (cuDF 26.10 "
                            "needs numba-cuda < 0.31: the env step says which it is)"}
        else:
            problems.append(f"no {wheels}")
        (self.logs / "kit.log").write_text(json.dumps({"script": str(script), "wheels": str(wheels), "pins": pins},
                                                      indent=1) + "\n")
        step.log = "kit.log"
        return ("failed", "; ".join(problems)) if problems else ("passed", "")

    # ------------------------------------------------------------------ the run

    def main(self) -> int:
        self.out.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.logs, ignore_errors=True)
        self.logs.mkdir(parents=True)
        if self.rehearse:
            hide = self.work / "hidden-packages"
            shutil.rmtree(hide, ignore_errors=True)  # a rehearsal of the other tier hides other packages
            hide_modules(hide, [m for m in IMAGE_LACKS if self.tier == 1 or m not in KIT_ON_CPU])
            self.env.update(NUMBA_ENABLE_CUDASIM="1", GPU_DEDUP_SIMULATOR="1")
            self.env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hide), self.env.get("PYTHONPATH")]))
        print(f"first contact ({'rehearsal on the CPU, CUDA simulator' if self.rehearse else 'device'}): "
              f"{len(self.steps)} steps, {self.left():.0f}s budget; summary and logs in {self.out}", flush=True)
        try:
            for step in self.steps:
                if step.status != "not run":  # the background corpus step, already recorded
                    continue
                if self.wanted is not None and step.name not in self.wanted and step.name not in ALWAYS:
                    step.status, step.reason = "skipped", "not in --steps"
                    continue
                if step.name == "corpus" and not self.args.dry_run:
                    self.start_corpus(step)
                    continue
                need = MIN_SECONDS.get(step.name, 5) + RESERVE
                if self.left() < need:
                    step.status, step.reason = "skipped", f"{self.left():.0f}s left of the budget (needs {need}s)"
                    self.save()
                    continue
                self.one(step)
            if self.background is not None:
                self.wait_corpus(self.background[0])
        finally:
            for link in self.links:
                link.unlink(missing_ok=True)
            self.save()
        print(self.markdown(short=True), flush=True)
        return 0 if all(s.status in ("passed", "skipped") for s in self.steps) else 1

    def start_corpus(self, step: Step):
        log = self.logs / "corpus.log"
        step.log, step.status = log.name, "running"
        inject = self.args.fail_step == "corpus"
        argv = _failing(self.python, "corpus") if inject else self.bench(*self.bench_args("corpus", 0)[0])
        f = open(log, "a")
        f.write(f"$ {' '.join(map(str, argv))}\n# in the background, started {_now()}\n")
        f.flush()
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        f.close()
        self.background = (step, proc, time.time())
        print(f"step corpus: started in the background (pid {proc.pid})", flush=True)

    def one(self, step: Step):
        t0 = time.time()
        step.status = "running"
        self.save()
        try:
            if self.args.fail_step == step.name:  # a deliberate failure: the summary must say so, the rest go on
                rc = self.run(step, _failing(self.python, step.name), 30)
                verdict = ("failed", _last_error(self.logs / step.log) or f"exit status {rc}")
            elif self.args.dry_run:
                verdict = self.dry(step)
            else:
                verdict = getattr(self, "step_" + step.name.replace("-", "_"))(step)
        except Exception as exc:  # the driver's own bug must not cost the other steps
            verdict = ("failed", f"driver error: {type(exc).__name__}: {exc}")
        step.status, step.reason = verdict
        step.seconds = time.time() - t0
        print(f"step {step.name}: {step.status} in {step.seconds:.0f}s" + (f": {step.reason}" if step.reason else ""),
              flush=True)
        self.save()

    # ------------------------------------------------------------------ summary and packing

    def summary(self) -> dict:
        env = next(s for s in self.steps if s.name == "env").numbers
        mode = "rehearsal (CUDA simulator, CPU)" if self.rehearse else "device"
        if self.args.dry_run:
            mode = "dry run (nothing measured)"
        return {"first_contact": mode, "tier": self.tier,
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                "device": env.get("device"), "wall_seconds": round(time.time() - self.start, 1),
                "budget_seconds": round(self.deadline - self.start), "parameters": self.p,
                "steps": [s.record() for s in self.steps]}

    def markdown(self, short: bool = False) -> str:
        data = self.summary()
        lines = [f"# gpu_dedup first contact, tier {self.tier}: {data['first_contact']}, {data['date']}", "",
                 f"Device: {data['device'] or 'unknown'}; {data['wall_seconds']}s of a {data['budget_seconds']}s "
                 f"budget; documents: {self.p['docs']:,} (end to end), {self.p['sig_docs']:,} (signatures).", "",
                 "| step | status | seconds | what | why / key numbers |", "| --- | --- | ---: | --- | --- |"]
        for s in self.steps:
            key = s.reason or _headline(s)
            lines.append(f"| {s.name} | {s.status} | {s.seconds:.0f} | {s.what} | {_cell(key, 300)} |")
        if short:
            return "\n".join(lines) + "\n"
        for s in self.steps:
            detail = _detail(s)
            if detail:
                lines += ["", f"## {s.name}", "", *detail]
        lines += ["", "Logs: logs.tar.gz (one log per step; JSON of the benchmarks)."]
        return "\n".join(lines) + "\n"

    def save(self):
        """summary.json, summary.md and logs.tar.gz under OUT (each written beside, then renamed)."""
        self.out.mkdir(parents=True, exist_ok=True)
        data = self.summary()
        _atomic(self.out / "summary.json", json.dumps(data, indent=1, default=str).encode())
        self.logs.mkdir(parents=True, exist_ok=True)
        (self.logs / "summary.json").write_text(json.dumps(data, indent=1, default=str))
        _atomic(self.out / "summary.md", self.markdown().encode())
        tmp = self.out / "logs.tar.gz.part"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.logs.iterdir()):
                if path.is_file():
                    _add_capped(tar, path, f"first-contact/{path.name}")
        os.replace(tmp, self.out / "logs.tar.gz")


# ---------------------------------------------------------------------- helpers


ENV_SNIPPET = r'''
import json, os, platform, sys
from importlib import metadata
info = {"python": platform.python_version(), "executable": sys.executable, "versions": {}}
for dist in ("numpy", "numba", "numba-cuda", "llvmlite", "cupy-cuda13x", "cupy-cuda12x", "cuda-python", "cuda-bindings",
             "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "pyarrow", "pandas", "scipy", "pyyaml", "matplotlib", "pytest",
             "pytest-timeout", "hypothesis", "setuptools", "cudf-cu13", "cudf-cu12", "rmm-cu13", "dask", "distributed",
             "dask-cuda", "nvidia-ml-py"):
    try:
        info["versions"][dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        pass
v = info["versions"].get("numba-cuda")
if v:
    parts = [int(p) for p in v.split(".")[:2] if p.isdigit()]
    info["tier2_numba_cuda"] = f"numba-cuda {v}: " + ("fits cuDF 26.10 (< 0.31)" if parts < [0, 31] else
                                                    "too new for cuDF 26.10 (needs < 0.31)")
try:
    import cupy
    rt = cupy.cuda.runtime
    fmt = lambda x: f"{x // 1000}.{x % 1000 // 10}"
    info["driver_cuda"], info["runtime_cuda"] = fmt(rt.driverGetVersion()), fmt(rt.runtimeGetVersion())
    p = rt.getDeviceProperties(0)
    info["device"] = p["name"].decode() if isinstance(p["name"], bytes) else str(p["name"])
    info["compute_capability"] = f"{p['major']}.{p['minor']}"
    info["multiprocessors"] = p["multiProcessorCount"]
    info["memory_gib"] = round(p["totalGlobalMem"] / 2**30, 1)
except Exception as exc:
    info["cupy_error"] = f"{type(exc).__name__}: {exc}"
try:  # what fresh host memory costs here (huge pages against small ones), for the CPU runs' host work
    from gpu_dedup.bench import host_memory
    info["host_memory"] = host_memory()
except Exception as exc:
    info["host_memory_error"] = f"{type(exc).__name__}: {exc}"
try:
    from gpu_dedup.backends import get_backend
    gpu = get_backend("gpu")
    info["gpu_mode"] = gpu.mode
    info.setdefault("device", gpu.device_name)
except Exception as exc:
    info["gpu_error"] = f"{type(exc).__name__}: {exc}"
print(json.dumps(info, indent=1))
json.dump(info, open(sys.argv[1], "w"), indent=1)
'''


def hide_modules(directory: Path, names) -> Path:
    """A folder of stand-ins that make ``import NAME`` fail as for a package that is not installed."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        pkg = directory / name
        pkg.mkdir(exist_ok=True)
        (pkg / "__init__.py").write_text(
            f"raise ModuleNotFoundError(\"No module named '{name}' (hidden: the GPU image lacks it)\", name='{name}')\n")
    return directory


def stop(proc: subprocess.Popen) -> None:
    """End ``proc`` and the processes it started (its own session): TERM, then KILL after 5 s."""
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _failing(python: str, name: str) -> list:
    return [python, "-c", f"import sys; print('error: step {name} deliberately failed (--fail-step {name})'); "
                          "sys.exit(3)"]


def _now() -> str:
    return datetime.datetime.now().strftime("%H:%M:%S")


def _has_module(python: str, name: str, env: dict) -> bool:
    return subprocess.run([python, "-c", f"import {name}"], env=env, capture_output=True).returncode == 0


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _read_markers(root: Path) -> list:
    out = []
    for marker in sorted(m for name in ("_PLANTED", "_planted.json") for m in root.glob(f"*/{name}")):  # corpora
        info = _read_json(marker)
        out.append({"corpus": marker.parent.name, "bytes": info.get("bytes"), "rows": info.get("rows"),
                    "seconds": info.get("seconds")})
    return out


def _last_match(path: Path, pattern: str) -> str | None:
    found = None
    try:
        for line in path.read_text(errors="replace").splitlines():
            m = re.match(pattern, line)
            if m:
                found = m.group(1)
    except OSError:
        pass
    return found


def _last_error(path: Path) -> str:
    """The last line of a log that says what went wrong (an exception, ``error:``), else its last line."""
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return ""
    lines = [ln for ln in lines if not ln.startswith("# ")]
    for ln in reversed(lines):
        if re.match(r"^(error:|E\s|[A-Za-z_.]*(Error|Exception)\b|AssertionError|SystemExit)", ln):
            return ln[:400]
    return lines[-1][:400] if lines else ""


def _verdict(rc, log: Path, problem) -> tuple:
    if rc is None:
        return "timed out", "stopped at its cap: " + (_last_error(log) or "no output")
    if problem:
        return "failed", problem
    if rc != 0:
        return "failed", _last_error(log) or f"exit status {rc}"
    return "passed", ""


PYTEST_LINE = re.compile(r"^(tests/\S.*?) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")


def parse_pytest(log: Path) -> dict:
    """Counts, failed tests, collection errors and the most frequent skip reasons of a ``pytest -v -rfEs`` log
    (also of one stopped before its end)."""
    counts, failed, skips, collection = {}, [], {}, []
    final = None
    try:
        text = log.read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        m = PYTEST_LINE.match(line)
        if m:
            counts[m.group(2).lower()] = counts.get(m.group(2).lower(), 0) + 1
            if m.group(2) in ("FAILED", "ERROR"):
                failed.append(m.group(1))
            continue
        m = re.match(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$", line)
        if m:
            skips[m.group(2)[:200]] = skips.get(m.group(2)[:200], 0) + int(m.group(1))
        m = re.match(r"^ERROR (tests/\S+)(?: - .*)?$", line)
        if m and "::" not in m.group(1):
            collection.append(m.group(1))
        m = re.match(r"^=+ (.*\bin [\d.]+s.*?) =+$", line)
        if m:
            final = m.group(1)
        m = re.match(r"^(\d+)/(\d+) tests collected|^(\d+) tests? collected", line)
        if m:
            final = final or line.strip()
    if final and " in " in final:  # pytest's own tally (it also counts modules skipped as a whole)
        tally = {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)",
                                                   final)}
        if tally and "collected" not in final:
            counts = {("error" if k.startswith("error") else k): v for k, v in tally.items()}
    collected = re.search(r"collected (\d+) items?(?: / (\d+) deselected)?", text)
    out = {"counts": counts, "failed": failed[:50], "collection_errors": sorted(set(collection)),
           "skip_reasons": sorted(skips.items(), key=lambda kv: -kv[1])[:8], "final": final}
    if collected:
        out["collected"] = int(collected.group(1)) - int(collected.group(2) or 0)
    quiet = re.search(r"^(\d+)(?:/\d+)? tests? collected", text, re.M)  # pytest -q --collect-only
    if quiet:
        out["collected"] = int(quiet.group(1))
    return out


def signature_numbers(res: dict) -> dict:
    rows = res.get("rows", [])
    return {"rows": [[r["shingle"], r["num_perm"], r["backend"], r.get("seconds"), r.get("mb_per_s"),
                      r.get("docs_per_s"), r.get("identical_to_cpu"), r.get("skipped") or r.get("error")]
                     for r in rows]}


def signature_problem(res: dict):
    differ = [f"{r['shingle']} x {r['num_perm']}" for r in res.get("rows", []) if r.get("identical_to_cpu") is False]
    return differ and f"GPU signatures differ from the CPU's: {differ}"


def cudf_problem(res: dict):
    failed = [f"{r['shingle']} x {r['num_perm']}" for r in res.get("rows", [])
              if r["backend"] == "cudf" and "error" in r]
    return failed and f"cuDF str.minhash failed for {failed}"


def e2e_problem(res: dict):
    """GPU outputs whose content differs from the CPU's (other bytes with the same content are the rule when
    cuDF writes the shards), and runs that failed."""
    rows = res.get("end_to_end", [])

    def differs(r) -> bool:
        if "content_identical" in r:
            return r["content_identical"] is False
        return r.get("identical") is False and bool(
            {n for n in r["compared"]["differ"] if not n.startswith(".gpu_dedup_manifest")}
            - set(r["compared"].get("same_table", [])) | set(r["compared"]["only_in_one"]))

    bad = [f"{r['config']} {r.get('mode', 'shards')} {r['backend']} "
           f"({', '.join(list(r['compared'].get('content_differs', {})) + r['compared']['only_in_one'])})"
           for r in rows if differs(r)]
    errors = [f"{r['config']} {r['backend']}: {r['error'][:200]}" for r in rows if "error" in r]
    return "; ".join(filter(None, [bad and f"GPU outputs differ from the CPU's: {bad}", "; ".join(errors)])) or None


def kit_script() -> Path | None:
    """The tier-2 kit's install script: carried in .gpu/ (pack.sh copies it there), else ../shared/gpu."""
    for cand in (ROOT / ".gpu" / "install-on-device.sh", kit_dir() / "install-on-device.sh"):
        if cand.is_file():
            return cand
    return None


def kit_dir() -> Path:
    return Path(os.environ.get("FC_KIT_DIR") or ROOT.parent / "shared" / "gpu")


def dask_numbers(rows: list) -> dict:
    """The dask step's rows (gpu_dedup.bench.cluster) for the summary: every run's seconds against one process,
    its identity and what it moved; each cluster's fixed costs; the memory probe's outcome."""
    runs = [[r.get("config"), r.get("docs"), r.get("shuffle", ""), r.get("seconds"), r.get("vs_one_process"),
             r.get("identical"), r.get("content_identical"), r.get("shuffle_mb"), r.get("device_routes"),
             r.get("spilled_text_blocks"), r.get("memory") or r.get("skipped") or r.get("error") or ""]
            for r in rows if not r.get("cluster") and "stopped_naming_the_setting" not in r]
    fixed = [[r.get("config"), r.get("start_seconds"), r.get("kernel_load_seconds"), r.get("warmup_seconds"),
              r.get("close_seconds")] for r in rows if r.get("cluster")]
    stopped = [r for r in rows if "stopped_naming_the_setting" in r]
    return {"runs": runs, "fixed": fixed,
            "limit_error": [[r.get("config"), r.get("stopped_naming_the_setting"), r.get("error", "")[:600]]
                            for r in stopped]}


def dask_problems(rows: list) -> list:
    """What is wrong in the dask step's rows although it ran (as gpu_dedup.bench.cluster.problems says it; this
    driver imports nothing of gpu_dedup)."""
    out = []
    for r in rows:
        where = f"{r.get('config')} {r.get('docs', '')} {r.get('shuffle', '')}".strip()
        if r.get("content_identical") is False:
            out.append(f"{where}: outputs differ from one process's")
        if "error" in r and "stopped_naming_the_setting" not in r:
            out.append(f"{where}: {r['error'][:200]}")
        if r.get("stopped_naming_the_setting") is False:
            out.append(f"{where}: spill_texts false did not stop naming cluster.device_memory_limit")
    return out


def e2e_numbers(rows: list) -> dict:
    """Per configuration and output mode (``config`` for shards, ``config/list`` for the removal list): CPU and
    GPU seconds, speed-up, byte and content identity, GPU rates; per run its books: seconds per stage, named
    fixed costs, unbooked glue and the publication after the report."""
    configs, stages = {}, {}
    for r in rows:
        mode = r.get("mode", "shards")
        key = r.get("config", "?") + ("" if mode == "shards" else f"/{mode}")
        c = configs.setdefault(key, {"docs": r.get("docs")})
        b = r["backend"]
        if "seconds" in r:
            c[f"{b}_seconds"] = r["seconds"]
            c[f"{b}_docs_per_s"] = r["docs_per_s"]
            c[f"{b}_tb_per_hour"] = r["tb_per_hour"]
            if "warmup_seconds" in r:
                c[f"{b}_warmup_seconds"] = r["warmup_seconds"]
            if r.get("writer"):
                c[f"{b}_writer"] = r["writer"]
            stages[(key, b)] = dict(r["stage_seconds"], **r.get("fixed_seconds", {}),
                                    unbooked=r.get("unbooked_seconds", ""), publish=r.get("publish_seconds", ""),
                                    prepare=r.get("kernel_prepare_seconds", 0))
        else:
            c[f"{b}_not_run"] = r.get("error") or f"skipped: {r.get('skipped')}"
        if "identical" in r:
            c["byte_identical" if b == "gpu" else f"{b}_byte_identical"] = r["identical"]
            c["content_identical" if b == "gpu" else f"{b}_content_identical"] = r.get("content_identical")
            c["files_compared"] = r["compared"]["files"]
            if r["compared"].get("same_table"):
                c[f"{b}_same_tables_other_bytes"] = r["compared"]["same_table"]
    for c in configs.values():
        if c.get("cpu_seconds") and c.get("gpu_seconds"):
            c["gpu_speedup"] = round(c["cpu_seconds"] / c["gpu_seconds"], 2)
    return {"configs": configs, "stage_seconds": [[k[0], k[1], v] for k, v in stages.items()]}


def _headline(s: Step) -> str:
    n = s.numbers
    if s.name == "setup":
        parts = [n.get("install"), n.get("nvvm") and f"NVVM {n['nvvm']}", n.get("cuda_home") and
                 f"CUDA_HOME={n['cuda_home']}", n.get("carried") and f"carried: {n['carried']}"]
        return "; ".join(p for p in parts if p)
    if s.name == "kit":
        parts = [n.get("versions"), n.get("cugraph") and f"cuGraph: {n['cugraph']}"]
        return "; ".join(p for p in parts if p)
    if s.name == "dask" and n.get("runs"):
        one = {r[1]: r[3] for r in n["runs"] if r[0] == "1 process" and r[3]}
        parts = [f"1 process {d:,}: {sec}s" for d, sec in one.items()]
        parts += [f"{r[0].split(' ')[0]}w {r[2]} {r[1]:,}: {r[3]}s ({r[4]}x){'' if r[6] is not False else ' DIFFERS'}"
                  for r in n["runs"] if r[0] != "1 process" and r[3] and r[2] in ("host", "device")]
        parts += [f"limit error named: {e[1]}" for e in n.get("limit_error", [])]
        return "; ".join(parts)
    if s.name in ("components", "dask") and n.get("rows"):
        return "; ".join(f"{r.get('backend', r.get('docs'))}: {r.get('seconds', r.get('dask_cuda_1_worker_seconds'))}s"
                         for r in n["rows"])
    if s.name == "env":
        touch = n.get("host_memory", {}).get("first_touch_512mib_seconds", {})
        return "; ".join([str(n[k]) for k in ("device", "runtime_cuda", "tier2_numba_cuda") if n.get(k)]
                         + ([f"512 MiB first touched: {touch.get('numpy')} s NumPy, {touch.get('small_pages')} s small pages"]
                            if touch else []))
    if s.name == "smoke" and n:
        return f"{n.get('ok')} of {n.get('checks')} checks ok; compiling {n.get('first_call_seconds')}s"
    if s.name.startswith("test-") and n:
        return ", ".join(f"{v} {k}" for k, v in n.get("counts", {}).items()) or (n.get("final") or "")
    if s.name in ("signatures", "cudf-minhash") and n.get("rows"):
        rate = {(r[0], r[1], r[2]): r[4] for r in n["rows"] if r[4]}
        out = []
        for (sh, perm, backend), mbs in rate.items():
            if backend == "gpu-kernel":
                other = rate.get((sh, perm, "cudf" if s.name == "cudf-minhash" else "cpu"))
                out.append(f"{sh} x {perm}: {mbs:,} MB/s" + (f" ({mbs / other:.1f}x "
                                                             f"{'cuDF' if s.name == 'cudf-minhash' else 'CPU'})"
                                                             if other else ""))
        return "; ".join(out[:4])
    if s.name in ("e2e", "e2e-cudf", "scale") and n.get("configs"):
        return "; ".join(f"{k}: {v.get('gpu_speedup', '-')}x, {v.get('gpu_tb_per_hour', '-')} TB/h, content "
                         f"{v.get('content_identical')}" for k, v in n["configs"].items())
    if s.name == "corpus" and n.get("bytes_and_rows"):
        return "; ".join(f"{c['corpus']}: {c['rows']:,} rows in {c['seconds']}s" for c in n["bytes_and_rows"]
                         if c.get("rows") is not None)
    return ""


def _detail(s: Step) -> list:
    n = s.numbers
    if s.name == "env" and n:
        return [f"- {k}: {v}" for k, v in n.items() if k != "versions"] + \
            ["- versions: " + ", ".join(f"{k} {v}" for k, v in sorted(n.get("versions", {}).items()))]
    if s.name == "smoke" and n.get("table"):
        return ["| check | status | first call s | second call s | detail |", "| --- | --- | ---: | ---: | --- |"] + \
            [f"| {r[0]} | {r[1]} | {r[2] if r[2] is not None else ''} | {r[3] if r[3] is not None else ''} | "
             f"{_cell(r[4], 160)} |" for r in n["table"]]
    if s.name.startswith("test-") and n:
        out = [f"- counts: {n.get('counts')}; {n.get('final') or 'no final line (stopped?)'}"]
        if n.get("missing_paths"):
            out.append(f"- test paths missing in this checkout: {n['missing_paths']}")
        out += [f"- collection error: {e}" for e in n.get("collection_errors", [])]
        out += [f"- FAILED {t}" for t in n.get("failed", [])[:25]]
        out += [f"- skipped {k}x: {r}" for r, k in n.get("skip_reasons", [])[:6]]
        return out
    if s.name in ("signatures", "cudf-minhash") and n.get("rows"):
        return ["| shingles | perms | backend | seconds | MB/s | docs/s | same as CPU | note |",
                "| --- | ---: | --- | ---: | ---: | ---: | --- | --- |"] + \
            [f"| {r[0]} | {r[1]} | {r[2]} | {r[3] or ''} | {r[4] or ''} | {r[5] or ''} | "
             f"{'' if r[6] is None else ('yes' if r[6] else 'NO')} | {_cell(r[7] or '', 80)} |" for r in n["rows"]]
    if s.name == "dask" and n.get("runs"):
        yes = {True: "yes", False: "NO", None: ""}
        out = ["| configuration | docs | route | seconds | x 1 process | same bytes | same content | shuffle MiB | "
               "device routes | texts off the device | note |",
               "| --- | ---: | --- | ---: | ---: | --- | --- | ---: | ---: | ---: | --- |"]
        out += [f"| {r[0]} | {r[1] or 0:,} | {r[2]} | {r[3] or ''} | {r[4] or ''} | {yes[r[5]]} | {yes[r[6]]} | "
                f"{r[7] if r[7] is not None else ''} | {r[8] if r[8] is not None else ''} | "
                f"{r[9] if r[9] is not None else ''} | {_cell(r[10], 120)} |" for r in n["runs"]]
        if n.get("fixed"):
            out += ["", "| cluster | start s | kernels s | warm-up run s | close s |", "| --- | ---: | ---: | ---: | ---: |"]
            out += [f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} |" for r in n["fixed"]]
        out += [f"- spill_texts false under a tiny cluster.device_memory_limit ({e[0]}): stopped naming the setting: "
                f"{e[1]}; {_cell(e[2], 300)}" for e in n.get("limit_error", [])]
        return out
    if s.name in ("e2e", "e2e-cudf", "scale") and n.get("configs"):
        out = ["| config | docs | CPU s | GPU s | speed-up | same content | same bytes | GPU writer | GPU docs/s | "
               "GPU TB/h | GPU warm-up s | note |",
               "| --- | ---: | ---: | ---: | ---: | --- | --- | --- | ---: | ---: | ---: | --- |"]
        for k, v in n["configs"].items():
            note = "; ".join(str(v[x]) for x in ("cpu_not_run", "gpu_not_run") if x in v)
            out.append(f"| {k} | {v.get('docs') or 0:,} | {v.get('cpu_seconds', '')} | {v.get('gpu_seconds', '')} | "
                       f"{v.get('gpu_speedup', '')} | {v.get('content_identical', '')} | {v.get('byte_identical', '')} "
                       f"| {_cell(v.get('gpu_writer', ''), 30)} | {v.get('gpu_docs_per_s', '')} | "
                       f"{v.get('gpu_tb_per_hour', '')} | {v.get('gpu_warmup_seconds', '')} | {_cell(note, 120)} |")
        if n.get("stage_seconds"):
            names = list(dict.fromkeys(k for _, _, st in n["stage_seconds"] for k in st))
            out += ["", "| config | backend | " + " | ".join(names) + " |",
                    "| --- | --- | " + " | ".join("---:" for _ in names) + " |"]
            out += [f"| {c} | {b} | " + " | ".join(str(st.get(k, "")) for k in names) + " |"
                    for c, b, st in n["stage_seconds"]]
        return out
    return []


def _cell(text, width: int) -> str:
    text = str(text).replace("|", "/").replace("\n", " ")
    return text if len(text) <= width else text[: width - 3] + "..."


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _add_capped(tar: tarfile.TarFile, path: Path, arcname: str) -> None:
    """Add ``path``; a file over MAX_LOG_BYTES keeps its first 1 MiB and its last 5 MiB."""
    size = path.stat().st_size
    if size <= MAX_LOG_BYTES:
        tar.add(path, arcname=arcname)
        return
    import io

    with open(path, "rb") as f:
        head = f.read(1 << 20)
        f.seek(size - (5 << 20))
        tail = f.read()
    data = head + f"\n... [{size - len(head) - len(tail):,} bytes left out] ...\n".encode() + tail
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime = len(data), int(time.time())
    tar.addfile(info, io.BytesIO(data))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rehearse", action="store_true", default=os.environ.get("FC_REHEARSE", "0") not in ("", "0"),
                    help="run on a CPU machine: CUDA simulator, tiny corpus, image-missing packages hidden")
    ap.add_argument("--steps", help="comma-separated steps to run (setup always runs)")
    ap.add_argument("--fail-step", help="make this step fail on purpose (to check the reporting)")
    ap.add_argument("--cap", action="append", metavar="STEP=SECONDS", help="a step's time cap")
    ap.add_argument("--deadline", type=float, help="seconds for the whole run (device default 470)")
    ap.add_argument("--out", help="where the summary and the tarball go (default $OUT)")
    ap.add_argument("--work", help="logs and corpora (default $FC_WORK or /tmp/gpu-dedup-first-contact)")
    ap.add_argument("--python", help="the Python that runs the steps (default: this one)")
    ap.add_argument("--tier", type=int, choices=(1, 2), default=1,
                    help="1: the image alone (CuPy, numba-cuda); 2: with the RAPIDS kit (cuDF, RMM, Dask-CUDA)")
    ap.add_argument("--dry-run", action="store_true",
                    help="check every step's files, paths and command lines (collect the tests), measure nothing")
    args = ap.parse_args(argv)
    return Driver(args).main()


if __name__ == "__main__":
    sys.exit(main())
