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

import os

# Numba's parallel loops run on its OpenMP threading layer (libgomp) unless TBB is installed.  libgomp's default
# has each worker spin for about 300,000 rounds after every parallel loop, waiting for the next; between kernels
# (the read stage's Python work, the reader threads' Parquet decoding) those spinning workers took a core the
# other threads needed: a run of 10^6 documents on 2 cores spent a fifth of its CPU time in libgomp's spin.
# Passive waiting (a worker sleeps until the next loop, woken in microseconds) is set here, before any kernel
# starts the threading layer (libgomp reads its environment once, when loaded); an OMP_WAIT_POLICY or
# GOMP_SPINCOUNT the user set is kept.
if "OMP_WAIT_POLICY" not in os.environ and "GOMP_SPINCOUNT" not in os.environ:
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
