"""Values taken later with ``result()``: the two shapes of a step started now and read after the caller's next
work.  :class:`Ready` holds a value computed at once; :class:`Soon` computes it on a thread of its own.

Both the executors (:meth:`gpu_dedup.run.contract.Executor.soon` and ``take_soon``) and the report (its
sample texts and ids) hand these back, so they sit below every layer that uses them.
"""

from __future__ import annotations

import threading
from typing import Any, Callable


class Ready:
    """A value taken at once (what :meth:`Executor.soon` hands back when it ran the step at once), handed back
    by ``result()``."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def result(self) -> Any:
        return self.value


class Soon:
    """``fn(*args, **kw)`` on a thread of its own, beside what the caller does next.  ``result()`` waits for it
    and hands back its value or raises its error; a caller that fails first leaves it to end alone (a daemon
    thread: it holds no process open), its error unread."""

    def __init__(self, fn: Callable, args: tuple = (), kw: dict | None = None, name: str = "gpu_dedup-soon") -> None:
        self._box: dict = {}
        self._thread = threading.Thread(target=self._run, args=(fn, args, kw or {}), name=name, daemon=True)
        self._thread.start()

    def _run(self, fn: Callable, args: tuple, kw: dict) -> None:
        try:
            self._box["value"] = fn(*args, **kw)
        except BaseException as exc:  # noqa: BLE001 - handed to result()
            self._box["error"] = exc

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["value"]
