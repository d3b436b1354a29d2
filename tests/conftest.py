"""Shared pytest configuration for the gpu_dedup test suite.

``tests`` is a package (``tests/__init__.py``), so pytest puts the repository
root on ``sys.path`` and test modules import the oracle as
``from tests import reference as ref``.

GPU runs: tests marked ``gpu`` need a real CUDA device and are skipped, with
the reason ``gpu_dedup.backends.gpu.probe()`` gives, where there is none (and
always under the CUDA simulator).  ``--backend gpu`` makes the kernel-level
tests, which take the ``cpu_backend`` fixture, run on the GPU backend instead
(their oracle checks then apply to the GPU kernels).
"""

import os

import pytest


def pytest_addoption(parser):
    parser.addoption("--backend", default="cpu", choices=("cpu", "gpu"),
                     help="backend the kernel-level tests (fixture cpu_backend) run on; gpu needs a CUDA device")


def gpu_unavailable() -> str | None:
    """Why no real GPU run is possible here, or None when one is."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return "NUMBA_ENABLE_CUDASIM is set (the simulator is not a device)"
    from gpu_dedup.backends.gpu import probe
    from gpu_dedup.errors import BackendError

    try:
        probe()
    except BackendError as exc:
        return str(exc)
    return None


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
    from gpu_dedup.backend import get_backend

    return get_backend(request.config.getoption("--backend"))
