"""A cluster of one worker runs the whole run as one task there (gpu_dedup/run/cluster/whole.py): the same
outputs as one process, every second booked, and the cluster's own way wherever something asks for it."""

import threading
import time
import types

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.run.cluster import whole
from gpu_dedup.run.entry import run_dedup
from tests.accounting import assert_accounted
from tests.run.clusters import scheduler_of

distributed = pytest.importorskip("distributed")

BASE = {"backend": "cpu", "input": {"id_column": "id"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("whole")
    table = planted_corpus(n_docs=1500, n_clusters=90, words=(30, 150), seed=5).table.select(["id", "text"])
    (d / "in").mkdir()
    for i, lo in enumerate(range(0, 1500, 500)):
        pq.write_table(table.slice(lo, 500), d / "in" / f"part-{i}.parquet", row_group_size=100)
    return d


@pytest.fixture(scope="module")
def one_worker():
    with scheduler_of(1) as address:
        yield address


def _files(d):
    return sorted(p.name for p in d.iterdir() if p.name.endswith(".parquet"))


def _booked(report) -> float:
    return sum(v["seconds"] for v in report["stages"].values()) + sum(report["fixed_seconds"].values())


@pytest.mark.timeout(300)
def test_one_worker_runs_the_whole_run_with_one_process_outputs(corpus, one_worker, tmp_path):
    single = run_dedup(corpus / "in", tmp_path / "single", Config.from_dict(BASE))
    cfg = Config.from_dict({**BASE, "cluster": {"scheduler": one_worker}})
    res = run_dedup(corpus / "in", tmp_path / "whole", cfg)
    rep = res.report
    assert rep["cluster"]["run"] == "whole, as one task on the only worker" and rep["cluster"]["workers"] == 1
    assert {"cluster_start", "handoff", "setup", "kernel_load"} <= set(rep["fixed_seconds"])
    assert _booked(rep) + rep["unbooked_seconds"] == pytest.approx(rep["wall_seconds"], abs=0.01)
    assert abs(rep["unbooked_seconds"]) < 0.05
    assert res.duplicates_table is None and res.edges is None  # nothing per document came back to the client
    assert np.array_equal(res.kept, single.kept) and np.array_equal(res.cluster, single.cluster)  # read back
    names = _files(tmp_path / "single")
    assert names == _files(tmp_path / "whole") and "duplicates.parquet" in names
    for name in names:
        assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes(), name
    assert_accounted(tmp_path / "whole", [pq.read_table(p, columns=["id"]) for p in sorted((corpus / "in").iterdir())])
    # block by block on the same worker: the same files
    blocks = Config.from_dict({**BASE, "cluster": {"scheduler": one_worker, "whole_on_one_worker": False,
                                                  "block_rows": 300}})
    rep = run_dedup(corpus / "in", tmp_path / "blocks", blocks).report
    assert rep["cluster"]["blocks"] > 1 and "handoff" not in rep["fixed_seconds"]
    from dask.system import cpu_count

    # its 3 shards written at once on the host's cores, not one at a time on the worker's one thread
    assert list(rep["cluster"]["write_threads"].values()) == [min(cpu_count(), 3)]
    for name in names:
        assert (tmp_path / "single" / name).read_bytes() == (tmp_path / "blocks" / name).read_bytes(), name


def _client(workers: dict):
    return types.SimpleNamespace(scheduler_info=lambda: {"workers": workers})


def _job(tmp_path, active=False, sink=None, out=True):
    return types.SimpleNamespace(out=tmp_path if out else None, prior=types.SimpleNamespace(active=active), sink=sink)


def test_the_whole_run_goes_only_where_nothing_asks_for_the_cluster(corpus, tmp_path):
    from gpu_dedup import storage

    shards = storage.discover(corpus / "in", "auto")
    one = {"tcp://w:1": {"memory_limit": 8 << 30}}
    cfg = Config.from_dict({**BASE, "cluster": {"scheduler": "tcp://s:1"}})
    assert whole.whole_run_worker(_client(one), cfg, shards, _job(tmp_path)) == "tcp://w:1"
    assert whole.whole_run_worker(_client({"tcp://w:1": {"memory_limit": 0}}), cfg, shards, _job(tmp_path))
    refused = {
        "two workers": (_client({**one, "tcp://w:2": {}}), cfg, _job(tmp_path)),
        "a memory limit the corpus may not fit": (_client({"tcp://w:1": {"memory_limit": 1 << 30}}), cfg,
                                                  _job(tmp_path)),
        "an index": (_client(one), cfg, _job(tmp_path, active=True)),
        "a sink": (_client(one), cfg, _job(tmp_path, sink=object())),
    }
    for key, value in (("whole_on_one_worker", False), ("shuffle", "p2p"), ("spill_texts", True),
                       ("device_memory_limit", "1GiB")):
        refused[key] = (_client(one), Config.from_dict({**BASE, "cluster": {"scheduler": "tcp://s:1", key: value}}),
                        _job(tmp_path))
    for why, (client, c, job) in refused.items():
        assert whole.whole_run_worker(client, c, shards, job) is None, why
    with pytest.raises(Exception, match="whole_on_one_worker = 'yes' must be auto or false"):
        Config.from_dict({"cluster": {"whole_on_one_worker": "yes"}})


@pytest.mark.timeout(120)
def test_the_clients_stop_interrupts_the_task_on_the_worker():
    """The watcher a worker's whole run starts turns the client's stop (a Dask event) into a KeyboardInterrupt in
    the task's thread, which the run then handles as one process handles Ctrl-C."""
    from distributed import Client, Event, LocalCluster

    with LocalCluster(n_workers=1, processes=False, dashboard_address=":0") as cluster, Client(cluster) as client:
        seen, done = {}, threading.Event()

        def task():
            watcher = threading.Thread(target=whole._stopped_by_client,
                                       args=("stop-test", client, threading.get_ident(), done), daemon=True)
            watcher.start()
            try:
                for _ in range(600):  # up to a minute of work, in small steps
                    time.sleep(0.1)
                seen["ended"] = "ran to its end"
            except KeyboardInterrupt:
                seen["ended"] = "interrupted"
            finally:
                done.set()

        worker = threading.Thread(target=task)
        worker.start()
        time.sleep(0.3)
        Event("stop-test", client=client).set()
        worker.join(timeout=30)
        assert seen.get("ended") == "interrupted"


@pytest.mark.timeout(300)
def test_the_whole_run_goes_on_on_the_worker_that_replaces_a_dead_one(corpus, tmp_path, monkeypatch):
    """The only worker killed in the middle of the whole run: its nanny starts another at a new address, and the
    task, placed on the first loosely, runs there, resuming from the checkpoints; the outputs are one process's.
    Pinned to the dead worker's address, it waited forever.  A worker that dies every time ends the run with exit
    5's one message."""
    import os
    import signal

    from distributed import Client, LocalCluster

    from gpu_dedup.errors import ResourceError

    single = run_dedup(corpus / "in", tmp_path / "single", Config.from_dict(BASE))
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      env={"NUMBA_NUM_THREADS": "1"}) as cluster:
        cfg = Config.from_dict({**BASE, "cluster": {"scheduler": cluster.scheduler_address}})
        with Client(cluster) as watcher:
            first = watcher.run(os.getpid)

            box: list = []

            def killed():  # the worker, killed once its run has checkpointed a stage
                while not box:
                    time.sleep(0.05)
                    if list((tmp_path / "whole").glob(".gpu_dedup_checkpoint/*.arrays")):
                        pid = next(iter(first.values()))
                        os.kill(pid, signal.SIGKILL)
                        box.append(pid)
            killer = threading.Thread(target=killed, daemon=True)
            killer.start()
            res = run_dedup(corpus / "in", tmp_path / "whole", cfg)
            killer.join(timeout=1)
            assert not killer.is_alive()
            assert watcher.run(os.getpid) != first  # a new worker ran it
        for name in _files(tmp_path / "single"):
            assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "single" / name).read_bytes(), name
        assert res.report["counts"] == single.report["counts"]
    monkeypatch.setenv("GPU_DEDUP_FAULT", "select")  # the workers inherit it: each dies at the select stage
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        cfg = Config.from_dict({**BASE, "cluster": {"scheduler": cluster.scheduler_address}})
        with pytest.raises(ResourceError, match=r"the Dask worker died running the whole run as one task.*"
                                                r"cluster.whole_on_one_worker=false"):
            run_dedup(corpus / "in", tmp_path / "dying", cfg)
