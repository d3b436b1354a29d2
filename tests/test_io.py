import gzip
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import io
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError


def _pq(path, **cols):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path)
    return path


def test_discover_files_dirs_globs(tmp_path):
    _pq(tmp_path / "d" / "b.parquet", text=["x"])
    _pq(tmp_path / "d" / "sub" / "a.parquet", text=["y"])
    (tmp_path / "d" / "notes.txt").write_text("ignored")
    (tmp_path / "d" / "c.jsonl").write_text('{"text": "z"}\n')
    shards = io.discover([tmp_path / "d"])
    assert [s.name for s in shards] == ["b.parquet", "c.jsonl", "sub/a.parquet"]
    assert [s.format for s in shards] == ["parquet", "jsonl", "parquet"]
    assert [s.name for s in io.discover(str(tmp_path / "d" / "**" / "*.parquet"))] == ["b.parquet", "sub/a.parquet"]
    assert [s.name for s in io.discover(tmp_path / "d" / "b.parquet")] == ["b.parquet"]


def test_discover_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        io.discover([tmp_path / "nope.parquet"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .parquet or .jsonl"):
        io.discover([tmp_path / "empty"])
    with pytest.raises(InputError, match="matches no files"):
        io.discover([str(tmp_path / "*.parquet")])
    _pq(tmp_path / "a" / "x.parquet", text=["1"])
    _pq(tmp_path / "b" / "x.parquet", text=["2"])
    with pytest.raises(InputError, match="same name 'x.parquet'"):
        io.discover([tmp_path / "a" / "x.parquet", tmp_path / "b" / "x.parquet"])
    (tmp_path / "data.csv").write_text("text\nx\n")
    with pytest.raises(InputError, match="cannot tell the format"):
        io.discover([tmp_path / "data.csv"])


def test_read_keeps_ids_verbatim_and_generates_when_absent(tmp_path):
    _pq(tmp_path / "a.parquet", text=["a", "b"], uid=pa.array([10**15, -3], pa.int64()))
    _pq(tmp_path / "b.parquet", text=["c"], uid=pa.array([7], pa.int64()))
    c = io.read([tmp_path], InputConfig(id_column="uid"))
    assert c.ids.to_pylist() == [10**15, -3, 7] and c.ids.type == pa.int64()
    assert np.asarray(c.table.column("row")).tolist() == [0, 1, 2]
    assert np.asarray(c.table.column("shard_row")).tolist() == [0, 1, 0]
    g = io.read([tmp_path])
    assert g.id_generated and g.ids.to_pylist() == [0, 1, 2]


def test_missing_columns_name_the_existing_ones(tmp_path):
    _pq(tmp_path / "a.parquet", body=["x"], url=["u"])
    with pytest.raises(InputError, match=r"text column 'text' is not in shard .*its columns are: 'body', 'url'"):
        io.read([tmp_path])
    with pytest.raises(InputError, match=r"id column 'uid' is not in shard"):
        io.read([tmp_path], InputConfig(text_column="body", id_column="uid"))


def test_mixed_id_types_across_shards(tmp_path):
    _pq(tmp_path / "a.parquet", text=["x"], uid=pa.array([1]))
    _pq(tmp_path / "b.parquet", text=["y"], uid=pa.array(["1"]))
    with pytest.raises(InputError, match="mixed schemas across shards"):
        io.read([tmp_path], InputConfig(id_column="uid"))


def test_non_string_text_column(tmp_path):
    _pq(tmp_path / "a.parquet", text=pa.array([1, 2]))
    with pytest.raises(InputError, match="has type int64; it must be a string column"):
        io.read([tmp_path])


def test_corrupt_and_truncated_parquet_name_the_file(tmp_path):
    good = _pq(tmp_path / "good.parquet", text=["x"] * 100)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(InputError, match=r"bad.parquet.*not a readable Parquet file"):
        io.read([tmp_path])
    (tmp_path / "bad.parquet").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    with pytest.raises(InputError, match="bad.parquet"):
        io.read([tmp_path])


def test_jsonl_blank_lines_gzip_and_verbatim_write(tmp_path):
    lines = ['{"id": "a", "text": "héllo", "x": 1}', "", '{ "text":"world","id":"b" }', "   ",
             '{"id": "c", "text": null}']
    src = tmp_path / "in" / "s.jsonl.gz"
    src.parent.mkdir()
    with gzip.open(src, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    c = io.read([src], InputConfig(id_column="id"))
    assert c.ids.to_pylist() == ["a", "b", "c"]
    assert c.text.to_pylist() == ["héllo", "world", None]
    shard = c.shards[0]
    assert shard.rows == 3
    io.write_shard(shard, np.array([True, True, False]), tmp_path / "out")
    with gzip.open(tmp_path / "out" / "s.jsonl.gz", "rt", encoding="utf-8") as f:
        assert f.read() == lines[0] + "\n" + lines[2] + "\n"


def test_invalid_jsonl_is_reported(tmp_path):
    (tmp_path / "x.jsonl").write_text('{"text": "ok"}\n{not json}\n')
    with pytest.raises(InputError, match="x.jsonl.*not valid JSON Lines"):
        io.read([tmp_path / "x.jsonl"])


def test_parquet_write_keeps_schema_and_metadata(tmp_path):
    table = pa.table({"text": ["a", "b", "c"], "n": pa.array([1, 2, 3], pa.int16())})
    table = table.replace_schema_metadata({"origin": "crawl-7"})
    src = tmp_path / "in" / "p.parquet"
    src.parent.mkdir()
    pq.write_table(table, src)
    shard = io.read([src]).shards[0]
    assert io.write_shard(shard, np.array([True, False, True]), tmp_path / "out") == 2
    out = pq.read_table(tmp_path / "out" / "p.parquet")
    assert out.schema.equals(table.schema, check_metadata=True)
    assert out.column("n").to_pylist() == [1, 3]


def test_input_changed_during_run_is_detected(tmp_path):
    src = _pq(tmp_path / "in" / "p.parquet", text=["a", "b"])
    shard = io.read([src]).shards[0]
    _pq(src, text=["a", "b", "c"])
    with pytest.raises(InputError, match="inputs must not change during a run"):
        io.write_shard(shard, np.array([True, True]), tmp_path / "out")


def test_atomic_write_leaves_no_temp_files(tmp_path):
    io.atomic_write_bytes(tmp_path / "r.json", json.dumps({"a": 1}).encode())
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_outputs_get_the_umask_mode_not_mkstemp_0600(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        io.atomic_write_bytes(tmp_path / "a.json", b"{}")
        io.atomic_write_parquet(tmp_path / "b.parquet", pa.table({"x": [1]}))
    finally:
        os.umask(old)
    for name in ("a.json", "b.parquet"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o644
