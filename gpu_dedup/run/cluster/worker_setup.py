"""Run by each worker process of a local CPU cluster as it starts (Dask's preload, see
:data:`gpu_dedup.run.cluster.connection.WORKER_SETUP`)."""

from gpu_dedup.run.cluster.connection import own_process_group
from gpu_dedup.storage.pool import keep_freed_pages


def dask_setup(worker) -> None:
    """A process group of its own and SIGTERM back: a signal to the run's process group reaches only the run's
    own process, and the worker's nanny still ends it at once.  Its Arrow pool (the command's, through
    ``ARROW_DEFAULT_MEMORY_POOL``: :mod:`gpu_dedup.storage.pool`) keeps freed pages for reuse as the command's
    does."""
    own_process_group()
    keep_freed_pages()
