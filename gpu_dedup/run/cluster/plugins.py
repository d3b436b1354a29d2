"""A scheduler plugin the runs register on the cluster they start or join (imported only with Dask).

:class:`LooseRestrictions`: a task placed on a worker loosely (``workers=[...]``, ``allow_other_workers=True``:
:func:`gpu_dedup.run.cluster.routing.placed`) runs elsewhere when its worker is gone, but not when every worker is
gone at once.  Then it waits in ``no-worker``, and Dask's scheduler (2026.8) hands a ``no-worker`` task to a new
worker only when the task's restrictions name it: a restarted worker has a new address, so the task waited
forever (dask/distributed#7346, #8600).  Both of a 2-worker cluster's workers restarted for memory, and the run
waited with its workers idle."""

from __future__ import annotations

from distributed.diagnostics.plugin import SchedulerPlugin


class LooseRestrictions(SchedulerPlugin):
    """As a worker joins: a waiting task whose loose worker restrictions name only workers that are gone loses
    them, so the scheduler runs it on the joining worker (or any other)."""

    name = "gpu-dedup-loose-restrictions"

    def add_worker(self, scheduler, worker: str) -> None:
        live = scheduler.workers
        for ts in list(scheduler.unrunnable):
            if ts.loose_restrictions and ts.worker_restrictions and not any(w in live for w in ts.worker_restrictions):
                ts.worker_restrictions = None  # the scheduler's next step after this hook schedules it
