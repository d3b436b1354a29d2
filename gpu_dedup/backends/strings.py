"""Zero-copy views of Arrow string arrays as (offsets, bytes) for the kernels.

The same two buffers describe a cuDF string column on the device (an int32 or
int64 offsets child and a uint8 chars buffer), so :class:`StringBuffers` holds
either NumPy arrays (host) or CuPy arrays (device); :func:`column_buffers`
takes them out of an Arrow array or a cuDF / pylibcudf column without copying.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import ByArrays, array_module, get_backend, to_host
from gpu_dedup.backends.arrow_arrays import arrow_array, numpy_array

@dataclass(frozen=True)
class StringBuffers:
    """``offsets`` (int64, n + 1, absolute positions into ``data``) and ``data`` (uint8): NumPy arrays
    on the host, CuPy arrays on the device."""

    offsets: np.ndarray
    data: np.ndarray

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    @property
    def lengths(self) -> np.ndarray:
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1] - self.offsets[0])


def as_arrow_strings(texts) -> pa.Array:
    """Coerce a pyarrow (chunked) array, pandas Series, NumPy array or list of str to one Arrow array."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    elif not isinstance(texts, pa.Array):
        texts = pa.array(texts, type=pa.large_string())
    if not (
        pa.types.is_string(texts.type)
        or pa.types.is_large_string(texts.type)
        or pa.types.is_binary(texts.type)
        or pa.types.is_large_binary(texts.type)
    ):
        raise TypeError(f"expected a string column, got Arrow type {texts.type}")
    return texts


def string_buffers(texts) -> StringBuffers:
    """Offsets and bytes of an Arrow string/binary array (nulls read as empty)."""
    arr = as_arrow_strings(texts)
    if arr.null_count:  # Arrow lets a null slot span bytes: make every null read as empty
        arr = arr.fill_null(pa.scalar(b"" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) else "", arr.type))
    n = len(arr)
    large = pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)
    _, off_buf, data_buf = arr.buffers()
    if off_buf is None:  # zero-length array
        return StringBuffers(np.zeros(1, np.int64), np.zeros(0, np.uint8))
    offsets = np.frombuffer(off_buf, dtype=np.int64 if large else np.int32)[arr.offset : arr.offset + n + 1]
    offsets = offsets.astype(np.int64)
    data = np.frombuffer(data_buf, dtype=np.uint8) if data_buf is not None else np.zeros(0, np.uint8)
    return StringBuffers(offsets, data)


def arrow_strings(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A ``large_string`` Arrow array over host buffers ``offsets`` (n + 1) and ``data`` (no copy)."""
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    if offsets.shape[0] and offsets[0] != 0:
        data, offsets = data[offsets[0]:], offsets - offsets[0]
    n = offsets.shape[0] - 1
    return pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def take_arrow(strings: StringBuffers, rows) -> pa.Array:
    """The strings ``rows`` (any order, repeats allowed) of ``strings`` as host Arrow (``large_string``): device
    strings are gathered on the device first (:meth:`~gpu_dedup.backends.gpu.GPUBackend.take_strings`), so only
    those rows' bytes cross to the host, not all of ``strings``."""
    return _TAKE.pick(array_module(strings.offsets))(strings, np.asarray(rows, np.int64))


def _take_host(strings: StringBuffers, rows: np.ndarray) -> pa.Array:
    return arrow_strings(strings.offsets, strings.data).take(pa.array(rows, pa.int64()))


def _take_device(strings: StringBuffers, rows: np.ndarray) -> pa.Array:
    picked = get_backend("gpu").take_strings(strings, rows)
    return arrow_strings(to_host(picked.offsets), to_host(picked.data))


_TAKE = ByArrays(_take_device, host=_take_host)


def _bit_valid(xp, mask, offset: int, n: int):
    """Bool per row from an Arrow/cuDF validity bitmap (least significant bit first)."""
    idx = xp.arange(offset, offset + n, dtype=xp.int64)
    return ((mask[idx >> 3] >> (idx & 7).astype(xp.uint8)) & 1).astype(bool)


def _bytes_view(buf, xp):
    """A uint8 ``xp`` view of a column buffer: through the CUDA array interface (pylibcudf's
    ``gpumemoryview``), or from its ``ptr`` / ``size`` for a buffer without one (CuPy only)."""
    try:
        arr = xp.asarray(buf)
    except (TypeError, ValueError):
        if not hasattr(buf, "ptr") or xp.__name__ != "cupy":
            raise
        size = int(getattr(buf, "size", getattr(buf, "nbytes", 0)))
        mem = xp.cuda.UnownedMemory(int(buf.ptr), size, buf)
        arr = xp.ndarray((size,), dtype=xp.uint8, memptr=xp.cuda.MemoryPointer(mem, 0))
    return arr.reshape(-1).view(xp.uint8)


def column_buffers(column, xp=np):
    """``(offsets, chars, valid)`` of a string column without copying its bytes.

    ``column``: a pyarrow (chunked) array (host buffers, NumPy), or a cuDF Series or a
    pylibcudf Column (device buffers, viewed as ``xp`` arrays through the CUDA array
    interface: ``Series.to_pylibcudf()`` is zero-copy; a strings column keeps its chars in
    ``data()`` and its offsets in ``child(0)``, int32 or int64).  ``offsets`` are absolute
    positions into ``chars`` (the column's row offset applied); ``valid`` is a bool
    array, or None when the column has no nulls.
    """
    if isinstance(column, RawText):
        return column.offsets, column.chars, column.valid
    if isinstance(column, (pa.Array, pa.ChunkedArray)):
        arr = as_arrow_strings(column)
        buf = string_buffers(arr)  # nulls read as empty
        valid = None
        if arr.null_count:
            valid = numpy_array(arr.is_valid())
        return buf.offsets, buf.data, valid
    if hasattr(column, "to_pylibcudf"):  # a cudf.Series
        column = column.to_pylibcudf()[0]
    n, offset = column.size(), column.offset()
    kids = column.children()
    valid = None
    if n and column.null_count():
        valid = _bit_valid(xp, _bytes_view(column.null_mask(), xp), offset, n)
    if n == 0 or not kids:  # libcudf may leave a column of only nulls (or of no rows) without children
        return xp.zeros(n + 1, dtype=xp.int64), xp.zeros(0, dtype=xp.uint8), valid
    off_col = kids[0]
    type_id = off_col.type().id()
    width = np.dtype(np.int64 if "INT64" in str(getattr(type_id, "name", type_id)) else np.int32)
    offsets = _bytes_view(off_col.data(), xp).view(width)[offset : offset + n + 1].astype(xp.int64)
    chars = column.data()
    chars = _bytes_view(chars, xp) if chars is not None else xp.zeros(0, dtype=xp.uint8)
    return offsets, chars, valid


@dataclass(frozen=True)
class RawText:
    """The texts of one or more string columns as read (not normalized), as one buffer set:
    ``offsets`` (int64, n + 1, absolute positions into ``chars``), ``chars`` (uint8) and ``valid``
    (bool per row, or None when no row is null); NumPy or CuPy arrays.  ``owner``: the columns
    the buffers may view (kept alive with them)."""

    offsets: np.ndarray
    chars: np.ndarray
    valid: np.ndarray | None
    owner: object = None

    def __len__(self) -> int:
        return self.offsets.shape[0] - 1

    def null(self, xp=np):
        """Bool per row: the row's text is null."""
        n = len(self)
        return xp.zeros(n, dtype=bool) if self.valid is None else ~self.valid


def raw_text(columns, xp=np) -> RawText:
    """The string columns ``columns`` (cuDF Series, pylibcudf Columns or Arrow arrays) one after
    another as one :class:`RawText` of ``xp`` arrays.  One column is viewed in place; several are
    concatenated (one copy of their bytes, one step per column)."""
    parts = [column_buffers(c, xp) for c in columns]
    if len(parts) == 1:
        offsets, chars, valid = parts[0]
        return RawText(offsets, chars, valid, owner=tuple(columns))
    offs, chunks, valids, base = [], [], [], 0
    any_null = any(valid is not None for _, _, valid in parts)
    for offsets, chars, valid in parts:  # one step per column (a shard)
        n = offsets.shape[0] - 1
        if n == 0:
            continue
        lo, hi = int(offsets[0]), int(offsets[-1])
        offs.append(offsets[:-1] - lo + base)
        chunks.append(chars[lo:hi])
        if any_null:
            valids.append(valid if valid is not None else xp.ones(n, dtype=bool))
        base += hi - lo
    offs.append(xp.asarray([base], dtype=xp.int64))
    chars = xp.concatenate(chunks) if chunks else xp.zeros(0, dtype=xp.uint8)
    valid = (xp.concatenate(valids) if valids else xp.zeros(0, dtype=bool)) if any_null else None
    return RawText(xp.concatenate(offs), chars, valid)


def raw_arrow(raw: RawText) -> pa.Array:
    """A host :class:`RawText` as a ``large_string`` Arrow array (nulls where ``valid`` is False)."""
    arr = arrow_strings(np.asarray(raw.offsets), np.asarray(raw.chars))
    if raw.valid is None or len(arr) == 0:
        return arr
    bitmap = arrow_array(raw.valid, pa.bool_()).buffers()[1]
    _, off_buf, data_buf = arr.buffers()
    return pa.Array.from_buffers(pa.large_string(), len(arr), [bitmap, off_buf, data_buf])


def is_string_column(column) -> bool:
    """Whether a cuDF Series or pylibcudf Column holds strings (its type id is STRING)."""
    try:
        if hasattr(column, "to_pylibcudf"):
            column = column.to_pylibcudf()[0]
        tid = column.type().id()
    except (AttributeError, TypeError, ValueError):
        return False
    return str(getattr(tid, "name", tid)).split(".")[-1] == "STRING"


def arrow_column(column, rows=None) -> pa.Array:
    """A string column (cuDF Series, pylibcudf Column or Arrow array), or its rows ``rows``, as a
    host ``large_string`` Arrow array.  A cuDF Series gathers the rows on the device and copies only
    those (``Series.iloc``, ``to_arrow``)."""
    if hasattr(column, "to_arrow") and hasattr(column, "iloc"):  # a cudf.Series
        part = column if rows is None else column.iloc[np.asarray(rows, np.int64)]
        return as_arrow_strings(part.to_arrow()).cast(pa.large_string())
    arr = raw_arrow(raw_text([column]))
    return arr if rows is None else arr.take(arrow_array(rows, pa.int64()))


LENGTH_CHUNK = 1 << 26  # bytes per step of :func:`code_point_lengths` (bounds its scratch to 8x this)


def code_point_lengths(raw: RawText, xp=np, chunk: int = LENGTH_CHUNK):
    """Code points of each text (-1 for nulls), as Arrow's ``utf8_length`` counts them (every
    byte that is not a UTF-8 continuation byte ``10xxxxxx``), in steps of about ``chunk`` bytes."""
    n = len(raw)
    out = xp.zeros(n, dtype=xp.int64)
    if n == 0:
        return out
    lo, hi = int(raw.offsets[0]), int(raw.offsets[-1])
    cuts = xp.searchsorted(raw.offsets, xp.arange(lo, hi, max(1, chunk), dtype=xp.int64), side="right") - 1
    bounds = sorted(set(cuts.tolist() + [0, n]))
    for a, b in zip(bounds[:-1], bounds[1:]):  # one step per chunk of bytes, not per document
        if b <= a:
            continue
        off = raw.offsets[a : b + 1]
        start = int(off[0])
        starts = ((raw.chars[start : int(off[-1])] & 0xC0) != 0x80).astype(xp.int64)
        total = xp.zeros(starts.shape[0] + 1, dtype=xp.int64)
        total[1:] = xp.cumsum(starts)
        rel = off - start
        out[a:b] = total[rel[1:]] - total[rel[:-1]]
    if raw.valid is not None:
        out = xp.where(raw.valid, out, -1)
    return out
