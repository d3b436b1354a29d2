"""Dask (CPU workers) and Dask-CUDA (one worker per GPU): the stage sequence with every part on the workers.

:func:`run_cluster` (chosen by :func:`gpu_dedup.run.entry.run_dedup` with ``cluster.workers`` or
``cluster.scheduler``) opens the output directory and the checkpoints and hands a
:class:`~gpu_dedup.run.cluster.executor.DaskExecutor` to the one stage
sequence (:func:`gpu_dedup.run.sequence.execute`).  ``blocks`` plans and reads
the blocks on the workers, ``routing`` moves rows between workers (Dask's
shuffle), ``executor`` is the executor, ``connection`` starts or joins the
cluster.

Every stage's result is saved by the workers under the output directory's
checkpoint folder (which every worker must see: a local cluster, or a shared
filesystem), so a killed cluster run resumes at the last finished stage, with
the same fingerprint, input-identity and commit guarantees as one process.
Results are identical to the single-process run for any number of workers and
any block size.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import replace

from gpu_dedup.backends import cluster_backend
from gpu_dedup.config import Config
from gpu_dedup.errors import ResourceError
from gpu_dedup.run.checkpoint import Checkpoints, NoCheckpoints, run_fingerprint
from gpu_dedup.run.cluster.executor import DaskExecutor
from gpu_dedup.run.cluster.whole import run_on_worker, whole_run_worker
from gpu_dedup.run.sequence import RunResult, execute, open_output, plan_run
from gpu_dedup.run.stagelog import StageLog

log = logging.getLogger("gpu_dedup")

__all__ = ["run_cluster", "DaskExecutor"]


def run_cluster(inputs, output_dir, cfg: Config, *, restart: bool = False, prior=None, sink=None,
                write_shards: bool = True) -> RunResult:
    """The sequence on a Dask cluster; the same outputs as the single-process run
    (:func:`gpu_dedup.run.local.run_local`, whose arguments it takes).

    Resumable like it (stage checkpoints under the output directory, written by the workers), except runs
    against an index, which keep none; the output directory is locked, staged and published alike.  A run
    that writes an index has the workers write its segments (one per block) into the index directory, which
    every worker must see, like the output directory."""
    st = StageLog()  # the run's seconds count from here (from the process's start under the CLI)
    shards, job = plan_run(inputs, output_dir, cfg, prior=prior, sink=sink, write_shards=write_shards, st=st)
    cfg = replace(cfg, backend=cluster_backend(cfg.backend))  # auto: CPU workers (GPU ones only when asked for)
    job = replace(job, cfg=cfg)
    ex = DaskExecutor(shards, cfg, job.prior)
    ex.writes_shards = job.write_shards  # its blocks hold their input batches only for a write stage
    od = None
    ckpt: Checkpoints | NoCheckpoints = NoCheckpoints()
    out = job.out
    resumable = out is not None and not job.prior.active
    whole = False  # the run went to the only worker as one task
    try:
        with st.cost("cluster_start"):  # started, or joined; its workers' kernels load in kernel_load
            ex.connect()  # first: a cluster that cannot start leaves no output directory behind
            ex.advise_pools()  # a joined cluster's workers decoding on one Arrow thread: how to start them
            address = whole_run_worker(ex.client, cfg, shards, job)
        if address is not None:  # one worker: the one-process sequence there, as one task (run/cluster/whole.py)
            log.info("the cluster has one worker (%s): the whole run goes to it as one task", address)
            booked = dict(st.fixed)  # what this process spent so far, the glue between its costs as setup
            glue = time.perf_counter() - st.started - sum(booked.values())
            booked["setup"] = round(booked.get("setup", 0.0) + max(0.0, glue), 4)
            whole = True
            return run_on_worker(ex.client, address, inputs, output_dir, cfg, restart, job.write_shards, booked)
        if out is not None:
            with st.cost("setup"):
                od = open_output(out, shards, inputs, cfg, shards_written=job.write_shards, fresh=not resumable)
                job = replace(job, outdir=od)
                if resumable:
                    fingerprint = run_fingerprint(cfg, shards, f"dask:block_rows={cfg.cluster.block_rows}")
                    ckpt = Checkpoints(out, fingerprint, restart)
        return execute(job, ex, ckpt, st)
    except Exception as exc:
        if type(exc).__name__ != "KilledWorker":
            raise
        limit = cfg.cluster.memory_limit or "the cluster's default"
        if whole:  # the whole run as one task on the only worker (run/cluster/whole.py)
            raise ResourceError(
                f"the Dask worker died running the whole run as one task ({exc.args[0] if exc.args else exc}; Dask "
                f"tried it on the workers that replaced it too); most often the run does not fit the worker's memory "
                f"(memory limit {limit}): raise cluster.memory_limit, or run block by block on more workers "
                "(--workers N, or --set cluster.whole_on_one_worker=false)") from None
        largest = max((b.rows for b in ex.blocks), default=0)
        smaller = max(1, min(cfg.cluster.block_rows, largest or cfg.cluster.block_rows) // 4)  # than the largest block
        raise ResourceError(
            f"Dask workers died running a task ({exc.args[0] if exc.args else exc}); most often a block does not "
            f"fit a worker's memory (memory limit {limit}, cluster.block_rows = {cfg.cluster.block_rows:,}, largest "
            f"block {largest:,} rows; a block holds whole Parquet row groups): lower cluster.block_rows (e.g. "
            f"--set cluster.block_rows={smaller}), write the shards with smaller row "
            "groups, or raise cluster.memory_limit"
        ) from None
    finally:
        try:
            ex.close()
        finally:
            if od is not None:  # as a context manager: an interrupt after the commit says what is published
                od.__exit__(*sys.exc_info())
