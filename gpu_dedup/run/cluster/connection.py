"""Connecting to Dask: a client for ``cluster.scheduler``, or a local cluster of ``cluster.workers`` workers
(CPU processes, or one Dask-CUDA worker per visible GPU, counted without a CUDA context on the client)."""

from __future__ import annotations

import logging
import os
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
        from distributed import Client, LocalCluster
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
        with dask.config.set(LOCAL_SCHEDULER):
            cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=devices, n_workers=c.workers,
                                       memory_limit=c.memory_limit, dashboard_address=":0")
        client = Client(cluster)
    else:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        threads = max(1, cores // c.workers)
        with dask.config.set(LOCAL_SCHEDULER):
            cluster = LocalCluster(n_workers=c.workers, threads_per_worker=1, processes=True,
                                   memory_limit=c.memory_limit, dashboard_address=":0",
                                   env={"NUMBA_NUM_THREADS": str(threads)})
        client = Client(cluster)
    log.info("Dask dashboard: %s (%d workers)", client.dashboard_link, len(client.scheduler_info()["workers"]))
    if log.isEnabledFor(logging.INFO):  # -q: nothing
        print(f"Dask dashboard: {client.dashboard_link}", flush=True)
    return client, cluster


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
    if isinstance(exc, (OSError, ValueError, TypeError, MemoryError)):  # unreachable, not an address, garbage
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
