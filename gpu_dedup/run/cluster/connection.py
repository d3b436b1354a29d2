"""Connecting to Dask: a client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers
(CPU processes, or one Dask-CUDA worker per visible GPU, counted without a CUDA context on the client)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading

from gpu_dedup.config import Config
from gpu_dedup.errors import BackendError, ConfigError

log = logging.getLogger("gpu_dedup")


# The scheduler of a local cluster this process starts: no work stealing.  A task that reads a block is placed
# on the block's worker (DaskExecutor.map); stealing it for an idle worker copied the block (tens of MiB) there.
LOCAL_SCHEDULER = {"distributed.scheduler.work-stealing": False}


def connect(cfg: Config):
    """A client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers."""
    try:
        import dask
        from distributed import Client
    except ImportError:
        raise BackendError("--workers / --scheduler need Dask: pip install -e '.[dask]' in the gpu_dedup "
                           "checkout (or pip install 'dask[distributed,dataframe]')") from None
    c = cfg.cluster
    if c.scheduler:
        client = _client_within(Client, c.scheduler, connect_timeout())
        cluster = None
    elif cfg.backend == "gpu":
        devices = gpu_devices(c.workers)  # before dask-cuda: a clear error, and no CUDA context here
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError:
            raise BackendError("GPU workers need dask-cuda and dask-cudf: pip install -e '.[cuda12]' (or "
                               "'.[cuda13]') in the gpu_dedup checkout; README.md, section GPU") from None
        with dask.config.set(LOCAL_SCHEDULER), shielded_children():
            cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, n_workers=c.workers,
                                       memory_limit=c.memory_limit, dashboard_address=":0")
            client = Client(cluster)
    else:
        with shielded_children():
            cluster = local_cluster(c.workers, c.memory_limit, {"NUMBA_NUM_THREADS": str(worker_threads(c.workers))})
            client = Client(cluster)
    log.info("Dask dashboard: %s (%d workers)", client.dashboard_link, len(client.scheduler_info()["workers"]))
    if log.isEnabledFor(logging.INFO):  # -q: nothing
        print(f"Dask dashboard: {client.dashboard_link}", flush=True)
    return client, cluster


def quiet_teardown(client) -> None:
    """Silence Dask in the worker and scheduler processes of a local cluster about to be closed.

    Closing it while tasks run or workers fetch data from each other (Ctrl-C, SIGTERM, a failed stage) makes
    them log what the close breaks, with tracebacks, on this process's stderr, which they share: "failed
    during get data ... StreamClosedError", "Closed comm ... while trying to write", "Removing worker ...
    caused the cluster to lose already computed task(s)".  The run's outcome is decided by then (its error is
    this process's one line); what a worker logs while the run goes on still shows.  A process that does not
    answer is left as it is."""
    try:
        client.run(_silence_dask_logs, os.getpid(), on_error="ignore")
        client.run_on_scheduler(_silence_dask_logs, os.getpid())
    except Exception:  # noqa: BLE001, S110 - the scheduler is gone: nothing is left to close noisily
        pass


# Loggers of a worker or scheduler process that report a closing cluster's broken connections and tasks:
# Dask's, Tornado's ("Exception in callback") and asyncio's ("Task exception was never retrieved").
TEARDOWN_LOGGERS = ("distributed", "tornado", "asyncio")


def _silence_dask_logs(client_pid: int) -> None:
    """In a worker or scheduler process: nothing more from TEARDOWN_LOGGERS, CRITICAL included (the scheduler
    logs a closed client connection as CRITICAL).  Every logger under them is set too: Dask gives some of its
    own levels (distributed.client, distributed.gc).  Not in the client's process (a LocalCUDACluster's
    scheduler runs there), whose logging main() sets, and which may go on after the run (main([...]))."""
    if os.getpid() == client_pid:
        return
    names = [n for n in list(logging.root.manager.loggerDict)
             if n.startswith(tuple(f"{t}." for t in TEARDOWN_LOGGERS))]
    for name in (*TEARDOWN_LOGGERS, *names):
        logging.getLogger(name).setLevel(logging.CRITICAL + 1)


INTERRUPTS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def shielded_children():
    """Start a local cluster with SIGINT and SIGTERM blocked in this thread: the threads Dask starts meanwhile
    (its event loop, and those that spawn the worker and scheduler processes) inherit the mask, and so do the
    processes they spawn.  Ctrl-C in a terminal and a scheduler's SIGTERM go to a whole process group; a
    worker or scheduler that took them died with a traceback each, and the run's client then waited for a
    scheduler that was gone (exit 1 after 71 s).  Blocked, they reach this process's main thread only, which
    raises KeyboardInterrupt and closes the cluster: one line, exit 130.  A CPU worker and the scheduler move to process groups of their own and take SIGTERM again as they start
    (:func:`own_process_group`), so that closing them is as quick as before; a Dask-CUDA worker keeps them
    blocked (its nanny stops it through a queue, then SIGKILL).  Children end with this process through Dask's
    parent-alive pipe, however it ends.  Signals that came while blocked are delivered on leaving."""
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    from multiprocessing import resource_tracker

    # started here, before the mask: starting it unblocks SIGINT and SIGTERM in the thread that does (Python's
    # resource_tracker.ensure_running), which would be Dask's event loop, and the processes spawned from it
    resource_tracker.ensure_running()
    before = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def own_process_group() -> None:
    """In a scheduler or worker process of a local cluster (started with SIGINT and SIGTERM blocked, see
    :func:`shielded_children`): a process group of its own, so that a signal to the run's group no longer
    reaches it, then SIGTERM as by default (how :class:`SchedulerProcess` and a worker's nanny end it) and
    SIGINT ignored; one that reached the group before is dropped."""
    if not hasattr(signal, "pthread_sigmask"):
        return
    try:
        os.setpgrp()
    except OSError:  # pragma: no cover - already a group leader
        pass
    for sig in INTERRUPTS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)  # a pending one is dropped (ignored)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def worker_threads(workers: int) -> int:
    """Kernel threads of each of ``workers`` local workers: this machine's cores shared among them."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // workers)


def local_cluster(workers: int, memory_limit, env: dict):
    """A local cluster of ``workers`` worker processes (one thread each) whose scheduler runs in a child process
    too, as a Dask deployment's scheduler does: Dask's LocalCluster keeps it inside this process, where its task
    state grew the client with the number of blocks (+30 MiB from 10^5 to 10^6 documents on 2 workers, +5 MiB
    with the scheduler outside).  The children end with this process, however it ends."""
    import dask
    from distributed import Nanny, SpecCluster

    worker = {"cls": Nanny, "options": {"host": "127.0.0.1", "nthreads": 1, "memory_limit": memory_limit,
                                         "env": env, "silence_logs": logging.WARN, "preload": [WORKER_SETUP]}}
    scheduler = {"cls": _scheduler_process_class(),
                 "options": {"host": "127.0.0.1", "port": 0, "dashboard_address": ":0", "config": LOCAL_SCHEDULER}}
    with dask.config.set(KEEP_GLIBC_DEFAULTS):
        return SpecCluster(scheduler=scheduler, workers={i: worker for i in range(workers)},
                           silence_logs=logging.WARN, name="gpu_dedup")


# Loaded by each worker process of a local CPU cluster as it starts (Dask's preload): its own process group and
# SIGTERM back (own_process_group), so that its nanny's SIGTERM ends it at once when the cluster closes
WORKER_SETUP = "gpu_dedup.run.cluster.worker_setup"


# The workers of a local cluster start without Dask's MALLOC_TRIM_THRESHOLD_=65536: glibc then keeps its own
# defaults, which reuse freed arrays of up to 32 MiB instead of handing every array over 128 KiB back to the OS
# and faulting its pages in again.  At 10^6 documents on 2 workers that was 2.65 M page faults against 0.30 M
# (with Arrow's own pool), 3.8 to 4.9 s of system time a worker against 2.0 to 2.3 s, for about 210 MiB more at
# a worker's peak (955 against 745 MiB).
KEEP_GLIBC_DEFAULTS = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def _serve_scheduler(options: dict, config: dict, address) -> None:
    """The scheduler process: serve until closed; its address goes back through the queue ``address``.
    ``config`` is set here: the Dask config a child inherits yields to the child's own defaults."""
    own_process_group()
    import dask
    from distributed import Scheduler

    dask.config.set(config)

    async def serve():
        async with Scheduler(**options) as scheduler:
            address.put(scheduler.address)
            await scheduler.finished()

    asyncio.run(serve())


@functools.cache
def _scheduler_process_class():
    """The class, made on first use: importing this module needs no Dask."""
    from distributed.deploy.spec import ProcessInterface

    class SchedulerProcess(ProcessInterface):
        """A Dask scheduler in a child process of this one, the way a Nanny runs a worker: Dask's own process
        wrapper ends it when this process ends; ``config`` (Dask settings) is set in the child."""

        def __init__(self, config: dict | None = None, **options):
            super().__init__()
            self.options = options
            self.config = dict(config or {})
            self.process = None

        async def start(self):
            from distributed.process import AsyncProcess
            from distributed.utils import get_mp_context

            address = get_mp_context().Queue()
            self.process = AsyncProcess(target=_serve_scheduler, name="gpu_dedup-scheduler",
                                        args=(self.options, self.config, address))
            self.process.daemon = True
            await self.process.start()
            timeout = connect_timeout()
            loop = asyncio.get_running_loop()
            try:
                self.address = await loop.run_in_executor(None, address.get, True, timeout)
            except Exception:
                await self.close()
                raise BackendError(f"the local Dask scheduler did not start within {timeout:.0f} s "
                                   "(distributed.comm.timeouts.connect)") from None
            await super().start()

        async def close(self):
            if self.process is not None:
                process, self.process = self.process, None
                try:
                    await process.terminate()
                    await process.join(timeout=10)
                except Exception:  # noqa: BLE001 - already gone
                    pass
                process.close()
            await super().close()

    return SchedulerProcess


def connect_timeout() -> float:
    """Seconds a client waits for a scheduler to answer: Dask's ``distributed.comm.timeouts.connect``."""
    import dask

    try:
        return float(dask.utils.parse_timedelta(dask.config.get("distributed.comm.timeouts.connect", "30s")))
    except (TypeError, ValueError):
        return 30.0


def _client_within(Client, address: str, timeout: float):
    """``Client(address)``, or a BackendError when no Dask scheduler answers within ``timeout`` seconds
    (Dask's own timeout does not bound the handshake: a port that accepts connections but speaks another
    protocol, e.g. the dashboard's HTTP, made it wait forever or read a length of exabytes)."""
    box = {}

    def go():
        try:
            box["client"] = Client(address, timeout=timeout)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=go, name="gpu_dedup-connect", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    fix = ("give its address as tcp://HOST:PORT (--scheduler, cluster.scheduler; a scheduler listens on port 8786 "
           "unless told otherwise, its dashboard on 8787) and check that it runs, or use --workers N for a local "
           "cluster")
    if thread.is_alive():  # it stays behind as a daemon thread; the process ends with the error
        raise BackendError(f"no Dask scheduler answered at {address!r} within {timeout + 5:.0f} s (a port that is "
                           f"not a scheduler's, e.g. an HTTP server?); {fix}")
    exc = box.get("error")
    if isinstance(exc, MemoryError):  # its first bytes read as the length of a message of exabytes
        raise BackendError(f"{address!r} answered, but not as a Dask scheduler does (another protocol: an HTTP "
                           f"server such as a scheduler's dashboard?); {fix}") from None
    if isinstance(exc, (OSError, ValueError, TypeError)):  # unreachable, not an address
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BackendError(f"cannot connect to the Dask scheduler {address!r} ({reason}); {fix}") from None
    if exc is not None:
        raise exc
    return box["client"]


def visible_gpus() -> list | None:
    """The GPUs a local CUDA cluster may use, without creating a CUDA context: the entries of
    ``CUDA_VISIBLE_DEVICES`` when it is set, else NVML's device count; None when neither says."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        ids = [d.strip() for d in env.split(",") if d.strip()]
        out = []
        for d in ids:  # CUDA stops at the first invalid entry (e.g. -1)
            if d.lstrip("-").isdigit() and int(d) < 0:
                break
            out.append(d)
        return out
    try:
        import pynvml  # NVML (nvidia-ml-py, a dask-cuda dependency) counts devices without a CUDA context

        pynvml.nvmlInit()
        try:
            return [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


def gpu_devices(workers: int) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a local CUDA cluster of ``workers`` workers (one per GPU); a
    ConfigError when fewer GPUs are visible."""
    gpus = visible_gpus()
    if gpus is None:
        return None  # dask-cuda finds the devices itself
    if workers > len(gpus):
        where = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
                 if "CUDA_VISIBLE_DEVICES" in os.environ else "NVML")
        raise ConfigError(f"--workers {workers} with --backend gpu asks for {workers} GPU workers (one per GPU), but "
                          f"{len(gpus)} GPU(s) are visible ({where}); use --workers {max(1, len(gpus))} or fewer, or "
                          "make more GPUs visible" if gpus else
                          f"--workers {workers} with --backend gpu needs a GPU per worker, but no GPU is visible "
                          f"({where}); run with --backend cpu, or make GPUs visible")
    return ",".join(gpus[:workers])
