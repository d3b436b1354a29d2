"""Local Dask clusters the cluster tests run on: worker processes of one thread each, each Numba on one thread
(the workers share this machine's cores)."""

from __future__ import annotations

from contextlib import contextmanager


def local_cluster(n: int):
    """A LocalCluster of ``n`` such workers (a context manager)."""
    from distributed import LocalCluster

    return LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=":0",
                        env={"NUMBA_NUM_THREADS": "1"})


@contextmanager
def scheduler_of(n: int):
    """The scheduler address of a :func:`local_cluster` of ``n`` workers, closed on leaving."""
    with local_cluster(n) as cluster:
        yield cluster.scheduler_address
