"""Parquet shards: schema reads, whole and streamed reads with one clear error, each shard's codec,
and whether a device reader can read the text columns.

Streamed reads (:func:`iter_parquet`) decode a shard's pages as they arrive, a batch of rows at a
time (``ParquetFile.iter_batches`` over a buffered stream, nothing read ahead), so the memory they
take is a batch's, whatever the shard's row groups: one row group of a million documents reads in
the same memory as a hundred small ones.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.config import InputConfig
from gpu_dedup.errors import read_error
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import source

BATCH_BYTES = 1 << 25  # about this many bytes of the read columns per streamed batch (32 MiB)
BUFFER_BYTES = 1 << 22  # read buffer per column chunk when streaming (pages are decoded as they arrive)
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 1024, 1 << 20

# Parquet's codec names (column chunk metadata) -> pyarrow's writer names; a codec pyarrow cannot write
# (LZO, Hadoop's framed LZ4) is absent and its shards are written with zstd
CODECS = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
          "LZ4_RAW": "lz4", "LZ4": "lz4"}
FALLBACK_CODEC = "zstd"


def parquet_schema(shard: Shard) -> pa.Schema:
    try:
        return pq.read_schema(source(shard.path))
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is not a readable Parquet file ({exc}); remove or "
                         "replace it") from None


def _corrupt(shard: Shard, exc: BaseException) -> Exception:
    return read_error(shard.path, exc, f"shard {shard.path!r} is corrupt or truncated ({exc}); remove or replace it")


def parquet_metadata(shard: Shard) -> pq.FileMetaData:
    try:
        return pq.ParquetFile(source(shard.path)).metadata
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


def read_parquet(shard: Shard, columns: list[str], row_groups=None) -> pa.Table:
    try:
        f = pq.ParquetFile(source(shard.path))
        return f.read(columns=columns) if row_groups is None else f.read_row_groups(list(row_groups), columns=columns)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


def open_streamed(shard: Shard) -> pq.ParquetFile:
    """The shard opened for streamed reads: column chunks read through a small buffer, nothing pre-read."""
    try:
        return pq.ParquetFile(source(shard.path), buffer_size=BUFFER_BYTES, pre_buffer=False)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


def batch_rows(meta: pq.FileMetaData, columns, batch_bytes: int = BATCH_BYTES) -> int:
    """Rows per streamed batch so that one holds about ``batch_bytes`` of ``columns`` (None: all), from
    the row groups' uncompressed sizes."""
    if meta.num_rows == 0 or meta.num_row_groups == 0:
        return MIN_BATCH_ROWS
    wanted = None if columns is None else set(columns)
    size = 0
    for g in range(meta.num_row_groups):  # one step per row group and column chunk (footer data only)
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if wanted is None or col.path_in_schema.split(".")[0] in wanted:
                size += col.total_uncompressed_size
    per_row = max(1.0, size / meta.num_rows)
    return int(min(MAX_BATCH_ROWS, max(MIN_BATCH_ROWS, batch_bytes // per_row)))


def iter_parquet(shard: Shard, columns, batch_bytes: int | None = None, row_groups=None):
    """The shard's ``columns`` (None: all) of its ``row_groups`` (None: all) as tables of consecutive
    rows, about ``batch_bytes`` (default BATCH_BYTES) each, in order; no rows: one empty table."""
    f = open_streamed(shard)
    size = batch_rows(f.metadata, columns, batch_bytes or BATCH_BYTES)
    it = f.iter_batches(batch_size=size, row_groups=row_groups, columns=columns, use_threads=True)
    yielded = False
    while True:
        try:
            batch = next(it)
        except StopIteration:
            break
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise _corrupt(shard, exc) from None
        yielded = True
        yield pa.Table.from_batches([batch])
    if not yielded:
        schema = f.schema_arrow
        if columns is not None:
            schema = pa.schema([schema.field(c) for c in columns], metadata=schema.metadata)
        yield schema.empty_table()


def shard_codec(meta: pq.FileMetaData, fallback: str = FALLBACK_CODEC):
    """The codec a shard's columns are written with, as pyarrow's writer names it: one name when every
    column chunk uses the same, else {column path: name}; ``fallback`` for a shard without row groups
    and for a codec pyarrow cannot write."""
    codecs = {}
    for g in range(meta.num_row_groups):  # footer data: one step per row group and column chunk
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            codecs.setdefault(col.path_in_schema, CODECS.get(str(col.compression).upper(), fallback))
    names = set(codecs.values())
    if not names:
        return fallback
    if len(names) == 1:
        return names.pop()
    return codecs


def device_readable(shards, cfg: InputConfig, score_column: str | None = None) -> bool:
    """Whether every shard's text column can be read by a device reader: all shards are Parquet
    files whose text column is a UTF-8 string column used for nothing else (no vector column), or
    memory shards whose text is already in device memory."""
    if not shards or cfg.vector_column or cfg.text_column in (cfg.id_column, score_column):
        return False
    for shard in shards:  # one schema (footer) read per shard
        if shard.format == "memory" and shard.text is not None:
            continue  # already in device memory
        if shard.format != "parquet":
            return False
        schema = parquet_schema(shard)
        if schema.names.count(cfg.text_column) != 1:
            return False  # missing or repeated: the host read reports it
        text_type = schema.field(cfg.text_column).type  # UTF-8 only: binary, dictionary, null go to the host
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            return False
    return True
