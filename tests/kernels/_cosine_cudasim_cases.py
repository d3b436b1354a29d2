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


def test_vector_exact_similarity_on_the_gpu_backend_equals_cpu(cuda, monkeypatch):
    """``Cosine.exact_similarity`` with the GPU backend launches the CUDA kernels and returns the CPU's bits,
    scoring in place and (vectors where the backend does not compute) on the rows the pairs name."""
    import types

    from gpu_dedup.backends.cpu import CPUBackend
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.config import Config
    from gpu_dedup.stages.families import RowData, family_for

    launches = []
    for name in ("cosine_pairs_device", "row_norms_device"):
        real = getattr(cuda, name)
        monkeypatch.setattr(cuda, name, lambda *a, _real=real, _name=name, **k: launches.append(_name) or _real(
            *a, **{**k, "threads": 4}))
    gpu, cpu = GPUBackend(item_threads=4, max_blocks=3), CPUBackend()
    rng = np.random.default_rng(3)
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "input": {"vector_column": "emb"}})
    fam = family_for(cfg, 30)
    for d in (1, 3, 4, 6, 17):
        x = rng.standard_normal((30, d)).astype(np.float32)
        x[4] = 0
        left, right = rng.integers(0, 30, 50), rng.integers(0, 30, 50)
        want = fam.exact_similarity(RowData(vectors=vx.from_numpy(x, bad_vectors="keep")), left, right, cpu)
        launches.clear()
        got = fam.exact_similarity(RowData(vectors=vx.from_numpy(x, bad_vectors="keep")), left, right, gpu)
        assert launches == ["row_norms_device", "cosine_pairs_device"]
        assert isinstance(got, np.ndarray) and got.dtype == np.float64 and np.array_equal(got, want)
        elsewhere = types.ModuleType("elsewhere")  # NumPy under another name: the vectors are not where
        elsewhere.__getattr__ = lambda name: getattr(np, name)  # the backend computes
        monkeypatch.setattr(gpu, "xp", elsewhere)
        got = fam.exact_similarity(RowData(vectors=vx.from_numpy(x, bad_vectors="keep")), left, right, gpu)
        monkeypatch.setattr(gpu, "xp", np)
        assert np.array_equal(got, want)


def test_cosine_vector_run_on_the_gpu_backend_writes_what_the_cpu_run_writes(tmp_path):
    """A whole run with vectors (similarity cosine, verify exact) on the simulated device: outputs byte for
    byte equal to the CPU run's."""
    import pyarrow.parquet as pq

    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_embeddings
    from gpu_dedup.run.entry import run_dedup

    pe = planted_embeddings(60, 6, n_clusters=8, to_centre=(0.95, 1.0), seed=4)
    (tmp_path / "in").mkdir()
    pq.write_table(pe.table("emb"), tmp_path / "in" / "part-0.parquet")
    cfg = {"similarity": "cosine", "input": {"id_column": "id", "vector_column": "emb"},
           "lsh": {"threshold": 0.9}, "cosine": {"bits": 64}}
    registry._CACHE["gpu"] = GPUBackend(threads=8, span=32, seg_bytes=64, item_threads=8, max_blocks=4)
    try:
        res = {name: run_dedup(tmp_path / "in", tmp_path / name, Config.from_dict({**cfg, "backend": name}))
               for name in ("cpu", "gpu")}
    finally:
        registry._CACHE.pop("gpu", None)
    c, g = res["cpu"], res["gpu"]
    assert g.report["backend"].startswith("gpu") and c.report["counts"]["removed"] > 0
    assert np.array_equal(c.edges.similarity, g.edges.similarity) and c.report["counts"] == g.report["counts"]
    names = sorted(p.name for p in (tmp_path / "cpu").iterdir() if p.suffix == ".parquet")
    assert names and names == sorted(p.name for p in (tmp_path / "gpu").iterdir() if p.suffix == ".parquet")
    for name in names:
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "gpu" / name).read_bytes(), name


def _gpu_backend(xp=np, **kw):
    from gpu_dedup.backends.gpu import GPUBackend

    return GPUBackend(xp=xp, **{"threads": 8, "span": 32, "seg_bytes": 64, "item_threads": 4, "max_blocks": 3, **kw})


@pytest.mark.parametrize("shingle,n", [("word", 2), ("char", 3)])
def test_text_features_and_sparse_cosine_on_the_gpu_backend_equal_cpu(cuda, shingle, n):
    """The GPU backend's feature sets (count and emit kernels, then a sort per document) and its sparse norms
    and cosine pairs equal the CPU kernels' bits, for every document and for a scattered subset."""
    from gpu_dedup.kernels.cosine_scalar import EXACT_WEIGHT

    from gpu_dedup.backends.cpu import CPUBackend

    gpu, cpu = _gpu_backend(), CPUBackend()
    buf = string_buffers(pa.array(DOCS * 3, pa.large_binary()))
    word = shingle == "word"
    for docs in (np.arange(len(DOCS) * 3, dtype=np.int64), np.array([5, 0, 12, 3, 5], np.int64)):
        got, want = gpu.text_features(buf, docs, word, n), cpu.text_features(buf, docs, word, n)
        assert all(g.dtype == w.dtype and np.array_equal(g, w) for g, w in zip(got, want))
    offsets, feat, tf = want
    k = int(docs[-1])
    assert {int(f): int(c) for f, c in zip(feat[offsets[-2]:offsets[-1]], tf[offsets[-2]:offsets[-1]])} == \
        {f: int(c) for f, c in ref.term_vector((DOCS * 3)[k], shingle, n).items()}
    # weights beyond the exact int64 products too (a feature repeated ~10^5 times in both documents)
    w = tf.astype(np.float64) * 1000.0
    w[: min(3, w.shape[0])] = float(EXACT_WEIGHT) * 3.0
    norms = cpu.sparse_norms(offsets, feat, w)
    assert np.array_equal(gpu.sparse_norms(offsets, feat, w), norms)
    left, right = np.array([0, 1, 2, 4, 3, 0], np.int64), np.array([4, 1, 3, 0, 2, 2], np.int64)
    assert np.array_equal(gpu.sparse_cosine_pairs(offsets, feat, w, norms, left, right),
                          cpu.sparse_cosine_pairs(offsets, feat, w, norms, left, right))


def test_text_steps_on_device_texts_stay_there_and_equal_cpu_in_chunks(monkeypatch):
    """Document frequencies, tf-idf SimHash of a scattered subset and the exact sparse cosine, on stand-in
    device texts (``tests/fake_cupy.py``) in chunks of a few documents: results on the device, the CPU's
    bits; a running document-frequency total on the host takes the device counts."""
    from gpu_dedup.backends import on_device, to_device, to_host
    from gpu_dedup.backends.cpu import CPUBackend
    from gpu_dedup.backends.strings import StringBuffers
    from gpu_dedup.stages.verify import text_cosine_similarity
    from tests.fake_cupy import fake_cupy

    xp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", xp)
    gpu, cpu = _gpu_backend(xp), CPUBackend()
    buf = string_buffers(pa.array(DOCS * 3, pa.large_binary()))
    dev = StringBuffers(to_device(buf.offsets, xp), to_device(buf.data, xp))
    df, n = vx.document_frequencies(buf, "word", 2, 8, chunk_bytes=20, backend=cpu)
    got, m = vx.document_frequencies(dev, "word", 2, 8, chunk_bytes=20, backend=gpu)  # several chunks
    assert on_device(got) and m == n and np.array_equal(to_host(got), df)
    total, _ = vx.document_frequencies(dev, "word", 2, 8, df=df.copy(), backend=gpu)
    assert isinstance(total, np.ndarray) and not on_device(total) and np.array_equal(total, 2 * df)
    idf = vx.idf_table(got, n, 8)
    docs = np.array([9, 2, 3, 20, 5], np.int64)
    want = pj.text_signatures(buf, 128, 5, "word", 2, idf=idf, docs=docs, backend=cpu)
    sig = pj.text_signatures(dev, 128, 5, "word", 2, idf=idf, docs=to_device(docs, xp), backend=gpu)
    assert on_device(sig.bits) and np.array_equal(to_host(sig.bits), want.bits)
    assert np.array_equal(to_host(sig.status), want.status)
    left, right = np.array([3, 10, 17, 5, 2, 0], np.int64), np.array([10, 17, 3, 12, 9, 1], np.int64)
    cos = text_cosine_similarity(left, right, buf, "word", 2, idf, chunk_bytes=30, backend=cpu)
    got = text_cosine_similarity(to_device(left, xp), to_device(right, xp), dev, "word", 2, idf, chunk_bytes=30,
                                 backend=gpu)
    assert on_device(got) and np.array_equal(to_host(got), cos) and cos[0] == pytest.approx(1.0)


@pytest.mark.parametrize("where", ["host", "device"])
def test_cosine_text_run_on_the_gpu_backend_writes_what_the_cpu_run_writes(tmp_path, monkeypatch, where):
    """A whole tf-idf text run (similarity cosine, verify exact) on the simulated GPU backend: outputs byte for
    byte equal to the CPU run's.  ``device``: the backend's arrays are stand-in device arrays
    (``tests/fake_cupy.py``), so the run takes the device-resident path: document frequencies, SimHash, band
    hashes and the sparse cosine of the verify and select stages run on the texts where they are.  Only the
    document-frequency table and small results come back to the host: the normalized texts, copied to the
    device once by the normalize stage, never come back (they did 23 times at 10^6 documents, in 16 signature
    chunks, the idf, verify and select); and every copy back the stand-in saw was counted."""
    from gpu_dedup import backends as registry
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards
    from gpu_dedup.run.entry import run_dedup
    from tests.fake_cupy import fake_cupy

    sample = planted_corpus(n_docs=60, n_clusters=6, words=(30, 80), seed=3)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    text_bytes = sum(len(t.encode()) for t in sample.table.column("text").to_pylist())
    cfg = {"similarity": "cosine", "input": {"id_column": "id"}, "lsh": {"threshold": 0.7},
           "cosine": {"bits": 64, "text": {"idf_bits": 8}}}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    xp = np
    if where == "device":
        xp = fake_cupy()
        monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setitem(registry._CACHE, "gpu", _gpu_backend(xp))
    before = registry.transfer_totals()
    g = run_dedup(tmp_path / "in", tmp_path / "gpu", Config.from_dict({**cfg, "backend": "gpu"}))
    counted = {k: v - before[k] for k, v in registry.transfer_totals().items()}
    if where == "device":  # every copy back the stand-in saw was counted (whether in a stage or not): the
        # checkpoints' apart (their writer's thread copies them while the next stages run)
        checkpoints = counted["checkpoint_device_to_host_bytes"]
        assert xp.moved["device_to_host_bytes"] == counted["device_to_host_bytes"] + checkpoints
        assert counted["device_to_host_bytes"] > 0 and checkpoints > 0
        on_streams = {thread for what, thread, stream in xp.calls if what == "get" and stream is not None}
        assert on_streams == {"gpu-dedup-checkpoints"}  # the checkpoint copies, on the writer's thread
    assert g.report["backend"].startswith("gpu") and c.report["counts"]["removed"] > 0
    assert c.report["counts"] == g.report["counts"] and c.report["counts"]["near_duplicates"] > 0
    assert np.array_equal(c.edges.similarity, registry.to_host(g.edges.similarity))
    names = sorted(p.name for p in (tmp_path / "cpu").iterdir() if p.suffix == ".parquet")
    assert "duplicates.parquet" in names and names == sorted(p.name for p in (tmp_path / "gpu").iterdir()
                                                             if p.suffix == ".parquet")
    for name in names:
        assert (tmp_path / "cpu" / name).read_bytes() == (tmp_path / "gpu" / name).read_bytes(), name
    if where == "host":
        return
    stages, moved = g.report["stages"], g.report["gpu"]
    assert stages["normalize"]["host_to_device_bytes"] >= text_bytes  # the texts go to the device once ...
    # ... and never come back: what the run copies back is per-row results, checkpoints and the report's
    # numbers, less than the texts in all (at 10^6 documents their 23 copies were 37 GB)
    assert moved["device_to_host_bytes"] < text_bytes
    df_table = 8 << 8  # the document-frequency table (2**idf_bits int64 counts)
    assert df_table <= stages["signatures"]["device_to_host_bytes"] < df_table + 1024
    for name in ("exact", "bands", "buckets", "verify", "components", "select"):
        assert stages[name].get("device_to_host_bytes", 0) < 256, (name, stages[name])
