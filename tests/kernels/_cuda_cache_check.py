"""Compile every CUDA kernel for its launch signatures through the dispatcher, with numba-cuda's disk cache.

    NUMBA_CACHE_DIR=/tmp/c python tests/kernels/_cuda_cache_check.py

Run twice by ``tests/kernels/test_cuda_cache.py``: the first run compiles and saves every kernel, the second
loads them all.  No device is needed: the device queries a compile makes (compute capability, runtime
version) are answered as `_cuda_compile_check.py` answers them, and binding the kernel to a CUDA context is skipped.  Prints one
line: ``kernels N hits H misses M seconds S``.
"""

import os
import sys
import time

import numba.cuda.codegen as codegen
import numba.cuda.dispatcher as dispatcher

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# answers the device query of a compile (compute capability CC) and imports the kernels as ``k``
from _cuda_compile_check import CC, SIGNATURES, kernel  # noqa: E402

codegen.JITCUDACodegen.magic_tuple = lambda self: ((13, 0), CC)  # the cache index key: runtime version, device
codegen.CUDACodeLibrary._ensure_cc = lambda self, cc: cc if cc is not None else (*CC, "")
dispatcher._Kernel.bind = lambda self: None  # loading the module into a CUDA context needs a device


def main() -> int:
    start = time.perf_counter()
    hits = misses = 0
    for name, variants in SIGNATURES.items():
        fn = kernel(name)
        for sig in variants:
            fn.compile(sig)
        hits += sum(fn._cache_hits.values())
        misses += sum(fn._cache_misses.values())
    count = sum(len(v) for v in SIGNATURES.values())
    print(f"kernels {count} hits {hits} misses {misses} seconds {time.perf_counter() - start:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
