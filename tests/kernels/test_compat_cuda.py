"""numba-cuda compiles on a NumPy without ``np.row_stack`` (removed in NumPy 2.5).

numba-cuda 0.30 reads ``np.row_stack`` when its typing context first loads; on an H100 with numpy
2.5.2 every kernel compile failed there.  The child process removes the name the way NumPy 2.5 has
it, then compiles a kernel to PTX (no device needed) after importing the project's CUDA kernels.
"""

import os
import subprocess
import sys

import numpy as np
import pytest

from gpu_dedup.kernels.compat_cuda import restore_numpy_aliases

from .test_cuda_compile import _nvvm_missing

CHILD = """
import sys, types
import numpy as np
np.__dict__.pop("row_stack", None)  # NumPy 2.5
import numba.cuda.dispatcher as dispatcher
dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=(8, 0))
if sys.argv[1] == "with-kernels":
    from gpu_dedup.kernels import hash_cuda  # noqa: F401
from numba import cuda, types as t
from numba.cuda import compile_ptx

def add_one(x):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += 1

ptx, _ = compile_ptx(add_one, (t.uint64[::1],), cc=(8, 0))
print("compiled", len(ptx) > 0)
"""


def test_restores_a_missing_alias_and_leaves_a_present_one(monkeypatch):
    monkeypatch.delitem(np.__dict__, "row_stack", raising=False)
    assert restore_numpy_aliases() == ["row_stack"]
    assert np.row_stack is np.vstack
    assert restore_numpy_aliases() == []  # present now: nothing changes


def test_kernels_compile_on_a_numpy_without_row_stack():
    reason = _nvvm_missing()
    if reason:
        pytest.skip(reason)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    run = [sys.executable, "-c", CHILD]
    proc = subprocess.run(run + ["with-kernels"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0 and "compiled True" in proc.stdout, proc.stderr[-3000:]
