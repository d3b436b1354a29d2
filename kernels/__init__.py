"""Numba kernel sources of gpu_dedup, installed as ``gpu_dedup.kernels``.

One naming scheme: ``<subject>_<target>``.  ``*_scalar`` modules hold math
written once as plain functions; ``*_cpu`` compiles it with ``numba.njit``
around parallel CPU loops and ``*_cuda`` with ``numba.cuda.jit(device=True)``
around GPU kernels (:mod:`.twin` does the compiling).  Subjects: ``hash``
(shingle, MinHash, band and exact hashes), ``cosine`` (random projections),
``text`` (normalization) and ``lines`` (JSON Lines scanning, CPU only);
``params`` derives every hash constant from a seed.  Modules import each other
relatively.  Import the submodule you need: importing this package compiles
nothing.
"""
