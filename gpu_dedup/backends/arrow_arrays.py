"""Arrow arrays made from NumPy buffers without ``pa.array``.

``pa.array`` (and every pyarrow call that converts a NumPy array or a list, such as ``Table.take`` of a
NumPy array) imports pandas on its first call where pandas is installed: 0.2 to 0.4 s that a run spends
for nothing, since a one-process run and a cluster's client build no pandas object. These helpers wrap
the array's memory as an Arrow buffer instead (no copy, as ``pa.array`` of a NumPy array does not copy).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

_TYPES = {np.dtype(t): f() for t, f in (
    (np.int8, pa.int8), (np.int16, pa.int16), (np.int32, pa.int32), (np.int64, pa.int64),
    (np.uint8, pa.uint8), (np.uint16, pa.uint16), (np.uint32, pa.uint32), (np.uint64, pa.uint64),
    (np.float32, pa.float32), (np.float64, pa.float64))}
_DTYPES = {t: d for d, t in _TYPES.items()}


def arrow_array(values, type: pa.DataType | None = None) -> pa.Array:
    """An Arrow array of the 1-d NumPy ``values`` (numbers or bools), with no nulls.  ``type``, where given,
    is a numeric Arrow type the values are cast to first (NumPy's rules: ``arrow_array(x, pa.int64())`` is
    ``x.astype(np.int64)``) or ``pa.bool_()``."""
    values = np.asarray(values)
    if type is not None and not pa.types.is_boolean(type):
        values = values.astype(_DTYPES[type], copy=False)
    if values.dtype == np.bool_ or (type is not None and pa.types.is_boolean(type)):
        bits = np.packbits(values.astype(np.bool_, copy=False), bitorder="little")
        return pa.Array.from_buffers(pa.bool_(), values.shape[0], [None, pa.py_buffer(bits)])
    values = np.ascontiguousarray(values)
    if values.ndim != 1 or values.dtype not in _TYPES:
        raise TypeError(f"arrow_array takes 1-d numeric or bool NumPy arrays, not {values.dtype} of shape "
                        f"{values.shape}")
    return pa.Array.from_buffers(_TYPES[values.dtype], values.shape[0], [None, pa.py_buffer(values)])


def empty_array(type: pa.DataType) -> pa.Array:
    """An empty Arrow array of ``type`` (``pa.array([], type)`` without pandas)."""
    return pa.nulls(0, type)


def string_array(labels: list[str], codes, type: pa.DataType = pa.string()) -> pa.Array:
    """``labels[codes[i]]`` for every row, as Arrow strings of ``type`` (a few labels, many rows)."""
    raw = [s.encode() for s in labels]
    offsets = np.zeros(len(raw) + 1, np.int64 if type in (pa.large_string(), pa.large_binary()) else np.int32)
    np.cumsum([len(b) for b in raw], out=offsets[1:])
    small = pa.Array.from_buffers(type, len(raw), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raw))])
    return small.take(arrow_array(np.asarray(codes, np.int64)))


def numpy_array(values) -> np.ndarray:
    """The values of an Arrow array or chunked array of numbers or bools without nulls, as NumPy
    (``to_numpy`` without pandas: a view of a single chunk's numbers, else a copy)."""
    if isinstance(values, pa.ChunkedArray):
        parts = [numpy_array(c) for c in values.chunks]
        return np.concatenate(parts) if parts else np.zeros(0, _DTYPES.get(values.type, np.bool_))
    if values.null_count:
        raise ValueError(f"numpy_array takes arrays without nulls; this {values.type} array has "
                         f"{values.null_count}")
    n, at = len(values), values.offset
    if pa.types.is_boolean(values.type):
        bits = np.frombuffer(values.buffers()[1], np.uint8)
        return np.unpackbits(bits, count=at + n, bitorder="little")[at:].astype(np.bool_)
    if values.type not in _DTYPES:
        raise TypeError(f"numpy_array takes numeric or bool Arrow arrays, not {values.type}")
    return np.frombuffer(values.buffers()[1], _DTYPES[values.type], count=n, offset=at * values.type.byte_width)


def null_mask(column) -> np.ndarray:
    """Which rows of an Arrow array or chunked array are null, as a NumPy bool array (``column.is_null()``)."""
    return numpy_array(column.is_null())
