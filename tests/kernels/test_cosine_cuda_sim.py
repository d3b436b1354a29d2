"""The cosine CUDA kernels, run by Numba's CUDA simulator in a child process, equal the CPU kernels.

``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is first imported,
so the cases (``_cosine_cudasim_cases.py``) run in a fresh interpreter.  Fails
if any case fails, errors or is skipped, or if none ran.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CASES = Path(__file__).with_name("_cosine_cudasim_cases.py")


def test_cosine_cuda_kernels_under_simulator_equal_cpu_kernels():
    env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONHASHSEED="0")
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=", str(CASES)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed and int(passed.group(1)) >= 5, summary
    assert not re.search(r"failed|error|skipped|xfail", summary), summary
