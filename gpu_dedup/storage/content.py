"""Content identity of output files: what must hold between backends and writers.

Two runs of one backend and writer write the same bytes.  Across backends or writers (pyarrow on the
host, cuDF on the device) a Parquet file's bytes may differ (its footer names its writer; pages, row
groups and encodings are the writer's choice), so what must hold there is that the files have the same
**content**: the same rows in the same order, the same string and binary bytes, the same numeric bits
(NaNs and signed zeros included), the same nulls, and the same **logical schema**: field names, order,
nullability and types, and the input's own schema metadata, where

- ``string`` and ``large_string`` count as one type, as do ``binary`` and ``large_binary`` and a list
  and a large list of one value type: Parquet stores each pair as the same column type (UTF8 /
  BYTE_ARRAY, a repeated group); which one a reader gets is a hint in the file's ``ARROW:schema``
  metadata that only pyarrow writes;
- the ``ARROW:schema`` and ``pandas`` metadata keys, writers' bookkeeping, are not compared.

JSONL outputs keep the kept lines byte for byte, so they are compared as bytes.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends.arrow_arrays import numpy_array

BOOKKEEPING = (b"ARROW:schema", b"pandas")  # schema metadata keys writers add for themselves


def logical_type(t: pa.DataType) -> pa.DataType:
    """``t`` with its large string, binary and list types as the plain ones (nested types recursively)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(logical_field(t.value_field))
    if pa.types.is_struct(t):
        return pa.struct([logical_field(t.field(i)) for i in range(t.num_fields)])
    if pa.types.is_map(t):
        return pa.map_(logical_type(t.key_type), logical_field(t.item_field))
    return t


def logical_field(f: pa.Field) -> pa.Field:
    return pa.field(f.name, logical_type(f.type), f.nullable)


def logical_schema(schema: pa.Schema) -> pa.Schema:
    """The schema as content identity compares it: logical types, and only the input's own metadata."""
    own = {k: v for k, v in (schema.metadata or {}).items() if k not in BOOKKEEPING}
    return pa.schema([logical_field(f) for f in schema], metadata=own or None)


def schema_difference(written: pa.Schema, source: pa.Schema) -> str | None:
    """How ``written`` differs from ``source`` in its logical schema (fields, types, nullability, or the
    source's own schema metadata ``written`` lacks); None: it does not."""
    a, b = logical_schema(written), logical_schema(source)
    if not a.equals(b):
        was = {f.name: f for f in b}
        now = {f.name: f for f in a}
        diff = [f"{name}: {_field(was.get(name))} -> {_field(now.get(name))}" for name in list(was) + [
            n for n in now if n not in was] if _field(was.get(name)) != _field(now.get(name))]
        return "; ".join(diff) or "the order of the fields"
    own, kept = b.metadata or {}, a.metadata or {}
    lost = [k.decode(errors="replace") for k, v in own.items() if kept.get(k) != v]
    return f"schema metadata {', '.join(lost)} not kept" if lost else None


def _field(f: pa.Field | None) -> str:
    return "absent" if f is None else f"{f.type}{'' if f.nullable else ' not null'}"


def table_difference(a: pa.Table, b: pa.Table) -> str | None:
    """How table ``a``'s content differs from ``b``'s (schema, rows, or the first column whose values or
    bits differ); None: the same content."""
    why = schema_difference(a.schema, b.schema)
    if why is not None:
        return f"schema: {why}"
    if a.num_rows != b.num_rows:
        return f"rows: {a.num_rows} and {b.num_rows}"
    for name, x, y in zip(a.column_names, a.columns, b.columns):
        if not _same_values(x, y):
            return f"column {name!r}: values differ"
    return None


def _same_values(x: pa.ChunkedArray, y: pa.ChunkedArray) -> bool:
    t = logical_type(x.type)
    if x.type != t:
        x = x.cast(t)
    if y.type != t:
        y = y.cast(t)
    if pa.types.is_floating(t):  # bits: NaN payloads and signed zeros count
        x, y = x.combine_chunks(), y.combine_chunks()
        if x.null_count != y.null_count or not x.is_null().equals(y.is_null()):
            return False
        width = {16: np.uint16, 32: np.uint32, 64: np.uint64}[t.bit_width]
        bx = np.frombuffer(x.buffers()[1], width)[x.offset:x.offset + len(x)]
        by = np.frombuffer(y.buffers()[1], width)[y.offset:y.offset + len(y)]
        valid = ~numpy_array(x.is_null())
        return bool(np.array_equal(bx[valid], by[valid]))
    return x.equals(y)


def file_difference(a, b) -> str | None:
    """How output file ``a``'s content differs from ``b``'s (see the module doc); None: the same content.
    Parquet files are compared by content, other files byte for byte."""
    a, b = str(a), str(b)
    if a.lower().endswith((".parquet", ".pq")):
        try:
            ta, tb = pq.read_table(a), pq.read_table(b)
        except (OSError, pa.ArrowException) as exc:
            return f"unreadable: {exc}"
        return table_difference(ta, tb)
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return None if fa.read() == fb.read() else "bytes differ"
