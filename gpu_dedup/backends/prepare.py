"""Load (or compile) before the first stage the kernels a run with a given configuration calls.

``prepare(backend, cfg)`` pushes a tiny sample through the same host code and
backend methods a run uses, with the run's argument types: the text
normalization (its fast path and, for the code points the configured Unicode
form changes, which nearly every real corpus has, its slow path), the
exact-duplicate keys (if ``exact_dedup``), the signature
kernel of the configured shingle mode, the band hashes and the verification
kernels of ``verify.method``.  Numba then loads each kernel from its on-disk
cache, or compiles it the first time after an install (or an upgrade of the
kernel sources).  Nothing else is compiled: a word-shingle run never builds
the char kernel, a signature-verified run never builds the shingle-set ones.

The message ``compiling kernels (first run after install) ...`` is logged
once, at INFO on the ``gpu_dedup`` logger, and only when Numba actually
compiles something (its ``numba:compile`` event, which a cache hit does not
raise).  The runner books the returned seconds outside the stages.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import pyarrow as pa
from numba.core import event

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.backends.textnorm import normalize_counted
from gpu_dedup.kernels.params import hash_params

log = logging.getLogger("gpu_dedup")

MESSAGE = "compiling kernels (first run after install) ..."
SAMPLE = [
    "prepare the kernels on a tiny sample with enough words for the longest shingles of any preset",
    "prepare the kernels on a tiny sample with enough words for the longest shingles of any preset too",
    "",
    # a code point the Unicode form changes: real text has some, and they take normalization's slow path
    "\ufb01le ＦＵＬＬＷＩＤＴＨ na\u0308ive",
]


def _sample() -> pa.LargeStringArray:
    """SAMPLE as an Arrow array built from its buffers (``pa.array`` of a list would import pandas)."""
    data = [t.encode() for t in SAMPLE]
    offsets = np.zeros(len(data) + 1, np.int64)
    np.cumsum([len(d) for d in data], out=offsets[1:])
    return pa.LargeStringArray.from_buffers(len(data), pa.py_buffer(offsets), pa.py_buffer(b"".join(data)))


class _FirstCompile(event.Listener):
    """Logs MESSAGE when the first compilation starts (once per listener)."""

    def __init__(self):
        self.compiled = False

    def on_start(self, ev):
        if not self.compiled:
            self.compiled = True
            log.info(MESSAGE)

    def on_end(self, ev):
        pass


def prepare(backend, cfg) -> tuple[float, bool]:
    """(seconds spent, whether anything compiled) loading the kernels a run with ``cfg`` calls on ``backend``."""
    t0 = time.perf_counter()
    listener = _FirstCompile()
    with event.install_listener("numba:compile", listener):
        texts, _ = normalize_counted(_sample(), cfg.normalize)
        strings = string_buffers(texts)
        mh = cfg.minhash
        params = hash_params(mh.seed, mh.num_perm)
        if cfg.exact_dedup:
            backend.exact_hashes(strings, params.exact_seed1, params.exact_seed2)
        docs = np.arange(len(strings), dtype=np.int64)
        sig, _ = backend.minhash(strings, params, mh.shingle, mh.ngram, cfg.signature_perms, docs)
        bands, rows = cfg.layout
        backend.band_hashes(sig, bands, rows, params.band_base)
        if cfg.verify.method == "exact":
            offsets, values = backend.shingle_sets(strings, params, mh.shingle, mh.ngram, docs=docs)
            backend.jaccard_pairs(offsets, values, [0], [1])
        else:  # signature and none both score candidates by their signatures
            backend.signature_similarity(sig, [0], [1])
    return time.perf_counter() - t0, listener.compiled
