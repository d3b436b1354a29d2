"""When this process started, so that a run started by the ``gpu-dedup`` command books its own start-up
(the interpreter, the imports, the command line) as the fixed cost ``startup``.  Standard library only: the
command reads the clock before anything heavy (or anything that checks the environment) is imported."""

from __future__ import annotations

import os
import time

_STARTED: dict = {}  # "process": perf_counter time of this process's start, when the CLI is the process


def count_process_start() -> None:
    """Book the process's start-up to the next run's ``startup`` fixed cost: called by the ``gpu-dedup``
    command, once, as the process's entry point."""
    started = process_start()
    if started is not None:
        _STARTED["process"] = started


def take_process_start() -> float | None:
    """The process's start (perf_counter), once: the first run books it, later runs of the process do not."""
    return _STARTED.pop("process", None)


def process_start() -> float | None:
    """When this process started, on the ``time.perf_counter`` clock (Linux: /proc), or None."""
    try:
        with open("/proc/self/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22: start time, clock ticks after boot
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):  # pragma: no cover - non-Linux
        return None
    age = uptime - ticks / os.sysconf("SC_CLK_TCK")
    return time.perf_counter() - age if 0 <= age < 3600 else None
