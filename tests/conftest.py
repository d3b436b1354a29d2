"""Shared pytest configuration for the gpu_dedup test suite.

``tests`` is a package (``tests/__init__.py``), so pytest puts the repository
root on ``sys.path`` and test modules import the oracle as
``from tests import reference as ref``.

GPU runs: tests marked ``gpu`` need a real CUDA device and are skipped, with
the reason ``gpu_dedup.backends.gpu_probe.probe()`` gives, where there is none (and
always under the CUDA simulator).  ``--backend gpu`` runs the whole suite on
the GPU backend: every test that asks for the CPU backend (``backend="cpu"``,
``Config(backend="cpu")``, the ``cpu_backend`` fixture) gets the GPU backend
instead, so the oracle and end-to-end checks apply to the GPU path (tests that
compare CPU with GPU then compare the GPU with itself).  Without a GPU,
``NUMBA_ENABLE_CUDASIM=1 GPU_DEDUP_FAKE_DEVICE=1 pytest --backend gpu ...`` rehearses that on the
simulator, the backend's arrays being ``tests/fake_cupy.py``'s stand-in device arrays (small tests only:
every CUDA thread runs in Python).
"""

import os

import pytest

FAKE_DEVICE = "GPU_DEDUP_FAKE_DEVICE"  # with --backend gpu under the simulator: device arrays from tests/fake_cupy.py


def pytest_addoption(parser):
    parser.addoption("--backend", default="cpu", choices=("cpu", "gpu"),
                     help="backend the kernel-level tests (fixture cpu_backend) run on; gpu needs a CUDA device")
    parser.addoption("--failures-at-once", action="store_true",
                     help="print each failure's traceback as it happens (a run stopped early keeps them)")


def pytest_runtest_logreport(report):
    """With --failures-at-once, a failed test's traceback goes out when it fails, not in the final summary."""
    config = _CONFIG.get("config")
    if report.failed and config is not None and config.getoption("--failures-at-once"):
        tw = config.get_terminal_writer()
        tw.line()
        tw.sep("!", f"FAILED {report.nodeid} ({report.when})")
        tw.line(report.longreprtext)


_CONFIG: dict = {}


@pytest.fixture(autouse=True)
def _cluster_state_before_timeout(request):
    """With --failures-at-once (the device runs) and pytest-timeout: a test still running 5 s before its timeout
    that has a Dask client writes, to the uncaptured stderr, what the tests' own stack dump cannot show: the
    cluster's workers, the stacks of the tasks they run and their (and their nannies') recent logs.  A worker that
    hangs or never starts is in another process."""
    config = request.config
    timeout = float(config.getoption("timeout", None) or 0) if config.getoption("--failures-at-once") else 0.0
    if timeout <= 10:
        yield
        return
    import threading

    timer = threading.Timer(timeout - 5, _dump_clusters, args=(request.node.nodeid,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _dump_clusters(nodeid: str) -> None:
    import sys
    import threading

    client_module = sys.modules.get("distributed.client")
    clients = list(getattr(client_module, "_global_clients", {}).values()) if client_module else []
    err = sys.__stderr__
    print(f"\n===== {nodeid}: near its timeout, {len(clients)} Dask client(s) =====", file=err, flush=True)
    for client in clients:
        for what, ask in (("workers", lambda c=client: list(c.scheduler_info().get("workers", {}))),
                          ("tasks' stacks", lambda c=client: c.call_stack()),
                          ("worker logs", lambda c=client: c.get_worker_logs(n=40)),
                          ("nanny logs", lambda c=client: c.get_worker_logs(n=40, nanny=True))):
            box: dict = {}
            asker = threading.Thread(target=lambda: box.update(out=_answer(ask)), daemon=True)
            asker.start()
            asker.join(3)
            print(f"--- {what}: {box.get('out', 'no answer within 3 s')}", file=err, flush=True)


def _answer(ask):
    try:
        return ask()
    except Exception as exc:  # noqa: BLE001 - a diagnostic: what went wrong is the answer
        return f"{type(exc).__name__}: {exc}"


def pytest_configure(config):
    _CONFIG["config"] = config


def gpu_unavailable() -> str | None:
    """Why no real GPU run is possible here, or None when one is."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM is set (the simulator is not a device)"
    from gpu_dedup.backends.gpu_probe import probe
    from gpu_dedup.errors import BackendError

    try:
        probe()
    except BackendError as exc:
        return str(exc)
    return None


@pytest.fixture(scope="session", autouse=True)
def _backend_under_test(request):
    """Under ``--backend gpu``, the name ``cpu`` resolves to the GPU backend for the whole session."""
    if request.config.getoption("--backend") != "gpu":
        yield
        return
    import sys

    from gpu_dedup import backends

    saved = dict(backends._REGISTRY), dict(backends._CACHE), sys.modules.get("cupy")
    backends._CACHE.clear()
    backends._REGISTRY["cpu"] = backends._REGISTRY["gpu"]
    if os.environ.get(FAKE_DEVICE, "0") not in ("", "0"):  # a rehearsal: the simulator on stand-in device arrays
        from gpu_dedup.backends.gpu import GPUBackend
        from tests.fake_cupy import fake_cupy

        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") in ("", "0"):
            raise pytest.UsageError(f"{FAKE_DEVICE}=1 needs NUMBA_ENABLE_CUDASIM=1 (kernels run in the simulator)")
        sys.modules["cupy"] = fake_cupy()
        backends._CACHE["cpu"] = backends._CACHE["gpu"] = GPUBackend(
            {"devices": 0, "frames": "pyarrow", "simulator": True}, xp=sys.modules["cupy"], threads=8, span=32,
            seg_bytes=64, item_threads=8, max_blocks=4)
    try:
        yield
    finally:
        backends._REGISTRY.clear()
        backends._REGISTRY.update(saved[0])
        backends._CACHE.clear()
        backends._CACHE.update(saved[1])
        if saved[2] is None:
            sys.modules.pop("cupy", None)
        else:
            sys.modules["cupy"] = saved[2]


def pytest_collection_modifyitems(config, items):
    marked = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not marked:
        return
    reason = gpu_unavailable()
    if reason:
        skip = pytest.mark.skip(reason=f"needs a CUDA device: {reason}")
        for item in marked:
            item.add_marker(skip)


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def cpu_backend(request):
    """The CPU backend object (Numba kernels; compiled once, cached on disk);
    the GPU backend under ``--backend gpu``."""
    from gpu_dedup.backends import get_backend

    return get_backend("cpu")
