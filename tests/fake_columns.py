"""A stand-in for a cuDF strings column's pylibcudf view, on host buffers.

``cudf.Series.to_pylibcudf()[0]`` of a strings column keeps the chars in
``data()``, the offsets (int32 or int64) as ``children()[0]``, a row offset and
an Arrow validity bitmap; :func:`gpu_dedup.backends.strings.column_buffers`
reads exactly these.  Here the buffers are NumPy arrays (``xp.asarray`` stands
in for the CUDA array interface), so the CPU suite and the CUDA simulator run
the buffer handoff; the ``gpu`` tests run it on real cuDF columns.
"""

import numpy as np
import pyarrow as pa


class FakeDataType:
    def __init__(self, name):
        self._name = name

    def id(self):
        return type("TypeId", (), {"name": self._name})()


class FakePlcColumn:
    """What ``cudf.Series.to_pylibcudf()[0]`` gives for a strings column: chars in ``data()``, the
    offsets column as ``children()[0]``, a row offset, an Arrow validity bitmap.  Buffers are NumPy
    here (``np.asarray`` stands in for the CUDA array interface)."""

    def __init__(self, offsets, chars, offset, size, mask=None, nulls=0):
        self._offsets, self._chars, self._offset, self._size = offsets, chars, offset, size
        self._mask, self._nulls = mask, nulls

    def size(self):
        return self._size

    def __len__(self):  # as a cudf.Series has
        return self._size

    def offset(self):
        return self._offset

    def data(self):
        return self._chars

    def null_mask(self):
        return self._mask

    def null_count(self):
        return self._nulls

    def type(self):
        return FakeDataType("STRING")

    def children(self):
        off = self._offsets
        child = FakePlcColumn(None, off.view(np.uint8), 0, off.shape[0])
        child.type = lambda: FakeDataType("INT64" if off.dtype == np.int64 else "INT32")
        return [child]


def fake_plc_column(arr: pa.Array) -> FakePlcColumn:
    """The pylibcudf-like view of Arrow string array ``arr`` (its own buffers, row offset and nulls)."""
    validity, offsets_buf, data_buf = arr.buffers()
    width = np.int64 if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type) else np.int32
    mask = np.frombuffer(validity, np.uint8) if validity is not None else None
    data = np.frombuffer(data_buf, np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return FakePlcColumn(np.frombuffer(offsets_buf, width), data, arr.offset, len(arr), mask, arr.null_count)
