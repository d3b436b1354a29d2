"""Streamed reads and writes of shards: batches of pages / blocks of lines, the same rows, values and bytes
as reading the whole shard."""

import gzip
import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.storage import filter as filt
from gpu_dedup.storage import parquet as pqs


def _old_write(src, keep, dst, compression, row_group_size=None):
    """The write stage before streaming: the whole shard read, filtered and written in one call."""
    table = pq.ParquetFile(src).read()
    kept = filt._filter_rows(table, pa.array(keep), str(src))
    pq.write_table(kept, dst, compression=None if compression == "none" else compression,
                   row_group_size=row_group_size)


def _digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _table(n: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "\u00e9t\u00e9", "\u4e2d\u6587", ""], dtype=object)
    lengths = rng.integers(0, 40, n)
    text = [" ".join(rng.choice(words, k)) if k % 11 else None for k in lengths]
    vec = pa.array([list(rng.random(int(k % 5)).astype(np.float32)) if k % 7 else None for k in lengths],
                   pa.list_(pa.float32()))
    cat = pa.array(rng.choice(["x", "y", "z"], n)).dictionary_encode()
    return pa.table({"id": pa.array(np.arange(n) * 3), "text": pa.array(text, pa.string()), "vec": vec,
                     "score": pa.array(lengths / 7.0, mask=lengths % 5 == 0), "cat": cat},
                    metadata={b"owner": b"someone"})


@pytest.mark.parametrize("row_group_size,batch_bytes,out_rows,keep_kind", [
    (1000, 3000, 2048, "random"),  # batches cross row groups; several output row groups
    (50_000, 1 << 12, 1 << 20, "random"),  # one input row group, many small batches
    (777, 1 << 16, 4096, "runs"),  # long runs kept and dropped
    (300, 1 << 10, 1 << 20, "none"),
    (300, 1 << 10, 1024, "all"),
])
def test_streamed_parquet_write_is_byte_identical_to_the_whole_table_write(tmp_path, monkeypatch, row_group_size,
                                                                          batch_bytes, out_rows, keep_kind):
    n = 12_345
    src = tmp_path / "in.parquet"
    pq.write_table(_table(n), src, row_group_size=row_group_size, compression="snappy")
    rng = np.random.default_rng(1)
    keep = {"random": rng.random(n) < 0.7, "runs": (np.arange(n) // 2500) % 2 == 0,
            "none": np.zeros(n, bool), "all": np.ones(n, bool)}[keep_kind]
    monkeypatch.setattr(pqs, "BATCH_BYTES", batch_bytes)
    monkeypatch.setattr(filt, "ROW_GROUP_ROWS", out_rows)
    shard = storage.discover([src])[0]
    for codec in ("zstd", "snappy", "none"):
        out = tmp_path / codec
        assert storage.write_shard(shard, keep, out, codec) == int(keep.sum())
        _old_write(src, keep, tmp_path / "old.parquet", codec,
                   row_group_size=min(int(keep.sum()), out_rows) if keep.sum() else None)
        assert _digest(out / "in.parquet") == _digest(tmp_path / "old.parquet"), codec


def test_streamed_write_of_more_rows_than_one_row_group_is_byte_identical(tmp_path, monkeypatch):
    """pyarrow's own row-group size (1Mi rows) with batches that do not divide it."""
    n = (1 << 20) + 200_000
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"a": np.arange(n), "b": (np.arange(n) % 97).astype(np.int8)}), src,
                   row_group_size=300_000)
    keep = (np.arange(n) % 13) != 0
    keep[: 200_000] = True
    monkeypatch.setattr(pqs, "BATCH_BYTES", 700_000)
    storage.write_shard(storage.discover([src])[0], keep, tmp_path / "out", "zstd")
    _old_write(src, keep, tmp_path / "old.parquet", "zstd")
    assert pq.ParquetFile(tmp_path / "old.parquet").metadata.num_row_groups == 2
    assert _digest(tmp_path / "out" / "in.parquet") == _digest(tmp_path / "old.parquet")


def test_same_codec_keeps_each_shards_codec(tmp_path):
    t = _table(3000)
    for codec in ("snappy", "zstd", "gzip", "none"):
        pq.write_table(t, tmp_path / f"{codec}.parquet", compression=codec)
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(t, mixed, compression={"id": "gzip", "text": "zstd", "vec": "snappy", "score": "snappy",
                                          "cat": "snappy"})
    keep = np.arange(3000) % 3 != 0
    for shard in storage.discover([tmp_path]):
        storage.write_shard(shard, keep, tmp_path / "out", "same")
        meta = pq.ParquetFile(tmp_path / "out" / shard.name).metadata
        written = {meta.row_group(0).column(c).path_in_schema: meta.row_group(0).column(c).compression
                   for c in range(meta.num_columns)}
        source = pq.ParquetFile(shard.path).metadata
        assert written == {source.row_group(0).column(c).path_in_schema: source.row_group(0).column(c).compression
                           for c in range(source.num_columns)}
        assert pq.read_table(tmp_path / "out" / shard.name).equals(pq.read_table(shard.path).filter(pa.array(keep)))
    # "same" is that codec: the file is the one written with it by name
    _old_write(tmp_path / "gzip.parquet", keep, tmp_path / "old.parquet", "gzip")
    assert _digest(tmp_path / "out" / "gzip.parquet") == _digest(tmp_path / "old.parquet")


def test_streamed_parquet_write_refuses_a_changed_row_count(tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), src)
    shard = storage.discover([src])[0]
    with pytest.raises(storage.discovery.InputError, match="had 4 rows when read and 3 now"):
        storage.write_shard(shard, np.ones(4, bool), tmp_path / "out", "same")
    assert not (tmp_path / "out" / "in.parquet").exists()


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst", ".bz2"])
def test_streamed_jsonl_write_keeps_the_lines_byte_for_byte(tmp_path, monkeypatch, suffix):
    lines = [json.dumps({"id": i, "text": "w" * (i % 50) + "\u00e9"}, ensure_ascii=False) for i in range(5000)]
    # blank lines, CRLF line ends, no final newline
    body = ("\n".join(lines[:2500]) + "\n  \n\n" + "\r\n".join(lines[2500:])).encode()
    path = tmp_path / f"in.jsonl{suffix}"
    codec = {"": None, ".gz": "gzip", ".zst": "zstd", ".bz2": "bz2"}[suffix]
    with pa.CompressedOutputStream(str(path), codec) if codec else open(path, "wb") as f:
        f.write(body)
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 4096)  # a few lines per block
    keep = np.arange(5000) % 4 != 1
    shard = storage.discover([path])[0]
    assert storage.write_shard(shard, keep, tmp_path / "out", "zstd") == int(keep.sum())
    data = np.frombuffer(body, np.uint8)
    starts, ends = storage.jsonl.jsonl_lines(body)[1:]
    want = storage.jsonl.gather_lines_of(data, starts[keep], ends[keep]).tobytes()
    written = (tmp_path / "out" / path.name).read_bytes()
    if suffix:
        with pa.input_stream(str(tmp_path / "out" / path.name), compression="detect") as f:
            assert f.read() == want
        sink = pa.BufferOutputStream()  # and compressed as one write of those bytes would be
        with pa.CompressedOutputStream(sink, codec) as out:
            out.write(want)
        assert written == sink.getvalue().to_pybytes()
    else:
        assert written == want
    with pytest.raises(storage.discovery.InputError, match="had 4999 records when read and 5000 now"):
        storage.write_shard(shard, keep[1:], tmp_path / "out2", "same")


def test_streamed_reads_give_the_whole_reads_columns(tmp_path, monkeypatch):
    t = _table(5000)
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=1234)
    with open(tmp_path / "b.jsonl", "w") as f:
        for row in t.select(["id", "text", "score"]).to_pylist():
            f.write(json.dumps(row) + "\n")
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        for row in t.select(["id", "text"]).slice(0, 1000).to_pylist():
            f.write(json.dumps(row) + "\n")
    monkeypatch.setattr(pqs, "BATCH_BYTES", 5000)
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 3000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 2000)  # the first lines that fix the types
    cfg = InputConfig(id_column="id")
    for shard in storage.discover([tmp_path]):
        score = "score" if shard.name != "c.jsonl.gz" else None
        whole = storage.read_columns(shard, cfg, score)
        parts = list(storage.iter_columns(shard, cfg, score))
        assert len(parts) >= 5
        assert pa.concat_tables(parts).equals(whole)


def test_jsonl_whose_later_lines_change_type_is_read_whole(tmp_path, monkeypatch):
    """The first lines fix id as an integer; a later one is a float: the whole file is read, which refuses
    integers mixed with fractions as the whole read always did."""
    path = tmp_path / "a.jsonl"
    rows = [{"id": i, "text": f"t {i}"} for i in range(3000)] + [{"id": 0.5, "text": "half"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 2000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 1000)
    shard = storage.discover([path])[0]
    cfg = InputConfig(id_column="id")
    with pytest.raises(storage.ReadWhole):
        list(storage.iter_columns(shard, cfg))
    from gpu_dedup.stages.read import read

    with pytest.raises(InputError, match=r"mixes integers \(line 1: 0\) and numbers with a fraction or exponent "
                                         r"\(line 3001: 0.5\)"):
        read([shard], cfg)


def test_streamed_parquet_read_takes_a_batch_of_memory_whatever_the_row_groups(tmp_path):
    """One row group of ~60 MB of text, streamed: what the reader allocates stays near a batch."""
    n = 60_000
    text = pa.array([("%08d " % i) * 120 for i in range(n)], pa.string())
    path = tmp_path / "one.parquet"
    pq.write_table(pa.table({"text": text}), path, row_group_size=n)
    del text
    shard = storage.discover([path])[0]
    pool = pa.default_memory_pool()
    pool.release_unused()
    base = pool.bytes_allocated()
    peak = 0
    rows = 0
    for batch in storage.iter_columns(shard, InputConfig(), batch_bytes=4 << 20):
        rows += batch.num_rows
        peak = max(peak, pool.bytes_allocated() - base)
        del batch
    assert rows == n
    assert peak < 24 << 20  # the whole column is ~65 MB


@pytest.mark.parametrize("name", ["empty.parquet", "empty.jsonl", "empty.jsonl.gz"])
def test_shards_without_rows_are_written_as_before(tmp_path, name):
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())}), path)
    elif name.endswith(".gz"):
        with gzip.open(path, "wb") as f:
            f.write(b"\n \n")
    else:
        path.write_bytes(b"")
    shard = storage.discover([path])[0]
    assert storage.write_shard(shard, np.zeros(0, bool), tmp_path / "out", "zstd") == 0
    written = (tmp_path / "out" / name).read_bytes()
    if name.endswith(".parquet"):
        _old_write(path, np.zeros(0, bool), tmp_path / "old.parquet", "zstd")
        assert written == (tmp_path / "old.parquet").read_bytes()
    else:
        sink = pa.BufferOutputStream()
        if name.endswith(".gz"):
            with pa.CompressedOutputStream(sink, "gzip") as out:
                out.write(b"")
        assert written == sink.getvalue().to_pybytes()


def test_short_unique_strings_keep_their_pages_and_dictionary_fallback(tmp_path, monkeypatch):
    """Pages of short strings end at the writer's row cap and their dictionary falls back to plain mid-column:
    where each happens depends on where the writer's batches fall, which one run of values per column keeps."""
    n = 300_000
    src = tmp_path / "in.parquet"
    pq.write_table(pa.table({"id": pa.array([f"c0-doc-{i:07d}" for i in range(n)])}), src)
    keep = np.random.default_rng(0).random(n) < 0.965
    monkeypatch.setattr(pqs, "BATCH_BYTES", 300_000)  # batches of ~17,000 rows
    storage.write_shard(storage.discover([src])[0], keep, tmp_path / "out", "zstd")
    _old_write(src, keep, tmp_path / "old.parquet", "zstd")
    assert _digest(tmp_path / "out" / "in.parquet") == _digest(tmp_path / "old.parquet")


@pytest.mark.parametrize("bad,message", [
    ("null", r"line 2501 of shard .* is 'null', not a JSON object"),
    ('{"id": 1.5, "text": "x"}', r"mixes integers \(line 1: 0\) and numbers with a fraction or exponent \(line 2501"),
])
def test_a_later_block_the_whole_read_refuses_is_refused_by_line(tmp_path, monkeypatch, bad, message):
    """A line past the first block that the whole read refuses is refused by a streamed read too, naming
    its line in the whole file."""
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": i, "text": f"t {i}"}) for i in range(3000)]
    lines[2500] = bad
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 2000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 1000)
    from gpu_dedup.stages.read import read

    with pytest.raises(InputError, match=message):
        read(storage.discover([path]), InputConfig(id_column="id"))


def test_lines_without_the_text_field_past_the_first_block_are_named(tmp_path, monkeypatch, caplog):
    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": i, "text": f"t {i}"}) for i in range(3000)]
    lines[2500] = json.dumps({"id": 2500, "body": "elsewhere"})
    lines[2600] = json.dumps({"id": 2600, "text": None})  # an explicit null: no warning of its own
    path.write_text("\n".join(lines) + "\n")
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 2000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 1000)
    from gpu_dedup.stages.read import read

    with caplog.at_level("WARNING", logger="gpu_dedup"):
        c = read(storage.discover([path]), InputConfig(id_column="id"))
    assert c.table.num_rows == 3000 and c.table.column("text").null_count == 2
    assert "1 line(s) of shard" in caplog.text and "(first: line 2501)" in caplog.text


def test_explicit_null_texts_are_streamed(tmp_path, monkeypatch):
    """Null texts with the field present need no whole read: the blocks are streamed as they are."""
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": None if i % 3 == 0 else f"t {i}"}) + "\n"
                            for i in range(3000)))
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 2000)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 1000)
    shard = storage.discover([path])[0]
    cfg = InputConfig(id_column="id")
    parts = list(storage.iter_columns(shard, cfg))
    assert len(parts) > 3 and pa.concat_tables(parts).equals(storage.read_columns(shard, cfg))


def test_a_shards_write_memory_is_a_few_copies_of_one_written_row_group(tmp_path, monkeypatch):
    table = _table(3000)
    pq.write_table(table, tmp_path / "a.parquet", row_group_size=500)
    shard = storage.discover([str(tmp_path / "a.parquet")], "parquet")[0]
    meta = pq.ParquetFile(tmp_path / "a.parquet").metadata
    total = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
    assert filt.write_memory(shard) == filt.WRITE_COPIES * total  # every row in one written row group
    monkeypatch.setattr(filt, "ROW_GROUP_ROWS", 1000)  # row groups of a third of the rows: a third of the memory
    assert filt.write_memory(shard) == filt.WRITE_COPIES * total // 3
    (tmp_path / "b.jsonl").write_text('{"text": "a"}\n')
    assert filt.write_memory(storage.discover([str(tmp_path / "b.jsonl")], "jsonl")[0]) == filt.STREAMED_WRITE_BYTES


def test_as_many_shards_are_written_at_once_as_fit_in_half_the_memory():
    mb = 1 << 20
    assert filt.concurrent_writes([100 * mb] * 16, 16, 10_000 * mb) == 16  # room for all
    assert filt.concurrent_writes([100 * mb] * 16, 4, 10_000 * mb) == 4  # the threads bound it
    assert filt.concurrent_writes([100 * mb] * 16, 16, 1000 * mb) == 5  # 5 x 100 MB <= half of 1000 MB
    assert filt.concurrent_writes([480 * mb, 20 * mb, 20 * mb], 3, 1000 * mb) == 2  # the largest together
    assert filt.concurrent_writes([900 * mb], 8, 100 * mb) == 1  # one at least
    assert filt.concurrent_writes([], 8, 0) == 1


def test_a_jsonl_line_longer_than_a_parse_block_is_a_document_not_an_error(tmp_path, monkeypatch):
    """pyarrow refuses an object that spans more than two of its parse blocks ("straddling object"): a valid line
    longer than two blocks (a 50 MB document at the real block size) is read, whole and streamed, with the lines
    around it, and the write stage keeps it byte for byte; an invalid line is still named."""
    monkeypatch.setattr(storage.jsonl, "JSON_BLOCK", 1024)
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 4096)
    monkeypatch.setattr(storage.jsonl, "SAMPLE_BYTES", 1000)
    long_text = " ".join(f"w{i}" for i in range(2000))  # about 11 KB: ten blocks
    rows = [{"id": i, "text": long_text if i == 40 else f"document {i}"} for i in range(100)]
    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shard = storage.discover([path])[0]
    cfg = InputConfig(id_column="id")
    whole = storage.read_columns(shard, cfg)
    assert whole.column("text").to_pylist() == [r["text"] for r in rows]
    assert pa.concat_tables(list(storage.iter_columns(shard, cfg))).equals(whole)
    keep = np.ones(100, bool)
    keep[3] = False
    storage.write_shard(shard, keep, tmp_path / "out")
    assert (tmp_path / "out" / "a.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in rows if r["id"] != 3)
    from gpu_dedup.stages.read import read

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "b.jsonl").write_text(json.dumps(rows[40]) + "\n" + '{"text": "unterminated}\n')
    with pytest.raises(InputError, match=r"b.jsonl.*not valid JSON Lines: line 2: .*fix or remove that line"):
        read(storage.discover([bad / "b.jsonl"]), cfg)
