"""Shard files: everything gpu_dedup knows about the files it reads and writes.

============  ====================================================================
module        what it holds
============  ====================================================================
discovery     files, directories and globs -> a sorted list of :class:`Shard`
identity      a digest that changes when a shard is rewritten (checked before publishing)
jsonl         JSON Lines bytes, line scanning, parsing, bad-line reports, compression
parquet       Parquet footers (read once per process), schema, whole and streamed reads, codecs; what a device reader can read
columns       the validated ``text`` / ``id`` / ``score`` / ``vector`` columns of one shard (whole or in batches)
filter        a shard's kept rows written under its name (schema or bytes kept)
atomic        temporary file + rename for every output; file digests
ahead         a reader thread one or two batches ahead of its consumer
filesystems   URLs of object stores (s3://, gs://, any fsspec URL) beside local paths
pages         a few rows of a Parquet text column, from only the pages that hold them
pool          the Arrow memory pool of the processes gpu_dedup starts
============  ====================================================================

The stages read and write rows through these functions (:mod:`gpu_dedup.stages.read`,
:mod:`gpu_dedup.stages.write`); nothing here knows about deduplication.
"""

from gpu_dedup.storage.ahead import ahead
from gpu_dedup.storage.atomic import (
    atomic_write_bytes,
    atomic_write_parquet,
    atomic_write_parquet_groups,
    busy_into,
    file_digest,
    known_digest,
    no_busy,
    row_groups,
    written_digest,
)
from gpu_dedup.storage.columns import (
    auto_id_column,
    check_id_type,
    id_column_type,
    id_kind,
    iter_columns,
    read_columns,
    read_rows,
    rows_only,
    shard_id_kind,
    without_views,
)
from gpu_dedup.storage.discovery import (
    COMPRESSED_EXT,
    JSONL_EXT,
    MEMORY_PATH,
    PARQUET_EXT,
    Shard,
    Shards,
    discover,
    memory_shard,
)
from gpu_dedup.storage.filesystems import RemotePath, as_path, is_url, source
from gpu_dedup.storage.filter import concurrent_writes, write_memory, write_shard, write_shards_on_device
from gpu_dedup.storage.identity import check_unchanged, shard_identity
from gpu_dedup.storage.jsonl import ReadWhole
from gpu_dedup.storage.parquet import device_readable, parquet_metadata, parquet_schema

__all__ = [
    "busy_into",
    "no_busy",
    "ahead", "Shard", "Shards", "discover", "memory_shard", "MEMORY_PATH", "PARQUET_EXT", "JSONL_EXT",
    "COMPRESSED_EXT", "shard_identity", "check_unchanged", "read_columns", "iter_columns", "ReadWhole", "read_rows",
    "rows_only", "check_id_type", "without_views", "id_column_type", "auto_id_column", "id_kind",
    "shard_id_kind", "device_readable", "parquet_schema", "parquet_metadata", "write_shard", "write_shards_on_device",
    "write_memory", "concurrent_writes",
    "atomic_write_bytes", "atomic_write_parquet", "atomic_write_parquet_groups", "row_groups", "file_digest", "known_digest", "written_digest", "RemotePath",
    "as_path", "is_url", "source",
]
