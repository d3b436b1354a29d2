"""Progress of long stages: a live line on a terminal, plain log lines otherwise.

On a TTY (stderr) each stage shows ``[stage] 42% 84,000/200,000 docs 51,200 docs/s ETA 2s``,
redrawn in place.  Elsewhere (CI, batch logs) the same facts go through the
``gpu_dedup`` logger at most every 10 seconds and at the end.  Nothing is
shown when the logger is quieter than INFO (``--quiet``).
"""

from __future__ import annotations

import logging
import sys
import time

log = logging.getLogger("gpu_dedup")


class Progress:
    def __init__(self, stage: str, total: int, unit: str = "docs", interval: float = 10.0, stream=None):
        self.stage, self.total, self.unit = stage, max(int(total), 0), unit
        self.done = 0
        self.t0 = self.last = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = log.isEnabledFor(logging.INFO)
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.2 if self.tty else interval

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self) -> str:
        elapsed = max(time.perf_counter() - self.t0, 1e-9)
        rate = self.done / elapsed
        pct = f"{100 * self.done / self.total:3.0f}% " if self.total else ""
        eta = ""
        if self.total and rate > 0 and self.done < self.total:
            eta = f" ETA {(self.total - self.done) / rate:.0f}s"
        return f"[{self.stage}] {pct}{self.done:,}/{self.total:,} {self.unit} {rate:,.0f} {self.unit}/s{eta}"

    def update(self, n: int) -> None:
        self.done += int(n)
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            if self.tty:
                self.stream.write("\r" + self._line().ljust(79))
                self.stream.flush()
            else:
                log.info("%s", self._line())

    def close(self) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\r" + self._line().ljust(79) + "\n")
            self.stream.flush()
        elif time.perf_counter() - self.t0 >= self.interval:
            log.info("%s", self._line())


def chunks(n: int, size: int):
    """(start, stop) pairs covering range(n) in steps of ``size``."""
    for lo in range(0, n, max(size, 1)):
        yield lo, min(lo + size, n)
