"""Progress of stages: a live line on a terminal, plain log lines otherwise.

On a TTY (stderr) each stage shows ``[stage] 42% 84,000/200,000 docs 51,200 docs/s ETA 2s``,
redrawn in place and left as ``[stage] 100% 200,000/200,000 docs 50,800 docs/s in 3.9s``.
Elsewhere (CI, batch logs) the same facts go through the ``gpu_dedup``
logger at most every 10 seconds while a stage runs; :class:`gpu_dedup.run.stagelog.StageLog`
ends each stage that ran that long with one ``stage NAME done in ...s: DONE/TOTAL UNIT, RATE UNIT/s``
line (a short run's batch log holds its summary only).  Nothing is shown when the logger is quieter
than INFO (``--quiet``).

Counts advance per chunk or per stage, never per document.
"""

from __future__ import annotations

import logging
import os
import sys
import time

log = logging.getLogger("gpu_dedup")

_live: "Progress | None" = None  # the progress whose line is drawn on the terminal, not yet ended


class ClearLine(logging.Filter):
    """Attached to a terminal log handler: a log record first wipes a live
    progress line on that stream, so the two never share a line."""

    def __init__(self, stream):
        super().__init__()
        self.stream = stream

    def filter(self, record) -> bool:
        live = _live
        if live is not None and live.stream is self.stream:
            live.stream.write("\r" + " " * terminal_width(live.stream) + "\r")
            live.stream.flush()
        return True


def terminal_width(stream) -> int:
    """Characters a live line may use on ``stream``'s terminal (one less than its columns, so the
    cursor never wraps): $COLUMNS when set, else the terminal's size, else 80 columns."""
    cols = 0
    try:
        cols = int(os.environ.get("COLUMNS", "0"))
    except ValueError:
        pass
    if cols <= 0:
        try:
            cols = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # no file descriptor, or not a terminal
            cols = 80
    return max(cols - 1, 20)


def attach_to_handlers(logger: logging.Logger | None = None) -> None:
    """Install :class:`ClearLine` on every stream handler of ``logger`` (default: the root logger)."""
    for h in (logger or logging.getLogger()).handlers:
        stream = getattr(h, "stream", None)
        if stream is not None and not any(isinstance(f, ClearLine) for f in h.filters):
            h.addFilter(ClearLine(stream))


class Progress:
    """Progress of one stage over ``total`` items (``None``: the total is not known).

    ``log_close``: on a non-terminal, log a last line at :meth:`close` when the
    stage ran longer than one interval (StageLog turns it off: its own closing
    line carries the counts and the rate).
    """

    def __init__(self, stage: str, total: int | None, unit: str = "docs", interval: float = 10.0, stream=None,
                 log_close: bool = True):
        self.stage, self.unit = stage, unit
        self.total = None if total is None else max(int(total), 0)
        self.done = 0
        self.t0 = self.last = time.perf_counter()
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = log.isEnabledFor(logging.INFO)
        self.tty = self.enabled and hasattr(self.stream, "isatty") and self.stream.isatty()
        self.interval = 0.2 if self.tty else interval
        self.log_close = log_close
        self.closed = False
        self.drawn = False

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    @property
    def elapsed(self) -> float:
        return max(time.perf_counter() - self.t0, 1e-9)

    def counts(self) -> str:
        """``DONE/TOTAL UNIT, RATE UNIT/s`` (``DONE UNIT, ...`` without a total); empty when nothing was counted."""
        if self.total is None and self.done == 0:
            return ""
        rate = self.done / self.elapsed
        of = "" if self.total is None else f"/{self.total:,}"
        return f"{self.done:,}{of} {self.unit}, {rate:,.0f} {self.unit}/s"

    def _line(self, final: bool = False, width: int | None = None) -> str:
        """The progress line; with ``width``, fitted to it: the rate goes first, then the counts,
        then the time, and a line still too long is cut."""
        stage = f"[{self.stage}]"
        pct = counts = speed = when = ""
        rate = self.done / self.elapsed
        if self.total is not None or self.done:
            if self.total is not None:  # nothing to do is all done
                pct = f"{100 * self.done / self.total if self.total else 100:3.0f}%"
            of = "" if self.total is None else f"/{self.total:,}"
            counts, speed = f"{self.done:,}{of} {self.unit}", f"{rate:,.0f} {self.unit}/s"
        if final:
            when = f"in {self.elapsed:.1f}s"
        elif self.total and rate > 0 and self.done < self.total:
            when = f"ETA {(self.total - self.done) / rate:.0f}s"
        parts = [stage, pct, counts, speed, when]
        line = " ".join(p for p in parts if p)
        for drop in (3, 2, 4):  # speed, counts, time
            if width is None or len(line) <= width:
                break
            parts[drop] = ""
            line = " ".join(p for p in parts if p)
        return line if width is None else line[:width]

    def _draw(self, final: bool = False) -> None:
        global _live
        width = terminal_width(self.stream)
        self.stream.write("\r" + self._line(final, width).ljust(width) + ("\n" if final else ""))
        self.stream.flush()
        self.drawn = not final
        _live = None if final else self

    def start(self) -> "Progress":
        """Show the line at once on a terminal (a stage that runs one long call shows what runs)."""
        if self.tty:
            self._draw()
        return self

    def expect(self, n: int) -> None:
        """``n`` more items to do (a stage whose work is known a round at a time)."""
        self.total = (self.total or 0) + max(int(n), 0)

    def update(self, n: int) -> None:
        self.done += int(n)
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last >= self.interval:
            self.last = now
            if self.tty:
                self._draw()
            else:
                log.info("%s", self._line())

    def finish(self) -> None:
        """The stage completed: every item is done (stages made of one call count them here)."""
        if self.total is not None and self.done < self.total:
            self.done = self.total

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.enabled:
            return
        if self.tty:
            self._draw(final=True)
        elif self.log_close and time.perf_counter() - self.t0 >= self.interval:
            log.info("%s", self._line())

    def abort(self) -> None:
        """The stage failed: end a half-drawn terminal line so the error starts on its own line."""
        if self.closed:
            return
        self.closed = True
        if self.tty and self.drawn:
            global _live
            self.stream.write("\n")
            self.stream.flush()
            _live = None


def chunks(n: int, size: int):
    """(start, stop) pairs covering range(n) in steps of ``size``."""
    for lo in range(0, n, max(size, 1)):
        yield lo, min(lo + size, n)
