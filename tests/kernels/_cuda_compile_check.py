"""Compile every CUDA kernel of ``gpu_dedup.kernels.hash_cuda`` to PTX with the real
numba-cuda compiler (NVVM) -- no device needed.  This catches what the simulator
cannot: typing that only fails on the CUDA target (e.g. uint64 mixed with int64
promoting to float64), unsupported constructs, and (with ptxas) spills.

    python tests/kernels/_cuda_compile_check.py      # needs numba-cuda[cu12] or [cu13]

Run by ``tests/kernels/test_cuda_compile.py`` in a child process: it patches the
device query numba-cuda makes when it compiles a device function.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import types as pytypes

import numba.cuda.dispatcher as dispatcher
from numba import types as t
from numba.cuda import compile_ptx

CC = (8, 0)
# device functions ask the current device for its compute capability; there may be none
dispatcher.get_current_device = lambda: pytypes.SimpleNamespace(compute_capability=CC)

from gpu_dedup.kernels import hash_cuda as k  # noqa: E402

u8, i64, u32, u64, f64 = t.uint8[::1], t.int64[::1], t.uint32[::1], t.uint64[::1], t.float64[::1]
u64_2d, u32_2d = t.uint64[:, ::1], t.uint32[:, ::1]
I, U, B = t.int64, t.uint64, t.boolean
SEG = (u8, i64, i64, i64, i64, i64, B, I, U, U, U)  # data, doc_start, doc_end, segments, shingle args
SIGNATURES = {  # the argument types GPUBackend launches each kernel with
    "minhash_segments": [SEG + (u32, u32, I, u32_2d, i64, i64)],
    "count_segments": [SEG + (i64, i64)],
    "emit_segments": [SEG + (I, i64, u64)],
    "short_values": [(i64, u8, i64, i64, i64, B, I, U, U, U, u64)],
    "short_signatures": [(i64, u64, u32, u32, u32_2d, i64)],
    "band_hashes": [(u32_2d, I, I, U, u64_2d)],
    "exact_hashes": [(i64, u8, U, U, u64_2d)],
    "jaccard_pairs": [(i64, u64, i64, i64, f64)],
    "signature_similarity": [(u32_2d, i64, i64, f64)],
    "hook_min": [(i64, i64, i64, i64)],
    # text normalization (kernels/text_scalar.py): data, starts, ends, stage1, stage2, ascii actions, need, flags, out...
    "normalize_texts": [(u8, i64, i64, t.uint16[::1], u64, i64, I, B, B, B, u8, i64, i64, i64)],
    "gather_segments": [(u8, i64, i64, i64, u8)],
    "sort_segments": [(i64, i64, u64)],
}
# the warp signature kernel: one variant per (minima per lane, shingle mode), made by hash_cuda.warp_kernel
WARP_SIG = (u8, i64, i64, i64, i64, i64, I, U, U, U, u64, I, u32, u32, u32_2d, i64, i64)
WARP_VARIANTS = {"minhash_warps_1_char": (1, False), "minhash_warps_4_word": (4, True),
                 "minhash_warps_9_char": (9, False), "minhash_warps_16_word": (16, True)}
SIGNATURES.update({name: [WARP_SIG] for name in WARP_VARIANTS})


def kernel(name):
    """The kernel SIGNATURES names: a module attribute, or a variant of the warp kernel."""
    if name in WARP_VARIANTS:
        return k.warp_kernel(*WARP_VARIANTS[name])
    return getattr(k, name)


def find_ptxas():
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as nvcc

        for base in list(getattr(nvcc, "__path__", [])):
            cand = os.path.join(base, "bin", "ptxas")
            if os.path.exists(cand):
                return cand
    except Exception:
        pass
    return None


def main() -> int:
    kernels = [name for name in dir(k) if hasattr(getattr(k, name), "py_func") and not name.startswith("_")
               and name not in ("dev",)]
    missing = sorted(set(kernels) - set(SIGNATURES))
    failed = 0
    if missing:
        print(f"FAIL kernels without a signature here: {missing}")
        failed += 1
    ptxas = find_ptxas()
    for name, variants in SIGNATURES.items():
        for sig in variants:
            try:
                ptx, _ = compile_ptx(kernel(name).py_func, sig, cc=CC)
            except Exception as exc:
                failed += 1
                print(f"FAIL {name}{sig}: {type(exc).__name__}: {str(exc)[:2000]}")
                continue
            info = f"{len(ptx):7d} chars PTX, {ptx.count('.f64')} f64 ops"
            if ptxas:
                with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
                    f.write(ptx)
                r = subprocess.run([ptxas, f"-arch=sm_{CC[0]}{CC[1]}", "-v", f.name, "-o", os.devnull],
                                   capture_output=True, text=True)
                os.unlink(f.name)
                lines = [ln.split(":", 1)[-1].strip() for ln in r.stderr.splitlines() if "registers" in ln or "spill" in ln]
                info += "; " + "; ".join(lines)
                # a warp kernel's minima must stay in registers: no stack frame (local memory) at all
                local = name in WARP_VARIANTS and " 0 bytes stack frame" not in r.stderr
                if r.returncode != 0 or " 0 bytes spill stores" not in r.stderr or local:
                    failed += 1
                    info = "ptxas: " + r.stderr[-1500:]
            print(f"{'ok  ' if 'ptxas:' not in info else 'FAIL'} {name:22s} {info}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
