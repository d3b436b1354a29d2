"""Content identity (what must hold across backends and writers): rows, order, string bytes, numeric bits,
nulls and the logical schema, where string / large_string and binary / large_binary are one type."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.storage.content import file_difference, schema_difference, table_difference


def _table(text_type=pa.string(), floats=(1.5, float("nan"), 0.0), meta=None) -> pa.Table:
    return pa.table({"id": pa.array([1, 2, 3], pa.int64()), "text": pa.array(["a", None, "ç"], text_type),
                     "x": pa.array(floats, pa.float64()),
                     "tags": pa.array([["u"], [], None], pa.list_(pa.string()))},
                    metadata=meta)


def test_large_and_plain_strings_are_one_logical_type():
    assert table_difference(_table(pa.large_string()), _table(pa.string())) is None
    assert schema_difference(pa.schema([("b", pa.large_binary())]), pa.schema([("b", pa.binary())])) is None
    assert schema_difference(pa.schema([("l", pa.large_list(pa.large_string()))]),
                             pa.schema([("l", pa.list_(pa.string()))])) is None


def test_other_types_nullability_order_and_own_metadata_count():
    assert "int32" in schema_difference(pa.schema([("id", pa.int32())]), pa.schema([("id", pa.int64())]))
    assert "not null" in schema_difference(pa.schema([pa.field("id", pa.int64(), False)]),
                                           pa.schema([("id", pa.int64())]))
    assert schema_difference(pa.schema([("b", pa.int8()), ("a", pa.int8())]),
                             pa.schema([("a", pa.int8()), ("b", pa.int8())])) == "the order of the fields"
    lost = schema_difference(pa.schema([("a", pa.int8())]), pa.schema([("a", pa.int8())], metadata={b"owner": b"x"}))
    assert lost == "schema metadata owner not kept"
    bookkeeping = pa.schema([("a", pa.int8())], metadata={b"pandas": b"{}", b"ARROW:schema": b"..."})
    assert schema_difference(pa.schema([("a", pa.int8())]), bookkeeping) is None


def test_values_are_compared_to_the_bit():
    assert table_difference(_table(), _table()) is None  # the same NaN
    assert "'x'" in table_difference(_table(floats=(1.5, float("nan"), -0.0)), _table())  # a signed zero
    other_nan = np.array([0x7FF8000000000001], np.uint64).view(np.float64)[0]
    assert "'x'" in table_difference(_table(floats=(1.5, other_nan, 0.0)), _table())  # another NaN payload
    swapped = _table().take([1, 0, 2])
    assert table_difference(swapped, _table()) is not None  # the row order counts
    assert table_difference(_table().slice(0, 2), _table()) == "rows: 2 and 3"


def test_parquet_files_of_other_bytes_with_the_same_content_are_identical(tmp_path):
    t = _table(meta={b"owner": b"someone"})
    pq.write_table(t, tmp_path / "a.parquet", compression="snappy")
    pq.write_table(t.cast(_table(pa.large_string(), meta={b"owner": b"someone"}).schema), tmp_path / "b.parquet",
                   compression="zstd", row_group_size=1, use_dictionary=False)
    assert (tmp_path / "a.parquet").read_bytes() != (tmp_path / "b.parquet").read_bytes()
    assert file_difference(tmp_path / "a.parquet", tmp_path / "b.parquet") is None
    pq.write_table(t.replace_schema_metadata(None), tmp_path / "c.parquet")
    assert "owner" in file_difference(tmp_path / "c.parquet", tmp_path / "a.parquet")


def test_other_files_are_compared_byte_for_byte(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b'{"a": 1}\n')
    (tmp_path / "b.jsonl").write_bytes(b'{"a":1}\n')
    assert file_difference(tmp_path / "a.jsonl", tmp_path / "b.jsonl") == "bytes differ"
    assert file_difference(tmp_path / "a.jsonl", tmp_path / "a.jsonl") is None
