"""Numba kernel sources of gpu_dedup, installed as ``gpu_dedup.kernels``.

``scalar`` holds the hash math written once; ``cpu`` compiles it with
``numba.njit`` around parallel CPU loops; ``cuda`` compiles the same functions
with ``numba.cuda.jit(device=True)`` around GPU kernels.  Import the submodule
you need: importing this package compiles nothing.
"""
