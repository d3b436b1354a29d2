"""GPU backend: CUDA twins of the kernels (``gpu_dedup.kernels.hash_cuda``).

Imported only when the GPU backend is asked for.  ``create()`` checks, in
order, that CuPy and numba-cuda import, that a CUDA device answers and that
numba-cuda finds its compiler (NVVM); the error names what is missing and the
command that installs it.

Rehearsals without a device: with ``NUMBA_ENABLE_CUDASIM=1`` *and*
``GPU_DEDUP_SIMULATOR=1`` the GPU backend runs its CUDA kernels in Numba's CUDA
simulator on NumPy arrays (no CuPy, no device; tiny inputs only: every CUDA
thread is a Python thread).  ``results/gpu/first-contact.sh --rehearse`` uses it
to run the device script's steps on a CPU machine.  The simulator alone does not
make ``backend: gpu`` (or ``auto``) usable.
"""

from __future__ import annotations

import logging
import os

from gpu_dedup.errors import BackendError
from gpu_dedup.kernels.compat_cuda import restore_numpy_aliases

log = logging.getLogger("gpu_dedup")

# gpu_dedup is installed from its checkout (it is not on a package registry), so the extras are named from there
EXTRA_HINT = ("install the GPU packages matching your CUDA driver from the gpu_dedup checkout: "
              "pip install -e '.[cuda12]' (or '.[cuda13]'); README.md, section GPU, has the set-up")
SIMULATOR_SWITCH = "GPU_DEDUP_SIMULATOR"


def _flag(name: str) -> bool:
    return os.environ.get(name, "0").strip().lower() not in ("", "0", "false", "no")


def simulator_requested() -> bool:
    """Whether the GPU backend is to run in Numba's CUDA simulator (both switches set)."""
    return _flag("NUMBA_ENABLE_CUDASIM") and _flag(SIMULATOR_SWITCH)


def optional_import(name: str):
    """(module, None) when ``name`` imports; (None, None) when it is not installed; (None, "Type: message")
    when it is installed but fails to import (a broken install must not pass for a missing one)."""
    try:
        return __import__(name), None
    except ModuleNotFoundError as exc:
        if exc.name == name or (exc.name or "").split(".")[0] == name:
            return None, None
        return None, f"{type(exc).__name__}: {exc}"
    except Exception as exc:  # ImportError of a shared library, a version check, a CUDA error at import
        return None, f"{type(exc).__name__}: {exc}"


def nvvm_missing() -> str | None:
    """Why numba-cuda cannot compile kernels here (its NVVM not found), or None when it can."""
    try:
        from numba.cuda.cudadrv import nvvm

        if nvvm.is_available():
            return None
        reason = "numba-cuda does not find NVVM (libnvvm)"
    except Exception as exc:
        reason = f"numba-cuda's NVVM does not load ({type(exc).__name__}: {exc})"
    home = os.environ.get("CUDA_HOME")
    hint = (f"CUDA_HOME={home} has no usable nvvm/lib64" if home else
            "set CUDA_HOME to the CUDA toolkit (e.g. CUDA_HOME=/usr/local/cuda)")
    return f"{reason}: {hint}, or pip install 'numba-cuda[cu13]' (or '[cu12]') for its NVVM wheel"


IO_THREADS_MAX = 16  # KvikIO threads a run asks for at most (its thread pool reads and writes libcudf's files)


def io_threads(environ=os.environ, loaded=None) -> str:
    """KvikIO's thread pool, which reads and writes libcudf's Parquet files, as wide as the host's cores (at most
    16) rather than KvikIO's one thread: ``KVIKIO_NTHREADS`` set before cuDF loads (KvikIO reads it once).  Left
    as it is where the user set it, or where cuDF is already loaded (then too late).  Returns what is in effect,
    for the run's mode line."""
    import sys

    if "KVIKIO_NTHREADS" in environ:
        return f"KvikIO threads {environ['KVIKIO_NTHREADS']} (KVIKIO_NTHREADS)"
    if any(m in (sys.modules if loaded is None else loaded) for m in ("cudf", "pylibcudf")):
        return ""
    n = max(1, min(IO_THREADS_MAX, os.cpu_count() or 1))
    environ["KVIKIO_NTHREADS"] = str(n)
    return f"KvikIO threads {n}"


def probe() -> dict:
    """What the GPU backend would run on; raises BackendError naming what is missing."""
    if simulator_requested():
        return {"devices": 0, "frames": "pyarrow", "simulator": True}
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise BackendError(f"GPU backend needs CuPy, which is not importable ({exc}); {EXTRA_HINT}") from None
    try:
        import numba_cuda  # noqa: F401  the numba-cuda package: numba's built-in CUDA target is deprecated
        from numba import cuda

        restore_numpy_aliases()  # a user's own @cuda.jit kernels compile on NumPy >= 2.5 too
    except Exception as exc:
        raise BackendError(f"GPU backend needs numba-cuda, which is not importable ({exc}); {EXTRA_HINT}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise BackendError(f"no CUDA device is usable ({exc}); run with backend: cpu") from None
    if count == 0 or not cuda.is_available():
        raise BackendError("no CUDA device found (CuPy and numba-cuda are installed); run with backend: cpu")
    missing = nvvm_missing()
    if missing:
        raise BackendError(f"the GPU backend cannot compile its kernels: {missing}")
    info = {"devices": count, "frames": "pyarrow", "io_threads": io_threads()}
    cudf, broken = optional_import("cudf")
    if cudf is not None:
        info["frames"] = "cudf"
    elif broken:  # installed but broken: said, not mistaken for "not installed"
        info["cudf_error"] = broken
        log.warning("cuDF is installed but does not import (%s); the GPU backend reads and writes shards with "
                    "pyarrow", broken)
    _, broken = optional_import("cugraph")
    if broken:
        info["cugraph_error"] = broken
        log.warning("cuGraph is installed but does not import (%s); components run on CuPy", broken)
    return info


def create():
    info = probe()
    from gpu_dedup.backends.gpu import GPUBackend

    return GPUBackend(info)
