"""Load (or compile) before the first stage the kernels a run with a given configuration calls.

``prepare(backend, cfg)`` pushes a tiny sample through the same host code and
backend methods a run uses, with the run's argument types: the text
normalization (its fast path and, for the code points the configured Unicode
form changes, which nearly every real corpus has, its slow path), the
exact-duplicate keys (if ``exact_dedup``), the signature
kernel of the configured shingle mode, the band hashes (and the buckets'
pre-filter of host arrays) and the verification
kernels of ``verify.method``.  Numba then loads each kernel from its on-disk
cache, or compiles it the first time after an install (or an upgrade of the
kernel sources).  Nothing else is compiled: a word-shingle run never builds
the char kernel, a signature-verified run never builds the shingle-set ones.  The host's radix sort
(``kernels/order_cpu.py``), with which every stage groups rows on the host, and the host's star round
(``kernels/edges_cpu.py``) are loaded too.

The text goes through ``backend.normalize_column`` (on the GPU backend: the
normalization kernel), so nothing compiles inside the normalize stage either.
A cosine run (``similarity: cosine``) prepares its own kernels instead of
MinHash's: SimHash, the feature sets of document frequencies and the sparse
cosine of text vectors, or the projections and dense cosine of embeddings.

The message ``compiling kernels (first run after install) ...`` is logged
once, at INFO on the ``gpu_dedup`` logger, and only when Numba actually
compiles something (its ``numba:compile`` event, which a cache hit does not
raise).  numba-cuda raises that event on its own event module
(``numba.cuda.core.event``), so the listener is installed on both.  The runner
books the returned seconds outside the stages.
"""

from __future__ import annotations

import importlib
import logging
import sys
import time
from contextlib import ExitStack

import numpy as np
import pyarrow as pa
from numba.core import event

from gpu_dedup.backends import array_module, radix, to_host
from gpu_dedup.kernels import cosine_cpu, edges_cpu
from gpu_dedup.kernels.buckets_cpu import maybe_shared
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


class _FirstCompile:
    """Logs MESSAGE when the first compilation starts (once per instance), whichever event module says so."""

    def __init__(self):
        self.compiled = False

    def started(self):
        if not self.compiled:
            self.compiled = True
            log.info(MESSAGE)

    def listener(self, module):
        """A listener of ``module`` (each event module accepts only its own ``Listener`` subclasses)."""
        first = self

        class Compiling(module.Listener):
            def on_start(self, ev):
                first.started()

            def on_end(self, ev):
                pass

        return Compiling()


# (event module, kind) pairs that say "compiling": Numba's CPU dispatchers raise ``numba:compile``; numba-cuda
# raises its own kinds on its own module (``numba-cuda:run_pass`` for every compiler pass; ``numba-cuda:compile``
# is reserved for it), and refuses listeners for ``numba:`` kinds there
CUDA_KINDS = ("numba-cuda:compile", "numba-cuda:run_pass")


def compile_events() -> list:
    """(event module, kind) pairs to listen to: Numba's ``numba:compile`` and, when the CUDA target is loaded,
    numba-cuda's compile kinds on ``numba.cuda.core.event`` (where that is a module of its own)."""
    pairs = [(event, "numba:compile")]
    if "numba.cuda" in sys.modules:  # the GPU backend is in use: never import the CUDA target for a CPU run
        try:
            cuda_event = importlib.import_module("numba.cuda.core.event")
        except Exception:  # a numba-cuda without its own event module
            cuda_event = None
        if cuda_event is not None and cuda_event is not event:
            pairs += [(cuda_event, kind) for kind in CUDA_KINDS]
    return pairs


def prepare(backend, cfg) -> tuple[float, bool]:
    """(seconds spent, whether anything compiled) loading the kernels a run with ``cfg`` calls on ``backend``."""
    t0 = time.perf_counter()
    first = _FirstCompile()
    with ExitStack() as listening:
        for mod, kind in compile_events():
            try:
                listening.enter_context(mod.install_listener(kind, first.listener(mod)))
            except ValueError:  # a kind this numba-cuda version does not define
                continue
        radix.warm()  # the host's radix sort (every stage groups rows by sorting)
        edges_cpu.warm()  # a star round's pairs on the host (verify's rounds, whatever the family)
        mh = cfg.minhash
        params = hash_params(mh.seed, mh.num_perm)
        if cfg.similarity == "cosine":
            _prepare_cosine(backend, cfg, params)
            return time.perf_counter() - t0, first.compiled
        strings, _ = backend.normalize_column(_sample(), cfg.normalize)
        if cfg.exact_dedup:
            backend.exact_hashes(strings, params.exact_seed1, params.exact_seed2)
        docs = np.arange(len(strings), dtype=np.int64)
        sig, _ = backend.minhash(strings, params, mh.shingle, mh.ngram, cfg.signature_perms, docs)
        bands, rows = cfg.layout
        bh = backend.band_hashes(sig, bands, rows, params.band_base)
        # the host's bucket pre-filter: a CPU run's, and a GPU run's whose corpus is batched through host memory
        maybe_shared(to_host(bh))
        if cfg.verify.method == "exact":
            offsets, values = backend.shingle_sets(strings, params, mh.shingle, mh.ngram, docs=docs)
            backend.jaccard_pairs(offsets, values, [0], [1])
        else:  # signature and none both score candidates by their signatures
            backend.signature_similarity(sig, [0], [1])
    return time.perf_counter() - t0, first.compiled



def _prepare_cosine(backend, cfg, params) -> None:
    """A cosine run's kernels on the sample, called with the argument types its stages give them (the stages
    sit above the backends, so their steps are repeated here by kernel): text vectors (normalization, exact
    keys, feature sets of the document frequencies and the verification, SimHash, band hashes, the sparse
    cosine or the Hamming estimate) or embeddings (row checks, quantization, sign packing, band hashes, the
    dense cosine or the Hamming estimate)."""
    c = cfg.cosine
    bands, rows = cfg.cosine_layout_for(len(SAMPLE))
    left, right = np.array([0, 0], np.int64), np.array([1, 3], np.int64)
    if cfg.input.vector_column is None:
        strings, _ = backend.normalize_column(_sample(), cfg.normalize)
        if cfg.exact_dedup:
            backend.exact_hashes(strings, params.exact_seed1, params.exact_seed2)
        docs = array_module(strings.offsets).arange(len(SAMPLE), dtype=np.int64)
        word, n = c.text.shingle == "word", int(c.text.ngram)
        offsets, feat, tf = backend.text_features(strings, docs, word, n)
        table = np.full(256, 256, np.int64)  # an idf table (its values do not change what compiles)
        bits, _ = backend.simhash_text(strings, docs, c.bits, 1, word, n, c.text.weighting == "tfidf", table,
                                       np.uint64(56))
        if cfg.verify.method == "exact":
            weights = tf.astype(np.float64)
            backend.sparse_cosine_pairs(offsets, feat, weights, backend.sparse_norms(offsets, feat, weights), left,
                                        right)
    else:
        x = (np.arange(len(SAMPLE) * 8, dtype=np.float32).reshape(len(SAMPLE), 8) % 5) - 2
        status = np.empty(len(SAMPLE), np.int8)
        cosine_cpu.check_rows(x, status)
        q = np.empty_like(x)
        cosine_cpu.quantize_rows(x, q, status)
        bits = np.empty((len(SAMPLE), c.bits // 64), np.uint64)
        cosine_cpu.pack_signs(np.ascontiguousarray(q @ np.ones((8, c.bits), np.float32)), bits)
        if cfg.verify.method == "exact":
            backend.cosine_pairs(x, backend.row_norms(x), left, right)
    host = np.ascontiguousarray(to_host(bits))
    bh = np.empty((host.shape[0], bands), np.uint64)
    cosine_cpu.band_hashes(host, int(bands), int(rows), bh)  # on the host; the device's are array lines
    maybe_shared(bh)
    if cfg.verify.method != "exact":
        backend.hamming_pairs(bits, left, right)
