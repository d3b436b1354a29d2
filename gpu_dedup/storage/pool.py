"""The Arrow memory pool of the processes gpu_dedup starts (the command's own process, a local cluster's
workers): jemalloc where this pyarrow has it, unless ``ARROW_DEFAULT_MEMORY_POOL`` names one.

Why: a run reads its shards in batches of about 32 MiB, each decoded, used and freed.  With pyarrow's
default pool (mimalloc), on a Linux machine whose transparent huge pages are ``always``, every batch's
pages were faulted in and zeroed again: the read stage of 10^6 documents (1.59 GB of text, 2 cores)
spent 3.4 to 4.8 s in the kernel (clearing huge pages) against 1.8 to 2.3 s with jemalloc, and took
5.5 to 6.0 s against 4.2 to 4.9 s; the whole run's peak memory was a little lower.  A process that
imports gpu_dedup as a library keeps the pool its owner chose.
"""

from __future__ import annotations

import os

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
PREFERRED = "jemalloc"


def preferred_pool() -> str | None:
    """The pool name for a process gpu_dedup starts: None where the user chose one (``ARROW_DEFAULT_MEMORY_POOL``)
    or this pyarrow lacks jemalloc."""
    if os.environ.get(POOL_VARIABLE):
        return None
    import pyarrow as pa

    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:  # a pyarrow built without it (e.g. on Windows)
        return None
    return PREFERRED


def use_preferred_pool() -> str:
    """Make the preferred pool this process's default (before the run allocates); the pool now in use."""
    import pyarrow as pa

    if preferred_pool() is not None:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    return pa.default_memory_pool().backend_name


def worker_environment(env: dict) -> dict:
    """``env`` for worker processes a run starts, with the preferred pool where there is one."""
    name = preferred_pool()
    return env if name is None else {**env, POOL_VARIABLE: name}
