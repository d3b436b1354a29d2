"""Every cosine CUDA kernel compiles for a real GPU (NVVM to PTX; ptxas: no spills) -- no device needed.

Needs numba-cuda with its NVVM (the ``cuda12``/``cuda13`` extras); skipped cleanly where it is not
installed.  Runs ``_cosine_cuda_compile_check.py`` in a child process (it patches the device query).
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECK = Path(__file__).with_name("_cosine_cuda_compile_check.py")


@pytest.mark.skipif(importlib.util.find_spec("numba_cuda") is None,
                    reason="numba-cuda is not installed (pip install 'numba-cuda[cu12]' compiles the kernels "
                           "to PTX without a GPU)")
def test_cosine_cuda_kernels_compile_to_ptx():
    proc = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    print(proc.stdout)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-4000:]
    assert proc.stdout.count("ok  ") >= 8
