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


VIEWS = {pa.string_view(): pa.large_string(), pa.binary_view(): pa.large_binary()}  # the same bytes, not as views


def plain_type(t: pa.DataType) -> pa.DataType:
    """``t`` with every view type in it (string_view, binary_view, at any depth) as the large type of the same
    values: Arrow's filter and take have no kernels for views (pyarrow 26)."""
    if t in VIEWS:
        return VIEWS[t]
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        inner = plain_type(t.value_type)
        if inner == t.value_type:
            return t
        field = t.value_field.with_type(inner)
        if pa.types.is_fixed_size_list(t):
            return pa.list_(field, t.list_size)
        return pa.large_list(field) if pa.types.is_large_list(t) else pa.list_(field)
    if pa.types.is_struct(t):
        fields = [t.field(i) for i in range(t.num_fields)]
        plain = [f.with_type(plain_type(f.type)) for f in fields]
        return t if plain == fields else pa.struct(plain)
    if pa.types.is_map(t):
        key, item = plain_type(t.key_type), plain_type(t.item_type)
        return t if (key, item) == (t.key_type, t.item_type) else pa.map_(key, item, t.keys_sorted)
    return t


def filter_rows(data, mask: pa.Array):
    """``data.filter(mask)`` of a table or record batch, also where columns hold view types: those are filtered as
    their large types and cast back, so the kept rows keep the schema."""
    plain = [plain_type(f.type) for f in data.schema]
    if all(p == f.type for p, f in zip(plain, data.schema)):
        return data.filter(mask)
    cols = [c.filter(mask) if p == c.type else c.cast(p).filter(mask).cast(c.type) for c, p in zip(data.columns, plain)]
    make = pa.RecordBatch.from_arrays if isinstance(data, pa.RecordBatch) else pa.Table.from_arrays
    return make(cols, schema=data.schema)
