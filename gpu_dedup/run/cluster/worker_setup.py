"""Run by each worker process of a local CPU cluster as it starts (Dask's preload, see
:data:`gpu_dedup.run.cluster.connection.WORKER_SETUP`)."""

from gpu_dedup.run.cluster.connection import own_process_group


def dask_setup(worker) -> None:
    """A process group of its own and SIGTERM back: a signal to the run's process group reaches only the run's
    own process, and the worker's nanny still ends it at once."""
    own_process_group()
