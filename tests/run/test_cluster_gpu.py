"""GPU workers of a cluster run (gpu_dedup/run/cluster: connection, blocks, routing, executor) on a machine
without a GPU: several Dask-CUDA workers sharing a GPU, their device memory, and the device route.

The real GPU path's plumbing is checked here against stand-ins of dask-cuda's helpers; the run itself goes
through the same code with the GPU backend in Numba's CUDA simulator (NumPy arrays: the device route then moves
pandas frames), the first-contact rehearsal runs the device step's benchmark the same way, and the GPU machine
runs it for real (results/gpu/README.md)."""

import json
import logging
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from gpu_dedup.backends.strings import StringBuffers
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, ResourceError
from gpu_dedup.run.cluster import blocks as B
from gpu_dedup.run.cluster import connection

distributed = pytest.importorskip("distributed")

GiB = 2**30


# ------------------------------------------------------------------ several workers on a GPU


def test_shared_gpus_are_counted_before_anything_starts(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert connection.gpu_devices(4, 2) == "3,5"
    assert connection.gpu_devices(2, 2) == "3"  # two workers on one GPU: the first
    assert connection.gpu_devices(2) == "3,5"
    with pytest.raises(ConfigError, match=r"--workers 6 with cluster.workers_per_gpu = 2 needs 3 GPUs, but 2 are "
                                          r"visible \(CUDA_VISIBLE_DEVICES='3,5'\); use --workers 4 or fewer"):
        connection.gpu_devices(6, 2)
    with pytest.raises(ConfigError, match=r"use --workers 2 or fewer, make more GPUs visible, or share each GPU "
                                          r"among several workers \(--set cluster.workers_per_gpu=2\)"):
        connection.gpu_devices(4)


def test_each_worker_of_a_shared_gpu_gets_its_share_of_the_device():
    """Dask-CUDA's device_memory_limit (80 % of the share) and an RMM pool starting at half the share and, on a
    shared GPU, growing to 90 % of the share at most; RMM's async allocator instead of the pool when asked."""
    def memory(free=80 * GiB, **cluster):
        return connection.gpu_worker_memory(Config.from_dict({"backend": "gpu", "cluster": cluster}).cluster,
                                            (80 * GiB, free))

    four = memory(workers=4, workers_per_gpu=4)
    assert four.device_memory_limit == int(0.8 * 20 * GiB)
    assert (four.pool_bytes, four.pool_max_bytes, four.rmm_async) == (10 * GiB, 18 * GiB, False)
    one = memory(workers=1)
    assert (one.device_memory_limit, one.pool_bytes, one.pool_max_bytes) == (int(0.8 * 80 * GiB), 40 * GiB, None)
    assert memory(workers=2, workers_per_gpu=2, device_memory_limit="5GiB").device_memory_limit == 5 * GiB
    fast = memory(workers=2, workers_per_gpu=2, rmm_async=True)
    assert (fast.pool_bytes, fast.pool_max_bytes, fast.rmm_async) == (None, None, True)
    unknown = connection.gpu_worker_memory(Config.from_dict({"backend": "gpu"}).cluster, None)  # no NVML
    assert (unknown.device_memory_limit, unknown.pool_bytes) == ("default", None)


def test_a_gpu_worker_shares_what_is_free_when_another_process_holds_device_memory(caplog):
    """A process that ran on the GPU before (a notebook, the tests) keeps its RMM pool: half the device.  A worker's
    pool of half the whole device would not fit beside it and its start would fail; its share is of what is free."""
    cfg = Config.from_dict({"backend": "gpu", "cluster": {"workers": 1}}).cluster
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        held = connection.gpu_worker_memory(cfg, (80 * GiB, 39 * GiB))
    assert (held.device_memory_limit, held.pool_bytes) == (int(0.8 * 39 * GiB), 39 * GiB // 2 // 256 * 256)
    assert "39.0 GiB of the device's 80.0 GiB are free" in caplog.text
    shared = Config.from_dict({"backend": "gpu", "cluster": {"workers": 2, "workers_per_gpu": 2}}).cluster
    two = connection.gpu_worker_memory(shared, (80 * GiB, 40 * GiB))
    assert (two.pool_bytes, two.pool_max_bytes) == (10 * GiB, 18 * GiB)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        connection.gpu_worker_memory(cfg, (80 * GiB, 79 * GiB))  # the driver's own: nothing to say
    assert caplog.text == ""


def test_a_shared_gpu_worker_is_started_as_dask_cuda_starts_one(monkeypatch):
    """Each worker's Nanny: its GPU first in CUDA_VISIBLE_DEVICES, dask-cuda's CUDA context, RMM plugins and
    device-to-host spilling with its share (dask-cuda's helpers are stand-ins here: no GPU)."""
    calls = {}
    utils = types.ModuleType("dask_cuda.utils")
    utils.nvml_device_index = lambda i, visible: int(visible.split(",")[i])
    common = types.ModuleType("dask_cuda.worker_common")

    def worker_plugins(**kw):
        calls.setdefault("plugins", []).append(kw)
        return {"plugins for", kw["device_index"]}

    def worker_data_function(**kw):
        calls.setdefault("data", []).append(kw)
        return lambda index: ("DeviceHostFile", {"device": index, **kw})

    common.worker_plugins, common.worker_data_function = worker_plugins, worker_data_function
    monkeypatch.setitem(sys.modules, "dask_cuda", types.ModuleType("dask_cuda"))
    monkeypatch.setitem(sys.modules, "dask_cuda.utils", utils)
    monkeypatch.setitem(sys.modules, "dask_cuda.worker_common", common)
    specs = {}

    class Spec:
        def __init__(self, scheduler, workers, **kw):
            import dask

            specs.update(workers)  # the Nannies are made here, under the config their workers start with
            specs["omp"] = dask.config.get("distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS")

    monkeypatch.setattr(distributed, "SpecCluster", Spec)
    memory = connection.GPUWorkerMemory(8 * GiB, 5 * GiB, 10 * GiB, False)
    connection.shared_gpu_cluster(["0", "1"], 2, "4GiB", memory, simulated=False)
    assert specs.pop("omp") == connection.worker_threads(4)  # Arrow's pool: the worker's share, not Dask's 1
    assert sorted(specs) == ["gpu0-0", "gpu0-1", "gpu1-0", "gpu1-1"]
    opts = {name: spec["options"] for name, spec in specs.items()}
    assert [opts[n]["env"]["CUDA_VISIBLE_DEVICES"] for n in sorted(opts)] == ["0,1", "0,1", "1,0", "1,0"]
    assert all(o["preload"] == ["dask_cuda.initialize"] and o["preload_argv"] == ["--create-cuda-context"]
               for o in opts.values())
    assert opts["gpu1-0"]["data"] == ("DeviceHostFile", {"device": 1, "device_memory_limit": 8 * GiB,
                                                         "memory_limit": 4 * GiB})  # in bytes, as zict compares
    plugin = calls["plugins"][0]
    assert (plugin["rmm_initial_pool_size"], plugin["rmm_maximum_pool_size"], plugin["rmm_async_alloc"]) == \
        (5 * GiB, 10 * GiB, False)
    assert sorted(p["device_index"] for p in calls["plugins"]) == [0, 0, 1, 1]


def test_simulated_gpu_workers_share_one_gpu_and_the_machines_memory():
    """Under the CUDA simulator the same workers start without dask-cuda: two on "GPU 0", each told so, each
    with half the machine's memory."""
    memory = connection.GPUWorkerMemory("default", None, None, False)
    cluster = connection.shared_gpu_cluster(["0"], 2, "auto", memory, simulated=True)
    try:
        with distributed.Client(cluster) as client:
            info = client.run(lambda dask_worker: (dask_worker.name, os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                   dask_worker.memory_manager.memory_limit))
    finally:
        cluster.close()
    assert sorted((name, visible) for name, visible, _ in info.values()) == [("gpu0-0", "0"), ("gpu0-1", "0")]
    from distributed.system import MEMORY_LIMIT

    assert {limit for _, _, limit in info.values()} == {MEMORY_LIMIT // 2}


SIMULATED_RUN = r"""
import json, sys
from pathlib import Path
from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.entry import run_dedup


def main(d):
    d = Path(d)
    s = planted_corpus(n_docs=36, n_clusters=6, words=(8, 20), seed=5)
    write_shards(s.table.select(["id", "text"]), d / "in", shards=3)
    base = {"input": {"id_column": "id"}}
    run_dedup(d / "in", d / "one", Config.from_dict({**base, "backend": "cpu"}))
    res = run_dedup(d / "in", d / "two", Config.from_dict({
        **base, "backend": "gpu", "cluster": {"workers": 2, "workers_per_gpu": 2, "block_rows": 12,
                                              "shuffle": "device", "device_memory_limit": "600B"}}))
    print(json.dumps(res.report["cluster"]))


if __name__ == "__main__":
    main(sys.argv[1])
"""


def test_two_gpu_workers_on_one_gpu_equal_one_process_under_the_simulator(tmp_path):
    """``--workers 2 --workers-per-gpu 2 --backend gpu``: the run starts two GPU workers on one GPU (the
    simulator's), moves the band hashes and edges as device frames (cluster.shuffle: device) and keeps the
    texts past a tiny device_memory_limit in host memory; its outputs are the one-process CPU run's."""
    from gpu_dedup.bench.cluster import compared

    script = tmp_path / "run.py"
    script.write_text(SIMULATED_RUN)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", "GPU_DEDUP_SIMULATOR": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))), check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["workers"] == 2 and report["blocks"] == 3
    assert report["device_routes"] >= 3  # the buckets shuffle and the edges' routes
    assert 0 < report["spilled_text_blocks"] <= 3
    # what the bench's dask rows carry: each worker's Arrow pool (its share of the cores, not Dask's 1) and, for
    # GPU workers, the host<->device MiB of every stage (none under the simulator: its arrays are NumPy)
    assert list(report["arrow_threads"].values()) == [max(1, len(os.sched_getaffinity(0)) // 2)] * 2
    stages = report["worker_transfer_mb_by_stage"]
    assert {"read", "exact", "buckets", "verify", "select", "write"} <= set(stages)
    assert all(set(v) == {"host_to_device", "device_to_host"} for v in stages.values())
    same = compared(tmp_path / "one", tmp_path / "two")
    assert same["identical"] and same["content_identical"] and same["files_compared"] >= 4, same


# ------------------------------------------------------------------ device memory: where a GPU worker's texts go


def _block(n_bytes: int, index: int = 0):
    data = np.frombuffer(b"x" * n_bytes, np.uint8).copy()
    strings = StringBuffers(np.array([0, n_bytes], np.int64), data)
    return B.BlockData(B.Block(index, 0, 1, ()), None, strings=strings, text_bytes=n_bytes)


def _gpu_cfg(**cluster):
    return Config.from_dict({"backend": "gpu", "cluster": cluster})


def test_gpu_worker_texts_stay_on_the_device_up_to_their_share_then_go_to_host_memory():
    cfg = _gpu_cfg(device_memory_limit="1KiB")  # texts may take 512 bytes
    first, second = B._kept(_block(300, 0), cfg, "run-a"), B._kept(_block(300, 1), cfg, "run-a")
    assert not first.texts_on_host and second.texts_on_host
    assert B.block_norm_info(second)["spilled_blocks"] == 1 and B.block_norm_info(second)["spilled_bytes"] == 300
    assert bytes(second.texts().data) == b"x" * 300  # the same texts, in host memory
    assert not B._kept(_block(300, 2), cfg, "run-b").texts_on_host  # each run counts its own
    assert B._kept(_block(10, 3), _gpu_cfg(spill_texts=True, device_memory_limit="1GiB"), "run-c").texts_on_host
    B.drop_texts("run-a", types.SimpleNamespace(local_directory=str(os.getcwd())))
    assert not B._kept(_block(300, 4), cfg, "run-a").texts_on_host  # the run's count went with it


def test_gpu_worker_texts_over_the_device_limit_stop_the_run_naming_the_setting():
    cfg = _gpu_cfg(device_memory_limit="1KiB", spill_texts=False)
    B._kept(_block(400, 0), cfg, "run-e")
    with pytest.raises(ResourceError) as err:
        B._kept(_block(400, 1), cfg, "run-e")
    message = str(err.value)
    assert "need 800 bytes of device memory, over the 512 bytes they may take there (50% of " \
           "cluster.device_memory_limit = 1KiB)" in message
    assert "raise cluster.device_memory_limit, run more GPU workers (--workers), or set cluster.spill_texts: auto" \
        in message


# ------------------------------------------------------------------ the device route: which routes take it


def test_the_device_route_moves_the_band_hashes_and_the_edges_only():
    from gpu_dedup.run.cluster.executor import DaskExecutor
    from gpu_dedup.run.contract import Step
    from gpu_dedup.stages.buckets import bucket_part, long_frame
    from gpu_dedup.stages.components import large_star, star_labels
    from gpu_dedup.stages.edges import unique_edges

    on = DaskExecutor([], Config.from_dict({"backend": "gpu", "cluster": {"shuffle": "device"}}))
    assert on._device_route(long_frame, Step(bucket_part, min_size=2))
    assert all(on._device_route(None, Step(fn)) for fn in (unique_edges, large_star, star_labels))
    assert not on._device_route(None, None) and not on._device_route(None, Step(B.distinct_pairs))
    off = DaskExecutor([], Config.from_dict({"backend": "gpu", "cluster": {"shuffle": "p2p"}}))
    assert not off._device_route(long_frame, None) and not off._device_route(None, Step(unique_edges))


def test_a_device_route_hands_on_host_arrays():
    from gpu_dedup.backends import host_frame
    from gpu_dedup.run.cluster import routing

    frame = {"a": np.arange(3), "nested": {"b": np.ones(2)}}
    assert host_frame(frame)["nested"]["b"].tolist() == [1.0, 1.0] and host_frame(None) is None
    moved = routing.on_backend({"a": np.arange(3, dtype=np.int64)}, "cpu")
    assert moved["a"].tolist() == [0, 1, 2]


def test_a_block_with_its_texts_on_the_device_is_a_device_object_for_dask_cuda(monkeypatch):
    """Dask-CUDA's device_memory_limit counts (and past it spills) what its ``is_device_object`` says is on the
    device: a block whose texts are there is, one whose texts are in host memory is not."""
    from dask.utils import Dispatch

    module = types.ModuleType("dask_cuda.is_device_object")
    module.is_device_object = Dispatch(name="is_device_object")
    monkeypatch.setitem(sys.modules, "dask_cuda", types.ModuleType("dask_cuda"))
    monkeypatch.setitem(sys.modules, "dask_cuda.is_device_object", module)
    assert B.register_device_blocks()

    class DeviceBytes(np.ndarray):  # what on_device() takes for a CuPy array
        pass

    DeviceBytes.__module__ = "cupy._core"
    on_device = _block(8)
    on_device.strings = StringBuffers(on_device.strings.offsets, on_device.strings.data.view(DeviceBytes))
    assert module.is_device_object(on_device) is True
    assert module.is_device_object(_block(8)) is False
