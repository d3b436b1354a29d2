import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.stages.read import read
from gpu_dedup.storage import columns, jsonl


def _pq(path, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


def test_discover_files_dirs_globs(tmp_path):
    _pq(tmp_path / "d" / "b.parquet", text=["x"])
    _pq(tmp_path / "d" / "sub" / "a.parquet", text=["y"])
    (tmp_path / "d" / "notes.txt").write_text("ignored")
    (tmp_path / "d" / "c.jsonl").write_text('{"text": "z"}\n')
    shards = storage.discover([tmp_path / "d"])
    assert [s.name for s in shards] == ["b.parquet", "c.jsonl", "sub/a.parquet"]
    assert [s.format for s in shards] == ["parquet", "jsonl", "parquet"]
    assert [s.name for s in storage.discover(str(tmp_path / "d" / "**" / "*.parquet"))] == ["b.parquet", "sub/a.parquet"]
    assert [s.name for s in storage.discover(tmp_path / "d" / "b.parquet")] == ["b.parquet"]


def test_discover_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        storage.discover([tmp_path / "nope.parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .parquet, .jsonl"):
        storage.discover([tmp_path / "empty"])
    with pytest.raises(InputError, match="matches no files"):
        storage.discover([str(tmp_path / "*.parquet")])
    _pq(tmp_path / "a" / "x.parquet", text=["1"])
    _pq(tmp_path / "b" / "x.parquet", text=["2"])
    with pytest.raises(InputError, match="same name 'x.parquet'"):
        storage.discover([tmp_path / "a" / "x.parquet", tmp_path / "b" / "x.parquet"])
    (tmp_path / "data.csv").write_text("text\nx\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        storage.discover([tmp_path / "data.csv"])


def test_read_keeps_ids_verbatim_and_generates_when_absent(tmp_path):
    _pq(tmp_path / "a.parquet", text=["a", "b"], uid=pa.array([10**15, -3], pa.int64()))
    _pq(tmp_path / "b.parquet", text=["c"], uid=pa.array([7], pa.int64()))
    c = read([tmp_path], InputConfig(id_column="uid"))
    assert c.ids.to_pylist() == [10**15, -3, 7] and c.ids.type == pa.int64()
    assert np.asarray(c.table.column("row")).tolist() == [0, 1, 2]
    assert np.asarray(c.table.column("shard_row")).tolist() == [0, 1, 0]
    g = read([tmp_path])
    assert g.id_generated and g.ids.to_pylist() == [0, 1, 2]


def test_missing_columns_name_the_existing_ones(tmp_path):
    _pq(tmp_path / "a.parquet", body=["x"], url=["u"])
    with pytest.raises(InputError, match=r"text column 'text' is not in shard .*its columns are: 'body', 'url'"):
        read([tmp_path])
    with pytest.raises(InputError, match=r"id column 'uid' is not in shard"):
        read([tmp_path], InputConfig(text_column="body", id_column="uid"))


def test_mixed_id_types_across_shards(tmp_path):
    _pq(tmp_path / "a.parquet", text=["x"], uid=pa.array([1]))
    _pq(tmp_path / "b.parquet", text=["y"], uid=pa.array(["1"]))
    with pytest.raises(InputError, match="mixed schemas across shards"):
        read([tmp_path], InputConfig(id_column="uid"))


def test_non_string_text_column(tmp_path):
    _pq(tmp_path / "a.parquet", text=pa.array([1, 2]))
    with pytest.raises(InputError, match="has type int64; it must be a string column"):
        read([tmp_path])


def test_corrupt_and_truncated_parquet_name_the_file(tmp_path):
    good = _pq(tmp_path / "good.parquet", text=["x"] * 100)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=r"bad.parquet.*not a readable Parquet file"):
        read([tmp_path])
    (tmp_path / "bad.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputError, match="bad.parquet"):
        read([tmp_path])


def test_jsonl_blank_lines_gzip_and_verbatim_write(tmp_path):
    lines = ['{"id": "a", "text": "héllo", "x": 1}', "", '{ "text":"world","id":"b" }', "   ",
             '{"id": "c", "text": null}']
    src = tmp_path / "in" / "s.jsonl.gz"
    src.parent.mkdir()
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    c = read([src], InputConfig(id_column="id"))
    assert c.ids.to_pylist() == ["a", "b", "c"]
    assert c.text.to_pylist() == ["héllo", "world", None]
    shard = c.shards[0]
    assert shard.rows == 3
    storage.write_shard(shard, np.array([True, True, False]), tmp_path / "out")
    with gzip.open(tmp_path / "out" / "s.jsonl.gz", "rt", encoding="utf-8") as f:
        assert f.read() == lines[0] + "\n" + lines[2] + "\n"


def test_invalid_jsonl_is_reported_with_its_line_number(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(InputError, match=r"x.jsonl.*not valid JSON Lines: line 2: .*; fix or remove that line"):
        read([tmp_path / "x.jsonl"])
    # the line in the file (blank lines counted), far past pyarrow's parse blocks' own row numbers
    body = "".join(f'{{"text": "document {i}"}}\n' + ("\n" if i % 1000 == 0 else "") for i in range(60_000))
    bad = body.split("\n")
    bad[50_123] = '{"text": "unterminated}'
    (tmp_path / "y.jsonl").write_text("\n".join(bad))
    with pytest.raises(InputError, match=r"y.jsonl.*: line 50124: .*fix or remove that line"):
        read([tmp_path / "y.jsonl"])
    (tmp_path / "z.jsonl").write_text('{"text": "a"}\n{"text": 5}\n')  # no one line is wrong
    with pytest.raises(InputError, match=r"z.jsonl.*changed from string to number.*keep one type across lines"):
        read([tmp_path / "z.jsonl"])


def test_a_field_whose_type_changes_far_into_a_jsonl_shard_is_named_by_its_line(tmp_path, monkeypatch):
    """pyarrow's "changed from string to number in row N" counts records of its parse block: the line of the file
    is named instead (was: "in row 57003" for line 300001 of a 41 MB shard)."""
    monkeypatch.setattr(jsonl, "JSON_BLOCK", 1024)
    lines = [json.dumps({"id": i, "text": f"document {i}"}) for i in range(500)]
    lines[321] = json.dumps({"id": 321, "text": 5})
    (tmp_path / "t.jsonl").write_text("\n".join(lines[:100]) + "\n\n" + "\n".join(lines[100:]) + "\n")
    with pytest.raises(InputError, match=r"t.jsonl.*: line 323: .*changed from string to number.*"
                                         r"keep one type across lines") as err:
        read([tmp_path / "t.jsonl"])
    assert " in row " not in str(err.value)
    (tmp_path / "u.jsonl").write_text('{"text": "a"}\n{"text": 5}\n{"text": "b"}\n')  # the first line that disagrees
    with pytest.raises(InputError, match=r"u.jsonl.*: line 2: .*changed from string to number"):
        read([tmp_path / "u.jsonl"])


def test_int8_dictionary_columns_with_their_own_categories_per_row_group_are_written_back_readable(tmp_path):
    """pandas writes a categorical with int8 codes; a shard written a chunk at a time has each row group's own
    categories, 300 in all.  Joining the kept rows of several row groups into one output row group failed
    ("These dictionaries cannot be combined", exit 1); they are written as the input's row groups were."""
    batches = [pa.record_batch({"text": [f"doc {g} {i}" for i in range(100)],
                                "domain": pa.array([f"site{g}-{i}.example" for i in range(100)]).dictionary_encode()
                               .cast(pa.dictionary(pa.int8(), pa.string()))}) for g in range(3)]
    src = tmp_path / "in" / "c.parquet"
    src.parent.mkdir()
    pq.write_table(pa.Table.from_batches(batches), src, row_group_size=100)
    shard = read([src]).shards[0]
    keep = np.arange(300) % 3 != 0
    assert storage.write_shard(shard, keep, tmp_path / "out") == 200
    out = pq.read_table(tmp_path / "out" / "c.parquet")
    assert out.schema.equals(pq.read_schema(src))
    want = pq.read_table(src).filter(pa.array(keep))
    assert out.column("domain").cast(pa.string()).equals(want.column("domain").cast(pa.string()))
    assert out.column("text").equals(want.column("text"))


def test_a_raw_tab_inside_a_json_string_is_named_as_such(tmp_path):
    """pyarrow calls an unescaped tab (or other control character) in a string "Invalid encoding in string",
    which sent one looking for an encoding problem: the byte and the fix are named."""
    (tmp_path / "t.jsonl").write_bytes(b'{"text": "fine"}\n{"text": "raw\ttab"}\n')
    with pytest.raises(InputError, match=r"t.jsonl.*line 2: .*a raw control character, byte 0x09 at byte 14 of the "
                                         r"line: JSON strings must escape them"):
        read([tmp_path / "t.jsonl"])
    (tmp_path / "u.jsonl").write_bytes(b'{"text": "fine"}\r\n{"text": "unterminated}\r\n')  # CRLF: not named
    with pytest.raises(InputError, match=r"u.jsonl.*line 2: ") as err:
        read([tmp_path / "u.jsonl"])
    assert "control character" not in str(err.value)


def test_parquet_write_keeps_schema_and_metadata(tmp_path):
    table = pa.table({"text": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int16())})
    table = table.replace_schema_metadata({"origin": "crawl-7"})
    src = tmp_path / "in" / "p.parquet"
    src.parent.mkdir()
    pq.write_table(table, src)
    shard = read([src]).shards[0]
    assert storage.write_shard(shard, np.array([True, False, True]), tmp_path / "out") == 2
    out = pq.read_table(tmp_path / "out" / "p.parquet")
    assert out.schema.equals(table.schema, check_metadata=True)
    assert out.column("n").to_pylist() == [1, 3]


def test_input_changed_during_run_is_detected(tmp_path):
    src = _pq(tmp_path / "in" / "p.parquet", text=["a", "b"])
    shard = read([src]).shards[0]
    _pq(src, text=["a", "b", "c"])
    with pytest.raises(InputError, match="changed during the run"):
        storage.write_shard(shard, np.array([True, True]), tmp_path / "out")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    storage.atomic_write_bytes(tmp_path / "r.json", json.dumps({"a": 1}).encode())
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_outputs_get_the_umask_mode_not_mkstemp_0600(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        storage.atomic_write_bytes(tmp_path / "a.json", b"{}")
        storage.atomic_write_parquet(tmp_path / "b.parquet", pa.table({"x": [1]}))
    finally:
        os.umask(old)
    for name in ("a.json", "b.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644


def test_publishing_a_file_never_changes_the_umask_other_threads_create_files_with(tmp_path, monkeypatch):
    """Reading the umask with os.umask sets it (to 0, for a moment, process-wide): a directory another thread made
    then came out 0777.  A publish reads it without setting it."""
    import os
    import stat

    old = os.umask(0o027)
    try:
        def refuse(mask):
            raise AssertionError(f"os.umask({mask:o}) called while publishing")

        monkeypatch.setattr(os, "umask", refuse)
        storage.atomic_write_bytes(tmp_path / "a.json", b"{}")
        monkeypatch.undo()
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o640


# ----------------------------------------------------------------------------- JSONL: only the wanted fields


def _full_read(path):
    """The reference: every field with full type inference (what the reader did before)."""
    import pyarrow.json as pajson

    return pajson.read_json(str(path))


def test_jsonl_reads_only_wanted_fields_with_the_types_of_a_full_read(tmp_path):
    lines = [{"id": i, "text": f"doc {i} ünï", "meta": {"url": f"u{i}", "tags": ["a", i]}, "score": i % 3}
             for i in range(2000)]
    path = tmp_path / "a.jsonl"
    path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in lines) + "\n")
    shard = storage.discover([str(path)])[0]
    got = storage.read_columns(shard, InputConfig(text_column="text", id_column="id"), score_column="score")
    assert got.column_names == ["text", "id", "score"]
    assert got.column("text").to_pylist() == [r["text"] for r in lines]
    assert got.column("id").type == pa.int64() and got.column("id").to_pylist() == list(range(2000))
    assert got.column("score").to_pylist() == [float(r["score"]) for r in lines]
    # an unwanted field of mixed types (which a full read rejects) does not stop the read
    with pytest.raises(pa.ArrowInvalid):
        _full_read(path)
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({k: v for k, v in r.items() if k != "meta"}, ensure_ascii=False)
                               for r in lines) + "\n")
    full = _full_read(plain)
    got = storage.read_columns(storage.discover([str(plain)])[0], InputConfig(text_column="text", id_column="id"))
    assert got.column("id").type == full.column("id").type and got.column("id").equals(full.column("id"))


def test_jsonl_sample_types_disagreeing_with_later_lines_fall_back_to_full_inference(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 64)
    rows = [{"id": i, "text": "x"} for i in range(50)] + [{"id": "late-string", "text": "y"}]
    rows += [{"text": "no id"}] + [{"id": 7, "text": None}]
    path = tmp_path / "b.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    shard = storage.discover([str(path)])[0]
    cfg = InputConfig(text_column="text", id_column="id")
    try:
        want = _full_read(path)
    except pa.ArrowInvalid:  # pyarrow itself cannot unify int and string ids: so do we, with our message
        with pytest.raises(InputError):
            storage.read_columns(shard, cfg)
        return
    got = storage.read_columns(shard, cfg)
    assert got.column("id").to_pylist() == want.column("id").to_pylist()


def test_jsonl_field_missing_from_the_sample_is_found_later(tmp_path, monkeypatch):
    monkeypatch.setattr(jsonl, "SAMPLE_BYTES", 16)
    rows = [{"text": "a"}] * 20 + [{"text": "b", "doc_id": "z"}]
    path = tmp_path / "c.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))  # no final newline
    got = storage.read_columns(storage.discover([str(path)])[0], InputConfig(text_column="text", id_column="doc_id"))
    assert got.column("id").to_pylist() == [None] * 20 + ["z"]


def test_jsonl_whitespace_lines_crlf_and_two_objects_on_a_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"text": "a"}\r\n  \t\r\n\n{"text": "b"}\r\n   ')
    got = storage.read_columns(storage.discover([str(path)])[0], InputConfig(text_column="text"))
    assert got.column("text").to_pylist() == ["a", "b"]
    bad = tmp_path / "e.jsonl"
    bad.write_bytes(b'{"text": "a"} {"text": "b"}\n{"text": "c"}\n')
    with pytest.raises(InputError, match="exactly one JSON object"):
        storage.read_columns(storage.discover([str(bad)])[0], InputConfig(text_column="text"))


def test_line_scanner_and_gather_equal_python(tmp_path):
    from gpu_dedup.kernels.lines_cpu import gather_lines, nonblank_lines

    raw = b'a\n\n  \n b \r\n\t\nlast'
    data = np.frombuffer(raw, np.uint8)
    starts, ends = nonblank_lines(data)
    want = [(m.start(), m.end()) for m in __import__("re").finditer(rb"[^\n]+", raw) if raw[m.start():m.end()].strip(b" \t\r")]
    assert list(zip(starts.tolist(), ends.tolist())) == want
    assert bytes(gather_lines(data, starts, ends)) == b"a\n b \r\nlast\n"
    assert bytes(gather_lines(data, starts, ends, newline=False)) == b"a b \rlast"


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_read_rows_reads_only_the_row_groups_of_the_rows(tmp_path, fmt, monkeypatch):
    texts = [f"document {i}" for i in range(1000)]
    if fmt == "parquet":
        path = tmp_path / "a.parquet"
        pq.write_table(pa.table({"id": list(range(1000)), "text": texts}), path, row_group_size=100)
    else:
        path = tmp_path / "a.jsonl"
        path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in enumerate(texts)))
    shard = storage.discover([path])[0]
    cfg = InputConfig(id_column="id")
    read = []
    real = storage.read_columns
    monkeypatch.setattr(columns, "read_columns", lambda *a, **k: read.append(k.get("row_groups")) or real(*a, **k))
    rows = np.array([999, 5, 450, 0, 451, 5])  # any order, repeats, several row groups
    got = storage.read_rows(shard, cfg, rows)
    assert got.column("text").to_pylist() == [texts[r] for r in rows]
    assert got.column("id").to_pylist() == rows.tolist()
    if fmt == "parquet":
        assert read == [[0, 4, 9]]  # 3 of the 10 row groups


def test_a_threads_sync_and_digest_seconds_are_its_own(tmp_path, monkeypatch):
    """What a write stage reports as its threads' seconds syncing and digesting outputs: each thread adds its own
    (threads may share the total); a sync on another thread (a checkpoint's, another worker's in one process)
    adds nothing to it."""
    import os
    import threading
    import time

    from gpu_dedup.storage.atomic import busy_into, file_digest, no_busy, sync_file

    monkeypatch.setattr(os, "fsync", lambda fd: time.sleep(0.2))  # 0.2 s a sync, whatever the disk
    (tmp_path / "f").write_bytes(b"x" * 1000)
    total = no_busy()
    other = threading.Thread(target=sync_file, args=(tmp_path / "f",))  # outside any total

    def mine():
        with busy_into(total):
            sync_file(tmp_path / "f")
            file_digest(tmp_path / "f")

    threads = [threading.Thread(target=mine) for _ in range(2)]
    for t in [other, *threads]:
        t.start()
    for t in [other, *threads]:
        t.join()
    assert 0.4 <= total["sync_thread_seconds"] < 0.55  # the two threads' own syncs, not the third one's
    assert 0 < total["digest_thread_seconds"] < 0.1


def test_a_small_jsonl_shard_is_written_without_a_reader_thread_and_a_large_one_with_the_same_bytes(tmp_path,
                                                                                                    monkeypatch):
    """A shard of one block needs no thread reading ahead (starting one per shard cost 3,000 one-line shards
    about a second); a larger one reads its next block while this one is written.  Both write the same bytes."""
    from gpu_dedup.storage import filter as shard_filter

    src = tmp_path / "a.jsonl.gz"
    lines = [json.dumps({"id": i, "text": f"document {i} " * (i % 7 + 1)}) for i in range(2000)]
    src.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    shard = storage.discover(str(src))[0]
    keep = np.arange(2000) % 3 != 1

    def no_thread(items, depth=2):
        raise AssertionError("a thread started to read a shard of one block ahead")

    monkeypatch.setattr(shard_filter, "ahead", no_thread)
    assert shard_filter.write_jsonl_shard(shard, keep, tmp_path / "small.jsonl.gz") == int(keep.sum())
    monkeypatch.undo()
    monkeypatch.setattr(shard_filter, "STREAM_BLOCK", 0)  # every shard read ahead
    shard_filter.write_jsonl_shard(shard, keep, tmp_path / "ahead.jsonl.gz")
    kept = gzip.decompress((tmp_path / "small.jsonl.gz").read_bytes())
    assert kept == gzip.decompress((tmp_path / "ahead.jsonl.gz").read_bytes())
    assert kept.decode().splitlines() == [x for x, k in zip(lines, keep) if k]


def test_jsonl_vectors_of_whole_numbers_are_read_as_floats(tmp_path):
    """JSON has one number type: a JSON Lines shard whose embeddings are all written as whole numbers
    (``[1, 0, 2]``, as JavaScript writes 1.0) is read as float vectors, not refused for holding int64 values
    with a fix ("cast the embeddings to float32") no JSON file can follow."""
    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": i, "emb": [1, 0, i % 3]}) + "\n" for i in range(4)))
    (tmp_path / "b.jsonl").write_text(json.dumps({"id": 9, "emb": [1.5, 0.25, 2]}) + "\n")
    c = read([tmp_path], InputConfig(id_column="id", vector_column="emb"))
    (_, _, a), (_, _, b) = c.vectors
    assert pa.types.is_floating(a.type.value_type) and a.to_pylist() == [[1, 0, 0], [1, 0, 1], [1, 0, 2], [1, 0, 0]]
    assert b.to_pylist() == [[1.5, 0.25, 2.0]]
