"""Benchmarks, run with ``gpu-dedup bench <name>``.

Each benchmark prints a table and writes JSON + Markdown to a results
directory.  Timings come from runs on the same machine in one invocation, so
ratios between them are meaningful even where absolute times are noisy.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from gpu_dedup.backends.pages import small_pages


def machine() -> dict:
    import os

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cores = os.cpu_count()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {"cpu": cpu, "cores": cores, "memory_gib": round(mem, 1), "python": platform.python_version()}


def first_touch_seconds(nbytes: int = 512 << 20) -> dict:
    """Seconds to write one byte in every 4 KiB of ``nbytes`` of fresh memory, as NumPy's array (huge pages
    where the kernel gives them) and as :func:`gpu_dedup.backends.pages.small_pages`.  Both arrays stay alive
    until both are timed, so neither is handed memory the other has just freed."""
    out, held = {}, []
    for name, make in (("numpy", lambda: np.empty(nbytes, np.uint8)), ("small_pages", lambda: small_pages(nbytes))):
        a = make()
        t = time.perf_counter()
        a[::4096] = 1
        out[name] = round(time.perf_counter() - t, 4)
        held.append(a)
    return out


def host_memory() -> dict:
    """What decides the cost of fresh host memory here: the kernel's transparent huge page settings, whether it
    reports free pages to a hypervisor (``page_reporting`` on its command line), whether it runs under one, and
    :func:`first_touch_seconds` of 512 MiB.  Linux; elsewhere the fields it cannot read are left out."""
    info: dict = {}
    for key, path in (("thp_enabled", "/sys/kernel/mm/transparent_hugepage/enabled"),
                      ("thp_defrag", "/sys/kernel/mm/transparent_hugepage/defrag")):
        try:
            with open(path) as f:
                info[key] = f.read().strip()
        except OSError:
            pass
    try:
        with open("/proc/cmdline") as f:
            info["free_page_reporting"] = "page_reporting" in f.read()
        with open("/proc/cpuinfo") as f:
            info["hypervisor"] = " hypervisor" in f.read(1 << 16)
    except OSError:
        pass
    info["first_touch_512mib_seconds"] = first_touch_seconds(512 << 20)
    return info


def scratch(workdir=None) -> tempfile.TemporaryDirectory:
    """A temporary directory for a benchmark's generated corpora and outputs, inside ``workdir`` (``--workdir``,
    made if it does not exist yet) or the system's temporary directory; removed when the benchmark ends."""
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    return tempfile.TemporaryDirectory(dir=workdir)


def growth_exponent(sizes, values) -> float:
    """Least-squares slope of log(value) against log(size): 1.0 is linear."""
    x, y = np.log(np.asarray(sizes, float)), np.log(np.asarray(values, float))
    return float(np.polyfit(x, y, 1)[0])


def child_env(env=None) -> dict:
    """The environment of a timed child process: ``env`` (default: this process's) as a user's shell has it,
    without ``PYTHONDONTWRITEBYTECODE``: a child that may not cache bytecode compiles every source module it
    imports again in each run (a quarter of a second for gpu_dedup in an editable install), which no
    installed tool pays."""
    import os

    out = dict(os.environ if env is None else env)
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    return out


def run_cli_job(inputs, output, extra=(), env=None) -> dict:
    """``gpu-dedup run`` in a child process (its own peak memory); returns its report."""
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(inputs), "-o", str(output), "-q", *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(env))
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark job failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return json.loads((Path(output) / "report.json").read_text())


def write_results(directory, name: str, payload: dict, markdown: str) -> Path:
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(json.dumps(payload, indent=2) + "\n")
    (d / f"{name}.md").write_text(markdown)
    return d
