"""The Arrow memory pool of the processes gpu_dedup starts (the command's own process, a local cluster's
workers): jemalloc where this pyarrow has it, unless ``ARROW_DEFAULT_MEMORY_POOL`` names one.

Why: a run reads its shards in batches of about 32 MiB, each decoded, used and freed.  With pyarrow's
default pool (mimalloc), on a Linux machine whose transparent huge pages are ``always``, every batch's
pages were faulted in and zeroed again: the read stage of 10^6 documents (1.59 GB of text, 2 cores)
spent 3.4 to 4.8 s in the kernel (clearing huge pages) against 1.8 to 2.3 s with jemalloc, and took
5.5 to 6.0 s against 4.2 to 4.9 s; the whole run's peak memory was a little lower.  A process that
imports gpu_dedup as a library keeps the pool its owner chose.

pyarrow's jemalloc gives freed pages back to the system at once (a decay of 0 ms), so the next batch's
buffers were faulted in and zeroed again all the same.  The processes gpu_dedup starts keep freed pages for
reuse for :data:`DECAY_MS` (jemalloc returns them gradually over that time): on 10^6 documents (2 cores,
3 rounds; results/bench/host-costs) the run's system time fell from 10.4-11.3 s to 7.0-7.6 s with shards
written and from 6.0-7.2 s to 5.3-5.6 s with a removal list, every wall was lower, and the peak rose by
40-80 MB.  Never giving them back (-1) was no faster than 5 s and raised the peak by 400-500 MB.
"""

from __future__ import annotations

import os

POOL_VARIABLE = "ARROW_DEFAULT_MEMORY_POOL"
PREFERRED = "jemalloc"
DECAY_MS = 5000  # how long jemalloc keeps freed pages for reuse (see the module)
JEMALLOC_CONF_VARIABLE = "JE_ARROW_MALLOC_CONF"  # pyarrow's jemalloc's own settings: a user's are kept


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
    """Make the preferred pool this process's default (before the run allocates), keeping freed pages for
    reuse where it is jemalloc (:func:`keep_freed_pages`); the pool now in use."""
    import pyarrow as pa

    if preferred_pool() is not None:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    keep_freed_pages()
    return pa.default_memory_pool().backend_name


def keep_freed_pages() -> bool:
    """Where this process's Arrow pool is jemalloc and ``JE_ARROW_MALLOC_CONF`` does not set it: freed pages
    kept for reuse for :data:`DECAY_MS` (in the memory arenas made from now on: call it before the process
    allocates).  Whether it did."""
    import pyarrow as pa

    if os.environ.get(JEMALLOC_CONF_VARIABLE) or pa.default_memory_pool().backend_name != "jemalloc":
        return False
    pa.jemalloc_set_decay_ms(DECAY_MS)
    return True


def worker_environment(env: dict) -> dict:
    """``env`` for worker processes a run starts, with the preferred pool where there is one."""
    name = preferred_pool()
    return env if name is None else {**env, POOL_VARIABLE: name}
