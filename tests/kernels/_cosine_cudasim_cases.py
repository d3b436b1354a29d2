"""Cosine CUDA kernels under Numba's CUDA simulator, bit for bit against the CPU kernels and the reference.

Run by ``tests/kernels/test_cosine_cuda_sim.py`` in a child process with
``NUMBA_ENABLE_CUDASIM=1`` (the simulator must be chosen before ``numba.cuda``
is imported).  Tiny inputs and 4 threads per block with a grid smaller than
the work, so the grid-stride loops wrap.  The ``*_device`` launchers run with
``xp = numpy``.
"""

import sys

import numpy as np
import pyarrow as pa
import pytest
from numba import config as numba_config

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.stages import projections as pj
from gpu_dedup.stages import vectors as vx
from tests import reference_cosine as ref

sys.setswitchinterval(2e-4)

pytestmark = [
    pytest.mark.skipif(not numba_config.ENABLE_CUDASIM,
                       reason="run with NUMBA_ENABLE_CUDASIM=1 (tests/kernels/test_cosine_cuda_sim.py)"),
    # the simulator runs the twins on NumPy scalars, whose wrap-around (the definition) warns
    pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning"),
]

DOCS = [b"", b"a", b"hello world", "caf\u00e9 \u65e5\u672c\u8a9e x".encode(), b"ab\xff cd \xe2\x82 ef",
        b"one two three four one two three four", b"  "]


@pytest.fixture(scope="module")
def cuda():
    from gpu_dedup.kernels import cosine_cuda

    return cosine_cuda


@pytest.mark.parametrize("shingle,n", [("word", 2), ("char", 3)])
@pytest.mark.parametrize("idf", [False, True])
def test_simhash_equals_cpu_and_reference(cuda, shingle, n, idf):
    buf = string_buffers(pa.array(DOCS, pa.large_binary()))
    table = None
    if idf:
        df, nd = vx.document_frequencies(buf, shingle, n, 8)
        table = vx.idf_table(df, nd, 8)
    cpu = pj.text_signatures(buf, 128, 9, shingle=shingle, ngram=n, idf=table)
    docs = np.arange(len(DOCS), dtype=np.int64)
    out, count = cuda.text_signatures_device(buf, docs, 128, pj.seed_key(9), shingle == "word", n, idf,
                                             table.weights if idf else np.zeros(1, np.int64),
                                             np.uint64(56) if idf else np.uint64(0), np, threads=4)
    ok = count > 0
    assert np.array_equal(ok, cpu.status == 0)
    assert np.array_equal(out[ok], cpu.bits[ok])
    i = 3
    vec = ref.term_vector(DOCS[i], shingle, n, table.weights.tolist() if idf else None, 8)
    assert [int(w) for w in out[i]] == ref.pack(ref.simhash(vec, 128, 9))


def test_cosine_norms_and_hamming_equal_cpu(cuda):
    from gpu_dedup.stages.verify import (
        cosine_similarity,
        hamming_distance,
        vector_norms,
    )

    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 11)).astype(np.float32)
    x[2] = 0
    left = np.array([0, 1, 2, 3, 6, 5, 4, 0, 1], np.int64)
    right = np.array([1, 1, 3, 2, 0, 4, 6, 6, 5], np.int64)
    norms = vector_norms(x)
    assert np.array_equal(cuda.row_norms_device(x, np, threads=4), norms)
    assert np.array_equal(cuda.cosine_pairs_device(x, norms, left, right, np, threads=4),
                          cosine_similarity(left, right, x, norms))
    sig = pj.signatures(x, 128, 3)
    assert np.array_equal(cuda.hamming_pairs_device(sig.bits, left, right, np, threads=4),
                          hamming_distance(left, right, sig.bits))
