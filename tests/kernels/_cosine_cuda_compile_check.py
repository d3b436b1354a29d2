"""Compile every CUDA kernel of ``gpu_dedup.kernels.cosine_cuda`` to PTX with the real numba-cuda
compiler (NVVM), and check it with ``ptxas`` (no spills) where ``ptxas`` is found -- no device needed.

    python tests/kernels/_cosine_cuda_compile_check.py      # needs numba-cuda[cu12] or [cu13]

Run by ``tests/kernels/test_cosine_cuda_compile.py`` in a child process (it patches the device
query numba-cuda makes when it compiles a device function), like ``_cuda_compile_check.py``.
"""

import os
import subprocess
import sys
import tempfile
import types as pytypes

import numba.cuda.dispatcher as dispatcher
from numba import types as t
from numba.cuda import compile_ptx

CC = (8, 0)
dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=CC)

from gpu_dedup.kernels import cosine_cuda as k  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _cuda_compile_check import find_ptxas  # noqa: E402

u8, i64, u64, f64, f32_2d = t.uint8[::1], t.int64[::1], t.uint64[::1], t.float64[::1], t.float32[:, ::1]
u64_2d, u32_2d = t.uint64[:, ::1], t.uint32[:, ::1]
I, U, B = t.int64, t.uint64, t.boolean
SIGNATURES = {  # the argument types the *_device launchers pass
    "simhash_docs": [(i64, i64, u8, B, I, U, B, i64, U, i64, u32_2d, i64)],
    "feature_counts": [(i64, i64, u8, B, I, i64)],
    "emit_features": [(i64, i64, u8, B, I, i64, u64)],
    "sparse_norms": [(i64, u64, f64, f64)],
    "sparse_cosine_pairs": [(i64, u64, f64, f64, i64, i64, f64)],
    "cosine_pairs": [(f32_2d, f64, i64, i64, f64)],
    "row_norms": [(f32_2d, f64)],
    "hamming_pairs": [(u64_2d, i64, i64, i64)],
}


def main() -> int:
    kernels = [name for name in dir(k) if hasattr(getattr(k, name), "py_func") and not name.startswith("_")
               and name != "dev"]
    failed = 0
    missing = sorted(set(kernels) - set(SIGNATURES))
    if missing:
        print(f"FAIL kernels without a signature here: {missing}")
        failed += 1
    ptxas = find_ptxas()
    for name, variants in SIGNATURES.items():
        for sig in variants:
            try:
                ptx, _ = compile_ptx(getattr(k, name).py_func, sig, cc=CC)
            except Exception as exc:
                failed += 1
                print(f"FAIL {name}{sig}: {type(exc).__name__}: {str(exc)[:2000]}")
                continue
            info = f"{len(ptx):7d} chars PTX"
            bad = False
            if ptxas:
                with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                    f.write(ptx)
                r = subprocess.run([ptxas, f"-arch=sm_{CC[0]}{CC[1]}", "-v", f.name, "-o", os.devnull],
                                   capture_output=True, text=True)
                os.unlink(f.name)
                lines = [ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines()
                         if "registers" in ln or "spill" in ln]
                info += "; " + "; ".join(lines)
                if r.returncode != 0 or " 0 bytes spill stores" not in r.stderr:
                    bad = True
                    failed += 1
                    info = "ptxas: " + r.stderr[-1500:]
            print(f"{'FAIL' if bad else 'ok  '} {name:22s} {info}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
