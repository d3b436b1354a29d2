"""The host-side lines of the device-resident GPU path, run on the CPU.

The GPU run keeps text, signatures, band hashes and driver arrays in device
memory; what moves host<->device is counted per stage; a corpus above
``gpu.memory_limit`` runs in batches; cuDF writes Parquet shards when it keeps
the schema.  Everything here runs without a device: the CuPy / cuDF
counterparts are the ``gpu``-marked tests of ``test_device_gpu.py``.
"""

import os
from dataclasses import replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from gpu_dedup import backends, storage
from gpu_dedup.backends import count_transfer, to_device, to_host, transfer_totals
from gpu_dedup.backends.gpu import corpus_estimate
from gpu_dedup.backends.placement import byte_batches
from gpu_dedup.backends.prepare import SAMPLE
from gpu_dedup.backends.strings import (
    arrow_column,
    arrow_strings,
    code_point_lengths,
    column_buffers,
    is_string_column,
    raw_arrow,
    raw_text,
    string_buffers,
)
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run import local
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.stagelog import StageLog
from tests.fake_columns import FakePlcColumn, fake_plc_column
from tests.footers import FooterReads, fresh_footers

# ------------------------------------------------------------------ transfers


def test_numpy_arrays_cross_no_bus():
    before = transfer_totals()
    a = np.arange(10)
    assert to_host(a) is a and to_device(a, np) is not None
    assert transfer_totals() == before


def test_stage_log_records_the_bytes_a_stage_moved(monkeypatch):
    monkeypatch.setattr(backends, "TRANSFERS", {"host_to_device_bytes": 5, "device_to_host_bytes": 7})
    st = StageLog()
    with st.stage("quiet"):
        pass
    with st.stage("busy"):
        count_transfer("host_to_device_bytes", 1000)
        count_transfer("device_to_host_bytes", 24)
    assert "host_to_device_bytes" not in st.stages["quiet"] and "device_to_host_bytes" not in st.stages["quiet"]
    assert st.stages["busy"]["host_to_device_bytes"] == 1000 and st.stages["busy"]["device_to_host_bytes"] == 24


def test_a_stage_leaves_out_the_checkpoint_copies_made_while_it_runs():
    """The checkpoint writer's thread copies a saved unit's device arrays while the next stages run: those bytes
    are counted apart, in no stage's numbers, and the report's gpu section gives them as their own number."""
    from types import SimpleNamespace

    from gpu_dedup.backends import CHECKPOINT_COPIES
    from gpu_dedup.backends.placement import Placement

    place = Placement(SimpleNamespace(xp=np), {"resident": True}, Config())
    st = StageLog()
    with st.stage("buckets"):
        count_transfer(CHECKPOINT_COPIES, 4000)  # (the writer's thread)
        count_transfer("device_to_host_bytes", 24)
    assert st.stages["buckets"]["device_to_host_bytes"] == 24 and CHECKPOINT_COPIES not in st.stages["buckets"]
    gpu = place.report("pyarrow", None, None)["gpu"]
    assert gpu[CHECKPOINT_COPIES] == 4000 and gpu["device_to_host_bytes"] == 24


def test_host_later_leaves_host_arrays_as_they_are():
    arrays = {"docs/row": np.arange(4), "docs/null": np.zeros(4, bool)}
    assert backends.host_later(arrays) is arrays


def test_host_later_copies_device_arrays_only_when_called_after_the_event_of_their_stage(monkeypatch):
    """At the call an event is recorded on the current stream and nothing is copied; the function returned
    copies, on the thread that calls it, each device array on a non-blocking stream that waits for that event
    first, and counts the bytes as checkpoint copies, not as any stage's."""
    import sys
    import threading

    from gpu_dedup.backends import CHECKPOINT_COPIES
    from tests.fake_cupy import fake_cupy

    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    dev = cp.asarray(np.arange(6, dtype=np.uint64).reshape(3, 2))
    host = np.arange(3)
    arrays = {"bands/band_hashes": dev, "bands/lsh_row": host, "bands/usable": cp.asarray(np.ones(3, bool))}
    before = transfer_totals()
    copy = backends.host_later(arrays)
    assert callable(copy) and transfer_totals() == before
    assert [(what, thread) for what, thread, _ in cp.calls] == [("record", threading.current_thread().name)]
    event = cp.calls[0][2]
    assert event.stream is cp.cuda.get_current_stream()  # after the work queued where the stages run
    got: dict = {}
    worker = threading.Thread(target=lambda: got.update(copy()), name="writer")
    worker.start()
    worker.join(30)
    after = transfer_totals()
    assert after[CHECKPOINT_COPIES] - before[CHECKPOINT_COPIES] == dev.nbytes + 3
    assert after["device_to_host_bytes"] == before["device_to_host_bytes"]
    steps = [(what, thread) for what, thread, _ in cp.calls[1:]]
    assert steps == [("stream", "writer"), ("wait_event", "writer"), ("get", "writer"), ("get", "writer"),
                     ("synchronize", "writer")]
    stream = cp.calls[1][2]
    assert stream.non_blocking and cp.calls[2][2] is event and cp.calls[3][2] is stream and cp.calls[4][2] is stream
    assert list(got) == list(arrays) and got["bands/lsh_row"] is host
    assert all(type(v) is np.ndarray for v in got.values())
    assert np.array_equal(got["bands/band_hashes"], to_host(dev)) and got["bands/usable"].all()


def test_cpu_report_counts_no_transfers(tmp_path, request):
    if request.config.getoption("--backend") == "gpu":
        pytest.skip("the CPU backend's report (under --backend gpu the name cpu runs the GPU backend)")
    sample = planted_corpus(n_docs=60, n_clusters=5, words=(10, 30), seed=2)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    res = run_dedup(tmp_path / "in", tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    assert "gpu" not in res.report
    assert not any("host_to_device_bytes" in s or "device_to_host_bytes" in s for s in res.report["stages"].values())


# ------------------------------------------------------------------ string column buffers


@pytest.mark.parametrize("large", [False, True])
def test_column_buffers_of_a_cudf_like_column_equal_arrow(large):
    texts = ["alpha", None, "", "béta gamma", None, "δ", "last one"]
    arr = pa.array(texts, pa.large_string() if large else pa.string()).slice(2)  # a row offset of 2
    col = fake_plc_column(arr)
    assert isinstance(col, FakePlcColumn) and col.offset() == 2
    off, chars, valid = column_buffers(col)
    want_off, want_chars, want_valid = column_buffers(arr)
    assert valid.tolist() == want_valid.tolist() == [t is not None for t in texts[2:]]
    # nulls: cuDF's may span bytes, Arrow's here are filled with "" -- compare the valid rows' bytes
    got = [bytes(chars[off[k]:off[k + 1]]) if valid[k] else None for k in range(len(arr))]
    assert got == [None if t is None else t.encode() for t in texts[2:]]
    assert off.dtype == np.int64 and want_off.dtype == np.int64 and want_chars.dtype == np.uint8


class ChildlessColumn(FakePlcColumn):
    """A strings column as libcudf may leave one of only nulls: rows, a null mask, but no offsets child."""

    def children(self):
        return []

    def data(self):
        return None


@pytest.mark.parametrize(("n", "nulls"), [(0, 0), (3, 3), (2, 0)])
def test_column_buffers_of_a_column_without_children_has_a_row_per_offset(n, nulls):
    mask = np.zeros(1, np.uint8) if nulls else None  # every bit 0: every row null
    col = ChildlessColumn(None, None, 0, n, mask, nulls)
    off, chars, valid = column_buffers(col)
    assert off.tolist() == [0] * (n + 1) and chars.shape == (0,)  # n + 1 offsets: rows stay aligned
    assert (valid is None) if not nulls else valid.tolist() == [False] * n
    raw = raw_text([col, fake_plc_column(pa.array(["x", None, "yz"]))])  # concatenated with another shard
    assert len(raw) == n + 3 and raw.null().tolist() == [bool(nulls)] * n + [False, True, False]
    assert bytes(raw.chars[raw.offsets[n + 2]:raw.offsets[n + 3]]) == b"yz"


def test_arrow_strings_round_trip_of_sliced_buffers():
    arr = pa.array(["x", "yz", "", "ünï"], pa.large_string())
    buf = string_buffers(arr.slice(1))
    assert arrow_strings(buf.offsets, buf.data).equals(arr.slice(1).cast(pa.large_string()))
    assert len(arrow_strings(np.zeros(1, np.int64), np.zeros(0, np.uint8))) == 0


# ------------------------------------------------------------------ gpu.memory_limit and batches


def test_memory_limit_is_validated_and_leaves_the_fingerprint():
    assert Config.from_dict({"gpu": {"memory_limit": "12GiB"}}).gpu.limit_bytes(0) == 12 * 2**30
    assert Config().gpu.limit_bytes(80 * 10**9) == 64 * 10**9
    for bad in ("lots", "-3GB", "12 parsecs", "100"):
        with pytest.raises(ConfigError, match="gpu.memory_limit.*12GiB"):
            Config.from_dict({"gpu": {"memory_limit": bad}})
    assert Config.from_dict({"gpu": {"memory_limit": "2GB"}}).fingerprint == Config().fingerprint


def test_byte_batches_cover_every_row_once_within_the_bound():
    lengths = np.array([5, 0, 30, 7, 7, 7, 100, 1, 1], np.int64)
    offsets = np.concatenate(([3], 3 + np.cumsum(lengths)))
    batches = byte_batches(offsets, 20)
    assert [a for a, _ in batches] == [0] + [b for _, b in batches][:-1] and batches[-1][1] == lengths.shape[0]
    for a, b in batches:  # within the bound, or a single longer document
        assert lengths[a:b].sum() <= 20 or b - a == 1
    assert byte_batches(np.zeros(1, np.int64), 20) == []
    assert byte_batches(offsets, 1000, max_rows=4) == [(0, 4), (4, 8), (8, 9)]


def test_corpus_estimate_reads_metadata(tmp_path):
    sample = planted_corpus(n_docs=50, n_clusters=5, words=(10, 30), seed=4)
    table = sample.table.select(["id", "text"])
    write_shards(table, tmp_path / "p", shards=2)
    write_shards(table, tmp_path / "j", shards=1, fmt="jsonl")
    text_bytes = sum(len(t.encode()) for t in table.column("text").to_pylist())
    text, rows = corpus_estimate(storage.discover(tmp_path / "p"), "text")
    assert rows == 50 and 0.5 * text_bytes < text < 3 * text_bytes
    text, rows = corpus_estimate(storage.discover(tmp_path / "j"), "text")
    assert text >= text_bytes and rows >= 1
    text, rows = corpus_estimate([storage.memory_shard(table)], "text")
    assert rows == 50 and text >= text_bytes
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.parquet").write_bytes(b"not parquet")
    assert corpus_estimate(storage.discover(tmp_path / "bad"), "text") == (0, 0)


@pytest.mark.parametrize("verify", ["exact", "signature"])
def test_batched_run_equals_the_whole_corpus_run(tmp_path, monkeypatch, verify):
    """The batches a GPU run takes above gpu.memory_limit (normalize and signatures in slices of a
    byte bound) give the outputs of the whole-corpus run, byte for byte."""
    sample = planted_corpus(n_docs=300, n_clusters=20, words=(20, 80), edit_rate=(0, 0.05), seed=8)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=3)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "verify": {"method": verify}})
    whole = run_dedup(tmp_path / "in", tmp_path / "whole", cfg)
    cpu = backends.get_backend("cpu")
    calls = []

    def plan(shards, cfg):
        calls.append(len(shards))
        return {"memory_limit_bytes": 4096, "device_bytes": 0, "estimate_bytes": 10**6, "resident": False,
                "batch_bytes": 1500}

    normalize = cpu.normalize_column
    slices = []

    def counted(column, cfg):
        slices.append(len(column))
        return normalize(column, cfg)

    monkeypatch.setattr(cpu, "plan_memory", plan, raising=False)
    monkeypatch.setattr(cpu, "normalize_column", counted)
    monkeypatch.setattr(local, "SIGNATURE_CHUNK", 64)
    batched = run_dedup(tmp_path / "in", tmp_path / "batched", cfg)
    assert calls == [3] and len(slices) > 10 and sum(slices) == 300 + len(SAMPLE)  # + prepare's sample, once
    assert batched.report["gpu"]["resident"] is False and batched.report["gpu"]["batch_bytes"] == 1500
    for name in ["duplicates.parquet"] + [s.name for s in whole.shards]:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "batched" / name).read_bytes(), name
    assert whole.report["counts"] == batched.report["counts"] and whole.report["counts"]["removed"] > 0


# ------------------------------------------------------------------ the device writer of Parquet shards


def _shard(tmp_path):
    table = pa.table({"id": pa.array([1, 2, 3, 4], pa.int64()), "text": pa.array(["a", "b", "c", "d"],
                                                                                   pa.large_string())})
    table = table.replace_schema_metadata({b"origin": b"crawl-7"})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "s.parquet")
    return storage.discover(tmp_path / "in")[0], table


def test_device_writer_used_when_it_keeps_the_schema(tmp_path):
    shard, table = _shard(tmp_path)
    keep = np.array([True, False, True, True])
    calls = []

    def writer(src, keep, dst, compression):  # what cuDF does, here with pyarrow: read, filter, write
        calls.append(compression)
        pq.write_table(pq.read_table(src.path).filter(pa.array(keep)), dst)
        return int(keep.sum())

    assert storage.write_shard(shard, keep, tmp_path / "out", "zstd", device_writer=writer) == 3
    assert calls == ["zstd"]
    got = pq.read_table(tmp_path / "out" / "s.parquet")
    assert got.equals(table.filter(pa.array(keep))) and got.schema.metadata[b"origin"] == b"crawl-7"
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_device_writer_keeps_a_shard_whose_strings_read_back_plain(tmp_path):
    """cuDF writes Parquet strings that pyarrow reads as ``string`` where the input's were ``large_string``: the
    same logical type (content identity), so its file is kept: on an H100 not one of them was, before."""
    shard, table = _shard(tmp_path)
    keep = np.array([True, True, False, True])

    def writer(src, keep, dst, compression):
        t = pq.read_table(src.path).filter(pa.array(keep))
        t = t.cast(pa.schema([("id", pa.int64()), ("text", pa.string())], metadata=t.schema.metadata))
        pq.write_table(t, dst)
        return t.num_rows

    storage.write_shard(shard, keep, tmp_path / "out", "zstd", device_writer=writer)
    got = pq.read_table(tmp_path / "out" / "s.parquet")
    assert got.schema.field("text").type == pa.string()  # the device writer's file
    assert got.cast(table.schema).equals(table.filter(pa.array(keep)))


@pytest.mark.parametrize("change", ["type", "metadata", "declines"])
def test_device_writer_falls_back_when_it_would_change_the_shard(tmp_path, change, caplog):
    """What the writer wrote is set aside, pyarrow writes the shard, and the log says why (once a reason)."""
    from gpu_dedup.storage import filter as filter_mod

    filter_mod._SAID.clear()
    shard, table = _shard(tmp_path)
    keep = np.array([False, True, True, False])

    def writer(src, keep, dst, compression):
        if change == "declines":
            return None  # e.g. a codec cuDF cannot write
        t = pq.read_table(src.path).filter(pa.array(keep))
        t = t.cast(pa.schema([("id", pa.int32()), ("text", pa.large_string())])) if change == "type" else \
            t.replace_schema_metadata({b"pandas": b"{}"})
        pq.write_table(t, dst)
        return t.num_rows

    assert storage.write_shard(shard, keep, tmp_path / "out", "zstd", device_writer=writer) == 2
    got = pq.read_table(tmp_path / "out" / "s.parquet")
    assert got.equals(table.filter(pa.array(keep))) and got.schema.metadata[b"origin"] == b"crawl-7"
    assert got.schema.field("text").type == pa.large_string()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["s.parquet"]
    said = [r.getMessage() for r in caplog.records if "gpu.writer cudf" in r.getMessage()]
    why = {"type": "(id: int64 -> int32)", "metadata": "(schema metadata origin not kept)"}.get(change)
    assert len(said) == (0 if why is None else 1) and all(why in m and "set gpu.writer: pyarrow" in m for m in said)
    storage.write_shard(shard, keep, tmp_path / "again", "zstd", device_writer=writer)
    assert len([r for r in caplog.records if "gpu.writer cudf" in r.getMessage()]) == len(said)  # said once


# ------------------------------------------------------------------ text columns read into device memory


def test_raw_text_of_several_columns_equals_their_concatenation():
    parts = [pa.array(["a", None, "béta"], pa.string()).slice(1), pa.array([], pa.large_string()),
             pa.array(["", "xyz", None, "δδ"], pa.large_string()), pa.array(["no nulls"], pa.string())]
    for cols in ([fake_plc_column(p) for p in parts], parts, [fake_plc_column(parts[2])]):
        raw = raw_text(cols)
        want = pa.concat_arrays([p.cast(pa.large_string()) for p in (parts if len(cols) > 1 else parts[2:3])])
        assert len(raw) == len(want) and raw.null().tolist() == [not v for v in want.is_valid().to_pylist()]
        assert raw_arrow(raw).equals(want)
    empty = raw_text([])
    assert len(empty) == 0 and raw_arrow(empty).equals(pa.array([], pa.large_string()))


def test_code_point_lengths_equal_arrow_utf8_length_in_small_chunks():
    texts = ["", None, "abc", "Ünïcödé ﬁ", "\U0001f600 smile", None, "x" * 40]
    arr = pa.array(texts, pa.large_string())
    bad = pa.array([b"ok\xff\xfe", b"\xc3", b"\xe2\x82"], pa.large_binary())  # ill-formed UTF-8
    for column in (arr, arr.slice(2), bad):
        want = pc.fill_null(pc.utf8_length(column.cast(pa.large_string(), safe=False) if column.type == pa.large_binary()
                                           else column), -1).to_pylist()
        for chunk in (1, 3, 1 << 26):
            assert code_point_lengths(raw_text([column]), chunk=chunk).tolist() == want


def _reader_on(monkeypatch, calls, rows=None):
    """The CPU backend with a stand-in device reader: pyarrow reads the column, handed over as a
    pylibcudf-like column (what cuDF's reader gives, on host buffers)."""
    cpu = backends.get_backend("cpu")

    def read_text(shard, column):  # the read stage hands the reader its discovered shard
        calls.append(shard.path)
        arr = pq.read_table(shard.path, columns=[column]).column(column).combine_chunks()
        return fake_plc_column(arr if rows is None else arr.slice(0, rows))

    monkeypatch.setattr(cpu, "text_reader", lambda cfg: read_text if cfg.gpu.reader == "cudf" else None,
                        raising=False)
    return cpu


@pytest.mark.parametrize("keep", ["first", "longest"])
def test_device_read_run_equals_the_host_read_run(tmp_path, monkeypatch, keep):
    sample = planted_corpus(n_docs=400, n_clusters=30, words=(20, 80), edit_rate=(0, 0.05), seed=12)
    table = sample.table.select(["id", "text"])
    text = table.column("text").to_pylist()
    for k in range(0, 400, 37):
        text[k] = None  # null texts take no part
    text[5] = "Ünïcödé " * 30
    table = table.set_column(1, "text", pa.array(text, pa.string()))
    write_shards(table, tmp_path / "in", shards=3)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": keep}})
    host = run_dedup(tmp_path / "in", tmp_path / "host", cfg)
    calls = []
    _reader_on(monkeypatch, calls)
    device = run_dedup(tmp_path / "in", tmp_path / "device", cfg)
    assert len(calls) == 3  # one read per shard
    for name in ["duplicates.parquet"] + [s.name for s in host.shards]:
        assert (tmp_path / "host" / name).read_bytes() == (tmp_path / "device" / name).read_bytes(), name
    assert host.report["counts"] == device.report["counts"] and host.report["counts"]["removed"] > 0
    assert host.report["largest_clusters"] == device.report["largest_clusters"]  # examples read from the shards
    calls.clear()
    run_dedup(tmp_path / "in", tmp_path / "off", cfg.with_overrides({"gpu.reader": "pyarrow"}))
    assert calls == []


def test_device_read_only_where_every_text_column_is_utf8_parquet(tmp_path):
    sample = planted_corpus(n_docs=40, n_clusters=5, words=(5, 20), seed=3)
    table = sample.table.select(["id", "text"])
    write_shards(table, tmp_path / "p", shards=2)
    write_shards(table, tmp_path / "j", shards=1, fmt="jsonl")
    (tmp_path / "b").mkdir()
    pq.write_table(table.set_column(1, "text", table.column("text").cast(pa.binary())), tmp_path / "b" / "x.parquet")
    (tmp_path / "d").mkdir()
    pq.write_table(table.set_column(1, "text", table.column("text").dictionary_encode()), tmp_path / "d" / "x.parquet")
    cfg = Config().input
    assert storage.device_readable(storage.discover(tmp_path / "p"), cfg)
    for other in ("j", "b", "d"):
        assert not storage.device_readable(storage.discover(tmp_path / other), cfg), other
    shards = storage.discover(tmp_path / "p")
    assert not storage.device_readable(shards, replace(cfg, vector_column="emb"))
    assert not storage.device_readable(shards, replace(cfg, id_column="text"))
    assert not storage.device_readable([], cfg)


def test_device_read_is_not_used_for_a_batched_run(tmp_path, monkeypatch):
    sample = planted_corpus(n_docs=60, n_clusters=5, words=(10, 30), seed=2)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    calls = []
    cpu = _reader_on(monkeypatch, calls)
    monkeypatch.setattr(cpu, "plan_memory", lambda shards, cfg: {
        "memory_limit_bytes": 4096, "device_bytes": 0, "estimate_bytes": 10**6, "resident": False,
        "batch_bytes": 1500}, raising=False)
    res = run_dedup(tmp_path / "in", tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    assert calls == [] and res.report["gpu"]["reader"] == "pyarrow"


def test_device_read_row_count_mismatch_is_an_input_error(tmp_path, monkeypatch):
    sample = planted_corpus(n_docs=60, n_clusters=5, words=(10, 30), seed=2)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=1)
    _reader_on(monkeypatch, [], rows=10)
    with pytest.raises(InputError, match="gave 60 rows to pyarrow but 10 text rows to cuDF.*gpu.reader: pyarrow"):
        run_dedup(tmp_path / "in", tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_gpu_reader_is_validated_and_leaves_the_fingerprint():
    assert Config.from_dict({"gpu": {"reader": "pyarrow"}}).fingerprint == Config().fingerprint
    with pytest.raises(ConfigError, match="gpu.reader = 'arrow' is not valid; choose one of cudf, pyarrow"):
        Config.from_dict({"gpu": {"reader": "arrow"}})


@pytest.mark.parametrize("outcome", ["ok", "corrupt", "oom"])
def test_read_text_counts_the_compressed_chunks_and_maps_cudf_errors(tmp_path, monkeypatch, outcome):
    """``GPUBackend.read_text`` with a stand-in ``cudf`` module: the column's compressed chunk bytes are
    counted as crossing the bus; libcudf's errors become one-line input / resource errors."""
    import sys
    import types

    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.errors import ResourceError

    table = pa.table({"id": pa.array(range(500)), "text": pa.array([f"text number {i} " * 5 for i in range(500)])})
    pq.write_table(table, tmp_path / "s.parquet", row_group_size=200)
    meta = pq.ParquetFile(tmp_path / "s.parquet").metadata
    want = sum(meta.row_group(g).column(1).total_compressed_size for g in range(meta.num_row_groups))

    def read_parquet(path, columns):
        if outcome == "corrupt":
            raise RuntimeError("CUDF failure at: parquet reader: invalid page header")
        if outcome == "oom":
            raise MemoryError("std::bad_alloc: out_of_memory: RMM failure")
        return {c: fake_plc_column(pq.read_table(path, columns=[c]).column(c).combine_chunks()) for c in columns}

    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(read_parquet=read_parquet))
    before = transfer_totals()["host_to_device_bytes"]
    if outcome == "ok":
        col = GPUBackend.read_text(None, str(tmp_path / "s.parquet"), "text")
        assert len(col) == 500 and transfer_totals()["host_to_device_bytes"] - before == want > 0
    elif outcome == "corrupt":
        with pytest.raises(InputError, match="cuDF could not read text column 'text' of shard .*invalid page header.*"
                                             "gpu.reader: pyarrow"):
            GPUBackend.read_text(None, str(tmp_path / "s.parquet"), "text")
    else:
        with pytest.raises(ResourceError, match="out of device memory reading the text.*gpu.memory_limit"):
            GPUBackend.read_text(None, str(tmp_path / "s.parquet"), "text")


class _FakeCudfParquetFrame:
    """What cuDF's Parquet writer does with nullability: a column is written ``required`` unless it holds
    nulls or ``force_nullable_schema`` is set (cudf/io/parquet.py, to_parquet)."""

    def __init__(self, table: pa.Table):
        self.table = table

    def __len__(self):
        return self.table.num_rows

    def __getitem__(self, mask):
        return _FakeCudfParquetFrame(self.table.filter(pa.array(np.asarray(mask.values, np.bool_))))

    def to_parquet(self, path, compression, index, force_nullable_schema=False):
        assert index is False
        fields = [f.with_nullable(force_nullable_schema or self.table.column(f.name).null_count > 0)
                  for f in self.table.schema]
        pq.write_table(self.table.cast(pa.schema(fields)), path, compression=compression or "none")
        self.written.append(storage.file_digest(path))

    written: list = []  # digests of the files it wrote


@pytest.mark.parametrize("source", ["nullable", "required", "unreadable"])
def test_cudf_writer_keeps_the_input_schema_or_leaves_the_shard_to_pyarrow(tmp_path, monkeypatch, source):
    """The GPU backend's shard writer with a stand-in ``cudf``: columns come out as nullable as the input's,
    so cuDF's file is published; where cuDF cannot read the shard, pyarrow writes it."""
    import sys
    import types

    from gpu_dedup.backends.gpu import GPUBackend

    table = pa.table({"id": pa.array(range(300), pa.int64()), "text": pa.array([f"doc {i}" for i in range(300)])})
    if source == "required":  # e.g. written by Spark: fields marked not null
        table = table.cast(pa.schema([f.with_nullable(False) for f in table.schema]))
    src = tmp_path / "in" / "s.parquet"
    src.parent.mkdir()
    pq.write_table(table, src)
    calls = []
    _FakeCudfParquetFrame.written.clear()

    def read_parquet(path):
        calls.append(path)
        if source == "unreadable":
            raise RuntimeError("CUDF failure at: parquet reader: unsupported type")
        return _FakeCudfParquetFrame(pq.read_table(path))

    monkeypatch.setitem(sys.modules, "cudf", types.SimpleNamespace(
        read_parquet=read_parquet, Series=lambda values: types.SimpleNamespace(values=values)))
    backend = types.SimpleNamespace(info={"frames": "cudf"}, _dev=lambda a, dtype: np.asarray(a, dtype))
    keep = np.arange(300) % 3 != 0
    fresh_footers(monkeypatch)
    shard = storage.discover(str(src))[0]
    reads = FooterReads(monkeypatch, src.parent)
    rows = storage.write_shard(shard, keep, tmp_path / "out", "zstd",
                          device_writer=lambda *a: GPUBackend.write_parquet_cudf(backend, *a))
    out = tmp_path / "out" / "s.parquet"
    assert rows == 200 and calls == [str(src)]
    # one pyarrow footer read of the input: the process's, shared by the writer's schema and the check after it
    assert dict(reads.by_path) == {os.path.realpath(src): 1}
    assert pq.read_schema(out).remove_metadata().equals(pq.read_schema(src).remove_metadata())
    assert pq.read_table(out).equals(pq.read_table(src).filter(pa.array(keep)))
    assert list((tmp_path / "out").iterdir()) == [out]  # no temporary file left behind
    published = _FakeCudfParquetFrame.written[-1:] == [storage.file_digest(out)]
    assert published == (source != "unreadable")  # cuDF's file, or pyarrow's where cuDF could not read


def test_is_string_column_and_arrow_column_of_device_columns():
    arr = pa.array(["a", None, "ünï", ""], pa.large_string())
    assert is_string_column(fake_plc_column(arr)) and not is_string_column(arr) and not is_string_column(object())
    ints = fake_plc_column(arr)
    ints.type = lambda: type("T", (), {"id": lambda self: type("I", (), {"name": "INT64"})()})()
    assert not is_string_column(ints)
    assert arrow_column(fake_plc_column(arr)).equals(arr)
    assert arrow_column(fake_plc_column(arr), [3, 1, 2]).equals(pa.array(["", None, "ünï"], pa.large_string()))


# ------------------------------------------------------------------ the device table: one read, one write


class _FakeDeviceTable:
    """What ``GPUBackend.read_table`` gives (every column of the shards, rows in shard order), on host buffers."""

    whole = True  # every column

    def __init__(self, paths):
        self.paths = list(paths)
        self.data = pa.concat_tables([pq.read_table(p) for p in paths])
        self.schemas = [pq.read_schema(p) for p in paths]
        self.num_rows = self.data.num_rows

    def column(self, name):
        return fake_plc_column(self.data.column(name).combine_chunks())

    def take(self, name, rows):
        return self.data.column(name).take(pa.array(np.asarray(rows, np.int64))).combine_chunks()


def _fake_table_writer(change=None, fail=False):
    """A stand-in for ``GPUBackend.write_table``: each shard's kept rows written by pyarrow with other
    settings than the host writer's (other bytes, the same content); ``change(k, table)``: what it does to
    shard ``k``'s table instead (a writer that would change its schema)."""
    calls = []

    def write(table, starts, keep, targets, codec, streams=1, after=None):
        calls.append(list(targets))
        if fail:
            raise RuntimeError("CUDF failure at: parquet writer: unsupported")
        kept = table.data.filter(pa.array(keep))
        firsts = np.concatenate(([0], np.cumsum(keep)))[np.asarray(starts)]
        counts = []
        for k, target in enumerate(targets):
            part = kept.slice(firsts[k], firsts[k + 1] - firsts[k])
            part = part.replace_schema_metadata(table.schemas[k].metadata)
            if change is not None:
                part = change(k, part)
            pq.write_table(part, target, compression="zstd", row_group_size=50, use_dictionary=False)
            counts.append(int(firsts[k + 1] - firsts[k]))
            if after is not None:
                after(k, counts[-1])
        return counts

    write.calls = calls
    return write


def _table_on(monkeypatch, writer):
    reads = []
    cpu = _reader_on(monkeypatch, [])

    def read_table(shards):  # the read stage hands the reader its discovered shards
        paths = [s.path for s in shards]
        reads.append(paths)
        return _FakeDeviceTable(paths)

    monkeypatch.setattr(cpu, "table_reader", lambda cfg: read_table if cfg.gpu.reader == "cudf" else None,
                        raising=False)
    monkeypatch.setattr(cpu, "write_table", writer, raising=False)
    return reads


@pytest.fixture
def metadata_corpus(tmp_path):
    sample = planted_corpus(n_docs=450, n_clusters=30, words=(20, 80), edit_rate=(0, 0.05), seed=21)
    table = sample.table.select(["id", "text"]).replace_schema_metadata({b"huggingface": b'{"info": 1}'})
    write_shards(table, tmp_path / "in", shards=3)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    host = local.run_local(tmp_path / "in", tmp_path / "host", cfg)
    return tmp_path, cfg, host


def _same_content(a, b, names):
    from gpu_dedup.storage.content import file_difference

    for name in names:
        assert file_difference(a / name, b / name) is None, name


def test_a_device_table_is_read_once_and_written_in_one_call(metadata_corpus, monkeypatch):
    from gpu_dedup.storage import filter as filt

    d, cfg, host = metadata_corpus
    writer = _fake_table_writer()
    reads = _table_on(monkeypatch, writer)
    monkeypatch.setattr(filt, "_write_parquet", lambda *a, **k: pytest.fail("the host wrote a shard"))
    dev = local.run_local(d / "in", d / "dev", cfg)
    names = [s.name for s in host.shards]
    assert reads == [[s.path for s in host.shards]] and len(writer.calls) == 1 and len(writer.calls[0]) == 3
    _same_content(d / "host", d / "dev", names)
    assert (d / "host" / names[0]).read_bytes() != (d / "dev" / names[0]).read_bytes()  # another writer's bytes
    assert (d / "host" / "duplicates.parquet").read_bytes() == (d / "dev" / "duplicates.parquet").read_bytes()
    assert dev.report["largest_clusters"] == host.report["largest_clusters"]  # samples from the device table
    assert not [p for p in (d / "dev").iterdir() if p.name.endswith(".tmp")]


def test_a_shard_whose_schema_the_device_would_change_is_written_by_the_host(metadata_corpus, monkeypatch, caplog):
    d, cfg, host = metadata_corpus
    writer = _fake_table_writer(change=lambda k, t: t.replace_schema_metadata(None) if k == 1 else t)
    _table_on(monkeypatch, writer)
    local.run_local(d / "in", d / "dev", cfg)
    names = [s.name for s in host.shards]
    assert (d / "dev" / names[1]).read_bytes() == (d / "host" / names[1]).read_bytes()  # pyarrow's
    assert (d / "dev" / names[0]).read_bytes() != (d / "host" / names[0]).read_bytes()  # the device's
    _same_content(d / "host", d / "dev", names)
    assert "huggingface not kept" in caplog.text


@pytest.mark.parametrize(("writer", "whole", "want"), [
    ("auto", True, (None, "table")), ("auto", False, (None, None)), ("auto", None, (None, None)),
    ("cudf", True, (None, "table")), ("cudf", False, ("one", None)), ("cudf", None, ("one", None)),
    ("pyarrow", True, (None, None)), ("pyarrow", False, (None, None))])
def test_only_a_device_table_of_every_column_goes_to_the_table_writer(writer, whole, want):
    """A device table of the text alone (``output.hold_inputs: false``) holds no shard's rows: the shards are
    written as without one (by the one-shard device writer where ``gpu.writer: cudf`` asks for it)."""
    from types import SimpleNamespace

    from gpu_dedup.backends.placement import Placement

    be = SimpleNamespace(xp=np, write_parquet="one", write_table="table")
    place = Placement(be, None, Config.from_dict({"gpu": {"writer": writer}}))
    assert place.shard_writers(None if whole is None else SimpleNamespace(whole=whole)) == want


@pytest.mark.parametrize("how", ["fails", "pyarrow"])
def test_without_the_device_writer_the_host_writes_every_shard(metadata_corpus, monkeypatch, how):
    d, cfg, host = metadata_corpus
    writer = _fake_table_writer(fail=how == "fails")
    _table_on(monkeypatch, writer)
    local.run_local(d / "in", d / "dev", cfg if how == "fails" else cfg.with_overrides({"gpu.writer": "pyarrow"}))
    assert len(writer.calls) == (1 if how == "fails" else 0)
    for name in [s.name for s in host.shards] + ["duplicates.parquet"]:
        assert (d / "dev" / name).read_bytes() == (d / "host" / name).read_bytes(), name
    assert not [p for p in (d / "dev").iterdir() if p.name.endswith(".tmp")]


def test_a_gpu_run_reads_every_column_for_its_shards_and_the_text_alone_for_a_removal_list(monkeypatch):
    """One libcudf read either way: every column where the write stage takes the kept rows from the held table,
    the text column alone where nothing is written but the removal list (or the write stage reads again)."""
    import importlib.util

    from gpu_dedup.backends import gpu as gpu_module

    be = gpu_module.GPUBackend.__new__(gpu_module.GPUBackend)  # no device: only the choice of reader is asked
    monkeypatch.setattr(be, "text_reader", lambda cfg: "cudf reader", raising=False)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "pylibcudf" else real(name, *a))
    base = {"backend": "gpu", "input": {"text_column": "body"}}
    assert be.table_reader(Config.from_dict(base)) == be.read_table
    for extra in ({"shards": False}, {"hold_inputs": False}):
        reader = be.table_reader(Config.from_dict({**base, "output": extra}))
        assert reader.func == be.read_table and reader.keywords == {"columns": ["body"]}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pylibcudf" else real(name, *a))
    assert be.table_reader(Config.from_dict(base)) is None  # a cuDF without pylibcudf: each shard's text column
    monkeypatch.setattr(be, "text_reader", lambda cfg: None, raising=False)
    assert be.table_reader(Config.from_dict(base)) is None  # pyarrow reads
