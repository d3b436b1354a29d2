"""Read stage: batches of every shard in order, the text hook, and texts read again for the report."""

import importlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.stages.read import read, read_texts
from gpu_dedup.storage import parquet as pqs

read_module = importlib.import_module("gpu_dedup.stages.read")  # (the package's name `read` is the stage)


@pytest.fixture
def shards(tmp_path):
    texts = [f"document {i} " + "word " * (i % 37) for i in range(3000)]
    pq.write_table(pa.table({"id": np.arange(3000), "text": texts}), tmp_path / "many.parquet", row_group_size=250)
    pq.write_table(pa.table({"id": np.arange(3000), "text": texts}), tmp_path / "one.parquet")
    (tmp_path / "lines.jsonl").write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    return tmp_path, texts


def _counted_parquet_batches(monkeypatch) -> list:
    """(row groups asked for, rows) of every batch the Parquet reader yields from now on, in batches of ~100 rows."""
    monkeypatch.setattr(pqs, "BATCH_BYTES", 4000)
    seen = []
    real = pqs.iter_parquet

    def counting(*args, **kw):
        for t in real(*args, **kw):
            seen.append((kw.get("row_groups", args[3] if len(args) > 3 else None), t.num_rows))
            yield t

    monkeypatch.setattr(storage.columns, "iter_parquet", counting)
    return seen


def test_read_texts_takes_parquet_rows_from_their_pages_without_a_batch(shards, monkeypatch):
    d, texts = shards
    seen = _counted_parquet_batches(monkeypatch)
    rows = np.array([1203, 5, 260, 5, 1210, 0])  # any order, repeats
    for name in ("many.parquet", "one.parquet"):
        got = read_texts(storage.discover([d / name])[0], InputConfig(), rows)
        assert got.type == pa.large_string() and got.to_pylist() == [texts[r] for r in rows], name
    assert seen == []


def test_read_texts_streams_only_up_to_the_rows_it_needs_where_pages_are_refused(shards, monkeypatch):
    d, texts = shards
    seen = _counted_parquet_batches(monkeypatch)
    monkeypatch.setattr(read_module, "take_pages", lambda *a, **k: None)  # a layout the page reader leaves
    rows = np.array([1203, 5, 260, 5, 1210, 0])  # any order, repeats
    for name in ("many.parquet", "one.parquet", "lines.jsonl"):
        seen.clear()
        shard = storage.discover([d / name])[0]
        got = read_texts(shard, InputConfig(), rows)
        assert got.to_pylist() == [texts[r] for r in rows], name
        if name == "many.parquet":  # row groups 0, 1 and 4 only
            assert {tuple(g) for g, _ in seen} == {(0, 1, 4)} and sum(n for _, n in seen) <= 750
        if name == "one.parquet":  # stops after the batch holding row 1210
            assert sum(n for _, n in seen) < 1210 + 1100


def test_the_text_hook_gets_every_batch_and_the_table_keeps_none(shards, monkeypatch):
    d, texts = shards
    monkeypatch.setattr(pqs, "BATCH_BYTES", 4000)
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 5000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 2000)
    got = []
    c = read(storage.discover([d]), InputConfig(id_column="id"),
                        text=lambda column: got.append(column.to_pylist()) or len(got))
    assert "text" not in c.table.column_names and c.table.num_rows == 9000
    assert c.text_parts == list(range(1, len(got) + 1)) and len(got) > 20
    assert sum(got, []) == texts * 3
    assert c.table.column("shard_row").to_pylist() == list(range(3000)) * 3
    assert c.table.column("row").to_pylist() == list(range(9000))
    assert [s.rows for s in c.shards] == [3000, 3000, 3000]


def test_a_read_error_in_the_reader_thread_is_raised_to_the_caller(shards, monkeypatch):
    d, _ = shards
    bad = d / "bad.parquet"
    bad.write_bytes((d / "many.parquet").read_bytes()[:-100] + b"\0" * 100)
    with pytest.raises(storage.discovery.InputError, match="bad.parquet"):
        read(storage.discover([d]), InputConfig(id_column="id"))


def test_the_reader_thread_stops_when_the_caller_fails(shards, monkeypatch):
    import threading

    d, _ = shards
    monkeypatch.setattr(pqs, "BATCH_BYTES", 4000)

    def failing(column):
        raise RuntimeError("the caller failed")

    with pytest.raises(RuntimeError, match="the caller failed"):
        read(storage.discover([d]), InputConfig(id_column="id"), text=failing)
    assert not [t for t in threading.enumerate() if t.name.startswith("gpu_dedup-read")]


@pytest.mark.parametrize("readers", [1, 2, 5])
def test_shards_read_at_once_come_in_order(shards, monkeypatch, readers):
    import importlib

    read_stage = importlib.import_module("gpu_dedup.stages.read")  # the package's name ``read`` is the function

    d, texts = shards
    monkeypatch.setattr(pqs, "BATCH_BYTES", 4000)
    monkeypatch.setattr(read_stage, "READERS", readers)
    monkeypatch.setattr(read_stage.os, "cpu_count", lambda: 8)
    for k in range(3):  # 6 shards: 3 Parquet files of 250-row groups, 2 of one group, a JSONL file
        pq.write_table(pa.table({"id": np.arange(3000), "text": texts}), d / f"more{k}.parquet", row_group_size=250)
    c = read(storage.discover([d]), InputConfig(id_column="id"))
    assert len(c.shards) == 6 and c.table.column("text").to_pylist() == texts * 6
    assert c.table.column("shard").to_pylist() == sum(([i] * 3000 for i in range(6)), [])
    assert c.table.column("row").to_pylist() == list(range(18000))


def test_held_texts_of_int8_dictionary_batches_with_their_own_categories_are_taken():
    """The report's sample texts from held batches whose int8 dictionaries hold 300 values in all: Arrow's take
    unifies them and failed ("requires a larger index type", exit 1 after every stage had run)."""
    held = [pa.table({"text": pa.array([f"doc {g} {i}" for i in range(100)]).dictionary_encode()
                      .cast(pa.dictionary(pa.int8(), pa.string()))}) for g in range(3)]
    got = read_module.held_texts(held, "text", np.array([250, 5, 120]))
    assert got.to_pylist() == ["doc 2 50", "doc 0 5", "doc 1 20"]


def test_hold_inputs_auto_holds_the_parquet_shards_when_they_fit_a_share_of_the_available_memory(tmp_path,
                                                                                                  monkeypatch):
    import importlib

    rd = importlib.import_module("gpu_dedup.stages.read")  # the module (the package exports its function read)
    pq.write_table(pa.table({"text": ["a b c"] * 1000}), tmp_path / "a.parquet")
    (tmp_path / "b.jsonl").write_text('{"text": "x y"}\n')
    parquet = storage.discover([tmp_path / "a.parquet"])
    size = pq.ParquetFile(tmp_path / "a.parquet").metadata.row_group(0).total_byte_size
    monkeypatch.setattr(rd, "available_memory", lambda: 4 * size)
    assert rd.hold_inputs(parquet, "auto")
    monkeypatch.setattr(rd, "available_memory", lambda: 4 * size - 8)
    assert not rd.hold_inputs(parquet, "auto")
    assert rd.hold_inputs(parquet, True) and not rd.hold_inputs(parquet, False)
    assert not rd.hold_inputs(storage.discover([tmp_path / "b.jsonl"]), True)  # JSONL is read again


def test_one_process_spills_its_texts_past_half_the_available_memory(monkeypatch):
    import importlib

    rd = importlib.import_module("gpu_dedup.stages.read")
    monkeypatch.setattr(rd, "available_memory", lambda: 1000)
    assert not rd.spill_texts("auto", 500) and rd.spill_texts("auto", 501)
    assert rd.spill_texts(True, 0) and not rd.spill_texts(False, 10**12)


def test_head_reads_the_first_documents_and_stops(shards, monkeypatch):
    from gpu_dedup.stages.read import head

    d, texts = shards
    seen = _counted_parquet_batches(monkeypatch)
    cfg = InputConfig(id_column="id")
    got = head([d / "many.parquet", d / "lines.jsonl"], cfg, limit=250)
    assert got.column("text").to_pylist() == texts[:250] and got.column("id").to_pylist() == list(range(250))
    assert sum(rows for _, rows in seen) < 3000  # stopped at the batch that reached the limit, not the shard's end
    both = head([d / "many.parquet", d / "lines.jsonl"], cfg, limit=3100)  # across the shard boundary
    assert both.num_rows == 3100 and both.column("text").to_pylist() == texts + texts[:100]
    assert head([d / "lines.jsonl"], cfg, limit=10**6).num_rows == 3000  # fewer documents than the limit
    with pytest.raises(InputError, match="at least 1"):
        head([d / "lines.jsonl"], cfg, limit=0)


def test_the_ids_of_every_shard_are_one_chunk_where_one_holds_them(tmp_path, monkeypatch):
    """The id column comes in one chunk (the write stage gathers ids from it), the same values; a column of 32-bit
    string offsets larger than one chunk may hold (here a limit of 100 bytes) stays in the chunks it came in."""
    for s in range(3):
        pq.write_table(pa.table({"id": [f"s{s}-{i}" for i in range(50)], "text": [f"t {s} {i}" for i in range(50)]}),
                       tmp_path / f"part-{s}.parquet")
    ids = read(tmp_path, InputConfig(id_column="id")).table.column("id")
    assert ids.to_pylist() == [f"s{s}-{i}" for s in range(3) for i in range(50)] and ids.num_chunks == 1
    chunks = [pa.array([f"s{s}-{i}" for i in range(50)], pa.string()) for s in range(3)]
    table = pa.table({"id": pa.chunked_array(chunks)})
    assert read_module.ids_in_one_chunk(table).column("id").num_chunks == 1
    monkeypatch.setattr(read_module, "ONE_CHUNK_BYTES", 100)
    assert read_module.ids_in_one_chunk(table).column("id").num_chunks == 3
    wide = pa.table({"id": pa.chunked_array([c.cast(pa.large_string()) for c in chunks])})
    assert read_module.ids_in_one_chunk(wide).column("id").num_chunks == 1  # 64-bit offsets: no limit
