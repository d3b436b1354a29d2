"""The GPU backend's whole-table libcudf path without a GPU: ``tests/fake_pylibcudf.py`` (a host pylibcudf 26.10.2)
and ``tests/fake_cupy.py`` (stand-in device arrays).

Here, in this process: the fake is as strict as pylibcudf where gpu_dedup could go wrong, and
``strings.column_buffers`` reads pylibcudf strings columns (sliced, with nulls, INT32 or INT64 offsets) as it reads
Arrow arrays.  In a child process under Numba's CUDA simulator (the GPU backend needs it without a device):
``_gpu_table_cases.py``, the backend's read, take and write of whole tables and whole runs that take that path.
"""

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.backends import to_host
from gpu_dedup.backends.strings import column_buffers
from tests.fake_cupy import fake_cupy
from tests.fake_pylibcudf import install
from tests.simulated import run_simulated

CASES = Path(__file__).with_name("_gpu_table_cases.py")


def test_the_table_path_under_the_simulator_equals_the_host():
    run_simulated([CASES], at_least=20, env={"GPU_DEDUP_FAKE_DEVICE": None}, timeout=900)


@pytest.fixture
def plc(monkeypatch):
    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    return install(monkeypatch)


# ------------------------------------------------------------------ the fake is strict where gpu_dedup could err


def test_the_fake_is_found_as_pylibcudf_and_names_its_release(plc):
    import importlib.util

    import pylibcudf

    assert pylibcudf is plc and importlib.util.find_spec("pylibcudf") is not None and plc.__version__ == "26.10.2"


def test_the_fake_refuses_files_whose_parquet_schemas_differ(plc, tmp_path):
    pq.write_table(pa.table({"id": [1, 2], "text": ["a", "b"]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": ["x"], "text": ["c"]}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"id": pa.array([3], pa.int64()), "text": pa.array(["d"], pa.large_string())},
                            schema=pa.schema([pa.field("id", pa.int64(), False), pa.field("text", pa.large_string())])),
                   tmp_path / "c.parquet")
    src = plc.io.types.SourceInfo([str(tmp_path / n) for n in ("a.parquet", "b.parquet")])
    with pytest.raises(RuntimeError, match="same schema"):
        plc.io.parquet.read_parquet(plc.io.parquet.ParquetReaderOptions.builder(src).build())
    with pytest.raises(RuntimeError, match="same schema"):  # the columns read alone: the whole schema compared
        plc.io.parquet.read_parquet(plc.io.parquet.ParquetReaderOptions.builder(src).column_names(["text"]).build())
    opts = plc.io.parquet.ParquetReaderOptions.builder(src).column_names(["text"]).allow_mismatched_pq_schemas(True)
    got = plc.io.parquet.read_parquet(opts.build())
    assert got.column_names() == ["text"] and got.tbl.columns()[0].to_arrow().to_pylist() == ["a", "b", "c"]
    opts = plc.io.parquet.ParquetReaderOptions.builder(src).column_names(["id"]).allow_mismatched_pq_schemas(True)
    with pytest.raises(RuntimeError, match="mismatching"):  # the projected columns must still agree
        plc.io.parquet.read_parquet(opts.build())
    # nullability and the Arrow schema's large_string are not the Parquet schema: one table
    both = plc.io.types.SourceInfo([str(tmp_path / n) for n in ("a.parquet", "c.parquet")])
    got = plc.io.parquet.read_parquet(plc.io.parquet.ParquetReaderOptions.builder(both).build())
    assert got.tbl.num_rows() == 3 and got.column_names() == ["id", "text"]


def test_the_fake_leaves_out_a_missing_column_as_libcudf_does_unless_told(plc, tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "a.parquet")
    src = plc.io.types.SourceInfo([str(tmp_path / "a.parquet")])
    got = plc.io.parquet.read_parquet(plc.io.parquet.ParquetReaderOptions.builder(src).column_names(["nope", "text"])
                                      .build())
    assert got.column_names() == ["text"]
    opts = plc.io.parquet.ParquetReaderOptions.builder(src).column_names(["nope"]).ignore_missing_columns(False)
    with pytest.raises(RuntimeError, match="non-existent"):
        plc.io.parquet.read_parquet(opts.build())
    with pytest.raises(FileNotFoundError):
        plc.io.types.SourceInfo([str(tmp_path / "missing.parquet")])


def test_the_fake_warns_where_pylibcudf_26_10_deprecates(plc, tmp_path):
    pq.write_table(pa.table({"text": ["a", "b"]}), tmp_path / "a.parquet")
    b = plc.io.parquet.ParquetReaderOptions.builder(plc.io.types.SourceInfo([str(tmp_path / "a.parquet")]))
    with pytest.warns(FutureWarning, match="Use column_names"):
        b.columns(["text"])
    t = plc.io.parquet.read_parquet(b.build()).tbl
    mask = plc.Column.from_cuda_array_interface(sys.modules["cupy"].asarray(np.array([True, False])))
    with pytest.warns(FutureWarning, match="apply_retention_mask"):
        plc.stream_compaction.apply_boolean_mask(t, mask)
    assert plc.stream_compaction.apply_retention_mask(t, mask).columns()[0].to_arrow().to_pylist() == ["a"]


def test_from_cuda_array_interface_takes_device_arrays_only(plc):
    cp = sys.modules["cupy"]
    with pytest.raises(TypeError, match="__cuda_array_interface__"):
        plc.Column.from_cuda_array_interface(np.arange(3))  # a host array
    dev = cp.asarray(np.array([2, -1, 0], np.int64))
    col = plc.Column.from_cuda_array_interface(dev)
    assert col.type().id().name == "INT64" and col.size() == 3 and col.null_mask() is None
    assert np.array_equal(to_host(cp.asarray(col.data())).view(np.int64), [2, -1, 0])  # a view, no copy
    assert cp.moved["host_to_device_bytes"] == 24
    t = plc.Table([plc.Column.from_arrow(pa.array(["a", "b", "c"]))])
    got = plc.copying.gather(t, col, plc.copying.OutOfBoundsPolicy.DONT_CHECK)
    assert got.columns()[0].to_arrow().to_pylist() == ["c", "c", "a"]  # negative: from the end
    with pytest.raises(IndexError):
        plc.copying.gather(t, plc.Column.from_cuda_array_interface(cp.asarray(np.array([3]))),
                           plc.copying.OutOfBoundsPolicy.DONT_CHECK)


def test_the_fake_writer_refuses_nulls_in_a_column_said_not_nullable(plc, tmp_path):
    t = plc.Table([plc.Column.from_arrow(pa.array([1, None]))])
    meta = plc.io.types.TableInputMetadata(t)
    meta.column_metadata[0].set_name("x").set_nullability(False)
    sink = plc.io.types.SinkInfo([str(tmp_path / "a.parquet")])
    opts = plc.io.parquet.ParquetWriterOptions.builder(sink, t).metadata(meta).build()
    with pytest.raises(RuntimeError, match="nullability"):
        plc.io.parquet.write_parquet(opts)
    with pytest.raises(RuntimeError, match="metadata maps"):
        plc.io.parquet.ParquetWriterOptions.builder(sink, t).key_value_metadata([{}, {}])
    opts = plc.io.parquet.ParquetWriterOptions.builder(sink, t).build()  # no metadata: libcudf's names, a mask
    plc.io.parquet.write_parquet(opts)
    assert pq.read_schema(tmp_path / "a.parquet").field("_col0").nullable
    assert pq.read_metadata(tmp_path / "a.parquet").metadata is None  # no Arrow schema of its own


# ------------------------------------------------------------------ strings columns' buffers


def sliced(plc, col, lo: int, n: int, nulls: int):
    """Rows ``lo:lo + n`` of ``col`` as libcudf slices: the same buffers and children, a row offset."""
    return plc.Column(col.type(), n, col.data(), col.null_mask(), nulls, col.offset() + lo, col.children())


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("nulls", [False, True])
def test_column_buffers_of_a_pylibcudf_strings_column_equal_the_arrow_path(plc, monkeypatch, large, nulls):
    cp = sys.modules["cupy"]
    monkeypatch.setenv("LIBCUDF_LARGE_STRINGS_THRESHOLD", "0" if large else str(2**31 - 1))
    texts = ["first", None, "ünïcödé", "", "😀 emoji", None, "last one"]
    if not nulls:
        texts = [t or "x" for t in texts]
    arr = pa.array(texts, pa.string())
    col = plc.Column.from_arrow(arr)
    assert col.child(0).type().id().name == ("INT64" if large else "INT32")
    for lo, n in ((0, 7), (2, 4), (5, 2), (7, 0)):
        part = arr.slice(lo, n)
        got = column_buffers(sliced(plc, col, lo, n, part.null_count), cp)
        want = column_buffers(part)
        offsets, chars, valid = (to_host(a) if a is not None else None for a in got)
        assert offsets.dtype == np.int64 and np.array_equal(offsets - offsets[0], want[0] - want[0][0]), (lo, n)
        assert offsets[0] == (n and int(np.frombuffer(arr.buffers()[1], np.int32)[lo])), (lo, n)  # absolute
        assert bytes(chars[offsets[0]:offsets[-1]]) == bytes(want[1][want[0][0]:want[0][-1]]), (lo, n)
        assert (valid is None) == (want[2] is None) and (valid is None or np.array_equal(valid, want[2])), (lo, n)
        for a in got:  # views of the column's device memory, nothing copied to the host
            assert a is None or type(a).__module__.startswith("cupy")
    assert cp.moved == {"host_to_device_bytes": 0, "device_to_host_bytes": cp.moved["device_to_host_bytes"]}


def test_column_buffers_of_an_empty_and_an_all_null_strings_column(plc):
    cp = sys.modules["cupy"]
    empty = column_buffers(plc.Column.from_arrow(pa.array([], pa.string())), cp)
    assert to_host(empty[0]).tolist() == [0] and empty[1].shape == (0,) and empty[2] is None
    offsets, chars, valid = column_buffers(plc.Column.from_arrow(pa.array([None, None], pa.string())), cp)
    assert to_host(offsets).tolist() == [0, 0, 0] and chars.shape == (0,) and to_host(valid).tolist() == [False, False]
