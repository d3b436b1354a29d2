"""A few rows of one Parquet column, decoded from the pages that hold them and no others.

A report shows a few dozen documents of a corpus whose texts are no longer in memory.  Read through
pyarrow, each of them costs the decompression and decoding of its whole column chunk up to it: with
one row group per shard (how many writers write), the texts of the whole corpus again.  Parquet
pages are independent units, though: each page header says how many rows it holds and how many
bytes follow it.  :func:`take_pages` walks a column chunk's page headers (a few bytes each, the page
data skipped), copies the data pages that hold the wanted rows (and the dictionary page, where their
values index it) into a small Parquet file of their own with a footer that describes just them, and
lets pyarrow decode that file: every codec, encoding and page version pyarrow reads is read the same
way, and no other page is decompressed.

It handles what texts are stored as (a top-level, non-repeated byte-array column, nullable or not) and
returns None for anything else (a nested column, an unreadable header, page counts that disagree with
the footer), where the caller reads the row groups as before, which also reports any real fault.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends.arrow_arrays import arrow_array
from gpu_dedup.storage.filesystems import source

# Thrift compact protocol types (Parquet's footer and page headers)
_TRUE, _FALSE, _BYTE, _I16, _I32, _I64, _DOUBLE, _BINARY, _LIST, _SET, _MAP, _STRUCT = range(1, 13)
# Parquet's enums
_BYTE_ARRAY = 6
_REQUIRED, _OPTIONAL = 0, 1
_UTF8 = 0
_DATA_PAGE, _DICTIONARY_PAGE, _DATA_PAGE_V2 = 0, 2, 3
_DICTIONARY_ENCODINGS = {2, 8}  # PLAIN_DICTIONARY, RLE_DICTIONARY: values that are indices into the dictionary
_CODECS = {"UNCOMPRESSED": 0, "SNAPPY": 1, "GZIP": 2, "LZO": 3, "BROTLI": 4, "LZ4": 5, "ZSTD": 6, "LZ4_RAW": 7}

HEADER_BYTES = 1 << 14  # bytes read for one page header first (statistics may make it longer: then more)
MAX_HEADER_BYTES = 1 << 24


class _Short(Exception):
    """A page header runs past the bytes read for it."""


class _Refused(Exception):
    """A layout this module does not handle: the caller reads the row groups instead."""


# ---------------------------------------------------------------------------------------------- Thrift
class _Reader:
    """Thrift compact protocol values of ``buf`` from ``pos``: structs as {field id: value}."""

    def __init__(self, buf: bytes, pos: int = 0):
        self.buf, self.pos = buf, pos

    def byte(self) -> int:
        if self.pos >= len(self.buf):
            raise _Short
        b = self.buf[self.pos]
        self.pos += 1
        return b

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.byte()
            out |= (b & 0x7F) << shift
            if b < 0x80:
                return out
            shift += 7
            if shift > 70:
                raise _Refused("a varint longer than 10 bytes")

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.buf):
            raise _Short
        out = self.buf[self.pos : self.pos + n]
        self.pos += n
        return out

    def value(self, t: int):
        if t in (_TRUE, _FALSE):  # (in a list: one byte each)
            return t == _TRUE
        if t == _BYTE:
            return self.byte()
        if t in (_I16, _I32, _I64):
            return self.zigzag()
        if t == _DOUBLE:
            return struct.unpack("<d", self.take(8))[0]
        if t == _BINARY:
            return self.take(self.varint())
        if t in (_LIST, _SET):
            head = self.byte()
            size, et = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            if et in (_TRUE, _FALSE):
                return [self.byte() == 1 for _ in range(size)]
            return [self.value(et) for _ in range(size)]
        if t == _MAP:
            size = self.varint()
            if not size:
                return {}
            kv = self.byte()
            return {self.value(kv >> 4): self.value(kv & 0x0F) for _ in range(size)}
        if t == _STRUCT:
            return self.struct()
        raise _Refused(f"Thrift type {t}")

    def struct(self) -> dict:
        out, last = {}, 0
        while True:
            head = self.byte()
            if head == 0:
                return out
            delta, t = head >> 4, head & 0x0F
            fid = last + delta if delta else self.zigzag()
            out[fid] = self.value(t)
            last = fid


def _varint(out: bytearray, n: int) -> None:
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return


def _write(out: bytearray, t: int, v) -> None:
    if t in (_I32, _I64):
        _varint(out, (v << 1) ^ (v >> 63))
    elif t == _BINARY:
        b = v.encode() if isinstance(v, str) else bytes(v)
        _varint(out, len(b))
        out += b
    elif t == _LIST:
        et, items = v
        if len(items) < 15:
            out.append((len(items) << 4) | et)
        else:
            out.append(0xF0 | et)
            _varint(out, len(items))
        for item in items:
            _write(out, et, item)
    elif t == _STRUCT:
        last = 0
        for fid, ft, fv in v:  # (field id, type, value), ids ascending; None: absent
            if fv is None:
                continue
            if 0 < fid - last <= 15:
                out.append(((fid - last) << 4) | ft)
            else:
                out.append(ft)
                _varint(out, (fid << 1) ^ (fid >> 63))
            _write(out, ft, fv)
            last = fid
        out.append(0)
    else:  # pragma: no cover - not written
        raise ValueError(t)


# ---------------------------------------------------------------------------------------------- pages
@dataclass(frozen=True, slots=True)
class _Page:
    offset: int  # of its header, in the file
    size: int  # header and compressed data
    uncompressed: int  # header and uncompressed data
    kind: int  # Parquet's PageType
    rows: int  # 0 for a dictionary page
    encodings: set


def _pages(f, start: int, length: int) -> list[_Page]:
    """The pages of the column chunk at ``start`` (``length`` bytes) of the open file ``f``, from their
    headers alone: one short read per page."""
    pages, pos, end = [], start, start + length
    while pos < end:
        want = min(HEADER_BYTES, end - pos)
        while True:
            f.seek(pos)
            buf = f.read(want)
            try:
                r = _Reader(buf)
                header = r.struct()
                break
            except _Short:
                if want >= min(MAX_HEADER_BYTES, end - pos) or len(buf) < want:
                    raise _Refused("a page header runs past its column chunk") from None
                want = min(MAX_HEADER_BYTES, end - pos, want * 16)
        kind, uncompressed, compressed = header.get(1), header.get(2), header.get(3)
        if not isinstance(compressed, int) or compressed < 0 or not isinstance(uncompressed, int):
            raise _Refused("a page header without sizes")
        encodings: set = set()
        rows = 0
        if kind == _DATA_PAGE:
            h = header.get(5) or {}
            rows = h.get(1)  # values, nulls included: rows, in a non-repeated column
            encodings.update(e for e in (h.get(2), h.get(3), h.get(4)) if isinstance(e, int))
        elif kind == _DATA_PAGE_V2:
            h = header.get(8) or {}
            rows = h.get(3)
            encodings.update(e for e in (h.get(4),) if isinstance(e, int))
            encodings.add(3)  # v2 levels are RLE
        elif kind == _DICTIONARY_PAGE:
            h = header.get(7) or {}
            encodings.update(e for e in (h.get(2),) if isinstance(e, int))
        if not isinstance(rows, int) or rows < 0:
            raise _Refused("a data page without a row count")
        pages.append(_Page(pos, r.pos + compressed, r.pos + uncompressed, kind, rows, encodings))
        pos += r.pos + compressed
    if pos != end:
        raise _Refused("pages that overrun their column chunk")
    return pages


def _footer(name: str, string: bool, nullable: bool, codec: int, created_by: str | None, pages: list[_Page],
            rows: int, dictionary: bool) -> bytes:
    """The Thrift FileMetaData of a file of one row group of ``rows`` rows whose only column, ``name``, is
    ``pages`` laid out one after the other from byte 4 (the dictionary page first, where there is one)."""
    size = sum(p.size for p in pages)
    first_data = 4 + (pages[0].size if dictionary else 0)
    encodings = sorted(set().union(*(p.encodings for p in pages)))
    leaf = [(1, _I32, _BYTE_ARRAY), (3, _I32, _OPTIONAL if nullable else _REQUIRED), (4, _BINARY, name),
            (6, _I32, _UTF8 if string else None), (10, _STRUCT, [(1, _STRUCT, [])] if string else None)]
    meta = [(1, _I32, _BYTE_ARRAY), (2, _LIST, (_I32, encodings)), (3, _LIST, (_BINARY, [name])),
            (4, _I32, codec), (5, _I64, sum(p.rows for p in pages)),
            (6, _I64, sum(p.uncompressed for p in pages)), (7, _I64, size), (9, _I64, first_data),
            (11, _I64, 4 if dictionary else None)]
    group = [(1, _LIST, (_STRUCT, [[(2, _I64, 4), (3, _STRUCT, meta)]])), (2, _I64, size), (3, _I64, rows)]
    out = bytearray()
    _write(out, _STRUCT, [(1, _I32, 1), (2, _LIST, (_STRUCT, [[(4, _BINARY, "schema"), (5, _I32, 1)], leaf])),
                          (3, _I64, rows), (4, _LIST, (_STRUCT, [group])), (6, _BINARY, created_by)])
    return bytes(out)


def _column(pf: pq.ParquetFile, column: str):
    """(leaf index, Parquet column schema) of the top-level byte-array column ``column``; refused otherwise."""
    schema = pf.schema
    found = [i for i in range(len(schema)) if schema.column(i).path == column and schema.column(i).name == column]
    if len(found) != 1:
        raise _Refused(f"column {column!r} is not one top-level leaf")
    col = schema.column(found[0])
    if col.physical_type != "BYTE_ARRAY" or col.max_repetition_level != 0 or col.max_definition_level > 1:
        raise _Refused(f"column {column!r} is not a flat byte-array column")
    if str(col.logical_type) not in ("String", "None"):
        raise _Refused(f"column {column!r} has logical type {col.logical_type}")
    if column not in pf.schema_arrow.names:
        raise _Refused(f"column {column!r} is not a top-level Arrow field")
    return found[0], col


def _group_values(f, pf: pq.ParquetFile, j: int, col, g: int, local: np.ndarray) -> pa.Array:
    """Column ``j`` of row group ``g`` at ``local`` (row-group rows, any order) from the pages holding them."""
    meta = pf.metadata
    rg = meta.row_group(g)
    cc = rg.column(j)
    codec = _CODECS.get(str(cc.compression).upper())
    if codec is None:
        raise _Refused(f"codec {cc.compression}")
    if cc.file_path:  # the chunk's pages in another file
        raise _Refused(f"a column chunk in {cc.file_path!r}")
    start = cc.data_page_offset
    if cc.has_dictionary_page and 0 < (cc.dictionary_page_offset or 0) < start:
        start = cc.dictionary_page_offset
    pages = _pages(f, start, cc.total_compressed_size)
    has_dictionary = bool(pages) and pages[0].kind == _DICTIONARY_PAGE
    data = [p for p in pages if p.kind in (_DATA_PAGE, _DATA_PAGE_V2)]
    if any(p.kind == _DICTIONARY_PAGE for p in pages[1:]) or sum(p.rows for p in data) != rg.num_rows:
        raise _Refused("pages that disagree with the footer")
    ends = np.cumsum([p.rows for p in data], dtype=np.int64)
    page = np.searchsorted(ends, local, side="right")
    chosen = np.unique(page)
    # the dictionary page only where a chosen page's values index it: a writer falls back to plain pages once the
    # dictionary is full (texts: after a page or two), and most rows are in those
    dictionary = has_dictionary and any(data[k].encodings & _DICTIONARY_ENCODINGS for k in chosen)
    kept = ([pages[0]] if dictionary else []) + [data[k] for k in chosen]
    body = bytearray(b"PAR1")
    for p in kept:
        f.seek(p.offset)
        got = f.read(p.size)
        if len(got) != p.size:
            raise _Refused("a page shorter than its header says")
        body += got
    firsts = ends - np.array([p.rows for p in data], np.int64)
    sizes = ends[chosen] - firsts[chosen]
    new_first = np.concatenate(([0], np.cumsum(sizes)))[:-1]
    at = local - firsts[page] + new_first[np.searchsorted(chosen, page)]
    footer = _footer(col.name, str(col.logical_type) == "String", col.max_definition_level == 1, codec,
                     meta.created_by, kept, int(sizes.sum()), dictionary)
    body += footer + struct.pack("<I", len(footer)) + b"PAR1"
    values = pq.ParquetFile(pa.BufferReader(pa.py_buffer(bytes(body)))).read().column(0).combine_chunks()
    return values.take(arrow_array(at, pa.int64()))


def _as_field_type(values: pa.Array, t: pa.DataType) -> pa.Array:
    """``values`` (strings or binaries as Parquet stores them) in the type the shard's Arrow schema gives."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    text = any(f(t) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_string_view))
    binary = any(f(t) for f in (pa.types.is_binary, pa.types.is_large_binary, pa.types.is_binary_view))
    if not text and not binary:
        raise _Refused(f"Arrow type {t}")
    plain = (pa.large_string() if pa.types.is_large_string(t) else pa.string()) if text else \
        (pa.large_binary() if pa.types.is_large_binary(t) else pa.binary())
    return values.cast(plain)


def take_pages(path, column: str, rows, metadata: pq.FileMetaData | None = None) -> pa.Array | None:
    """Values of the top-level text column ``column`` of the Parquet file ``path`` at ``rows`` (file rows,
    any order, repeats allowed), in that order and in the file's Arrow type (plain, not dictionary or view),
    decoded from only the pages that hold them; None where the file is not laid out as this reads (see the
    module), or cannot be read: the caller then reads its row groups, which names any fault.  ``metadata``:
    the file's footer, when the caller has it (not read again)."""
    rows = np.asarray(rows, np.int64)
    try:
        src = source(path)  # a local path, or an open file of a URL (closed here)
        local = isinstance(src, (str, bytes)) or hasattr(src, "__fspath__")
        with open(src, "rb") if local else src as f:
            pf = pq.ParquetFile(f, metadata=metadata)
            meta = pf.metadata
            if rows.shape[0] == 0 or rows.min() < 0 or rows.max() >= meta.num_rows:
                return None
            j, col = _column(pf, column)
            sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
            starts = np.concatenate(([0], np.cumsum(sizes)))
            group = np.searchsorted(starts, rows, side="right") - 1
            parts, order = [], []
            for g in np.unique(group):  # one step per row group holding a wanted row
                sel = np.flatnonzero(group == g)
                parts.append(_group_values(f, pf, j, col, int(g), rows[sel] - starts[g]))
                order.append(sel)
            t = pf.schema_arrow.field(column).type
            values = pa.concat_arrays([_as_field_type(p, t) for p in parts])
    except (_Refused, _Short, OSError, pa.ArrowException, ValueError, IndexError, KeyError, TypeError,
            MemoryError):
        return None
    inverse = np.empty(rows.shape[0], np.int64)
    inverse[np.concatenate(order)] = np.arange(rows.shape[0])
    return values.take(arrow_array(inverse))
