"""Arrow arrays from NumPy buffers and back, without pandas: the same arrays as ``pa.array`` / ``to_numpy``, and
a whole run that never imports pandas."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array, null_mask, numpy_array, string_array

NUMERIC = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.float32, np.float64]


@pytest.mark.parametrize("dtype", NUMERIC)
def test_numbers_equal_pa_array_both_ways(dtype):
    values = (np.arange(-5, 15) % 7 * 3).astype(dtype)
    arr = arrow_array(values)
    assert arr.equals(pa.array(values)) and arr.null_count == 0
    back = numpy_array(arr)
    assert back.dtype == values.dtype and np.array_equal(back, values)
    sliced = arr.slice(3, 9)  # an offset into the buffer
    assert np.array_equal(numpy_array(sliced), values[3:12])


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 64, 65])
def test_bools_pack_and_unpack_at_every_length_and_offset(n):
    values = (np.arange(n) * 7 % 3 == 1)
    arr = arrow_array(values)
    assert arr.equals(pa.array(values, pa.bool_()))
    assert np.array_equal(numpy_array(arr), values)
    for at in range(min(n, 9)):
        assert np.array_equal(numpy_array(arr.slice(at)), values[at:])
    assert arrow_array(values.astype(np.int64), pa.bool_()).equals(arr)  # numbers taken as truth values


def test_a_type_casts_as_numpy_does_and_non_contiguous_values_are_copied():
    values = np.arange(10, dtype=np.int32)
    assert arrow_array(values, pa.int64()).equals(pa.array(values.astype(np.int64)))
    assert arrow_array([1, 2, 3], pa.float32()).equals(pa.array([1, 2, 3], pa.float32()))
    assert arrow_array(values[::2]).equals(pa.array(values[::2]))


def test_chunked_and_refused_inputs():
    chunked = pa.chunked_array([arrow_array(np.arange(3)), arrow_array(np.arange(3, 5))])
    assert np.array_equal(numpy_array(chunked), np.arange(5))
    assert numpy_array(pa.chunked_array([], pa.int64())).shape == (0,)
    with pytest.raises(ValueError, match="without nulls"):
        numpy_array(pa.array([1, None]))
    with pytest.raises(TypeError, match="not string"):
        numpy_array(pa.array(["a"]))
    with pytest.raises(TypeError, match="1-d numeric or bool"):
        arrow_array(np.array(["a"]))


def test_strings_empty_arrays_and_null_masks():
    codes = np.array([2, 0, 1, 1, 0])
    got = string_array(["kept", "exact", "néar"], codes)
    assert got.equals(pa.array(["néar", "kept", "exact", "exact", "kept"], pa.string()))
    assert string_array(["a"], np.zeros(0, np.int64), pa.large_string()).equals(pa.array([], pa.large_string()))
    for t in (pa.int64(), pa.large_string(), pa.bool_()):
        assert empty_array(t).equals(pa.array([], t))
    col = pa.chunked_array([pa.array(["a", None]), pa.array([None, "b", "c"]).slice(1)])
    assert np.array_equal(null_mask(col), [False, True, False, False])


def test_a_run_imports_no_pandas(tmp_path):
    """pyarrow imports pandas (0.2 to 0.4 s) on its first NumPy conversion; a run, with shards or a removal list,
    on text that takes normalization's slow path and has a null, makes none."""
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    table = planted_corpus(n_docs=300, n_clusters=30, seed=3).table.select(["id", "text"])
    odd = ["ﬁnal Ⅻ ｆｕｌｌ width", None, "Cafe\u0301 \ud7ff ok"]
    odd = pa.array(odd + table.column("text").to_pylist()[len(odd):])
    write_shards(table.set_column(1, "text", odd), tmp_path / "in", shards=3)
    code = ("import sys, json; from gpu_dedup.cli import main; "
            "codes = [main([\"run\", sys.argv[1], \"-o\", sys.argv[2] + m, \"-q\", *extra]) "
            "for m, extra in (('/shards', []), ('/list', ['--no-shards']))]; "
            "print(json.dumps([codes, 'pandas' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "in"), str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    codes, imported = json.loads(out.stdout.strip().splitlines()[-1])
    assert codes == [0, 0] and not imported
    assert (tmp_path / "out/shards/_SUCCESS").exists() and (tmp_path / "out/list/_SUCCESS").exists()
