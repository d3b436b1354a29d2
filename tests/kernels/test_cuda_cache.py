"""CUDA kernels compile once: a second process loads them from numba-cuda's disk cache, and an edit of the
sources they compile from drops the cached entries (no device needed: ``_cuda_cache_check.py``).

On an H100 the first call of the kernels took 1-19 s each (91 s over the smoke checks), most of it NVVM."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .test_cuda_compile import _nvvm_missing

CHECK = Path(__file__).with_name("_cuda_cache_check.py")


def _run(cache_dir) -> dict:
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0", "NUMBA_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, str(CHECK)], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"kernels (\d+) hits (\d+) misses (\d+) seconds", proc.stdout)
    assert found, proc.stdout
    return dict(zip(("kernels", "hits", "misses"), map(int, found.groups())))


def test_kernels_load_from_the_disk_cache_and_stale_entries_are_dropped(tmp_path):
    reason = _nvvm_missing()
    if reason:
        pytest.skip(reason)
    first = _run(tmp_path)
    assert first["kernels"] >= 10 and first["misses"] == first["kernels"] and first["hits"] == 0
    second = _run(tmp_path)
    assert second["hits"] == second["kernels"] and second["misses"] == 0
    stamps = list(tmp_path.rglob("gpu_dedup-hash_cuda-*.stamp"))
    assert len(stamps) == 1
    stamps[0].unlink()  # what an edit of hash_scalar.py or text_scalar.py looks like: another digest
    third = _run(tmp_path)
    assert third["misses"] == third["kernels"] and third["hits"] == 0
