"""The first-contact driver (gpu_dedup/bench/first_contact.py, run by results/gpu/first-contact.sh) rehearsed
on the CPU, as CI runs it.

The whole script runs once under the CUDA simulator with a tiny corpus and the packages the GPU image
lacks hidden, with one step made to fail on purpose: the summary must list every step, say which one
failed and why, show that the later steps still ran, and what comes back must fit the device tool's
limits (at most 8 files, nothing deeper than OUT/a/b, plain names, 16 MiB each).
"""

import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from gpu_dedup.bench import first_contact  # the driver the shell scripts run as a file

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "results" / "gpu" / "first-contact.sh"
STEPS = ["setup", "corpus", "env", "smoke", "signatures", "e2e", "test-gpu", "test-backend"]
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent that no longer reaps it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def returned_files(out: Path) -> list:
    """What the device tool would bring back from ``out``, checked against its limits."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8, files
    for p in files:
        rel = p.relative_to(out)
        assert len(rel.parts) <= 3, rel  # OUT/a/b/file at most
        assert all(NAME.match(part) for part in rel.parts), rel
        assert p.stat().st_size <= 16 << 20, rel
    assert sum(p.stat().st_size for p in files) <= 64 << 20
    return files


@pytest.mark.timeout(600)
def test_rehearsal_runs_every_step_reports_a_failure_and_goes_on(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "FC_WORK": str(work), "PYTHON": sys.executable}
    for var in ("NUMBA_ENABLE_CUDASIM", "GPU_DEDUP_SIMULATOR", "PYTEST_ADDOPTS"):
        env.pop(var, None)
    t0 = time.time()
    proc = subprocess.run(["bash", str(SCRIPT), "--rehearse", "--fail-step", "corpus"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=580)
    seconds = time.time() - t0
    printed = proc.stdout + proc.stderr
    assert proc.returncode == 1, printed[-4000:]  # one step failed, on purpose
    files = returned_files(out)
    assert sorted(p.name for p in files) == ["logs.tar.gz", "summary.json", "summary.md"]

    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert [s["step"] for s in summary["steps"]] == STEPS
    assert summary["first_contact"].startswith("rehearsal") and summary["device"] == "CUDA simulator"
    failed = steps["corpus"]
    assert failed["status"] == "failed" and "deliberately failed" in failed["reason"], failed
    later = STEPS[STEPS.index("corpus") + 1:]
    assert {name: steps[name]["status"] for name in later + ["setup"]} == dict.fromkeys(later + ["setup"], "passed"), \
        {name: (steps[name]["status"], steps[name]["reason"]) for name in STEPS}
    assert all(steps[name]["seconds"] > 0 for name in later + ["setup"])

    # the numbers each step is there for
    assert steps["setup"]["numbers"]["nvvm"]  # numba-cuda's compiler answered
    smoke = steps["smoke"]["numbers"]
    assert smoke["checks"] >= 14 and smoke["ok"] == smoke["checks"] and not smoke["not_ok"]
    assert steps["test-gpu"]["numbers"]["counts"].get("skipped", 0) >= 20  # the simulator is no device
    assert not steps["test-gpu"]["numbers"]["collection_errors"]
    sigs = steps["signatures"]["numbers"]["rows"]
    assert {(r[0], r[2]) for r in sigs} >= {(s, b) for s in ("char:5", "char:24", "word:5") for b in ("cpu", "gpu")}
    assert all(r[6] is True for r in sigs if r[2] == "gpu")
    configs = steps["e2e"]["numbers"]["configs"]
    assert set(configs) == {"default", "cosine-vectors", "default/list", "cosine-vectors/list"}  # shards, list
    assert all(c["byte_identical"] is True and c["content_identical"] is True and c["files_compared"] >= 2
               for c in configs.values()), configs
    books = {(c, b): st for c, b, st in steps["e2e"]["numbers"]["stage_seconds"]}
    assert {"kernel_load", "unbooked", "publish"} <= set(books["default", "gpu"])
    backend = steps["test-backend"]["numbers"]
    assert backend["collected"] > 100 and backend["paths"] and not backend["collection_errors"]

    md = (out / "summary.md").read_text()
    for name in STEPS:
        assert re.search(rf"^\| {re.escape(name)} \| {steps[name]['status']} \|", md, re.M), name
    assert "deliberately failed" in md and "## e2e" in md
    assert "| test-backend | passed |" in printed  # the table is printed last, for the tool's output tail
    with tarfile.open(out / "logs.tar.gz") as tar:
        logs = {Path(m.name).name for m in tar.getmembers()}
    assert {f"{name}.log" for name in STEPS} <= logs and {"e2e.json", "smoke.json", "summary.json"} <= logs
    assert seconds < first_contact.REHEARSAL["deadline"] + 15  # its budget


def test_a_step_over_its_cap_is_stopped_with_its_children_and_reported(tmp_path, monkeypatch):
    fc = first_contact
    out, work = tmp_path / "out", tmp_path / "work"
    script = tmp_path / "slow.py"
    script.write_text("import subprocess, sys, time\n"
                      "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
                      "open(sys.argv[1], 'w').write(str(child.pid))\nprint('started', flush=True)\ntime.sleep(60)\n")
    pid_file = tmp_path / "child.pid"

    def slow_env(self, step):
        rc = self.run(step, [sys.executable, str(script), str(pid_file)], self.cap_for("env"))
        return fc._verdict(rc, self.logs / step.log, None)

    monkeypatch.setattr(fc.Driver, "step_env", slow_env)
    t0 = time.time()
    rc = fc.main(["--steps", "env", "--cap", "env=2", "--out", str(out), "--work", str(work), "--python",
                  sys.executable])
    assert time.time() - t0 < 40 and rc == 1
    steps = {s["step"]: s for s in json.loads((out / "summary.json").read_text())["steps"]}
    assert steps["env"]["status"] == "timed out" and "stopped at its cap" in steps["env"]["reason"]
    assert steps["smoke"]["status"] == "skipped" and steps["smoke"]["reason"] == "not in --steps"
    assert steps["setup"]["status"] == "passed"
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert not alive(child)  # the step's own child was stopped with it
    assert len(returned_files(out)) == 3


def test_packing_keeps_long_logs_short_and_the_file_count(tmp_path):
    fc = first_contact
    drv = fc.Driver(fc.argparse.Namespace(rehearse=True, steps=None, fail_step=None, cap=None, deadline=60,
                                          out=str(tmp_path / "out"), work=str(tmp_path / "work"), python=None,
                                          tier=1, dry_run=False))
    drv.logs.mkdir(parents=True)
    big = drv.logs / "test-backend.log"
    with open(big, "wb") as f:
        f.write(b"first line\n" + b"y" * (9 << 20) + b"\nlast line\n")
    for k in range(30):
        (drv.logs / f"extra-{k}.log").write_text("x")
    drv.save()
    assert sorted(p.name for p in returned_files(tmp_path / "out")) == ["logs.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(tmp_path / "out" / "logs.tar.gz") as tar:
        data = tar.extractfile("first-contact/test-backend.log").read()
    assert len(data) < 7 << 20 and data.startswith(b"first line") and data.endswith(b"last line\n")
    assert b"bytes left out" in data


def test_pytest_log_of_a_stopped_run_still_counts():
    fc = first_contact
    import tempfile

    text = "\n".join([
        "tests/stages/test_a.py::test_one PASSED                                   [  1%]",
        "tests/stages/test_a.py::test_two[data13-cosine.text.shingle = 'token' is not valid] FAILED [  2%]",
        "tests/run/test_b.py::test_three SKIPPED (needs a CUDA device)               [  3%]",
        "tests/run/test_b.py::test_four ERROR                                       [  4%]",
        "# stopped at its cap of 120s",
    ])
    with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as f:
        f.write(text)
    got = fc.parse_pytest(Path(f.name))
    os.unlink(f.name)
    assert got["counts"] == {"passed": 1, "failed": 1, "skipped": 1, "error": 1}
    assert got["failed"] == ["tests/stages/test_a.py::test_two[data13-cosine.text.shingle = 'token' is not valid]",
                             "tests/run/test_b.py::test_four"]
    assert got["final"] is None


def test_device_configurations_and_test_paths_exist():
    """What the device run names (end-to-end configurations, test folders) resolves in this checkout."""
    fc = first_contact
    from gpu_dedup.bench import gpu as bench_gpu

    for name in fc.DEVICE["configs"].split() + fc.REHEARSAL["configs"].split():
        settings, kind = bench_gpu.config_settings(name)
        assert kind in ("text", "vectors") and settings["input"]["id_column"] == "id"
    assert set(fc.CONFIGS) == set(bench_gpu.CONFIGS)
    assert all((ROOT / p).exists() for p in fc.BACKEND_TESTS)


def test_nvvm_found_only_with_cuda_home_is_kept_for_every_later_step(tmp_path, monkeypatch):
    """numba-cuda may not infer CUDA_HOME from wheels: setup retries with the toolkit folder and, when that
    works, every later step runs with it."""
    fc = first_contact
    home = tmp_path / "cuda"
    home.mkdir()
    monkeypatch.setenv("FC_CUDA_HOME", str(home))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    real_run = fc.Driver.run
    seen = {}

    def run(self, step, argv, cap, env=None, log_name=None):
        text = " ".join(map(str, argv))
        env = env or self.env
        if "NVVM()" in text:  # the probe answers only with CUDA_HOME set
            ok = env.get("CUDA_HOME") == str(home)
            with open(self.logs / "setup.log", "a") as f:
                f.write("NVVM (2, 0)\n" if ok else "NvvmSupportError: libNVVM cannot be found\n")
            return 0 if ok else 1
        if "import gpu_dedup" in text:
            return real_run(self, step, argv, cap, env, log_name)
        if "--target" in text:  # the carried wheels of a checkout's .whl/, where it has some
            return 0
        seen[step.name] = env.get("CUDA_HOME")
        return 0

    monkeypatch.setattr(fc.Driver, "run", run)
    monkeypatch.setattr(fc.Driver, "step_env", lambda self, step: (self.run(step, ["true"], 5), ("passed", ""))[1])
    drv = fc.Driver(fc.argparse.Namespace(rehearse=False, steps="env", fail_step=None, cap=None, deadline=120,
                                          out=str(tmp_path / "out"), work=str(tmp_path / "work"), python=None,
                                          tier=1, dry_run=False))
    assert drv.main() == 0
    setup = next(s for s in drv.steps if s.name == "setup")
    assert setup.status == "passed" and setup.numbers["cuda_home"] == str(home) and setup.numbers["nvvm"] == "(2, 0)"
    assert seen == {"env": str(home)}  # the later step ran with it


def stand_in_kit(directory: Path, drop: str | None = None) -> Path:
    """A kit folder as ../shared/gpu holds it: its install script and the pinned wheels (``drop`` left out)."""
    fc = first_contact
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "install-on-device.sh").write_text("#!/usr/bin/env bash\nexit 0\n")
    pins = [f"{name}==1.0" for name in fc.KIT_PINS if name != drop]
    (directory / "wheels.txt").write_text("# pinned\n" + "\n".join(pins + ["toolz==1.2.0"]) + "\n")
    return directory


@pytest.mark.timeout(300)
def test_tier2_dry_run_checks_the_kit_and_every_command(tmp_path, monkeypatch):
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "FC_WORK": str(tmp_path / "work"), "PYTHON": sys.executable,
           "FC_KIT_DIR": str(stand_in_kit(tmp_path / "kit"))}
    proc = subprocess.run(["bash", str(ROOT / "results" / "gpu" / "tier2.sh"), "--dry-run"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert proc.returncode == 0, {k: (v["status"], v["reason"]) for k, v in steps.items()}
    assert summary["tier"] == 2 and summary["first_contact"].startswith("dry run")
    assert list(steps) == ["kit", "setup", "corpus", "env", "e2e-cudf", "cudf-minhash", "scale", "test-gpu",
                           "components", "write", "dask"]
    assert all(s["status"] == "passed" for s in steps.values())
    assert steps["test-gpu"]["numbers"]["collected"] >= 20 and not steps["test-gpu"]["numbers"]["collection_errors"]
    assert steps["kit"]["numbers"]["pins"]["cudf-cu13"] == "1.0"
    assert len(returned_files(out)) == 3
    # a kit without RMM is named as such
    fc = first_contact
    stand_in_kit(tmp_path / "kit2", drop="rmm-cu13")
    drv = fc.Driver(fc.argparse.Namespace(rehearse=False, steps="kit", fail_step=None, cap=None, deadline=120,
                                          out=str(tmp_path / "out2"), work=str(tmp_path / "work2"), python=None,
                                          tier=2, dry_run=True))
    monkeypatch.setenv("FC_KIT_DIR", str(tmp_path / "kit2"))
    assert drv.main() == 1
    kit = next(s for s in drv.steps if s.name == "kit")
    assert kit.status == "failed" and "rmm-cu13" in kit.reason


def test_dask_tests_skip_on_a_machine_without_dask(tmp_path):
    """The GPU image has no Dask: the tests that start a Dask cluster skip there instead of failing."""
    fc = first_contact
    hide = fc.hide_modules(tmp_path / "hidden", fc.IMAGE_LACKS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(hide), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
                           "tests/run/test_cosine_run.py", "-k", "dask or bad_vectors"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "3 skipped" in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.count("hidden: the GPU image lacks it") == 3


@pytest.mark.timeout(600)
def test_tier2_rehearsal_runs_the_dask_step_on_simulated_gpu_workers(tmp_path):
    """Tier 2's dask step rehearsed: the kit's Dask is this machine's (cuDF, RMM and Dask-CUDA stay hidden), the
    GPU workers run the GPU backend in the CUDA simulator.  A cluster started once and joined by address, with
    the host and the device routes, outputs the same as one process's, its fixed costs apart, and device memory
    under pressure: the texts past a tiny limit in host memory, then the run that may not do that stopped with
    the error naming cluster.device_memory_limit."""
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**os.environ, "OUT": str(out), "FC_WORK": str(work), "PYTHON": sys.executable}
    for var in ("NUMBA_ENABLE_CUDASIM", "GPU_DEDUP_SIMULATOR", "PYTEST_ADDOPTS"):
        env.pop(var, None)
    proc = subprocess.run(["bash", str(ROOT / "results" / "gpu" / "tier2.sh"), "--rehearse", "--steps", "dask"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=580)
    summary = json.loads((out / "summary.json").read_text())
    steps = {s["step"]: s for s in summary["steps"]}
    assert proc.returncode == 0, {k: (v["status"], v["reason"]) for k, v in steps.items()}
    assert steps["kit"]["status"] == "passed" and "rehearsal" in steps["kit"]["numbers"]["versions"]
    dask = steps["dask"]["numbers"]
    runs = {(r[0], r[2]): r for r in dask["runs"]}
    assert runs[("1 process", "")][3] > 0
    host, device = runs[("2 GPU workers on 1 GPU", "host")], runs[("2 GPU workers on 1 GPU", "device")]
    whole, blocks = runs[("1 GPU worker on 1 GPU", "whole")], runs[("1 GPU worker on 1 GPU", "host")]
    for r in (host, device, whole, blocks):
        assert r[3] > 0 and r[5] is True and r[6] is True  # seconds; the same bytes and content as one process
    assert host[8] == 0 and device[8] >= 3  # routes that moved device frames
    assert whole[7] in (None, "") and blocks[7] is not None  # the whole run moved nothing; block by block did
    spilled = next(r for r in dask["runs"] if "in host memory" in r[10])
    assert spilled[6] is True and spilled[9] >= 1  # texts off the device, the same outputs
    assert [e[1] for e in dask["limit_error"]] == [True]
    assert "ResourceError" in dask["limit_error"][0][2] and "cluster.spill_texts: auto" in dask["limit_error"][0][2]
    assert [f[0] for f in dask["fixed"]] == ["1 GPU worker on 1 GPU", "2 GPU workers on 1 GPU"]
    assert all(v > 0 for f in dask["fixed"] for v in f[1:])
    md = (out / "summary.md").read_text()
    assert "## dask" in md and "| cluster | start s | kernels s | warm-up run s | close s |" in md
    assert len(returned_files(out)) == 3


def test_fc_profile_puts_the_end_to_end_steps_gpu_runs_under_cprofile(tmp_path, monkeypatch):
    """FC_PROFILE=1: the end-to-end steps of both tiers write each timed GPU run's costliest calls into the logs
    (the 10^7 step is left unprofiled: it times the read against the kernels' load)."""
    fc = first_contact
    args = fc.argparse.Namespace(rehearse=False, steps="kit", fail_step=None, cap=None, deadline=120,
                                 out=str(tmp_path / "out"), work=str(tmp_path / "work"), python=None, tier=2,
                                 dry_run=True)
    monkeypatch.setenv("FC_PROFILE", "1")
    drv = fc.Driver(args)
    for step, profiled in (("e2e-cudf", True), ("e2e", True), ("scale", False)):
        cmd, _ = drv.bench_args(step, 100)
        assert ("--profile-dir" in cmd) is profiled, step
    monkeypatch.delenv("FC_PROFILE")
    assert "--profile-dir" not in fc.Driver(args).bench_args("e2e-cudf", 100)[0]
