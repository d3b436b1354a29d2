"""The GPU backend: how it fails without a device, its array algorithms on NumPy,
and (marked ``gpu``, skipped without a device) its parity with the CPU on a real GPU.

The CUDA kernels themselves are checked under the simulator by
``tests/kernels/test_cuda_sim.py``; the device-side array algorithms here take
an array module ``xp`` and run on NumPy exactly as they do on CuPy.
"""

import logging
import sys
import types

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.backends import to_host
from gpu_dedup.backends.gpu import (
    components_xp,
    segment_table,
    signature_kernel_choice,
    signature_threads,
    sorted_distinct_counts,
    sorted_unique_segments,
    warp_launch,
)
from gpu_dedup.errors import BackendError, ConfigError
from gpu_dedup.stages.buckets import buckets
from gpu_dedup.stages.edges import edges, star_rounds
from tests import reference as ref

EXTRAS = ("pip install -e '.[cuda12]'", "'.[cuda13]'", "README.md, section GPU")  # from the checkout


# ------------------------------------------------------------------ probe: fails at once, naming the fix


def fake_cupy(count=None, error=None):
    def get_device_count():
        if error:
            raise error
        return count

    mod = types.ModuleType("cupy")
    mod.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=get_device_count))
    return mod


def probe_error(monkeypatch, cupy=None, numba_cuda=True) -> str:
    from gpu_dedup.backends import gpu_probe as gpu

    monkeypatch.setitem(sys.modules, "cupy", cupy)  # None: "import cupy" raises ImportError
    if not numba_cuda:  # numba's deprecated built-in numba.cuda may still import: the package is what counts
        monkeypatch.setitem(sys.modules, "numba_cuda", None)
    elif "numba_cuda" not in sys.modules:
        try:
            import numba_cuda  # noqa: F401
        except ImportError:  # stand in for the package; numba.cuda itself imports without a device
            monkeypatch.setitem(sys.modules, "numba_cuda", types.ModuleType("numba_cuda"))
    with pytest.raises(BackendError) as info:
        gpu.probe()
    return str(info.value)


def test_probe_without_cupy_names_cupy_and_the_extras(monkeypatch):
    msg = probe_error(monkeypatch, cupy=None)
    assert "CuPy" in msg and all(extra in msg for extra in EXTRAS), msg


def test_probe_without_numba_cuda_names_it_and_the_extras(monkeypatch):
    msg = probe_error(monkeypatch, cupy=fake_cupy(count=1), numba_cuda=False)
    assert "numba-cuda" in msg and all(extra in msg for extra in EXTRAS), msg


def test_probe_without_a_device_says_so_and_how_to_run(monkeypatch):
    msg = probe_error(monkeypatch, cupy=fake_cupy(error=RuntimeError("cudaErrorNoDevice: no CUDA-capable device")))
    assert "no CUDA device" in msg and "cudaErrorNoDevice" in msg and "backend: cpu" in msg, msg
    msg = probe_error(monkeypatch, cupy=fake_cupy(count=0))
    assert "no CUDA device found" in msg and "backend: cpu" in msg, msg


def test_backend_gpu_fails_at_once_and_auto_falls_back_saying_why(monkeypatch, caplog, tmp_path):
    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu_probe import SIMULATOR_SWITCH
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    # the real registry, whatever ``--backend gpu`` made of the name "cpu" for the rest of the session
    monkeypatch.setattr(registry, "_REGISTRY", {"cpu": "gpu_dedup.backends.cpu", "gpu": "gpu_dedup.backends.gpu_probe"})
    monkeypatch.setattr(registry, "_CACHE", {})
    monkeypatch.delenv(SIMULATOR_SWITCH, raising=False)
    monkeypatch.setitem(sys.modules, "cupy", None)
    with pytest.raises(BackendError, match="CuPy"):
        registry.get_backend("gpu")
    with pytest.raises(BackendError, match=r"cuda12"):  # before reading or writing anything
        run_dedup(tmp_path / "missing-input", tmp_path / "out", Config(backend="gpu"))
    assert not (tmp_path / "out").exists()
    caplog.set_level(logging.DEBUG, logger="gpu_dedup")  # a CPU install: the reason at -v
    monkeypatch.setattr(registry, "_AUTO_FALLBACK", [])  # as in a fresh process
    be = registry.get_backend("auto")
    assert be.name == "cpu"
    said = [r.getMessage() for r in caplog.records if "backend auto: using the CPU" in r.getMessage()]
    assert len(said) == 1 and "CuPy" in said[0] and "pip install -e '.[cuda12]'" in said[0]
    assert "gpu_dedup[cuda12]" not in said[0]  # no such distribution on a registry
    # once per process: later runs (evaluate and tune run the pipeline several times) say nothing more
    for _ in range(3):
        assert registry.get_backend("auto").name == "cpu"
    assert sum("backend auto" in r.getMessage() for r in caplog.records) == 1


def fake_device(monkeypatch, count=1):
    """CuPy with ``count`` devices, numba-cuda answering, NVVM found: what probe() checks before the frames."""
    from numba import cuda

    from gpu_dedup.backends import gpu_probe

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy(count=count))
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.delenv(gpu_probe.SIMULATOR_SWITCH, raising=False)
    monkeypatch.setenv("KVIKIO_NTHREADS", "1")  # recorded absent (or as it was): a probe's setting is undone
    monkeypatch.delenv("KVIKIO_NTHREADS")
    if "numba_cuda" not in sys.modules:
        try:
            import numba_cuda  # noqa: F401
        except ImportError:
            monkeypatch.setitem(sys.modules, "numba_cuda", types.ModuleType("numba_cuda"))
    return gpu_probe


def test_kvikio_threads_are_the_cores_unless_set_or_too_late(monkeypatch):
    """libcudf's files are read and written by KvikIO's thread pool: a run asks for one thread per core (at most
    16) before cuDF loads, keeps the user's KVIKIO_NTHREADS, and says nothing once cuDF is loaded."""
    from gpu_dedup.backends import gpu_probe

    monkeypatch.setattr(gpu_probe.os, "cpu_count", lambda: 64)
    env: dict = {}
    assert gpu_probe.io_threads(env, loaded={}) == "KvikIO threads 16" and env == {"KVIKIO_NTHREADS": "16"}
    monkeypatch.setattr(gpu_probe.os, "cpu_count", lambda: 2)
    env = {}
    assert gpu_probe.io_threads(env, loaded={}) == "KvikIO threads 2" and env["KVIKIO_NTHREADS"] == "2"
    env = {"KVIKIO_NTHREADS": "4"}
    assert gpu_probe.io_threads(env, loaded={}) == "KvikIO threads 4 (KVIKIO_NTHREADS)" and env["KVIKIO_NTHREADS"] == "4"
    env = {}
    assert gpu_probe.io_threads(env, loaded={"cudf": object()}) == "" and env == {}


def test_probe_without_nvvm_names_cuda_home_and_the_wheel(monkeypatch):
    from numba.cuda.cudadrv import nvvm

    gpu_probe = fake_device(monkeypatch)
    monkeypatch.setattr(nvvm, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_HOME", raising=False)
    with pytest.raises(BackendError) as info:
        gpu_probe.probe()
    msg = str(info.value)
    assert "NVVM" in msg and "CUDA_HOME=/usr/local/cuda" in msg and "numba-cuda[cu13]" in msg, msg
    monkeypatch.setenv("CUDA_HOME", "/opt/cuda-without-nvvm")
    with pytest.raises(BackendError, match="CUDA_HOME=/opt/cuda-without-nvvm has no usable nvvm"):
        gpu_probe.probe()


def test_probe_tells_a_broken_cudf_from_a_missing_one(monkeypatch, tmp_path, caplog):
    from numba.cuda.cudadrv import nvvm

    gpu_probe = fake_device(monkeypatch)
    monkeypatch.setattr(nvvm, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cudf", None)  # not installed
    info = gpu_probe.probe()
    assert info["frames"] == "pyarrow" and "cudf_error" not in info
    (tmp_path / "cudf").mkdir()
    (tmp_path / "cudf" / "__init__.py").write_text(
        "raise ImportError('libcudf.so: cannot open shared object file: No such file or directory')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "cudf")
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    info = gpu_probe.probe()  # installed, but broken: said, and the run goes on with pyarrow
    assert info["frames"] == "pyarrow" and "libcudf.so: cannot open" in info["cudf_error"], info
    assert any("cuDF is installed but does not import" in r.getMessage() for r in caplog.records)
    assert "cugraph_error" not in info
    (tmp_path / "cugraph").mkdir()  # cuGraph likewise: installed but broken is said
    (tmp_path / "cugraph" / "__init__.py").write_text("import pylibcugraph_missing_part\n")
    monkeypatch.delitem(sys.modules, "cugraph", raising=False)
    info = gpu_probe.probe()
    assert "pylibcugraph_missing_part" in info["cugraph_error"]
    assert any("cuGraph is installed but does not import" in r.getMessage() for r in caplog.records)


def test_simulator_needs_its_own_switch(monkeypatch):
    from gpu_dedup.backends import gpu_probe

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.setenv("NUMBA_ENABLE_CUDASIM", "1")
    monkeypatch.delenv(gpu_probe.SIMULATOR_SWITCH, raising=False)
    with pytest.raises(BackendError, match="CuPy"):  # the simulator alone is no device
        gpu_probe.probe()
    monkeypatch.setenv(gpu_probe.SIMULATOR_SWITCH, "1")
    assert gpu_probe.probe() == {"devices": 0, "frames": "pyarrow", "simulator": True}


FRAMES = {"cudf": "cuDF reads Parquet text columns (and writes shards with gpu.writer: cudf)",
          "broken": "(cuDF is installed but does not import: ",
          "missing": "(cuDF not installed: pyarrow writes)"}


def frames_case(info) -> str:
    return "cudf" if info.get("frames") == "cudf" else "broken" if info.get("cudf_error") else "missing"


@pytest.mark.parametrize("info", [{"frames": "cudf"}, {"frames": "pyarrow"},
                                  {"frames": "pyarrow", "cudf_error": "ImportError: libcudf.so: cannot open"}])
def test_mode_says_which_frames_and_why(info):
    from gpu_dedup.backends.gpu import GPUBackend

    be = object.__new__(GPUBackend)  # the mode line alone, no device
    be.info, be.device_name = info, "NVIDIA H100 80GB HBM3"
    mode = be.mode
    case = frames_case(info)
    assert FRAMES[case] in mode and mode.count("cuDF") == 1, mode
    assert all(text not in mode for other, text in FRAMES.items() if other != case), mode
    if case == "broken":
        assert "libcudf.so: cannot open" in mode


def test_backend_turns_off_low_occupancy_warnings_in_every_config_module(monkeypatch):
    """numba-cuda reads ``numba.cuda.core.config``; versions that keep it apart from ``numba.core.config``
    warned at every small launch."""
    import numba

    from gpu_dedup.backends.gpu import GPUBackend

    own = types.ModuleType("numba.cuda.core.config")
    own.CUDA_LOW_OCCUPANCY_WARNINGS = 1
    monkeypatch.setitem(sys.modules, "numba.cuda.core.config", own)
    monkeypatch.setattr(numba.config, "CUDA_LOW_OCCUPANCY_WARNINGS", 1)
    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 1)  # built as under the simulator: no device needed
    GPUBackend()
    assert own.CUDA_LOW_OCCUPANCY_WARNINGS == 0 and numba.config.CUDA_LOW_OCCUPANCY_WARNINGS == 0


def fake_rmm(current_kind: str):
    """A stand-in for rmm / rmm.mr / rmm.allocators.cupy recording what setup_memory does."""
    calls = []

    class Resource:
        def __init__(self, upstream=None, *args, **kwargs):
            self.upstream = upstream

    mr = types.ModuleType("rmm.mr")
    mr.CudaMemoryResource = type("CudaMemoryResource", (Resource,), {})
    mr.ManagedMemoryResource = type("ManagedMemoryResource", (Resource,), {})
    mr.PoolMemoryResource = type("PoolMemoryResource", (Resource,), {})
    state = {"current": getattr(mr, current_kind)()}
    mr.get_current_device_resource = lambda: state["current"]

    def set_current(res):
        calls.append(("set", res))
        state["current"] = res

    mr.set_current_device_resource = set_current
    rmm = types.ModuleType("rmm")
    rmm.mr = mr
    rmm.reinitialize = lambda **kw: calls.append(("reinitialize", kw))
    allocators = types.ModuleType("rmm.allocators")
    cupy_alloc = types.ModuleType("rmm.allocators.cupy")
    cupy_alloc.rmm_cupy_allocator = object()
    rmm.allocators = allocators
    allocators.cupy = cupy_alloc
    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(set_allocator=lambda a: calls.append(("cupy allocator", a)))
    modules = {"rmm": rmm, "rmm.mr": mr, "rmm.allocators": allocators, "rmm.allocators.cupy": cupy_alloc,
               "cupy": cupy}
    return modules, calls, state, cupy_alloc.rmm_cupy_allocator


@pytest.mark.parametrize("current", ["CudaMemoryResource", "ManagedMemoryResource"])
def test_setup_memory_wraps_the_current_resource_and_keeps_a_users_own(monkeypatch, current):
    from gpu_dedup.backends import gpu

    modules, calls, state, allocator = fake_rmm(current)
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(gpu, "_MEMORY", {})
    before = state["current"]
    got = gpu.setup_memory()
    assert not [c for c in calls if c[0] == "reinitialize"]  # undefined once cuDF objects exist
    assert ("cupy allocator", allocator) in calls
    if current == "CudaMemoryResource":  # RMM's default: a pool on top of it
        assert type(state["current"]).__name__ == "PoolMemoryResource" and state["current"].upstream is before
        assert got["allocator"] == "RMM pool (cuDF and CuPy)"
    else:  # the user's resource stays
        assert state["current"] is before and not [c for c in calls if c[0] == "set"]
        assert got["allocator"] == "RMM ManagedMemoryResource set by the caller (cuDF and CuPy)"
    done = len(calls)
    assert gpu.setup_memory() is got and len(calls) == done  # once per process


def test_auto_fallback_test_holds_under_backend_gpu():
    """``pytest --backend gpu`` maps the name "cpu" to the GPU backend for the session; the test of auto's
    fallback still sees the real registry (run here on the simulator's GPU backend, as a device run would)."""
    import os
    import subprocess
    from pathlib import Path

    from gpu_dedup.backends.gpu_probe import SIMULATOR_SWITCH

    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1", SIMULATOR_SWITCH: "1"}
    test = f"{Path(__file__).name}::test_backend_gpu_fails_at_once_and_auto_falls_back_saying_why"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--backend", "gpu", test],
                          cwd=Path(__file__).parent, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]


# ------------------------------------------------------------------ array algorithms on NumPy


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 50).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=3 * n))))
def test_components_xp_equals_oracle(case):
    n, pairs = case
    src = np.array([a for a, _ in pairs], np.int64)
    dst = np.array([b for _, b in pairs], np.int64)
    assert components_xp(np, src, dst, n).tolist() == ref.connected_components(n, pairs)


@pytest.mark.parametrize("n", [1, 2, 1000])
def test_components_xp_paths_stars_and_isolated(n):
    rng = np.random.default_rng(n)
    perm = rng.permutation(n)
    path = (perm[:-1], perm[1:])  # a path through the nodes in random order: the slow case for propagation
    got = components_xp(np, *path, n)
    assert (got == 0).all()
    star = (np.full(n - 1, n - 1), np.arange(n - 1))  # the largest node at the centre
    assert (components_xp(np, *star, n) == 0).all()
    assert components_xp(np, np.zeros(0, np.int64), np.zeros(0, np.int64), n).tolist() == list(range(n))
    half = n // 2
    two = (perm[: half - 1] if half > 1 else perm[:0], perm[1:half] if half > 1 else perm[:0])
    want = ref.connected_components(n, list(zip(*two)))
    assert components_xp(np, *two, n).tolist() == want


def test_sorted_unique_segments_equals_per_segment_unique():
    rng = np.random.default_rng(5)
    lengths = np.array([0, 1, 5, 0, 30, 2, 0], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    values = rng.integers(0, 6, offsets[-1]).astype(np.uint64)
    out_off, out_val = sorted_unique_segments(np, offsets, values)
    for k in range(lengths.shape[0]):
        want = np.unique(values[offsets[k] : offsets[k + 1]])
        assert np.array_equal(out_val[out_off[k] : out_off[k + 1]], want)
    assert out_off.dtype == np.int64 and out_val.dtype == np.uint64
    empty_off, empty_val = sorted_unique_segments(np, np.zeros(3, np.int64), np.zeros(0, np.uint64))
    assert empty_off.tolist() == [0, 0, 0] and empty_val.shape == (0,)


def test_sorted_distinct_counts_equals_per_segment_unique_counts():
    """The GPU's feature sets (sorted distinct features of each document and their counts), on NumPy."""
    rng = np.random.default_rng(6)
    lengths = np.array([0, 1, 5, 0, 30, 2, 0, 7], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    values = rng.integers(0, 6, offsets[-1]).astype(np.uint64) * np.uint64(2**61)  # high bits too
    out_off, out_val, counts = sorted_distinct_counts(np, offsets, values)
    for k in range(lengths.shape[0]):
        want, want_counts = np.unique(values[offsets[k] : offsets[k + 1]], return_counts=True)
        assert np.array_equal(out_val[out_off[k] : out_off[k + 1]], want)
        assert np.array_equal(counts[out_off[k] : out_off[k + 1]], want_counts)
    assert out_off.dtype == counts.dtype == np.int64 and out_val.dtype == np.uint64
    empty = sorted_distinct_counts(np, np.zeros(3, np.int64), np.zeros(0, np.uint64))
    assert empty[0].tolist() == [0, 0, 0] and empty[1].shape == empty[2].shape == (0,)
    assert empty[1].dtype == np.uint64 and empty[2].dtype == np.int64


def test_segment_table_covers_every_byte_once():
    starts = np.array([0, 10, 10, 100], np.int64)
    ends = np.array([10, 10, 45, 101], np.int64)
    doc, lo, hi = segment_table(starts, ends, 16)
    assert doc.tolist() == [0, 2, 2, 2, 3]  # the empty document has no segment
    assert lo.tolist() == [0, 10, 26, 42, 100] and hi.tolist() == [10, 26, 42, 45, 101]
    assert all(0 < h - l <= 16 for l, h in zip(lo, hi))


def test_signature_threads_one_permutation_per_thread():
    assert signature_threads(1) == 64 and signature_threads(128) == 128
    assert signature_threads(260) == 288 and signature_threads(112) == 128
    assert signature_threads(4096) == 512
    assert all(signature_threads(p) % 32 == 0 for p in range(1, 700))


def test_warp_launch_geometry():
    """Minima per lane, a ring of prefixes above n + 32 (a power of two), warps per block and shared bytes:
    the 66 powers once, then per warp the ring and 64 key slots (8 bytes each); under the simulator (if
    another test imported the kernels there) 32 slots of scratch come first."""
    from gpu_dedup.kernels.hash_cuda import SIM_SCRATCH

    block = (SIM_SCRATCH + 66) * 8
    assert warp_launch(260, 24) == (9, 64, 4, block + 4 * (64 + 64) * 8)
    assert warp_launch(128, 5) == (4, 64, 4, block + 4 * 128 * 8)
    assert warp_launch(32, 31)[:2] == (1, 64) and warp_launch(33, 32)[:2] == (2, 128)
    assert warp_launch(512, 1)[0] == 16
    _, ring, warps, shared = warp_launch(128, 1024)  # long n-grams: fewer warps keep a block under 48 KiB
    assert ring == 2048 and warps == 2 and shared <= 48 << 10
    assert warp_launch(128, 1024, shared_limit=8 << 10)[2] == 1  # never fewer than one


def test_signature_kernel_choice_from_argument_then_environment():
    assert signature_kernel_choice(environ={}) == "warp"
    assert signature_kernel_choice(environ={"GPU_DEDUP_SIGNATURE_KERNEL": "block"}) == "block"
    assert signature_kernel_choice("warp", environ={"GPU_DEDUP_SIGNATURE_KERNEL": "block"}) == "warp"
    with pytest.raises(ConfigError, match=r"'blocks' .*GPU_DEDUP_SIGNATURE_KERNEL.*warp, block.*unset it"):
        signature_kernel_choice(environ={"GPU_DEDUP_SIGNATURE_KERNEL": "blocks"})


# ------------------------------------------------------------------ real GPU (skipped without one)


@pytest.fixture(scope="module")
def gpu_backend():
    from gpu_dedup.backends import get_backend

    return get_backend("gpu")


@pytest.fixture(scope="module")
def cpu():
    """The CPU backend itself (``cpu_backend`` is the GPU one under ``--backend gpu``)."""
    from gpu_dedup.backends import get_backend

    return get_backend("cpu")


@pytest.mark.gpu
def test_gpu_mode_names_device_and_frames(gpu_backend):
    mode = gpu_backend.mode
    assert gpu_backend.name == "gpu" and mode.startswith("gpu: CUDA kernels (numba-cuda) on ")
    # one frames phrase, the right one (the allocator's part may name cuDF too: "RMM pool (cuDF and CuPy)")
    assert [case for case, text in FRAMES.items() if text in mode] == [frames_case(gpu_backend.info)], mode
    import cupy

    assert gpu_backend.xp is cupy


@pytest.mark.gpu
@pytest.mark.parametrize("num_perm", (128, 260))
@pytest.mark.parametrize(("kind", "n"), [("char", 5), ("char", 24), ("word", 5), ("word", 1), ("char", 1), ("word", 3)])
def test_gpu_kernels_equal_cpu(cpu, gpu_backend, kind, n, num_perm):
    from gpu_dedup.kernels.params import hash_params

    from gpu_dedup.backends.strings import string_buffers
    from tests.kernels.test_cpu import BAD_BYTES, TEXTS, big_document

    big = big_document()
    docs = [t.encode() for t in TEXTS] + BAD_BYTES + [big.encode(), b"", b"x", big[:5000].encode()]
    buf = string_buffers(pa.array(docs, pa.large_binary()))
    hp = hash_params(7, num_perm)
    gs, gc = gpu_backend.minhash(buf, hp, kind, n)
    cs, cc = cpu.minhash(buf, hp, kind, n)
    assert gs.dtype == cs.dtype == np.uint32 and np.array_equal(gs, cs) and np.array_equal(gc, cc)
    sub = np.array([3, len(docs) - 4, 0, 3])
    assert np.array_equal(gpu_backend.minhash(buf, hp, kind, n, docs=sub)[0], cs[sub])
    go, gv = gpu_backend.shingle_sets(buf, hp, kind, n)
    co, cv = cpu.shingle_sets(buf, hp, kind, n)
    assert np.array_equal(go, co) and np.array_equal(gv, cv)
    m = len(docs)
    left, right = np.repeat(np.arange(m), m), np.tile(np.arange(m), m)
    assert np.array_equal(gpu_backend.jaccard_pairs(co, cv, left, right), cpu.jaccard_pairs(co, cv, left, right))
    assert np.array_equal(gpu_backend.signature_similarity(cs, left, right),
                          cpu.signature_similarity(cs, left, right))
    for bands, rows in ((num_perm // 8, 8), (num_perm // 13, 13)):
        assert np.array_equal(gpu_backend.band_hashes(cs, bands, rows, hp.band_base),
                              cpu.band_hashes(cs, bands, rows, hp.band_base))
    assert np.array_equal(gpu_backend.exact_hashes(buf, hp.exact_seed1, hp.exact_seed2),
                          cpu.exact_hashes(buf, hp.exact_seed1, hp.exact_seed2))


@pytest.mark.gpu
@pytest.mark.parametrize(("kind", "n"), [("char", 24), ("char", 5), ("word", 5), ("word", 1)])
def test_gpu_warp_and_block_signature_kernels_equal_cpu(cpu, kind, n):
    """Both signature kernels on the device, 600 permutations (the warp kernel in two launches), a document
    cut into many warp segments; counts and first tokens agree."""
    from gpu_dedup.kernels.params import hash_params

    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.backends.strings import string_buffers
    from tests.kernels.test_cpu import BAD_BYTES, TEXTS, big_document

    docs = [t.encode() for t in TEXTS] + BAD_BYTES + [big_document().encode(), b"", b"x y", b" " * 9000 + b"a b"]
    buf = string_buffers(pa.array(docs, pa.large_binary()))
    hp = hash_params(11, 600)
    cs, cc = cpu.minhash(buf, hp, kind, n)
    warp = GPUBackend(signature_kernel="warp", warp_seg_bytes=1024)
    block = GPUBackend(signature_kernel="block")
    for be in (warp, block):
        gs, gc = be.minhash(buf, hp, kind, n)
        assert np.array_equal(to_host(gs), cs) and np.array_equal(to_host(gc), cc), be.signature_kernel
    _, wc, wf = warp.signature_pass(buf, hp, kind, n)
    _, bc, bf = block.signature_pass(buf, hp, kind, n)
    assert np.array_equal(to_host(wf), to_host(bf))
    full = to_host(bc) > 0
    assert np.array_equal(to_host(wc)[full], to_host(bc)[full])


@pytest.mark.gpu
def test_gpu_components_buckets_edges_equal_cpu(cpu, gpu_backend):
    rng = np.random.default_rng(1)
    n = 200_000
    src = rng.integers(0, n, 150_000)
    dst = rng.integers(0, n, 150_000)
    assert np.array_equal(gpu_backend.components(src, dst, n), cpu.components(src, dst, n))
    # the driver-side stage code is one source for both: the same functions on CuPy arrays
    import cupy

    bh = rng.integers(0, 50_000, size=(100_000, 8)).astype(np.uint64)
    want = buckets(bh)
    got = buckets(cupy.asarray(bh))
    assert np.array_equal(to_host(got.members), want.members) and np.array_equal(to_host(got.offsets), want.offsets)
    e = edges(got)
    assert np.array_equal(to_host(e.src), edges(want).src) and np.array_equal(to_host(e.dst), edges(want).dst)
    sims = rng.random(1 << 17)  # indexed by a ^ b: ids below 100,000 XOR to below 2 ** 17

    def sim(a, b):
        return sims[to_host(a) ^ to_host(b)] if not isinstance(a, np.ndarray) else sims[a ^ b]

    host = star_rounds(want, sim, 0.5, 3)
    dev = star_rounds(got, lambda a, b: cupy.asarray(sim(a, b)), 0.5, 3)
    assert np.array_equal(to_host(dev.verified.src), host.verified.src)
    assert np.array_equal(to_host(dev.scored.dst), host.scored.dst)


@pytest.mark.gpu
def test_gpu_vector_cosine_equals_cpu_and_returns_where_its_inputs_are(cpu, gpu_backend):
    """``Cosine.exact_similarity`` on the device: the CPU's bits (one scalar source, a fixed summation
    order; products of float32 values are exact in float64, so a fused multiply-add rounds like the add),
    for host vectors with host or device pairs and for device vectors."""
    import cupy

    from gpu_dedup.backends import on_device
    from gpu_dedup.config import Config
    from gpu_dedup.stages.families import RowData, family_for
    from gpu_dedup.stages.vectors import Vectors

    rng = np.random.default_rng(5)
    n, d = 5000, 771
    x = rng.standard_normal((n, d)).astype(np.float32)
    x[17] = 0
    status = np.zeros(n, np.int8)
    left, right = rng.integers(0, n, 20_000), rng.integers(0, n, 20_000)
    left[:3], right[:3] = 17, [17, 3, 4]
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "input": {"vector_column": "emb"}})
    fam = family_for(cfg, n)
    want = fam.exact_similarity(RowData(vectors=Vectors(x, status)), left, right, cpu)
    assert not want[:3].any()
    got = fam.exact_similarity(RowData(vectors=Vectors(x, status)), left, right, gpu_backend)
    assert isinstance(got, np.ndarray) and got.dtype == np.float64 and np.array_equal(got, want)
    got = fam.exact_similarity(RowData(vectors=Vectors(x, status)), cupy.asarray(left), cupy.asarray(right),
                               gpu_backend)
    assert on_device(got) and np.array_equal(to_host(got), want)
    got = fam.exact_similarity(RowData(vectors=Vectors(cupy.asarray(x), status)), left, right, gpu_backend)
    assert on_device(got) and np.array_equal(to_host(got), want)


@pytest.mark.gpu
@pytest.mark.parametrize("preset", ["default", "fineweb", "nemo_curator"])
def test_gpu_pipeline_outputs_equal_cpu(tmp_path, preset):
    import pyarrow.parquet as pq

    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards
    from gpu_dedup.run.entry import run_dedup

    sample = planted_corpus(n_docs=4000, n_clusters=200, seed=21)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=3)
    results = {}
    for name in ("cpu", "gpu"):
        cfg = Config.from_yaml(preset).with_overrides({"backend": name, "input.id_column": "id"})
        results[name] = run_dedup(tmp_path / "in", tmp_path / name, cfg)
    c, g = results["cpu"], results["gpu"]
    assert g.report["backend"].startswith("gpu: CUDA kernels")
    assert np.array_equal(c.kept, g.kept) and np.array_equal(c.cluster, g.cluster)
    assert np.array_equal(c.edges.src, g.edges.src) and np.array_equal(c.edges.dst, g.edges.dst)
    assert np.array_equal(c.edges.similarity, g.edges.similarity)
    assert c.report["counts"] == g.report["counts"] and c.report["counts"]["removed"] > 0
    assert c.duplicates.equals(g.duplicates)
    for shard in c.shards:
        assert pq.read_table(tmp_path / "cpu" / shard.name).equals(pq.read_table(tmp_path / "gpu" / shard.name))


def _index_content(path):
    """Manifest counts and every segment's docs, bands and centres tables."""
    import json

    from gpu_dedup.index.format import read_ipc as _read_ipc

    manifest = json.loads((path / "manifest.json").read_text())
    return (manifest["fingerprint"], manifest["documents"],
            {(seg, part): _read_ipc(path / seg / f"{part}.arrow")
             for seg in manifest["segments"] for part in ("docs", "bands", "centers")})


def cross_backend_index_runs(tmp_path, method, backends=("cpu", "gpu")):
    """Build an index on each backend, run --against --update-index on each; the runs of every
    (build, against) pair, the indexes they leave and a query on each backend must agree."""
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards
    from gpu_dedup.index.store import Index
    from gpu_dedup.run.entry import run_dedup

    sample = planted_corpus(n_docs=3000, n_clusters=200, cluster_size=(2, 6), edit_rate=(0.0, 0.06), seed=23)
    t = sample.table.select(["id", "text"])
    write_shards(t.slice(0, 1500), tmp_path / "a", shards=2, prefix="a")
    write_shards(t.slice(1500), tmp_path / "b", shards=2, prefix="b")
    queries = pa.array(t.column("text").to_pylist()[1400:1600:7], pa.large_string())
    runs = {}
    for build in backends:
        for against in backends:
            name = f"{build}-{against}"
            cfg = Config.from_dict({"backend": build, "input": {"id_column": "id"}, "verify": {"method": method}})
            run_dedup(tmp_path / "a", tmp_path / f"out-a-{name}", cfg, index_out=tmp_path / f"ix-{name}")
            res = run_dedup(tmp_path / "b", tmp_path / f"out-b-{name}", cfg.with_overrides({"backend": against}),
                      against=tmp_path / f"ix-{name}", update_index=True)
            query = Index.open(tmp_path / f"ix-{name}").query(queries, backend=against)
            runs[name] = (res, _index_content(tmp_path / f"ix-{name}"), query)
    ref_res, ref_index, ref_query = runs[f"{backends[0]}-{backends[0]}"]
    assert ref_res.report["counts"]["removed_against_index"] > 0 and ref_query.num_rows > 0
    for name, (res, index, query) in runs.items():
        assert np.array_equal(res.kept, ref_res.kept) and np.array_equal(res.cluster, ref_res.cluster), name
        assert res.duplicates.equals(ref_res.duplicates), name
        assert res.report["counts"] == ref_res.report["counts"], name
        assert index == ref_index, name
        assert query.equals(ref_query), name
    return runs


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["exact", "signature"])
def test_index_built_on_gpu_serves_cpu_and_vice_versa(tmp_path, method):
    runs = cross_backend_index_runs(tmp_path, method)
    assert set(runs) == {"cpu-cpu", "cpu-gpu", "gpu-cpu", "gpu-gpu"}
    assert runs["gpu-gpu"][0].report["backend"].startswith("gpu: CUDA kernels")


@pytest.mark.gpu
def test_dedup_on_a_cudf_frame_equals_pandas_on_cpu():
    """gpu_dedup.dedup(cudf.DataFrame, backend="gpu") with real cuDF: the same rows, clusters and tables
    as dedup(pandas.DataFrame, backend="cpu"), returned as cuDF frames."""
    cudf = pytest.importorskip("cudf")
    import pandas as pd

    import gpu_dedup
    from gpu_dedup.evaluation.sample import planted_corpus

    sample = planted_corpus(n_docs=3000, n_clusters=150, seed=17)
    ids = [f"doc-{i}" for i in range(sample.table.num_rows)] + ["null", "empty"]
    texts = sample.table.column("text").to_pylist() + [None, ""]
    cpu = gpu_dedup.dedup(pd.DataFrame({"id": ids, "text": texts}), text="text", id="id", backend="cpu")
    gpu = gpu_dedup.dedup(cudf.DataFrame({"id": ids, "text": texts}), text="text", id="id", backend="gpu")
    assert gpu.report["backend"].startswith("gpu: CUDA kernels")
    assert isinstance(gpu.deduplicated, cudf.DataFrame) and isinstance(gpu.duplicates, cudf.DataFrame)
    assert np.array_equal(gpu.kept, cpu.kept) and np.array_equal(gpu.clusters, cpu.clusters)
    assert np.array_equal(gpu.edges.src, cpu.edges.src) and np.array_equal(gpu.edges.dst, cpu.edges.dst)
    assert np.array_equal(gpu.edges.similarity, cpu.edges.similarity)
    assert gpu.report["counts"] == cpu.report["counts"] and cpu.report["counts"]["near_duplicates"] > 0
    kept = gpu.deduplicated.to_pandas()
    assert kept.index.tolist() == cpu.deduplicated.index.tolist()  # input rows, in input order
    assert kept["id"].tolist() == cpu.deduplicated["id"].tolist()
    assert kept["text"].tolist() == cpu.deduplicated["text"].tolist()
    pd.testing.assert_frame_equal(gpu.duplicates.to_pandas(), cpu.duplicates, check_dtype=False)
    assert gpu.duplicates.to_pandas().shape[0] > 0


@pytest.mark.parametrize("environ", [{}, {"CUPY_ACCELERATORS": "cub"}, {"CUPY_ACCELERATORS": ""}])
def test_steady_reductions_drops_cub_unless_the_user_chose(monkeypatch, environ):
    """CUB block reductions compile per block size (picked from the array length); CuPy's own reduction has
    one.  A user's CUPY_ACCELERATORS stands."""
    from gpu_dedup.backends import gpu

    chosen = []
    core = types.ModuleType("cupy._core")
    core.set_reduction_accelerators = chosen.append
    cupy = types.ModuleType("cupy")
    cupy._core = core
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy._core", core)
    got = gpu.steady_reductions(environ)
    if environ:
        assert chosen == [] and "CUPY_ACCELERATORS" in got
    else:
        assert chosen == [[]] and got == "CuPy reductions without CUB"
    del core.set_reduction_accelerators  # an older CuPy without the switch: nothing changes, nothing said
    assert gpu.steady_reductions({}) == ""


@pytest.mark.parametrize("frames", [None, "cudf"])
def test_write_parquet_is_none_without_cudf(monkeypatch, frames):
    """Without cuDF the write stage gets no device writer, so it writes a shard per core on the host."""
    import numba

    from gpu_dedup.backends.gpu import GPUBackend

    monkeypatch.setattr(numba.config, "ENABLE_CUDASIM", 1)
    be = GPUBackend({"frames": frames} if frames else {})
    assert (be.write_parquet is None) == (frames is None)
    if frames:
        assert be.write_parquet == be.write_parquet_cudf

