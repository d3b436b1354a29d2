"""Parquet shards: schema and row-group reads with one clear error, and whether a device reader can
read the text columns."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.config import InputConfig
from gpu_dedup.errors import read_error
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import source


def parquet_schema(shard: Shard) -> pa.Schema:
    try:
        return pq.read_schema(source(shard.path))
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is not a readable Parquet file ({exc}); remove or "
                         "replace it") from None


def read_parquet(shard: Shard, columns: list[str], row_groups=None) -> pa.Table:
    try:
        f = pq.ParquetFile(source(shard.path))
        return f.read(columns=columns) if row_groups is None else f.read_row_groups(list(row_groups), columns=columns)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is corrupt or truncated ({exc}); remove or "
                         "replace it") from None


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
