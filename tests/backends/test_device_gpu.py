"""The device-resident GPU path on a real GPU (every test is marked ``gpu``: skipped without a device).

Run on a GPU machine with ``pytest -m gpu`` (and the whole suite with
``pytest --backend gpu``).  The CPU-side lines of the same path are tested in
``test_device_path.py``; the kernels under the simulator in tests/kernels.
"""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.backends import get_backend, on_device, to_host
from gpu_dedup.backends.strings import column_buffers, string_buffers
from gpu_dedup.config import Config, NormalizeConfig
from gpu_dedup.errors import ConfigError
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.normalize import normalize_counted

pytestmark = pytest.mark.gpu

TEXTS = ["First  Document, with Punctuation!", None, "", "Ünïcödé ﬁ ligature", "dup text", "dup text", None,
         "bad utf8 follows"] * 50


@pytest.fixture(scope="module")
def gpu():
    return get_backend("gpu")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("device")
    sample = planted_corpus(n_docs=3000, n_clusters=150, words=(40, 200), edit_rate=(0, 0.05), seed=5)
    write_shards(sample.table.select(["id", "text"]), d / "in", shards=3)
    return d


def _tables_equal(a, b, names):
    """Content identity (cuDF may write the shards: other bytes, the same content)."""
    from gpu_dedup.storage.content import file_difference

    for name in names:
        assert file_difference(a / name, b / name) is None, name


def test_cudf_column_buffers_are_device_views(gpu):
    cudf = pytest.importorskip("cudf")
    import cupy

    series = cudf.Series(TEXTS).iloc[3:]  # a row offset
    off, chars, valid = column_buffers(series, cupy)
    assert on_device(off) and on_device(chars) and on_device(valid)
    arr = pa.array(TEXTS[3:], pa.large_string())
    want_off, want_chars, want_valid = column_buffers(arr)
    assert to_host(valid).tolist() == want_valid.tolist()
    o, c = to_host(off), to_host(chars)
    assert [bytes(c[o[k]:o[k + 1]]) for k in range(len(arr)) if want_valid[k]] == \
        [t.encode() for t in TEXTS[3:] if t is not None]


def test_normalize_of_a_cudf_column_equals_cpu(gpu):
    cudf = pytest.importorskip("cudf")

    cfg = NormalizeConfig()
    strings, bad = gpu.normalize_column(cudf.Series(TEXTS), cfg)
    assert on_device(strings.offsets) and on_device(strings.data)
    want, want_bad = normalize_counted(pa.array(TEXTS), cfg)
    w = string_buffers(want)
    assert np.array_equal(to_host(strings.offsets), w.offsets) and bytes(to_host(strings.data)) == bytes(w.data)
    assert bad == want_bad


def test_rmm_pool_backs_cupy(gpu):
    rmm = pytest.importorskip("rmm")
    import cupy
    from rmm.allocators.cupy import rmm_cupy_allocator

    assert gpu.memory["allocator"].startswith("RMM pool")
    assert cupy.cuda.get_allocator() is rmm_cupy_allocator
    resource = rmm.mr.get_current_device_resource()
    assert "Pool" in type(resource).__name__, type(resource)


def test_results_stay_on_the_device(gpu):
    import cupy

    strings, _ = gpu.normalize_column(pa.array(TEXTS), NormalizeConfig())
    from gpu_dedup.kernels.params import hash_params

    p = hash_params(42, 64)
    sig, n = gpu.minhash(strings, p, "char", 5, docs=cupy.arange(10))
    assert on_device(sig) and on_device(n)
    bh = gpu.band_hashes(sig, 8, 8, p.band_base)
    assert on_device(bh)
    offs, vals = gpu.shingle_sets(strings, p, "char", 5, docs=cupy.arange(10))
    assert on_device(offs) and on_device(gpu.jaccard_pairs(offs, vals, cupy.arange(5), cupy.arange(5, 10)))
    assert on_device(gpu.components(cupy.arange(3), cupy.arange(1, 4), 10))
    host_sig, _ = gpu.minhash(string_buffers(normalize_counted(pa.array(TEXTS), NormalizeConfig())[0]), p, "char", 5,
                              docs=np.arange(10))
    assert isinstance(host_sig, np.ndarray) and np.array_equal(host_sig, to_host(sig))


@pytest.mark.parametrize("reader", ["pyarrow", "cudf"])
def test_single_gpu_run_is_device_resident_and_equals_cpu(corpus, reader):
    if reader == "cudf":
        pytest.importorskip("cudf")
    cfg = {"input": {"id_column": "id"}, "minhash": {"num_perm": 128}, "gpu": {"reader": reader}}
    c = run_dedup(corpus / "in", corpus / f"cpu-{reader}", Config.from_dict({**cfg, "backend": "cpu"}))
    g = run_dedup(corpus / "in", corpus / f"gpu-{reader}", Config.from_dict({**cfg, "backend": "gpu"}))
    assert g.report["gpu"]["resident"] is True and g.report["gpu"]["reader"] == reader
    assert np.array_equal(c.kept, g.kept) and c.report["counts"] == g.report["counts"]
    assert (corpus / f"cpu-{reader}" / "duplicates.parquet").read_bytes() == \
        (corpus / f"gpu-{reader}" / "duplicates.parquet").read_bytes()
    _tables_equal(corpus / f"cpu-{reader}", corpus / f"gpu-{reader}", [s.name for s in c.shards])
    stages = g.report["stages"]
    text_bytes = sum(len(t.as_py().encode()) for s in c.shards for t in pq.read_table(s.path).column("text"))
    if reader == "pyarrow":
        assert stages["normalize"]["host_to_device_bytes"] >= text_bytes  # the text crosses once ...
    else:  # cuDF reads the compressed column chunks into device memory and decodes them there
        assert 0 < stages["read"]["host_to_device_bytes"] < text_bytes
        assert stages["normalize"].get("host_to_device_bytes", 0) < 3000 * 8
    signature_bytes = 3000 * 128 * 4
    for name in ("signatures", "bands", "buckets", "verify", "components", "select"):  # ... and nothing big after
        moved = stages[name].get("device_to_host_bytes", 0) + stages[name].get("host_to_device_bytes", 0)
        assert moved < signature_bytes // 4, (name, moved)


@pytest.mark.parametrize(("limit", "reader"), [(None, "pyarrow"), (None, "cudf"), ("1MiB", "pyarrow")])
def test_cosine_text_run_keeps_its_texts_on_the_device_and_equals_cpu(corpus, limit, reader):
    """tf-idf text vectors (similarity cosine, verify exact): document frequencies, SimHash, band hashes and the
    sparse cosine of verify and select run on the device texts, which never come back to the host; above
    gpu.memory_limit the texts stay on the host and each batch's span goes to the device.  Outputs equal the
    CPU's either way."""
    if reader == "cudf":
        pytest.importorskip("cudf")
    cfg = {"similarity": "cosine", "input": {"id_column": "id"}, "lsh": {"threshold": 0.8},
           "cosine": {"text": {"idf_bits": 12}}, "gpu": {"reader": reader, **({"memory_limit": limit} if limit else {})}}
    name = f"cosine-{limit or 'resident'}-{reader}"
    c = run_dedup(corpus / "in", corpus / f"cpu-{name}", Config.from_dict({**cfg, "backend": "cpu"}))
    g = run_dedup(corpus / "in", corpus / f"gpu-{name}", Config.from_dict({**cfg, "backend": "gpu"}))
    assert g.report["gpu"]["resident"] is (limit is None) and g.report["gpu"]["reader"] == reader
    assert c.report["counts"] == g.report["counts"] and c.report["counts"]["near_duplicates"] > 0
    assert (corpus / f"cpu-{name}" / "duplicates.parquet").read_bytes() == \
        (corpus / f"gpu-{name}" / "duplicates.parquet").read_bytes()
    _tables_equal(corpus / f"cpu-{name}", corpus / f"gpu-{name}", [s.name for s in c.shards])
    if limit is not None:
        return
    stages = g.report["stages"]
    text_bytes = sum(len(t.as_py().encode()) for s in c.shards for t in pq.read_table(s.path).column("text"))
    if reader == "pyarrow":
        assert stages["normalize"]["host_to_device_bytes"] >= text_bytes  # the texts cross once ...
    else:  # ... compressed, in the read stage, decoded on the device
        assert 0 < stages["read"]["host_to_device_bytes"] < text_bytes
        assert stages["normalize"].get("host_to_device_bytes", 0) < 3000 * 8
    assert g.report["gpu"]["device_to_host_bytes"] < text_bytes  # ... and do not come back
    assert stages["signatures"].get("device_to_host_bytes", 0) < (8 << 12) + 4096  # the df table, a few numbers
    for stage in ("verify", "select"):
        assert stages[stage].get("device_to_host_bytes", 0) < 3000 * 8, (stage, stages[stage])


def test_run_above_the_memory_limit_runs_in_batches_and_equals_cpu(corpus):
    cfg = {"input": {"id_column": "id"}, "gpu": {"memory_limit": "1MiB"}}
    c = run_dedup(corpus / "in", corpus / "cpu-b", Config.from_dict({**cfg, "backend": "cpu"}))
    g = run_dedup(corpus / "in", corpus / "gpu-b", Config.from_dict({**cfg, "backend": "gpu"}))
    assert g.report["gpu"]["resident"] is False and g.report["gpu"]["batch_bytes"] == 1 << 20
    assert (corpus / "cpu-b" / "duplicates.parquet").read_bytes() == \
        (corpus / "gpu-b" / "duplicates.parquet").read_bytes()
    _tables_equal(corpus / "cpu-b", corpus / "gpu-b", [s.name for s in c.shards])


def test_dask_cuda_one_worker_equals_single_process(corpus):
    pytest.importorskip("dask_cuda")
    pytest.importorskip("dask_cudf")
    cfg = {"backend": "gpu", "input": {"id_column": "id"}}
    one = run_dedup(corpus / "in", corpus / "single", Config.from_dict(cfg))
    dist = run_dedup(corpus / "in", corpus / "dask", Config.from_dict({**cfg, "cluster": {"workers": 1}}))
    assert np.array_equal(one.kept, dist.kept) and one.report["counts"] == dist.report["counts"]
    assert (corpus / "single" / "duplicates.parquet").read_bytes() == \
        (corpus / "dask" / "duplicates.parquet").read_bytes()
    _tables_equal(corpus / "single", corpus / "dask", [s.name for s in one.shards])


def test_two_dask_cuda_workers_sharing_one_gpu_equal_single_process(corpus, shuffle=None):
    """cluster.workers_per_gpu = 2: both workers on GPU 0, every route a transfer between them; a small
    device_memory_limit keeps the texts past it in host memory.  The outputs are one GPU process's.  (The
    device route, cluster.shuffle: device, is measured and compared by the tier-2 dask step.)"""
    pytest.importorskip("dask_cuda")
    pytest.importorskip("dask_cudf")
    cfg = {"backend": "gpu", "input": {"id_column": "id"}}
    one = run_dedup(corpus / "in", corpus / "single-2", Config.from_dict(cfg))
    dist = run_dedup(corpus / "in", corpus / f"shared-{shuffle}", Config.from_dict({**cfg, "cluster": {
        "workers": 2, "workers_per_gpu": 2, "block_rows": 1000, "shuffle": shuffle, "device_memory_limit": "1MiB"}}))
    assert dist.report["cluster"]["workers"] == 2 and dist.report["cluster"]["spilled_text_blocks"] >= 1
    assert (dist.report["cluster"]["device_routes"] > 0) == (shuffle == "device")
    assert np.array_equal(one.kept, dist.kept) and one.report["counts"] == dist.report["counts"]
    assert (corpus / "single-2" / "duplicates.parquet").read_bytes() == \
        (corpus / f"shared-{shuffle}" / "duplicates.parquet").read_bytes()
    _tables_equal(corpus / "single-2", corpus / f"shared-{shuffle}", [s.name for s in one.shards])


def test_dask_cuda_more_workers_than_gpus_is_a_clear_error(corpus):
    pytest.importorskip("distributed")  # without Dask the cluster connection says so first (a BackendError)
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    with pytest.raises(ConfigError, match=f"asks for {n + 1} GPU workers.*{n} GPU\\(s\\) are visible.*--workers {n}"):
        run_dedup(corpus / "in", corpus / "too-many", Config.from_dict({"backend": "gpu", "cluster": {"workers": n + 1}}))


def test_cudf_reader_with_nulls_and_the_longest_policy_equals_cpu(tmp_path):
    pytest.importorskip("cudf")
    texts = [t if t != "bad utf8 follows" else "longer " * 9 for t in TEXTS]
    for k in range(2):
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": pa.array(texts[k::2], pa.string())}), tmp_path / "in" / f"p{k}.parquet")
    cfg = {"select": {"keep": "longest"}, "exact_dedup": False}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    g = run_dedup(tmp_path / "in", tmp_path / "gpu", Config.from_dict({**cfg, "backend": "gpu"}))
    assert g.report["gpu"]["reader"] == "cudf" and g.report["counts"] == c.report["counts"]
    assert (tmp_path / "cpu" / "duplicates.parquet").read_bytes() == (tmp_path / "gpu" / "duplicates.parquet").read_bytes()
    _tables_equal(tmp_path / "cpu", tmp_path / "gpu", ["p0.parquet", "p1.parquet"])


def test_dedup_of_a_cudf_frame_keeps_its_text_on_the_device_and_equals_pandas():
    cudf = pytest.importorskip("cudf")
    import gpu_dedup

    sample = planted_corpus(n_docs=2000, n_clusters=100, words=(30, 120), edit_rate=(0, 0.05), seed=9)
    pdf = sample.table.select(["id", "text"]).to_pandas()
    res = gpu_dedup.dedup(cudf.from_pandas(pdf), id="id", backend="gpu")
    want = gpu_dedup.dedup(pdf, id="id", backend="cpu")
    assert (res.kept == want.kept).all() and res.report["gpu"]["reader"] == "cudf"
    assert res.report["stages"]["normalize"].get("host_to_device_bytes", 0) < len(pdf) * 8
    assert res.deduplicated.to_pandas().reset_index(drop=True).equals(pdf[want.kept].reset_index(drop=True))


def test_a_large_host_array_crosses_through_pinned_buffers(gpu):
    from gpu_dedup.backends.gpu import PINNED_CHUNK

    host = np.random.default_rng(0).integers(0, 256, 2 * PINNED_CHUNK + 12345, dtype=np.uint8)
    dev = gpu._dev(host, np.uint8)
    assert on_device(dev) and np.array_equal(to_host(dev), host)
    ints = np.arange((2 * PINNED_CHUNK) // 8 + 7, dtype=np.int64)  # a multi-byte dtype, not a chunk multiple
    assert np.array_equal(to_host(gpu._dev(ints, np.int64)), ints)


def test_the_device_table_is_read_in_one_call_and_written_in_one_call(gpu, tmp_path):
    pytest.importorskip("pylibcudf")
    from gpu_dedup import storage
    from gpu_dedup.storage.content import file_difference

    sample = planted_corpus(n_docs=900, n_clusters=40, words=(10, 60), seed=8)
    table = sample.table.select(["id", "text"]).replace_schema_metadata({b"huggingface": b'{"x": 1}'})
    write_shards(table, tmp_path / "in", shards=3)
    shards = storage.discover(tmp_path / "in")
    held = gpu.read_table([s.path for s in shards])
    assert held is not None and held.num_rows == 900 and held.names == ["id", "text"]
    keep = np.arange(900) % 4 != 1
    starts = np.cumsum([0] + [s.rows for s in shards])
    done = storage.write_shards_on_device(shards, keep, starts, tmp_path / "out", "same", held, gpu.write_table)
    assert done == {0, 1, 2}
    for k, s in enumerate(shards):
        pq.write_table(pq.read_table(s.path).filter(pa.array(keep[starts[k]:starts[k + 1]])), tmp_path / "want.parquet")
        assert file_difference(tmp_path / "out" / s.name, tmp_path / "want.parquet") is None, s.name
        assert pq.read_schema(tmp_path / "out" / s.name).metadata[b"huggingface"] == b'{"x": 1}'
    got = held.take("text", [5, 0, 899])
    assert got.to_pylist() == [table.column("text")[i].as_py() for i in (5, 0, 899)]
    text = gpu.read_table([s.path for s in shards], columns=["text"])  # a removal list's read: the text alone
    assert text.names == ["text"] and text.take("text", [7]).to_pylist() == [table.column("text")[7].as_py()]


@pytest.mark.parametrize("zone", [None, "Europe/Paris"])
def test_the_device_writes_every_kind_of_column_as_the_host_does(gpu, tmp_path, zone):
    """What tests/backends/_gpu_table_cases.py checks on the fake pylibcudf, on the real one: nested and nullable
    columns (a required field in a nullable struct with null rows), timestamps with or without a zone and in
    seconds, a dictionary column, an empty and an all-removed shard: every file the device wrote is published
    and has the host writer's content."""
    pytest.importorskip("pylibcudf")
    from gpu_dedup import storage
    from tests.backends._gpu_table_cases import host_written, shards_of, write_mixed

    shards = shards_of(write_mixed(tmp_path / "in", sizes=(7, 0, 12, 6), zone=zone))
    starts = np.cumsum([0] + [s.rows for s in shards])
    keep = np.random.default_rng(1).random(int(starts[-1])) < 0.6
    keep[starts[3]:] = False
    held = gpu.read_table([s.path for s in shards])
    done = storage.write_shards_on_device(shards, keep, starts, tmp_path / "dev", "zstd", held, gpu.write_table)
    host_written(shards, keep, starts, tmp_path / "host", "zstd")
    assert done == set(range(len(shards)))
    _tables_equal(tmp_path / "host", tmp_path / "dev", [s.name for s in shards])
