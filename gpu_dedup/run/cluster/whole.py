"""A cluster of one worker runs the whole run as one task on it (``cluster.whole_on_one_worker``).

With one worker nothing moves between workers, and the block-by-block executor's routes, tasks and scheduler
round trips between stages are all cost: on 2 cores, 10^6 documents (a removal list) took 14.1-15.2 s block by
block on a running one-worker cluster, 8.4-10.2 s as one task there, 8.6-10.5 s in one process
(results/bench/whole-run/).  The one-process sequence runs in the worker instead
(:func:`gpu_dedup.run.local.run_local`: its kernels already loaded there, its device its own on a Dask-CUDA
worker), writing the same outputs, checkpoints and report as one process; the client books its own start-up
and connection, and the task's way to the worker, as the run's fixed costs, so the report's seconds still add
up to the wall.  Nothing per document comes back to the client: like a cluster run's, the result reads
``kept`` / ``cluster`` from the output directory when asked.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import replace

from gpu_dedup.config import Config
from gpu_dedup.run.cluster.routing import placed
from gpu_dedup.run.local import run_local
from gpu_dedup.storage.parquet import input_bytes

log = logging.getLogger("gpu_dedup")

# the corpus fits the worker when this many times its uncompressed size, plus the interpreter with its kernels,
# stays within the worker's memory limit: one process peaked at 2.5 to 4.4 times the text (held inputs, the
# normalized texts, Arrow's retained pages; results/bench/layouts)
FOOTPRINT = 5
BASE_BYTES = 1 << 30


def whole_run_worker(client, cfg: Config, shards, job) -> str | None:
    """The address of the cluster's only worker when this run goes to it whole, else None (and why, at -v)."""
    address, why = _whole_run_worker(client, cfg, shards, job)
    if address is None:
        log.debug("the run goes block by block on the cluster: %s", why)
    return address


def _whole_run_worker(client, cfg: Config, shards, job) -> tuple[str | None, str]:
    c = cfg.cluster
    if c.workers is not None and c.workers != 1:  # a local cluster this run started: its size is known
        return None, f"{c.workers} workers"
    if c.whole_on_one_worker is False:
        return None, "cluster.whole_on_one_worker is false"
    if c.shuffle is not None:
        return None, f"cluster.shuffle = {c.shuffle} asks for the cluster's routes"
    if c.spill_texts != "auto" or c.device_memory_limit != "auto":
        return None, "cluster.spill_texts / cluster.device_memory_limit set where the cluster's blocks keep their texts"
    if job.out is None or job.prior.active or job.sink is not None:
        return None, "a run with an index keeps the cluster's own way"
    if any(s.format == "memory" for s in shards):
        return None, "in-memory inputs live in this process, not on the worker"
    workers = client.scheduler_info()["workers"]
    if len(workers) != 1:
        return None, f"{len(workers)} workers"
    address, info = next(iter(workers.items()))
    limit, size = info.get("memory_limit") or 0, corpus_bytes(shards)
    if limit and FOOTPRINT * size + BASE_BYTES > limit:
        return None, (f"the corpus ({size / 2**30:.1f} GiB uncompressed) may not fit the worker's memory limit "
                      f"({limit / 2**30:.1f} GiB) in one piece")
    return address, ""


def corpus_bytes(shards) -> int:
    """The inputs' size in memory (:func:`gpu_dedup.storage.parquet.input_bytes` of each)."""
    return sum(input_bytes(s) for s in shards)


def run_whole(inputs, output_dir, cfg: Config, restart: bool, write_shards: bool, booked: dict, sent: float,
              report_extra: dict):
    """On the worker: the one-process run, with the client's fixed costs and the task's transit (``sent``: the
    client's ``time.time()`` as it submitted) booked; its per-document arrays stay here."""
    from distributed import get_client

    booked = {**booked, "handoff": round(max(0.0, time.time() - sent), 4)}
    local = replace(cfg, cluster=replace(cfg.cluster, workers=None, scheduler=None))
    done = threading.Event()
    watcher = threading.Thread(target=_stopped_by_client, daemon=True, name="gpu-dedup-stop-watcher",
                               args=(stop_event_name(sent), get_client(), threading.get_ident(), done))
    watcher.start()
    try:
        res = run_local(inputs, output_dir, local, restart=restart, write_shards=write_shards, booked=booked,
                        report_extra=report_extra)
    except KeyboardInterrupt:  # the client's stop, handled by the run as in one process: a plain error for Dask
        raise InterruptedError("the run was stopped by its client") from None
    finally:
        done.set()
    return replace(res, duplicates_table=None, kept_rows=None, cluster_rows=None, edges=None, scored=None, rep=None)


def run_on_worker(client, address: str, inputs, output_dir, cfg: Config, restart: bool, write_shards: bool,
                  booked: dict):
    """On the client: the whole run as one task on ``address``; an interrupt here stops it there (and waits,
    up to a minute, for it to end as an interrupted run ends) before it goes on."""
    sent = time.time()
    extra = {"cluster": {"workers": 1, "worker": address, "run": "whole, as one task on the only worker"}}
    # placed on the worker, loosely: should it die, Dask runs the task again on the worker that replaces it (its
    # nanny's), which resumes from the checkpoints; a task pinned to the dead worker's address waited forever
    future = client.submit(run_whole, inputs, output_dir, cfg, restart, write_shards, booked, sent, extra,
                           pure=False, **placed([address]))
    try:
        return future.result()
    except KeyboardInterrupt:
        from distributed import Event, wait

        try:
            Event(stop_event_name(sent), client=client).set()
            wait([future], timeout=60)
        except Exception:  # noqa: BLE001 - the cluster is going: the worker's run goes with it
            pass
        if future.status == "finished":  # it ended before the stop reached it: its outputs are whole
            log.warning("the run had finished on the worker before the interrupt reached it: its outputs are "
                        "complete")
            return future.result()
        raise


def stop_event_name(sent: float) -> str:
    return f"gpu-dedup-stop-whole-run-{sent!r}"


def _stopped_by_client(name: str, client, thread_id: int, done: threading.Event) -> None:
    """A watcher on the worker: when the client sets the run's Dask event ``name`` (its user pressed Ctrl-C),
    the task's thread gets a KeyboardInterrupt, which the run handles as in one process (finished stages kept
    for the rerun, the output directory's lock released).  ``client``: the worker's, taken in the task (an
    event made there cannot be used from this thread)."""
    from distributed import Event

    try:
        event = Event(name, client=client)
    except Exception:  # noqa: BLE001 - no scheduler to ask: nobody can ask for a stop
        return
    while not done.is_set():
        try:
            if event.wait(timeout=0.5):
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id),
                                                           ctypes.py_object(KeyboardInterrupt))
                return
        except Exception:  # noqa: BLE001 - the scheduler is gone: nobody is left to ask for a stop
            return
