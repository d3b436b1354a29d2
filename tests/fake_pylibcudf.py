"""A host stand-in for pylibcudf: the subset gpu_dedup calls, with pylibcudf 26.10.2's names, signatures and
semantics, computed with pyarrow and NumPy.

gpu_dedup's whole-table libcudf path (``GPUBackend.read_table`` / ``write_table``, ``DeviceTable.take``,
``storage.write_shards_on_device``, ``strings.column_buffers`` on pylibcudf Columns) runs only where pylibcudf
imports, so CI never ran it.  :func:`fake_pylibcudf` returns a module named ``pylibcudf`` that lets it run on
the CPU, under Numba's CUDA simulator with ``tests/fake_cupy.py``'s stand-in device arrays (:func:`install`).
It checks gpu_dedup's **plumbing**: the calls, their arguments and options, the buffer layouts gpu_dedup reads,
the metadata it hands the writer and the files that come back; not libcudf's own behaviour (its encodings,
pages and row groups, its type mapping beyond the types below, its errors' exact words, its speed).

Modelled as pylibcudf 26.10.2 / libcudf 26.10 have them (the wheel's ``.pyi`` / ``.pyx``, libcudf's headers and
sources):

- ``Column``: the public constructor, ``type().id()`` (a ``TypeId``: the real names and values), ``size()``,
  ``offset()``, ``null_count()``, ``null_mask()``, ``data()``, ``children()``, ``child(i)``, ``to_arrow()``,
  ``from_cuda_array_interface(obj)``, and ``from_arrow(arr)`` (for tests to make columns).  Buffers are
  ``gpumemoryview`` objects of fresh "device" memory (``rmm.DeviceBuffer``'s stand-in: host memory described by a
  ``__cuda_array_interface__`` of bytes, ``|u1``), so ``cupy.asarray`` views them and NumPy does not.  A column
  has a null mask only where it has nulls (``Column.from_libcudf``); a strings column keeps its chars in
  ``data()`` and its offsets as ``children()[0]``: INT32, or INT64 where its chars reach
  ``LIBCUDF_LARGE_STRINGS_THRESHOLD`` bytes (environment; by default 2**31 - 1: libcudf's large-strings layout;
  0 gives INT64 offsets everywhere); an empty one has no children.  Lists: an INT32 offsets child, then the
  values; structs: a child per field, null wherever the struct is (``make_structs_column`` pushes a struct's
  nulls down into its fields); a sliced column keeps its children whole and applies ``offset()``, as libcudf.  ``from_cuda_array_interface`` takes only objects with that interface (a host NumPy array is refused
  with pylibcudf's ``TypeError``), 1-D, C-contiguous, unmasked.
- ``Table(columns, num_rows=None)``, ``num_rows()``, ``num_columns()``, ``columns()``.
- ``io.types``: ``SourceInfo`` (a missing file: ``FileNotFoundError``), ``SinkInfo``, ``PartitionInfo``,
  ``CompressionType``, ``TableInputMetadata(table).column_metadata`` (live references) of ``ColumnInMetadata``
  (``set_name``, ``set_nullability``, ``child(i)``, ``get_name``; children mirror the column's: a list's
  ``child(0)`` its offsets, ``child(1)`` its values; a struct's ``child(i)`` field i), ``TableWithMetadata``.
- ``io.parquet``: the reader options builder (``column_names``; ``columns``, which 26.10 deprecates with a
  ``FutureWarning``; ``allow_mismatched_pq_schemas``; ``ignore_missing_columns``, on by default: a projected
  column no file has is left out silently, as libcudf does) and ``read_parquet``: all files' rows in file order;
  files whose Parquet schemas differ (in anything but nullability) raise libcudf's ``RuntimeError`` unless
  mismatched schemas are allowed, and then the projected columns must still agree.  The writer options builder
  (``metadata`` copies the metadata; ``key_value_metadata`` and ``set_partitions`` take one per sink;
  ``compression``, SNAPPY by default; ``utc_timestamps``, on by default) and ``write_parquet``: a file per sink
  holding its partition's rows, column names from the metadata (libcudf's ``_col{i}`` / ``{parent}_{i}`` where
  unset), each column ``required`` unless the metadata says nullable or (nullability unset) it has a null mask,
  a column with nulls said not nullable refused; lists as ``list`` / ``element`` groups; timestamps
  UTC-adjusted (``isAdjustedToUTC``) unless ``utc_timestamps(False)``; the file's key-value metadata as given
  and no Arrow schema of its own (an ``ARROW:schema`` key given is written as given).
- ``copying.gather`` (``OutOfBoundsPolicy``; negative indices from the end; an index out of bounds raises
  here, where libcudf's DONT_CHECK would read garbage) and ``stream_compaction.apply_retention_mask`` (and
  ``apply_boolean_mask``, which 26.10 deprecates with a ``FutureWarning``).

Not modelled (gpu_dedup does not call them): other types (decimals, times, fixed-size binary, ...: the reader
raises ``NotImplementedError``; durations are read, but how libcudf writes them, as Parquet TIME types, is not:
the writer raises ``NotImplementedError``), binary columns as anything but strings, row selection, filters, chunked reading and writing, streams and memory resources
(accepted, ignored), remote sources, 2-D device arrays.
"""

from __future__ import annotations

import copy
import enum
import importlib.machinery
import io
import os
import types
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

VERSION = "26.10.2"  # the pylibcudf release whose API this follows
ROW_GROUP_ROWS = 1_000_000  # libcudf's default_row_group_size_rows


class TypeId(enum.IntEnum):
    """``pylibcudf.types.TypeId`` (libcudf's ``type_id``): names and values."""

    EMPTY = 0
    INT8 = 1
    INT16 = 2
    INT32 = 3
    INT64 = 4
    UINT8 = 5
    UINT16 = 6
    UINT32 = 7
    UINT64 = 8
    FLOAT32 = 9
    FLOAT64 = 10
    BOOL8 = 11
    TIMESTAMP_DAYS = 12
    TIMESTAMP_SECONDS = 13
    TIMESTAMP_MILLISECONDS = 14
    TIMESTAMP_MICROSECONDS = 15
    TIMESTAMP_NANOSECONDS = 16
    DURATION_DAYS = 17
    DURATION_SECONDS = 18
    DURATION_MILLISECONDS = 19
    DURATION_MICROSECONDS = 20
    DURATION_NANOSECONDS = 21
    DICTIONARY32 = 22
    STRING = 23
    LIST = 24
    DECIMAL32 = 25
    DECIMAL64 = 26
    DECIMAL128 = 27
    STRUCT = 28
    NUM_TYPE_IDS = 29


class DataType:
    """``pylibcudf.types.DataType``: a type id (and a decimal scale, unused here)."""

    def __init__(self, type_id, scale: int = 0):
        self._id = TypeId(type_id)
        self._scale = int(scale)

    def id(self) -> TypeId:
        return self._id

    def scale(self) -> int:
        return self._scale

    def __eq__(self, other) -> bool:
        return isinstance(other, DataType) and (self._id, self._scale) == (other._id, other._scale)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<DataType(type_id={self._id.name}, scale={self._scale})>"


# fixed-width types: type id <-> NumPy dtype of the values in the data buffer (BOOL8: a byte per value)
_FIXED = {TypeId.INT8: "i1", TypeId.INT16: "i2", TypeId.INT32: "i4", TypeId.INT64: "i8", TypeId.UINT8: "u1",
          TypeId.UINT16: "u2", TypeId.UINT32: "u4", TypeId.UINT64: "u8", TypeId.FLOAT32: "f4", TypeId.FLOAT64: "f8",
          TypeId.BOOL8: "b1", TypeId.TIMESTAMP_DAYS: "i4", TypeId.TIMESTAMP_SECONDS: "i8",
          TypeId.TIMESTAMP_MILLISECONDS: "i8", TypeId.TIMESTAMP_MICROSECONDS: "i8",
          TypeId.TIMESTAMP_NANOSECONDS: "i8", TypeId.DURATION_SECONDS: "i8", TypeId.DURATION_MILLISECONDS: "i8",
          TypeId.DURATION_MICROSECONDS: "i8", TypeId.DURATION_NANOSECONDS: "i8"}
_UNITS = ("s", "ms", "us", "ns")
_ARROW_FIXED = {TypeId.INT8: pa.int8(), TypeId.INT16: pa.int16(), TypeId.INT32: pa.int32(), TypeId.INT64: pa.int64(),
                TypeId.UINT8: pa.uint8(), TypeId.UINT16: pa.uint16(), TypeId.UINT32: pa.uint32(),
                TypeId.UINT64: pa.uint64(), TypeId.FLOAT32: pa.float32(), TypeId.FLOAT64: pa.float64(),
                TypeId.BOOL8: pa.bool_(), TypeId.TIMESTAMP_DAYS: pa.date32(),
                **{TypeId(TypeId.TIMESTAMP_SECONDS + k): pa.timestamp(u) for k, u in enumerate(_UNITS)},
                **{TypeId(TypeId.DURATION_SECONDS + k): pa.duration(u) for k, u in enumerate(_UNITS)}}
_TYPESTR = {"u1": TypeId.UINT8, "u2": TypeId.UINT16, "u4": TypeId.UINT32, "u8": TypeId.UINT64, "i1": TypeId.INT8,
            "i2": TypeId.INT16, "i4": TypeId.INT32, "i8": TypeId.INT64, "f4": TypeId.FLOAT32, "f8": TypeId.FLOAT64,
            "b1": TypeId.BOOL8}  # pylibcudf's _datatype_from_dtype_desc (the datetime kinds left out)


# ------------------------------------------------------------------ device memory


class _DeviceBuffer:
    """``rmm.DeviceBuffer``'s stand-in: bytes in "device memory" (host memory here), described by a CUDA array
    interface of ``|u1`` as RMM's is."""

    def __init__(self, data: np.ndarray):
        self._data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": (self._data.shape[0],), "strides": None, "typestr": "|u1",
                "data": (int(self._data.ctypes.data), False), "version": 3}

    @property
    def ptr(self) -> int:
        return int(self._data.ctypes.data)

    @property
    def size(self) -> int:
        return int(self._data.shape[0])


class gpumemoryview:
    """``pylibcudf.gpumemoryview``: a view of memory that has a CUDA array interface (else ``ValueError``)."""

    def __init__(self, obj):
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError:
            raise ValueError("gpumemoryview must be constructed from an object supporting the CUDA array "
                             "interface") from None
        self.obj, self.cai, self.ptr = obj, cai, cai["data"][0]
        itemsize = np.dtype(cai["typestr"]).itemsize
        self.nbytes = int(np.prod(cai["shape"])) * itemsize

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.cai

    @property
    def size(self) -> int:
        return self.nbytes

    def __len__(self) -> int:
        return self.cai["shape"][0]


def _new_buffer(values: np.ndarray) -> gpumemoryview:
    """Fresh device memory holding a copy of ``values``' bytes."""
    return gpumemoryview(_DeviceBuffer(np.array(values, copy=True)))


class _HostInterface:
    def __init__(self, cai: dict, owner):
        self.__array_interface__ = {k: cai[k] for k in ("shape", "typestr", "data", "strides") if k in cai}
        self.__array_interface__["version"] = 3
        self.owner = owner


def _host_bytes(span) -> np.ndarray:
    """The bytes a span (a ``gpumemoryview``) covers, read in place (the fake's device memory is host memory)."""
    if span is None:
        return np.zeros(0, np.uint8)
    cai = span.__cuda_array_interface__
    if int(np.prod(cai["shape"])) == 0:
        return np.zeros(0, np.uint8)
    return np.asarray(_HostInterface(cai, span)).reshape(-1).view(np.uint8)


# ------------------------------------------------------------------ columns and tables


def _spanlike(obj) -> bool:
    return hasattr(obj, "ptr") and hasattr(obj, "size")


class Column:
    """``pylibcudf.Column``: a type, a size, a data and a mask buffer, a null count, a row offset, children."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, data_type, size, data, mask, null_count, offset, children, validate=True):
        if not isinstance(data_type, DataType):
            raise TypeError(f"Argument 'data_type' has incorrect type (expected DataType, got "
                            f"{type(data_type).__name__})")
        children = list(children)
        if not all(isinstance(c, Column) for c in children):
            raise ValueError("All children must be pylibcudf Column objects")
        if validate:
            for what, span in (("data", data), ("mask", mask)):
                if span is not None and not _spanlike(span):
                    raise TypeError(f"{what} must satisfy Span protocol (have .ptr and .size), got "
                                    f"{type(span).__name__}")
        self._type, self._size, self._data, self._mask = data_type, int(size), data, mask
        self._null_count, self._offset, self._children = int(null_count), int(offset), children

    def type(self) -> DataType:
        return self._type

    def size(self) -> int:
        return self._size

    def offset(self) -> int:
        return self._offset

    def null_count(self) -> int:
        return self._null_count

    def data(self):
        return self._data

    def null_mask(self):
        return self._mask

    def children(self) -> list:
        return self._children

    def child(self, index: int) -> Column:
        return self._children[index]

    def num_children(self) -> int:
        return len(self._children)

    def to_arrow(self, metadata=None, stream=None) -> pa.Array:
        """The column as a pyarrow array (strings as ``string`` or ``large_string`` by their offsets' width)."""
        if metadata is not None:
            raise NotImplementedError("the fake's to_arrow takes no metadata")
        return _to_arrow(self)

    @staticmethod
    def from_arrow(obj, dtype=None, stream=None, mr=None) -> Column:
        """A new column (new device buffers, offset 0) of pyarrow array ``obj``, as libcudf types it."""
        if dtype is not None:
            raise NotImplementedError("the fake's from_arrow takes no dtype")
        arr = obj.combine_chunks() if isinstance(obj, pa.ChunkedArray) else obj
        return _column(_as_canonical(arr))

    @classmethod
    def from_cuda_array_interface(cls, obj, stream=None) -> Column:
        """A column viewing a device array (no copy): 1-D, C-contiguous, unmasked, of a NumPy kind pylibcudf
        maps to a type."""
        try:
            iface = obj.__cuda_array_interface__
        except AttributeError:
            raise TypeError("Object does not implement __cuda_array_interface__") from None
        if iface.get("mask") is not None:
            raise NotImplementedError("Masked array-interface inputs are not supported")
        if iface["typestr"][0] == ">":
            raise ValueError("Big-endian data is not supported")
        if not (isinstance(iface.get("data"), tuple) and isinstance(iface["data"][0], int)):
            raise ValueError("Expected a data field with an integer pointer in the array interface.")  # noqa: TRY004
        shape = iface["shape"]
        if not isinstance(shape, tuple) or len(shape) == 0:
            raise ValueError("shape must be a non-empty tuple")
        desc = iface["typestr"][1:]
        if desc not in _TYPESTR:
            raise ValueError(f"Unsupported dtype: {desc}")
        itemsize = np.dtype(iface["typestr"]).itemsize
        if iface.get("strides") not in (None, (itemsize,) if len(shape) == 1 else None):
            raise ValueError("Data must be C-contiguous")
        if len(shape) != 1:
            raise NotImplementedError("the fake models 1-D arrays only (pylibcudf makes a list column of 2-D)")
        return cls(DataType(_TYPESTR[desc]), shape[0], gpumemoryview(obj), None, 0, 0, [])


class Table:
    """``pylibcudf.Table``: columns of one size."""

    __hash__ = None  # type: ignore[assignment]

    def __init__(self, columns, num_rows=None):
        columns = tuple(columns)
        if not all(isinstance(c, Column) for c in columns):
            raise ValueError("All columns must be pylibcudf Column objects")
        self._columns = columns
        if num_rows is None:
            self._num_rows = columns[0].size() if columns else 0
        else:
            if any(c.size() != num_rows for c in columns):
                raise ValueError("num_rows does not match the size of the provided columns")
            self._num_rows = int(num_rows)

    def num_columns(self) -> int:
        return len(self._columns)

    def num_rows(self) -> int:
        return self._num_rows

    def shape(self) -> tuple:
        return self._num_rows, len(self._columns)

    def columns(self) -> tuple:
        return self._columns


def _valid(col: Column) -> np.ndarray:
    """Bool per row of ``col`` (its mask's bits from ``offset()``)."""
    if col.null_mask() is None:
        return np.ones(col.size(), bool)
    bits = np.unpackbits(_host_bytes(col.null_mask()), bitorder="little")
    return bits[col.offset():col.offset() + col.size()].astype(bool)


def _large_strings_threshold() -> int:
    return int(os.environ.get("LIBCUDF_LARGE_STRINGS_THRESHOLD", str(2**31 - 1)))


def _mask_of(valid: np.ndarray, nulls: int):
    """A libcudf null mask (bits, least significant first, padded to 64 bytes) where there are nulls, else None."""
    if not nulls:
        return None
    bits = np.packbits(valid, bitorder="little")
    padded = np.zeros(-(-max(bits.shape[0], 1) // 64) * 64, np.uint8)
    padded[:bits.shape[0]] = bits
    return _new_buffer(padded)


def _column(arr: pa.Array) -> Column:
    """A new libcudf column (offset 0, new buffers) holding Arrow array ``arr`` (of a type :func:`_canonical`
    gives)."""
    n, nulls = len(arr), arr.null_count
    valid = np.asarray(arr.is_valid(), bool) if nulls else np.ones(n, bool)
    mask = _mask_of(valid, nulls)
    t = arr.type
    if pa.types.is_large_binary(t):
        if n == 0:  # libcudf's empty strings column: no children
            return Column(DataType(TypeId.STRING), 0, None, None, 0, 0, [])
        off = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + n + 1]
        data = arr.buffers()[2]
        chars = np.frombuffer(data, np.uint8)[off[0]:off[-1]] if data is not None else np.zeros(0, np.uint8)
        width = np.int64 if chars.shape[0] >= _large_strings_threshold() else np.int32
        offsets = Column(DataType(TypeId.INT64 if width is np.int64 else TypeId.INT32), n + 1,
                         _new_buffer((off - off[0]).astype(width)), None, 0, 0, [])
        return Column(DataType(TypeId.STRING), n, _new_buffer(chars), mask, nulls, 0, [offsets])
    if pa.types.is_large_list(t):
        off = np.frombuffer(arr.buffers()[1], np.int64)[arr.offset:arr.offset + n + 1] if n else np.zeros(1, np.int64)
        values = _column(arr.values.slice(int(off[0]), int(off[-1] - off[0])))
        offsets = Column(DataType(TypeId.INT32), n + 1, _new_buffer((off - off[0]).astype(np.int32)), None, 0, 0, [])
        return Column(DataType(TypeId.LIST), n, None, mask, nulls, 0, [offsets, values])
    if pa.types.is_struct(t):
        fields = [arr.field(i) for i in range(t.num_fields)]  # pyarrow slices each field by the offset
        if nulls:  # make_structs_column pushes the struct's nulls down into its fields
            fields = [pc.if_else(pa.array(valid), f, pa.nulls(n, f.type)) for f in fields]
        return Column(DataType(TypeId.STRUCT), n, None, mask, nulls, 0, [_column(f) for f in fields])
    tid = _type_id(t)
    if tid == TypeId.BOOL8:
        values = np.asarray(arr.fill_null(False), bool)
    else:
        width = np.dtype(_FIXED[tid]).itemsize
        raw = np.frombuffer(arr.buffers()[1], np.uint8) if n else np.zeros(0, np.uint8)
        values = raw[arr.offset * width:(arr.offset + n) * width]
    return Column(DataType(tid), n, _new_buffer(values), mask, nulls, 0, [])


def _type_id(t: pa.DataType) -> TypeId:
    for tid, at in _ARROW_FIXED.items():
        if t == at:
            return tid
    raise NotImplementedError(f"the fake does not model Arrow type {t}")


def _canonical(t: pa.DataType) -> pa.DataType:
    """The Arrow type :func:`_column` builds a libcudf column of ``t`` from (what libcudf reads a Parquet column
    of that Arrow type as): strings and binaries as large binary (their offsets' width chosen later), lists as
    large lists, maps as lists of key/value structs, dictionaries decoded, timestamps without their zone."""
    if pa.types.is_dictionary(t):
        return _canonical(t.value_type)
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return pa.large_binary()
    if pa.types.is_map(t):
        return pa.large_list(pa.struct([pa.field("key", _canonical(t.key_type)),
                                        pa.field("value", _canonical(t.item_type))]))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.large_list(_canonical(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(t.field(i).name, _canonical(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_timestamp(t):
        return pa.timestamp(t.unit)
    _type_id(t)  # a type the fake models, or NotImplementedError
    return t


def _as_canonical(arr: pa.Array) -> pa.Array:
    t = _canonical(arr.type)
    if pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_decode()
    if pa.types.is_map(arr.type):
        entries = pa.StructArray.from_arrays([arr.keys, arr.items], names=["key", "value"])
        off = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset:arr.offset + len(arr) + 1]
        arr = pa.LargeListArray.from_arrays(pa.array(off.astype(np.int64)), entries, mask=arr.is_null())
    return arr if arr.type == t else arr.cast(t)


def _to_arrow(col: Column, t: pa.DataType | None = None) -> pa.Array:
    """Column ``col`` as an Arrow array, read from its buffers (``t``: the Arrow type to build, with the names and
    nullability of nested fields; by default one of the column's type, struct fields unnamed)."""
    n, tid = col.size(), col.type().id()
    valid = _valid(col)
    nulls = int(n - valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    lo = col.offset()
    if tid == TypeId.STRING:
        if not col.children():
            return pa.array([None] * n if nulls else [""] * n, t or pa.string())
        oc = col.child(0)
        width = np.int64 if oc.type().id() == TypeId.INT64 else np.int32
        off = _host_bytes(oc.data()).view(width)[oc.offset() + lo:oc.offset() + lo + n + 1]
        chars = _host_bytes(col.data())[off[0]:off[-1]]
        t = t or (pa.large_string() if width is np.int64 else pa.string())
        big = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offs = (off - off[0]).astype(np.int64 if big else np.int32)
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(offs), pa.py_buffer(chars.copy())], nulls)
    if tid == TypeId.LIST:
        oc = col.child(0)
        off = _host_bytes(oc.data()).view(np.int32)[oc.offset() + lo:oc.offset() + lo + n + 1]
        vt = t.value_field.type if t is not None else None
        values = _to_arrow(col.child(1), vt).slice(int(off[0]), int(off[-1] - off[0])) if n else _to_arrow(
            col.child(1), vt).slice(0, 0)
        t = t or pa.list_(pa.field("element", values.type))
        return pa.Array.from_buffers(t, n, [validity, pa.py_buffer((off - off[0]).astype(np.int32))],
                                     nulls, children=[values])
    if tid == TypeId.STRUCT:
        kids = [_to_arrow(c, t.field(i).type if t is not None else None).slice(lo, n)
                for i, c in enumerate(col.children())]
        t = t or pa.struct([pa.field("", k.type) for k in kids])
        return pa.Array.from_buffers(t, n, [validity], nulls, children=kids)
    dtype = np.dtype(_FIXED[tid])
    values = _host_bytes(col.data()).view(dtype)[lo:lo + n]
    t = t or _ARROW_FIXED[tid]
    if tid == TypeId.BOOL8:
        return pa.array(values.astype(bool), t, mask=~valid if nulls else None)
    return pa.Array.from_buffers(t, n, [validity, pa.py_buffer(values.copy())], nulls)


# ------------------------------------------------------------------ io.types


class CompressionType(enum.IntEnum):
    """``pylibcudf.io.types.CompressionType`` (libcudf's ``compression_type``)."""

    NONE = 0
    AUTO = 1
    SNAPPY = 2
    GZIP = 3
    BZIP2 = 4
    BROTLI = 5
    ZIP = 6
    XZ = 7
    ZLIB = 8
    LZ4 = 9
    LZO = 10
    ZSTD = 11


_WRITES = {CompressionType.NONE: None, CompressionType.SNAPPY: "snappy", CompressionType.ZSTD: "zstd",
           CompressionType.LZ4: "lz4"}  # the codecs gpu_dedup asks libcudf's writer for (pyarrow's names)


class SourceInfo:
    """Files to read (a missing one: ``FileNotFoundError``, as pylibcudf raises)."""

    def __init__(self, sources):
        paths = [os.fspath(s) for s in sources]
        if not paths:
            raise ValueError("Need to pass at least one source")
        for p in paths:
            if not os.path.isfile(p):
                raise FileNotFoundError(2, "No such file or directory", p)
        self._paths = paths


class SinkInfo:
    """Files to write (or host buffers to fill), one per sink."""

    def __init__(self, sinks):
        if not sinks:
            raise ValueError("At least one sink must be provided.")
        if not all(isinstance(s, type(sinks[0])) for s in sinks):
            raise ValueError("All sinks must be of the same type unless they are all instances of subclasses of "
                             "io.IOBase.")
        if isinstance(sinks[0], io.BytesIO):  # host buffers, as libcudf's host sink takes them
            self._paths = list(sinks)
            return
        if not isinstance(sinks[0], (str, os.PathLike)):
            raise NotImplementedError("the fake writes to paths and io.BytesIO only")
        self._paths = [os.path.expanduser(os.fspath(s)) for s in sinks]


class PartitionInfo:
    def __init__(self, start_row: int, num_rows: int):
        for v in (start_row, num_rows):
            if not -2**31 <= v < 2**31:
                raise OverflowError(f"value too large to convert to size_type: {v}")
        self.start_row, self.num_rows = int(start_row), int(num_rows)


class ColumnInMetadata:
    """A column's name and nullability for the writer, and its children's."""

    def __init__(self):
        raise ValueError("ColumnInMetadata should not be constructed directly. Use one of the factories.")

    @classmethod
    def _of(cls, col: Column) -> ColumnInMetadata:
        out = cls.__new__(cls)
        out._name, out._nullable = "", None
        out._children = [cls._of(c) for c in col.children()]
        return out

    def set_name(self, name: str) -> ColumnInMetadata:
        if not isinstance(name, str):
            raise TypeError(f"Argument 'name' has incorrect type (expected str, got {type(name).__name__})")
        self._name = name
        return self

    def set_nullability(self, nullable: bool) -> ColumnInMetadata:
        self._nullable = bool(nullable)
        return self

    def child(self, i: int) -> ColumnInMetadata:
        return self._children[i]

    def get_name(self) -> str:
        return self._name


class TableInputMetadata:
    """The writer's metadata of ``table``: a :class:`ColumnInMetadata` per column, children as the columns'."""

    def __init__(self, table: Table):
        if not isinstance(table, Table):
            raise TypeError("Argument 'table' has incorrect type")
        self._columns = [ColumnInMetadata._of(c) for c in table.columns()]

    @property
    def column_metadata(self) -> list:
        return list(self._columns)  # the objects themselves: setting them sets the metadata


class TableWithMetadata:
    """A table read, with its columns' names (``column_names()``; with ``include_children``, nested)."""

    def __init__(self, tbl: Table, column_names: list):
        self.tbl, self._names = tbl, column_names

    @property
    def columns(self) -> tuple:
        return self.tbl.columns()

    def column_names(self, include_children: bool = False) -> list:
        return list(self._names) if include_children else [name for name, _ in self._names]


# ------------------------------------------------------------------ io.parquet


class ParquetReaderOptions:
    def __init__(self):
        self._source: SourceInfo | None = None
        self._columns: list | None = None
        self._allow_mismatched = False
        self._ignore_missing = True
        self._row_groups: list | None = None

    def set_row_groups(self, row_groups: list) -> None:
        """One list of row groups per source, read in the order given (libcudf neither sorts nor dedupes them)."""
        if not isinstance(row_groups, list) or not all(isinstance(g, list) for g in row_groups):
            raise TypeError("row_groups must be a list of lists of ints")
        self._row_groups = [[int(g) for g in gs] for gs in row_groups]

    @staticmethod
    def builder(source: SourceInfo) -> ParquetReaderOptionsBuilder:
        if not isinstance(source, SourceInfo):
            raise TypeError("Argument 'source' has incorrect type (expected SourceInfo)")
        b = ParquetReaderOptionsBuilder()
        b._opts._source = source
        return b


class ParquetReaderOptionsBuilder:
    def __init__(self):
        self._opts = ParquetReaderOptions()

    def columns(self, col_names: list) -> ParquetReaderOptionsBuilder:
        warnings.warn("columns is deprecated and will be removed in a future version of cudf. Use column_names "
                      "instead.", FutureWarning, stacklevel=2)
        return self.column_names(col_names)

    def column_names(self, col_names: list) -> ParquetReaderOptionsBuilder:
        if not isinstance(col_names, list):
            raise TypeError(f"Argument 'col_names' has incorrect type (expected list, got {type(col_names).__name__})")
        self._opts._columns = [str(c) for c in col_names]
        return self

    def allow_mismatched_pq_schemas(self, val: bool) -> ParquetReaderOptionsBuilder:
        self._opts._allow_mismatched = bool(val)
        return self

    def ignore_missing_columns(self, val: bool) -> ParquetReaderOptionsBuilder:
        self._opts._ignore_missing = bool(val)
        return self

    def build(self) -> ParquetReaderOptions:
        return copy.copy(self._opts)


def _leaves(schema: pq.ParquetSchema, top: str | None = None) -> list:
    """What libcudf compares of two files' Parquet schemas (of top-level column ``top`` only, if given): every leaf's
    path, physical and logical type, length, precision, scale and nesting; not nullability."""
    out = []
    for j in range(len(schema)):
        c = schema.column(j)
        if top is None or c.path.split(".")[0] == top:
            out.append((c.path, c.physical_type, c.converted_type, str(c.logical_type), c.length, c.precision,
                        c.scale, c.max_repetition_level))
    return out


def _spec(t: pa.DataType, name: str) -> tuple:
    """(name, children) of a column read, as ``column_names(include_children=True)`` gives it."""
    if pa.types.is_struct(t):
        return name, [_spec(t.field(i).type, t.field(i).name) for i in range(t.num_fields)]
    if pa.types.is_large_list(t):
        return name, [("offsets", []), _spec(t.value_type, "element")]
    return name, []


_LIBCUDF_OPEN = pq.ParquetFile  # libcudf reads the footers itself: not counted as pyarrow reads (tests/footers.py)


def read_parquet(options: ParquetReaderOptions, stream=None, mr=None, parquet_metadatas=None) -> TableWithMetadata:
    """Every file's rows, in file order, as one table."""
    files = [_LIBCUDF_OPEN(p) for p in options._source._paths]
    first = files[0].schema_arrow.names
    names = first if options._columns is None else options._columns
    missing = [c for c in names if any(c not in f.schema_arrow.names for f in files)]
    if missing and not options._ignore_missing:
        raise RuntimeError(f"Encountered non-existent column in selected path: {missing[0]}")
    names = [c for c in names if c in first]
    for f in files[1:]:
        if options._allow_mismatched:  # the projected columns must still agree
            if any(_leaves(f.schema, c) != _leaves(files[0].schema, c) for c in names):
                raise RuntimeError("Encountered mismatching SchemaElement properties for a column in the selected "
                                   "path")
        elif _leaves(f.schema) != _leaves(files[0].schema):
            raise RuntimeError("All sources must have the same schema")
    groups = options._row_groups
    if groups is not None and len(groups) != len(files):
        raise RuntimeError("Mismatch between number of sources and row groups")
    for f, gs in zip(files, groups or ()):
        if any(g < 0 or g >= f.metadata.num_row_groups for g in gs):
            raise RuntimeError("Invalid row group index specified")
    tables = [f.read(columns=names, use_pandas_metadata=False) if groups is None
              else f.read_row_groups(groups[k], columns=names, use_pandas_metadata=False)
              for k, f in enumerate(files)]
    columns, specs = [], []
    for j, name in enumerate(names):
        chunks = [_as_canonical(c) for t in tables for c in t.column(j).chunks]
        t = _canonical(tables[0].schema.field(j).type)
        columns.append(_column(pa.concat_arrays(chunks) if chunks else pa.array([], t)))
        specs.append(_spec(t, name))
    return TableWithMetadata(Table(columns, sum(t.num_rows for t in tables)), specs)


class ParquetWriterOptions:
    def __init__(self):
        self._sink: SinkInfo | None = None
        self._table: Table | None = None
        self._metadata: TableInputMetadata | None = None
        self._kv: list | None = None
        self._compression = CompressionType.SNAPPY
        self._utc = True  # libcudf writes timestamps UTC-adjusted unless told
        self._partitions: list | None = None

    @staticmethod
    def builder(sink: SinkInfo, table: Table) -> ParquetWriterOptionsBuilder:
        if not isinstance(sink, SinkInfo) or not isinstance(table, Table):
            raise TypeError("ParquetWriterOptions.builder takes a SinkInfo and a Table")
        b = ParquetWriterOptionsBuilder()
        b._opts._sink, b._opts._table = sink, table
        return b

    def set_partitions(self, partitions: list) -> None:
        if not isinstance(partitions, list) or not all(isinstance(p, PartitionInfo) for p in partitions):
            raise TypeError("partitions must be a list of PartitionInfo")
        if len(partitions) != len(self._sink._paths):
            raise RuntimeError("Mismatch between number of sinks and number of partitions")
        self._partitions = list(partitions)


class ParquetWriterOptionsBuilder:
    def __init__(self):
        self._opts = ParquetWriterOptions()

    def metadata(self, metadata: TableInputMetadata) -> ParquetWriterOptionsBuilder:
        if not isinstance(metadata, TableInputMetadata):
            raise TypeError("Argument 'metadata' has incorrect type (expected TableInputMetadata)")
        self._opts._metadata = copy.deepcopy(metadata)  # the options hold a copy (C++ value semantics)
        return self

    def key_value_metadata(self, metadata) -> ParquetWriterOptionsBuilder:
        kv = [{key.encode().decode(): value.encode().decode() for key, value in m.items()} for m in metadata]
        if len(kv) != len(self._opts._sink._paths):
            raise RuntimeError("Mismatch between number of sinks and number of metadata maps")
        self._opts._kv = kv
        return self

    def compression(self, compression) -> ParquetWriterOptionsBuilder:
        self._opts._compression = CompressionType(compression)
        return self

    def utc_timestamps(self, enabled: bool) -> ParquetWriterOptionsBuilder:
        self._opts._utc = bool(enabled)
        return self

    def build(self) -> ParquetWriterOptions:
        return self._opts


def _written_field(col: Column, meta: ColumnInMetadata, name: str, utc: bool) -> pa.Field:
    """The field libcudf writes ``col`` as (its schema tree): the metadata's name (or the default), nullable as the
    metadata says (a column with nulls said not nullable refused) or, where unset, as the column has a mask."""
    if meta._nullable is not None:
        if not meta._nullable and col.null_count():
            raise RuntimeError("Mismatch in metadata prescribed nullability and input column. Metadata for input "
                               "column with nulls cannot prescribe nullability = false")
        nullable = meta._nullable
    else:
        nullable = col.null_mask() is not None
    name = meta.get_name() or name
    tid = col.type().id()
    if tid == TypeId.STRUCT:
        if len(meta._children) != col.num_children():
            raise RuntimeError("Mismatch in number of child columns between input table and metadata")
        t = pa.struct([_written_field(c, meta.child(i), f"{name}_{i}", utc) for i, c in enumerate(col.children())])
    elif tid == TypeId.LIST:
        if len(meta._children) != 2:
            raise RuntimeError("List column's metadata should have exactly two children")
        t = pa.list_(_written_field(col.child(1), meta.child(1), "element", utc).with_name("element"))
    elif tid == TypeId.STRING:
        t = pa.string()
    elif TypeId.DURATION_DAYS <= tid <= TypeId.DURATION_NANOSECONDS:
        raise NotImplementedError("the fake does not model how libcudf writes durations (Parquet TIME types)")
    elif TypeId.TIMESTAMP_SECONDS <= tid <= TypeId.TIMESTAMP_NANOSECONDS:
        t = pa.timestamp(_UNITS[tid - TypeId.TIMESTAMP_SECONDS], tz="UTC" if utc else None)  # isAdjustedToUTC
    else:
        t = _ARROW_FIXED[tid]
    return pa.field(name, t, nullable)


def write_parquet(options: ParquetWriterOptions, stream=None) -> memoryview:
    """A Parquet file per sink: its partition's rows (the whole table for one sink without partitions)."""
    o = options
    table, paths = o._table, o._sink._paths
    parts = o._partitions or [PartitionInfo(0, table.num_rows())]
    if len(parts) != len(paths):
        raise RuntimeError("Mismatch between number of sinks and number of partitions")
    meta = o._metadata or TableInputMetadata(table)
    if len(meta._columns) != table.num_columns():
        raise RuntimeError("Mismatch in the number of columns and the corresponding metadata elements")
    if o._compression not in _WRITES:
        raise NotImplementedError(f"the fake writes {', '.join(c.name for c in _WRITES)}, not {o._compression.name}")
    fields = [_written_field(c, m, f"_col{i}", o._utc) for i, (c, m) in enumerate(zip(table.columns(), meta._columns))]
    arrays = [_to_arrow(c, f.type) for c, f in zip(table.columns(), fields)]
    schema = pa.schema(fields)
    for k, (path, part) in enumerate(zip(paths, parts)):
        if part.start_row < 0 or part.num_rows < 0 or part.start_row + part.num_rows > table.num_rows():
            raise RuntimeError(f"partition {k} ({part.start_row}, {part.num_rows}) is out of the table's "
                               f"{table.num_rows()} rows")
        rows = pa.Table.from_arrays([a.slice(part.start_row, part.num_rows) for a in arrays], schema=schema)
        # libcudf writes no Arrow schema of its own (write_arrow_schema is off by default): only the given pairs
        with pq.ParquetWriter(path, schema, compression=_WRITES[o._compression] or "none", store_schema=False) as w:
            w.write_table(rows, row_group_size=ROW_GROUP_ROWS)
            if o._kv and o._kv[k]:
                w.add_key_value_metadata(o._kv[k])
    return memoryview(b"")


# ------------------------------------------------------------------ copying, stream_compaction


class OutOfBoundsPolicy(enum.IntEnum):
    NULLIFY = 0
    DONT_CHECK = 1


def _rows(col: Column) -> np.ndarray:
    if col.type().id() not in _FIXED or col.type().id() in (TypeId.BOOL8, TypeId.FLOAT32, TypeId.FLOAT64):
        raise RuntimeError("gather map must be an integral type")
    if col.null_count():
        raise ValueError("gather_map contains nulls")
    return _host_bytes(col.data()).view(np.dtype(_FIXED[col.type().id()]))[col.offset():col.offset() + col.size()]


def gather(source_table: Table, gather_map: Column, bounds_policy: OutOfBoundsPolicy, stream=None, mr=None) -> Table:
    """Rows ``gather_map`` of every column (negative indices count from the end)."""
    n = source_table.num_rows()
    rows = _rows(gather_map).astype(np.int64)
    rows = np.where(rows < 0, rows + n, rows)
    out = (rows < 0) | (rows >= n)
    if out.any() and OutOfBoundsPolicy(bounds_policy) == OutOfBoundsPolicy.DONT_CHECK:
        raise IndexError(f"gather map index {int(rows[out][0])} out of {n} rows with DONT_CHECK (undefined "
                         "behaviour in libcudf)")
    idx = pa.array(np.where(out, 0, rows), pa.int64())
    cols = []
    for c in source_table.columns():
        got = _as_canonical(_to_arrow(c)).take(idx)
        if out.any():  # NULLIFY
            got = pc.if_else(pa.array(out), pa.nulls(len(got), got.type), got)
        cols.append(_column(got))
    return Table(cols, len(rows))


def apply_retention_mask(source_table: Table, retention_mask: Column, stream=None, mr=None) -> Table:
    """The rows where ``retention_mask`` (BOOL8, the table's length) is valid and true."""
    if retention_mask.type().id() != TypeId.BOOL8:
        raise RuntimeError("Mask must be of type BOOL8")
    if retention_mask.size() != source_table.num_rows():
        raise RuntimeError("Column size mismatch")
    keep = _host_bytes(retention_mask.data()).view(bool)[retention_mask.offset():][:retention_mask.size()]
    keep = pa.array(keep & _valid(retention_mask))
    return Table([_column(_as_canonical(_to_arrow(c)).filter(keep)) for c in source_table.columns()],
                 int(keep.true_count))


def apply_boolean_mask(source_table: Table, boolean_mask: Column, stream=None, mr=None) -> Table:
    """Deprecated alias of :func:`apply_retention_mask` (26.10)."""
    warnings.warn("apply_boolean_mask is deprecated; use apply_retention_mask instead", FutureWarning, stacklevel=2)
    return apply_retention_mask(source_table, boolean_mask, stream, mr)


# ------------------------------------------------------------------ the module


def _module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    return mod


def fake_pylibcudf() -> types.ModuleType:
    """A fresh module named ``pylibcudf`` (with a ``__spec__``, so ``importlib.util.find_spec`` finds it once it is
    in ``sys.modules``)."""
    plc_types = _module("pylibcudf.types", TypeId=TypeId, DataType=DataType)
    io_types = _module("pylibcudf.io.types", SourceInfo=SourceInfo, SinkInfo=SinkInfo, PartitionInfo=PartitionInfo,
                       CompressionType=CompressionType, TableInputMetadata=TableInputMetadata,
                       ColumnInMetadata=ColumnInMetadata, TableWithMetadata=TableWithMetadata)
    parquet = _module("pylibcudf.io.parquet", ParquetReaderOptions=ParquetReaderOptions,
                      ParquetReaderOptionsBuilder=ParquetReaderOptionsBuilder, read_parquet=read_parquet,
                      ParquetWriterOptions=ParquetWriterOptions,
                      ParquetWriterOptionsBuilder=ParquetWriterOptionsBuilder, write_parquet=write_parquet)
    mod = _module("pylibcudf", __version__=VERSION, Column=Column, Table=Table, DataType=DataType, TypeId=TypeId,
                  gpumemoryview=gpumemoryview, types=plc_types, io=_module("pylibcudf.io", types=io_types,
                                                                          parquet=parquet),
                  copying=_module("pylibcudf.copying", OutOfBoundsPolicy=OutOfBoundsPolicy, gather=gather),
                  stream_compaction=_module("pylibcudf.stream_compaction", apply_retention_mask=apply_retention_mask,
                                            apply_boolean_mask=apply_boolean_mask))
    mod.__spec__ = importlib.machinery.ModuleSpec("pylibcudf", None)
    return mod


def install(monkeypatch) -> types.ModuleType:
    """This fake as ``sys.modules["pylibcudf"]`` for a test (``monkeypatch`` undoes it)."""
    import sys

    mod = fake_pylibcudf()
    monkeypatch.setitem(sys.modules, "pylibcudf", mod)
    return mod
