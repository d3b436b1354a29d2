"""A few rows of a Parquet text column from only the pages that hold them, against pyarrow's whole read."""

import itertools

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.storage import pages
from gpu_dedup.storage.pages import take_pages


def _texts(n: int, seed: int = 0, nulls: bool = False) -> list:
    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "δέλτα", "epsilon", "zeta", "", "eta theta"]
    out = [" ".join(rng.choice(words, rng.integers(0, 40))) + f" {i}" for i in range(n)]
    if nulls:
        for i in rng.choice(n, n // 7, replace=False):
            out[i] = None
    return out


def _rows(n: int, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, n, 25)
    return np.concatenate([rows, rows[:3], [0, n - 1]])  # any order, repeats, both ends


def _data_pages(path, group: int = 0, column: int = 1) -> int:
    meta = pq.ParquetFile(path).metadata.row_group(group).column(column)
    start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    with open(path, "rb") as f:
        return sum(p.kind != 2 for p in pages._pages(f, start, meta.total_compressed_size))


def _expected(path, rows, column="text"):
    return pq.read_table(path, columns=[column]).column(0).combine_chunks().take(pa.array(rows))


WRITERS = [dict(compression=c, use_dictionary=d, data_page_version=v)
           for c, d, v in itertools.product(["none", "snappy", "gzip", "brotli", "zstd", "lz4"], [True, False],
                                            ["1.0", "2.0"])]


@pytest.mark.parametrize("options", WRITERS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_rows_equal_the_whole_read_for_every_codec_dictionary_and_page_version(tmp_path, options):
    n = 4000
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"id": np.arange(n), "text": _texts(n, nulls=True)}), path, row_group_size=1500,
                   data_page_size=2048, write_batch_size=64, dictionary_pagesize_limit=8192,
                   **options)  # dictionary pages fall back to plain ones (as with real texts)
    assert _data_pages(path) > 10  # rows come from a few of many pages
    rows = _rows(n)
    got = take_pages(path, "text", rows)
    assert got is not None and got.equals(_expected(path, rows))


@pytest.mark.parametrize("options", [
    dict(column_encoding={"text": "DELTA_LENGTH_BYTE_ARRAY"}, use_dictionary=False),
    dict(column_encoding={"text": "DELTA_BYTE_ARRAY"}, use_dictionary=False, data_page_version="2.0"),
    dict(write_statistics=False, write_page_checksum=True),
    dict(write_page_index=True, dictionary_pagesize_limit=512),  # dictionary pages, then plain pages
    dict(data_page_size=1 << 20, compression="zstd"),  # one page per row group
], ids=["delta-length", "delta-v2", "checksums", "page-index-dictionary-fallback", "one-page"])
def test_rows_equal_the_whole_read_for_other_encodings_and_layouts(tmp_path, options):
    n = 3000
    path = tmp_path / "s.parquet"
    kw = dict(data_page_size=1024, row_group_size=1000, write_batch_size=64) | options
    pq.write_table(pa.table({"text": _texts(n, seed=3), "other": np.arange(n)}), path, **kw)
    rows = _rows(n, seed=4)
    got = take_pages(path, "text", rows)
    assert got is not None and got.equals(_expected(path, rows))


@pytest.mark.parametrize("kind", [pa.string(), pa.large_string(), pa.binary(), pa.large_binary(),
                                  pa.dictionary(pa.int32(), pa.string())])
def test_the_values_keep_the_shards_arrow_type_as_plain_values(tmp_path, kind):
    n = 2000
    texts = _texts(n, seed=5)
    path = tmp_path / "s.parquet"
    values = pa.array(texts, pa.string()).cast(kind)
    pq.write_table(pa.table({"text": values}), path, data_page_size=1024, write_batch_size=64)
    rows = _rows(n)
    got = take_pages(path, "text", rows)
    plain = kind.value_type if pa.types.is_dictionary(kind) else kind
    assert got is not None and got.type == plain
    assert got.to_pylist() == [texts[r].encode() if pa.types.is_binary(plain) or pa.types.is_large_binary(plain)
                               else texts[r] for r in rows]


def test_only_the_pages_holding_the_rows_are_decoded(tmp_path):
    """A page no wanted row is in is never decompressed: corrupt its data and the rows still come back."""
    n = 3000
    path = tmp_path / "s.parquet"
    texts = _texts(n, seed=6)
    pq.write_table(pa.table({"text": texts}), path, data_page_size=4096, use_dictionary=False, compression="zstd",
                   write_batch_size=64)
    meta = pq.ParquetFile(path).metadata.row_group(0).column(0)
    with open(path, "rb") as f:
        found = pages._pages(f, meta.data_page_offset, meta.total_compressed_size)
    assert len(found) > 10
    ends = np.cumsum([p.rows for p in found])
    victim = found[len(found) // 2]
    raw = bytearray(path.read_bytes())
    data_start = victim.offset + victim.size - 64  # inside the compressed data, after the header
    raw[data_start : data_start + 32] = b"\xff" * 32
    path.write_bytes(bytes(raw))
    with pytest.raises((OSError, pa.ArrowException)):
        pq.read_table(path)
    rows = np.array([0, int(ends[0]), n - 1])  # the first two pages and the last
    assert take_pages(path, "text", rows).to_pylist() == [texts[r] for r in rows]
    broken = int(ends[len(found) // 2]) - 1  # a row of the corrupted page: refused, never wrong
    assert take_pages(path, "text", [broken]) is None


@pytest.mark.parametrize("version", ["1.0", "2.0"])
def test_the_dictionary_page_is_read_only_for_pages_that_index_it(tmp_path, version):
    """Rows in the plain pages a writer falls back to once its dictionary is full need no dictionary: corrupt
    it and they still come back; rows of a page that indexes it are refused, never wrong."""
    n = 3000
    path = tmp_path / "s.parquet"
    texts = _texts(n, seed=8)
    pq.write_table(pa.table({"text": texts}), path, data_page_size=2048, dictionary_pagesize_limit=4096,
                   compression="zstd", write_batch_size=64, data_page_version=version)
    meta = pq.ParquetFile(path).metadata.row_group(0).column(0)
    with open(path, "rb") as f:
        found = pages._pages(f, meta.dictionary_page_offset, meta.total_compressed_size)
    data = [p for p in found if p.kind != 2]
    indexed = [bool(p.encodings & pages._DICTIONARY_ENCODINGS) for p in data]
    assert found[0].kind == 2 and indexed[0] and not indexed[-1]  # dictionary pages, then plain ones
    ends = np.cumsum([p.rows for p in data])
    plain = np.array([r for r in _rows(n) if not indexed[int(np.searchsorted(ends, r, side="right"))]])
    assert plain.shape[0] > 10
    raw = bytearray(path.read_bytes())
    at = found[0].offset + found[0].size - 64  # inside the dictionary page's compressed data
    raw[at : at + 32] = b"\xff" * 32
    path.write_bytes(bytes(raw))
    assert take_pages(path, "text", plain).to_pylist() == [texts[r] for r in plain]
    assert take_pages(path, "text", [0]) is None


@pytest.mark.parametrize("table, column", [
    (pa.table({"text": pa.array([["a", "b"], ["c"]] * 50)}), "text"),  # a list column
    (pa.table({"doc": pa.array([{"text": "a"}, {"text": "b"}] * 50)}), "doc.text"),  # a field of a struct
    (pa.table({"text": np.arange(100)}), "text"),  # not bytes
    (pa.table({"text": ["a"] * 100}), "body"),  # not there
], ids=["list", "struct-field", "integers", "missing"])
def test_columns_it_does_not_read_are_left_to_the_row_group_reader(tmp_path, table, column):
    path = tmp_path / "s.parquet"
    pq.write_table(table, path)
    assert take_pages(path, column, [1, 3]) is None


def test_rows_past_the_end_or_a_damaged_header_are_left_to_the_row_group_reader(tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": _texts(500)}), path, data_page_size=512, write_batch_size=64)
    assert take_pages(path, "text", [500]) is None and take_pages(path, "text", [-1]) is None
    assert take_pages(path, "text", []) is None
    meta = pq.ParquetFile(path).metadata.row_group(0).column(0)
    raw = bytearray(path.read_bytes())
    start = meta.dictionary_page_offset if meta.has_dictionary_page else meta.data_page_offset
    raw[start : start + 8] = b"\x00" * 8  # the first page header: an empty struct, no sizes
    path.write_bytes(bytes(raw))
    assert take_pages(path, "text", [3]) is None


def test_long_page_headers_are_read_in_more_than_one_step(tmp_path, monkeypatch):
    monkeypatch.setattr(pages, "HEADER_BYTES", 16)  # statistics make the headers longer than this
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": _texts(800, seed=8)}), path, data_page_size=1024, write_batch_size=64)
    rows = _rows(800)
    assert take_pages(path, "text", rows).equals(_expected(path, rows))


def test_the_thrift_writer_and_reader_agree():
    fields = [(1, pages._I32, 7), (2, pages._LIST, (pages._I32, list(range(20)))), (3, pages._BINARY, "name"),
              (40, pages._I64, -(1 << 40)), (41, pages._STRUCT, [(1, pages._STRUCT, [])])]
    out = bytearray()
    pages._write(out, pages._STRUCT, fields)
    assert pages._Reader(bytes(out)).struct() == {1: 7, 2: list(range(20)), 3: b"name", 40: -(1 << 40), 41: {1: {}}}
    with pytest.raises(pages._Short):
        pages._Reader(bytes(out[:-3])).struct()


def test_rows_of_a_shard_in_an_object_store(s3_server, bucket, tmp_path):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"text": _texts(2000, seed=9)}), path, data_page_size=1024, write_batch_size=64)
    s3_server.client().put_object(Bucket=bucket, Key="in/s.parquet", Body=path.read_bytes())
    rows = _rows(2000)
    got = take_pages(f"s3://{bucket}/in/s.parquet", "text", rows)
    assert got is not None and got.equals(_expected(path, rows))
