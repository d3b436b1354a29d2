"""Every CUDA kernel compiles for a real GPU (NVVM to PTX, ptxas: no spills) -- no device needed.

Needs numba-cuda with its NVVM (``pip install "numba-cuda[cu12]"``, part of the
``test`` extra and of the ``cuda12``/``cuda13`` extras).  Skipped only when
that compiler is truly missing (numba-cuda not installed, or its libNVVM not
found); a kernel that fails to compile fails the test.  The check runs in a
child process (``_cuda_compile_check.py``) because it patches numba-cuda's
device query.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("_cuda_compile_check.py")


def _nvvm_missing() -> str | None:
    """Why NVVM cannot compile here, or None when it can (probed in a child: no simulator, no device)."""
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed (pip install 'numba-cuda[cu12]' compiles the kernels to PTX without a GPU)"
    probe = "from numba.cuda.cudadrv import nvvm; import sys; sys.exit(0 if nvvm.is_available() else 3)"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    if proc.returncode == 3:
        return "numba-cuda is installed but its libNVVM is not found (pip install 'numba-cuda[cu12]')"
    if proc.returncode != 0:
        return f"numba-cuda does not import: {proc.stderr.strip()[-300:]}"
    return None


def test_cuda_kernels_compile_to_ptx():
    reason = _nvvm_missing()
    if reason:
        pytest.skip(reason)
    proc = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    assert "FAIL" not in proc.stdout
    assert proc.stdout.count("ok  ") >= 10  # one line per kernel signature
