"""GPU backend: CUDA twins of the kernels (``gpu_dedup.kernels.hash_cuda``).

Imported only when the GPU backend is asked for.  ``create()`` checks, in
order, that CuPy and numba-cuda import and that a CUDA device answers; the
error names what is missing and the command that installs it.
"""

from __future__ import annotations

from gpu_dedup.errors import BackendError

# gpu_dedup is installed from its checkout (it is not on a package registry), so the extras are named from there
EXTRA_HINT = ("install the GPU packages matching your CUDA driver from the gpu_dedup checkout: "
              "pip install -e '.[cuda12]' (or '.[cuda13]'); README.md, section GPU, has the set-up")


def probe() -> dict:
    """What the GPU backend would run on; raises BackendError naming what is missing."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a CUDA library that fails to load
        raise BackendError(f"GPU backend needs CuPy, which is not importable ({exc}); {EXTRA_HINT}") from None
    try:
        import numba_cuda  # noqa: F401  the numba-cuda package: numba's built-in CUDA target is deprecated
        from numba import cuda
    except Exception as exc:
        raise BackendError(f"GPU backend needs numba-cuda, which is not importable ({exc}); {EXTRA_HINT}") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        raise BackendError(f"no CUDA device is usable ({exc}); run with backend: cpu") from None
    if count == 0 or not cuda.is_available():
        raise BackendError("no CUDA device found (CuPy and numba-cuda are installed); run with backend: cpu")
    try:
        import cudf  # noqa: F401

        frames = "cudf"
    except Exception:
        frames = "pyarrow"
    return {"devices": count, "frames": frames}


def create():
    info = probe()
    from gpu_dedup.backends.gpu import GPUBackend

    return GPUBackend(info)
