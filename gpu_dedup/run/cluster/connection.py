"""Connecting to Dask: a client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers
(CPU processes, or Dask-CUDA workers: one per visible GPU, or ``cluster.workers_per_gpu`` sharing each; the GPUs
are counted, and their memory read, without a CUDA context on the client)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import threading
from dataclasses import dataclass
from typing import Any

from gpu_dedup.backends import traits
from gpu_dedup.backends.gpu_probe import simulator_requested
from gpu_dedup.config import Config, parse_size
from gpu_dedup.run.quiet import quiet_shuffles
from gpu_dedup.errors import BackendError, ConfigError
from gpu_dedup.storage.pool import worker_environment

log = logging.getLogger("gpu_dedup")


# The scheduler of a local cluster this process starts: no work stealing.  A task that reads a block is placed
# on the block's worker (DaskExecutor.map); stealing it for an idle worker copied the block (tens of MiB) there.
LOCAL_SCHEDULER = {"distributed.scheduler.work-stealing": False}


def connect(cfg: Config):
    """A client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers."""
    try:
        from distributed import Client
    except ImportError:
        raise BackendError("--workers / --scheduler need Dask: pip install -e '.[dask]' in the gpu_dedup "
                           "checkout (or pip install 'dask[distributed,dataframe]')") from None
    c = cfg.cluster
    if c.scheduler:
        client = _client_within(Client, c.scheduler, connect_timeout())
        cluster = None
    elif traits(cfg.backend).workers == "cuda":  # Dask-CUDA workers (see gpu_cluster)
        with shielded_children():
            cluster = gpu_cluster(c.workers or 1, c)
            client = Client(cluster)
    else:
        workers = c.workers or 1  # set: cluster.enabled without a scheduler
        with shielded_children():
            cluster = local_cluster(workers, c.memory_limit, {"NUMBA_NUM_THREADS": str(worker_threads(workers))})
            client = Client(cluster)
    log.info("Dask dashboard: %s (%d workers)", client.dashboard_link, len(client.scheduler_info()["workers"]))
    register_plugins(client)
    return client, cluster


def register_plugins(client) -> None:
    """The runs' scheduler plugin (:class:`~gpu_dedup.run.cluster.plugins.LooseRestrictions`: tasks placed on a
    worker that is gone run elsewhere even after every worker was gone at once).  A scheduler that cannot load it
    (a joined one without gpu_dedup installed) goes without, and the log says what that risks."""
    from gpu_dedup.run.cluster.plugins import LooseRestrictions

    try:
        client.register_plugin(LooseRestrictions())
    except Exception as exc:  # noqa: BLE001 - the scheduler's own error, whatever it is
        log.warning("the scheduler did not take gpu_dedup's plugin (%s: %s): should every worker be lost at once, "
                    "the run may wait for them; install gpu_dedup where the scheduler runs", type(exc).__name__, exc)


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

    env = worker_environment(env)  # their Arrow memory pool: as the command's own (storage.pool)
    # the command's -q asks Dask for errors only (DASK_LOGGING__DISTRIBUTED); otherwise warnings and up
    silence = logging.ERROR if os.environ.get("DASK_LOGGING__DISTRIBUTED", "").lower() == "error" else logging.WARN
    worker = {"cls": Nanny, "options": {"host": "127.0.0.1", "nthreads": 1, "memory_limit": memory_limit,
                                         "env": env, "silence_logs": silence, "preload": [WORKER_SETUP]}}
    scheduler = {"cls": _scheduler_process_class(),
                 "options": {"host": "127.0.0.1", "port": 0, "dashboard_address": ":0", "config": LOCAL_SCHEDULER}}
    with dask.config.set(worker_pools(workers)):
        return SpecCluster(scheduler=scheduler, workers={i: worker for i in range(workers)},
                           silence_logs=silence, name="gpu_dedup")


# Loaded by each worker process of a local CPU cluster as it starts (Dask's preload): its own process group and
# SIGTERM back (own_process_group), so that its nanny's SIGTERM ends it at once when the cluster closes
WORKER_SETUP = "gpu_dedup.run.cluster.worker_setup"


# The workers of a local cluster start without Dask's MALLOC_TRIM_THRESHOLD_=65536: glibc then keeps its own
# defaults, which reuse freed arrays of up to 32 MiB instead of handing every array over 128 KiB back to the OS
# and faulting its pages in again.  At 10^6 documents on 2 workers that was 2.65 M page faults against 0.30 M
# (with Arrow's own pool), 3.8 to 4.9 s of system time a worker against 2.0 to 2.3 s, for about 210 MiB more at
# a worker's peak (955 against 745 MiB).
KEEP_GLIBC_DEFAULTS = {"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None}


def worker_pools(workers: int) -> dict:
    """The Dask config under which a local cluster of ``workers`` workers is started: glibc's defaults
    (KEEP_GLIBC_DEFAULTS), and OMP_NUM_THREADS the worker's share of the cores (:func:`worker_threads`) instead
    of Dask's 1.  Arrow sizes its CPU pool by OMP_NUM_THREADS: with Dask's 1 every Parquet decode of a block (a
    worker's read stage, and the Arrow kernels after it) ran on one core of the machine's (pa.cpu_count() 1 in
    a worker of 2 cores); the worker's one task thread runs one block at a time, its Numba kernels take
    NUMBA_NUM_THREADS, the same share."""
    return {**KEEP_GLIBC_DEFAULTS, "distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS": worker_threads(workers)}


def _serve_scheduler(options: dict, config: dict, address) -> None:
    """The scheduler process: serve until closed; its address goes back through the queue ``address``.
    ``config`` is set here: the Dask config a child inherits yields to the child's own defaults."""
    own_process_group()
    import dask
    from distributed import Scheduler

    dask.config.set(config)
    quiet_shuffles()  # the P2P shuffle's routine lines, logged here (the scheduler's)

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
            self.process: Any = None

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
    fix = ("give its address as tcp://HOST:PORT (--scheduler, cluster.scheduler; a scheduler listens on port 8786 "
           "unless told otherwise, its dashboard on 8787) and check that it runs, or use --workers N for a local "
           "cluster")
    if _refused(address):  # nothing listens there: said at once, where Dask retries until its timeout (30 s)
        raise BackendError(f"cannot connect to the Dask scheduler {address!r} (nothing listens there: connection "
                           f"refused); {fix}")

    def go():
        try:
            box["client"] = Client(address, timeout=timeout)
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=go, name="gpu_dedup-connect", daemon=True)
    thread.start()
    thread.join(timeout + 5)
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


def _refused(address: str) -> bool:
    """Whether a TCP connection to ``address`` (``tcp://HOST:PORT`` or ``HOST:PORT``) is refused at once: nothing
    listens on that port.  Anything else (a name that does not resolve, a slow or filtered host, another scheme)
    is left to Dask's client, which says it."""
    import socket  # noqa: PLC0415

    rest = address[len("tcp://"):] if address.startswith("tcp://") else address
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not host or not port.isdigit():
        return False
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=2):
            return False
    except ConnectionRefusedError:
        return True
    except OSError:
        return False


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


def gpu_devices(workers: int, per_gpu: int = 1) -> str | None:
    """``CUDA_VISIBLE_DEVICES`` for a local CUDA cluster of ``workers`` workers, ``per_gpu`` on each GPU; a
    ConfigError when fewer GPUs are visible."""
    gpus = visible_gpus()
    if gpus is None:
        return None  # dask-cuda finds the devices itself
    need = -(-workers // per_gpu)
    if need > len(gpus):
        where = (f"CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r}"
                 if "CUDA_VISIBLE_DEVICES" in os.environ else "NVML")
        if not gpus:
            raise ConfigError(f"--workers {workers} with --backend gpu needs a GPU per worker, but no GPU is visible "
                              f"({where}); run with --backend cpu, or make GPUs visible")
        if per_gpu == 1:
            raise ConfigError(f"--workers {workers} with --backend gpu asks for {workers} GPU workers (one per GPU), "
                              f"but {len(gpus)} GPU(s) are visible ({where}); use --workers {len(gpus)} or fewer, "
                              "make more GPUs visible, or share each GPU among several workers (--set "
                              f"cluster.workers_per_gpu={-(-workers // len(gpus))})")
        raise ConfigError(f"--workers {workers} with cluster.workers_per_gpu = {per_gpu} needs {need} GPUs, but "
                          f"{len(gpus)} are visible ({where}); use --workers {len(gpus) * per_gpu} or fewer, or make "
                          "more GPUs visible")
    return ",".join(gpus[:need])


def device_bytes(device: str) -> tuple[int, int] | None:
    """(total, free) memory of GPU ``device`` (an index or a UUID, as CUDA_VISIBLE_DEVICES names it) from NVML,
    without a CUDA context; None when NVML cannot say."""
    try:
        import pynvml  # noqa: PLC0415  nvidia-ml-py, a dask-cuda dependency

        pynvml.nvmlInit()
        try:
            handle = (pynvml.nvmlDeviceGetHandleByIndex(int(device)) if device.isdigit()
                      else pynvml.nvmlDeviceGetHandleByUUID(device))
            info = pynvml.nvmlDeviceGetMemoryInfo(handle)
            return int(info.total), int(info.free)
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no NVML, or a device it does not know
        return None


@dataclass(frozen=True)
class GPUWorkerMemory:
    """What a GPU worker a run starts may use of its device: Dask-CUDA's ``device_memory_limit`` (past it, the
    worker spills device objects to host memory) and its RMM allocator: a pool of ``pool_bytes`` growing up to
    ``pool_max_bytes`` (None: the whole device), or RMM's asynchronous allocator (``rmm_async``)."""

    device_memory_limit: int | str  # bytes, or Dask-CUDA's "default" (80 % of the device)
    pool_bytes: int | None  # None: no pool from Dask-CUDA (the GPU backend wraps RMM's default in one)
    pool_max_bytes: int | None
    rmm_async: bool


def gpu_worker_memory(cluster_cfg, memory: tuple[int, int] | None) -> GPUWorkerMemory:
    """The device memory of each of ``cluster.workers_per_gpu`` workers sharing a GPU with ``memory`` = (total,
    free) bytes: ``cluster.device_memory_limit`` (auto: 80 % of its share), an RMM pool starting at half its share
    and, when the GPU is shared, growing to POOL_MAX_SHARE of its share at most (so one worker cannot starve the
    others; the rest is its CUDA context and the libraries' own memory); with ``cluster.rmm_async``, RMM's
    asynchronous allocator instead (one pool the driver shares among them).  A share is of the memory free as the
    cluster starts, where another process (a notebook's own GPU run, whose RMM pool holds half the device) holds
    some: a pool asked for beyond what is free fails the worker's start."""
    per = cluster_cfg.workers_per_gpu
    share = None
    if memory is not None:
        total, free = memory
        share = min(total, free) // per
        if free < total // 2:
            log.warning("GPU memory: %.1f GiB of the device's %.1f GiB are free (another process holds the rest); "
                        "each of its %d worker(s) gets a share of what is free", free / 2**30, total / 2**30, per)
    if cluster_cfg.device_memory_limit != "auto":
        limit: int | str = parse_size(cluster_cfg.device_memory_limit)
    else:
        limit = int(0.8 * share) if share else "default"
    if cluster_cfg.rmm_async or share is None:
        return GPUWorkerMemory(limit, None, None, cluster_cfg.rmm_async)
    align = 256  # RMM's pool sizes are multiples of 256 bytes
    return GPUWorkerMemory(limit, share // 2 // align * align,
                           int(POOL_MAX_SHARE * share) // align * align if per > 1 else None, False)


POOL_MAX_SHARE = 0.9  # a shared GPU's worker: its RMM pool grows to this share of its part of the device


def gpu_cluster(workers: int, cluster_cfg):
    """A local cluster of ``workers`` GPU workers, ``cluster.workers_per_gpu`` on each GPU: a
    ``LocalCUDACluster`` with one worker per GPU; several on a GPU, workers started one by one as
    ``dask cuda worker`` starts them (dask-cuda's LocalCUDACluster names each worker by its GPU, so it starts
    one a GPU).  Under the CUDA simulator (``GPU_DEDUP_SIMULATOR``): the same workers without Dask-CUDA."""
    per = cluster_cfg.workers_per_gpu
    devices = gpu_devices(workers, per)  # before dask-cuda: a clear error, and no CUDA context here
    simulated = simulator_requested()
    if not simulated:
        try:
            import dask_cuda  # noqa: F401,PLC0415
        except ImportError:
            raise BackendError("GPU workers need dask-cuda and dask-cudf: pip install -e '.[cuda12]' (or "
                               "'.[cuda13]') in the gpu_dedup checkout; README.md, section GPU") from None
    ids = devices.split(",") if devices else [str(i) for i in range(-(-workers // per))]
    memory = gpu_worker_memory(cluster_cfg, None if simulated else device_bytes(ids[0]))
    if per == 1 and not simulated:
        import dask  # noqa: PLC0415
        from dask_cuda import LocalCUDACluster  # noqa: PLC0415

        with dask.config.set({**LOCAL_SCHEDULER, **worker_pools(workers)}):
            return LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, n_workers=workers,
                                    memory_limit=cluster_cfg.memory_limit, dashboard_address=":0",
                                    device_memory_limit=memory.device_memory_limit, rmm_pool_size=memory.pool_bytes,
                                    rmm_async=memory.rmm_async)
    return shared_gpu_cluster(ids, per, cluster_cfg.memory_limit, memory, simulated)


def shared_gpu_cluster(devices: list, per_gpu: int, memory_limit, memory: GPUWorkerMemory, simulated: bool):
    """``per_gpu`` GPU workers on each of ``devices``, the scheduler in a child process (as
    :func:`local_cluster`'s).  Each worker is a Nanny started as dask-cuda's ``CUDAWorker`` starts one for a GPU:
    ``CUDA_VISIBLE_DEVICES`` listing its GPU first, a CUDA context made at start (``dask_cuda.initialize``), its
    RMM allocator and CPU affinity (``worker_plugins``) and device-to-host spilling past its
    ``device_memory_limit`` (``worker_data_function``); its host memory limit is its share of the machine's.
    ``simulated``: plain workers, the CUDA simulator's environment inherited from this process."""
    import dask  # noqa: PLC0415
    from distributed import Nanny, SpecCluster  # noqa: PLC0415
    from distributed.worker_memory import parse_memory_limit  # noqa: PLC0415

    n = len(devices) * per_gpu
    host_limit = parse_memory_limit(memory_limit, 1, total_cores=n, logger=log)  # bytes: DeviceHostFile needs them
    workers = {}
    for g, dev in enumerate(devices):
        visible = ",".join(devices[g:] + devices[:g])  # its GPU first, as dask-cuda rotates the list
        for j in range(per_gpu):
            options = {"host": "127.0.0.1", "nthreads": 1, "memory_limit": host_limit, "silence_logs": logging.WARNING,
                       "name": f"gpu{dev}-{j}", "env": {"CUDA_VISIBLE_DEVICES": visible}}
            if not simulated:
                options.update(_cuda_worker_options(visible, host_limit, memory))
            workers[f"gpu{dev}-{j}"] = {"cls": Nanny, "options": options}
    scheduler = {"cls": _scheduler_process_class(),
                 "options": {"host": "127.0.0.1", "port": 0, "dashboard_address": ":0", "config": LOCAL_SCHEDULER}}
    with dask.config.set(worker_pools(n)):
        return SpecCluster(scheduler=scheduler, workers=workers, silence_logs=logging.WARNING, name="gpu_dedup-cuda")


def _cuda_worker_options(visible: str, host_limit, memory: GPUWorkerMemory) -> dict:
    """A Nanny's options for a Dask-CUDA worker on the first GPU of ``visible`` (see :func:`shared_gpu_cluster`)."""
    from dask_cuda.utils import nvml_device_index  # noqa: PLC0415
    from dask_cuda.worker_common import worker_data_function, worker_plugins  # noqa: PLC0415

    index = nvml_device_index(0, visible)
    return {
        "env": {"CUDA_VISIBLE_DEVICES": visible},
        "preload": ["dask_cuda.initialize"], "preload_argv": ["--create-cuda-context"],
        "plugins": worker_plugins(device_index=index, rmm_initial_pool_size=memory.pool_bytes,
                                  rmm_maximum_pool_size=memory.pool_max_bytes, rmm_managed_memory=False,
                                  rmm_async_alloc=memory.rmm_async, rmm_release_threshold=None,
                                  rmm_log_directory=None, rmm_track_allocations=False,
                                  rmm_allocator_external_lib_list=None, pre_import=None, enable_cudf_spill=False,
                                  cudf_spill_stats=0),
        "data": worker_data_function(device_memory_limit=memory.device_memory_limit,
                                     memory_limit=host_limit)(index),
    }
