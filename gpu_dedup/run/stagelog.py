"""Stage timing, progress lines and memory readings of a run."""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from gpu_dedup.backends import STAGE_TRANSFERS, transfer_totals
from gpu_dedup.run.clock import take_process_start
from gpu_dedup.run.checkpoint import maybe_crash
from gpu_dedup.run.progress import Progress

log = logging.getLogger("gpu_dedup")


def rss_mb() -> float:
    """Current resident memory of this process in MiB."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:  # pragma: no cover - non-Linux
        return float("nan")


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MiB.

    Reads VmHWM (the high-water mark of this address space): ``ru_maxrss``
    survives fork + exec on Linux, so a child started by a large parent would
    report the parent's peak.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:  # pragma: no cover - non-Linux
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


class StageInfo(dict):
    """What a stage reports (a dict of details for report.json) and its :class:`Progress` (``.progress``)."""

    progress: Progress


@dataclass
class StageLog:
    """Times stages and shows their progress (see :mod:`gpu_dedup.run.progress`).

    Each stage gets a progress line on a terminal.  Elsewhere (a batch log, where the run's summary
    gives every stage's seconds) a stage that runs longer than the progress interval (10 s) logs a
    line at most every 10 s while it runs and ``stage NAME done in S: DONE/TOTAL UNIT, RATE UNIT/s``
    when it ends (INFO: ``--quiet`` hides them); shorter stages log nothing at INFO.  At DEBUG
    (``-v``) every stage logs where it starts and its end with its details.
    """

    stages: dict = field(default_factory=dict)
    stream: object = None  # where terminal progress lines go (default: sys.stderr)
    fixed: dict = field(default_factory=dict)  # named fixed costs (seconds): what is not a stage's work
    started: float = field(default_factory=time.perf_counter)  # the run's start (its wall clock counts from here)
    # callables(stage name) run as each stage ends, once its seconds are taken (an executor's look at its workers),
    # their time booked to the fixed cost ``stage_ends``
    ends: list = field(default_factory=list)

    def __post_init__(self):
        process = take_process_start()  # the CLI's own start-up, booked by the first run only
        if process is not None and process < self.started:
            self.fixed["startup"] = round(self.started - process, 4)
            self.started = process

    @contextmanager
    def cost(self, name: str):
        """Book the time of the body to fixed cost ``name`` (added up over calls).  Never inside a stage: a
        second is booked once."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.fixed[name] = round(self.fixed.get(name, 0.0) + time.perf_counter() - t0, 4)

    def accounts(self) -> dict:
        """The run's wall time so far and where it went: stages, named fixed costs, and what neither booked
        (the glue between them: should stay near zero)."""
        wall = time.perf_counter() - self.started
        stages = sum(v["seconds"] for v in self.stages.values() if not v.get("resumed"))
        fixed = sum(self.fixed.values())
        return {"wall_seconds": round(wall, 3), "stage_seconds": round(stages, 3),
                "fixed_seconds": dict(self.fixed), "unbooked_seconds": round(wall - stages - fixed, 3)}

    @contextmanager
    def stage(self, name: str, total: int | None = None, unit: str = "docs"):
        """Time stage ``name`` over ``total`` items of ``unit``; the body advances
        ``info.progress`` per chunk (or not at all: a stage that ends counts every item done)."""
        t0 = time.perf_counter()
        moved0 = transfer_totals()
        self.current: str | None = name  # the stage running (an executor accounts its data movement to it)
        info = StageInfo()
        prog = info.progress = Progress(name, total, unit, stream=self.stream, log_close=False)
        if not prog.tty:  # batch logs: one line per stage (its end); -v also shows where each starts
            log.debug("stage %s ...", name)
        prog.start()
        try:
            yield info
        except BaseException:
            self.current = None
            prog.abort()
            raise
        maybe_crash(name)  # fault injection (tests): killed after the work, before its checkpoint
        self.current = None
        prog.finish()
        prog.close()
        seconds = time.perf_counter() - t0
        # host<->device bytes of this stage (GPU backend only: nothing is counted on the CPU); not the checkpoint
        # writer's copies, which its thread makes while this stage runs (counted apart: backends.host_later)
        now = transfer_totals()
        moved = {k: now[k] - moved0[k] for k in STAGE_TRANSFERS if k in now and now[k] != moved0[k]}
        self.stages[name] = {"seconds": round(seconds, 4), "rss_mb": round(rss_mb(), 1), **info, **moved}
        if self.ends:
            t1 = time.perf_counter()
            for end in self.ends:
                end(name)
            self.fixed["stage_ends"] = round(self.fixed.get("stage_ends", 0.0) + time.perf_counter() - t1, 4)
        details = " ".join(f"{k}={v}" for k, v in info.items())
        counts = f": {prog.counts()}" if prog.counts() else ""
        if prog.tty or seconds < prog.interval:
            # on a terminal the progress line said it all; in a batch log the run's summary says it (a stage
            # shorter than a progress interval needs no progress line): the details stay one -v away
            log.debug("stage %s done in %.2fs%s%s", name, seconds, counts, f"; {details}" if details else "")
        else:  # a long stage in a batch log: its end is progress
            log.info("stage %s done in %.2fs%s", name, seconds, counts)
            if details:
                log.debug("stage %s: %s", name, details)
