"""Run test cases in a child pytest under Numba's CUDA simulator and check that every one passed.

``NUMBA_ENABLE_CUDASIM`` must be set before ``numba.cuda`` is first imported, and the parent process keeps the
real CPU kernels, so simulated cases run in a fresh interpreter with the variable set.  The check fails if any
case fails, errors, is skipped or xfails, or if fewer than expected ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_simulated(targets: list, *, at_least: int | None = None, exactly: int | None = None, env: dict | None = None,
                  args: tuple = (), timeout: int = 600) -> str:
    """Run pytest on ``targets`` (files or node ids) in a child process with ``NUMBA_ENABLE_CUDASIM=1`` (plus
    ``env``; a value None removes the variable) and assert all passed: ``exactly`` or ``at_least`` of them.
    Returns the run's summary line."""
    child = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", PYTHONHASHSEED="0")
    for key, value in (env or {}).items():
        if value is None:
            child.pop(key, None)
        else:
            child[key] = value
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly", "-o", "addopts=", *args,
         *[str(t) for t in targets]], check=False, cwd=ROOT, env=child, capture_output=True, text=True,
        timeout=timeout)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    summary = out.strip().splitlines()[-1]
    passed = re.search(r"(\d+) passed", summary)
    assert passed, summary
    if exactly is not None:
        assert int(passed.group(1)) == exactly, summary
    if at_least is not None:
        assert int(passed.group(1)) >= at_least, summary
    assert not re.search(r"failed|error|skipped|xfail", summary), summary
    return summary
