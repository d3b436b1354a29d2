"""Kept rows of one input shard, written under its name: Parquet keeps its schema (and schema metadata);
JSONL keeps the kept lines byte for byte, in the input's compression."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.errors import InputError, ResourceError
from gpu_dedup.storage.atomic import (
    atomic_write_bytes,
    atomic_write_parquet,
    publish,
    unlink,
)
from gpu_dedup.storage.columns import VIEW_TYPES, without_views
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import as_path, is_url, source
from gpu_dedup.storage.identity import check_unchanged
from gpu_dedup.storage.jsonl import (
    compress_like,
    gather_lines_of,
    jsonl_lines,
    read_bytes,
)


def _same_schema(written: pa.Schema, source: pa.Schema) -> bool:
    """Same fields and types, and no schema metadata of the source's own that ``written`` lacks
    (pandas' and Arrow's bookkeeping keys aside)."""
    own = {k: v for k, v in (source.metadata or {}).items() if k not in (b"pandas", b"ARROW:schema")}
    kept = written.metadata or {}
    return written.remove_metadata().equals(source.remove_metadata()) and all(kept.get(k) == v
                                                                               for k, v in own.items())


def _write_parquet_on_device(shard: Shard, keep, target: Path, compression: str, writer) -> int | None:
    """The GPU backend's Parquet writer (cuDF: read, filter and write in device memory) into a
    temporary file, published when the written schema is the input's; None (nothing written)
    when the writer cannot write this codec or the schema would change."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        rows = writer(shard.path, keep, tmp, compression)
        if rows is None or not _same_schema(pq.read_schema(tmp), pq.read_schema(source(shard.path))):
            unlink(tmp)
            return None
        publish(tmp, target)
        return rows
    except BaseException:
        unlink(tmp)
        raise


def write_shard(shard: Shard, keep: np.ndarray, out_dir: str | Path, compression: str = "zstd",
                device_writer=None) -> int:
    """Write the kept rows of one input shard under its name in ``out_dir``; return rows written.

    A memory shard is not written: its kept rows are the caller's to take
    (``shard.data.filter(keep)``).  ``device_writer(path, keep, tmp, compression)``: the GPU
    backend's Parquet writer (cuDF), tried first for Parquet shards; returns the rows written
    or None where it cannot keep the codec or schema (pyarrow writes the shard then)."""
    if shard.format == "memory":
        return int(np.count_nonzero(keep))
    check_unchanged([shard])  # the rows to keep were decided on what was read then
    target = as_path(out_dir) / shard.name  # a local path, or a URL (uploaded: the device writer writes files)
    if shard.format == "parquet" and device_writer is not None and not is_url(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = _write_parquet_on_device(shard, keep, target, compression, device_writer)
        if rows is not None:
            return rows
    if shard.format == "parquet":
        try:
            table = pq.ParquetFile(source(shard.path)).read()
        except (OSError, pa.ArrowException) as exc:
            if isinstance(exc, MemoryError):
                raise ResourceError(f"ran out of memory reading shard {shard.path!r} to write its kept rows ({exc}); "
                                    "the shard itself may be fine: free memory or split the input") from None
            raise InputError(f"shard {shard.path!r} became unreadable during the run ({exc})") from None
        if table.num_rows != keep.shape[0]:
            raise InputError(
                f"shard {shard.path!r} had {keep.shape[0]} rows when read and {table.num_rows} now; "
                "inputs must not change during a run"
            )
        kept = _filter_rows(table, pa.array(keep), shard.path)
        atomic_write_parquet(target, kept, compression)
        return kept.num_rows
    raw = read_bytes(shard.path)
    data, starts, ends = jsonl_lines(raw)
    if starts.shape[0] != keep.shape[0]:
        raise InputError(
            f"shard {shard.path!r} had {keep.shape[0]} records when read and {starts.shape[0]} now; "
            "inputs must not change during a run"
        )
    body = gather_lines_of(data, starts[keep], ends[keep])
    atomic_write_bytes(target, compress_like(shard.path, body))
    return int(keep.sum())



def _filter_rows(table: pa.Table, mask: pa.Array, path: str) -> pa.Table:
    """``table.filter(mask)``, also for columns of Arrow's view types (string_view, binary_view), which
    Arrow cannot filter: they are filtered as large strings / binaries and cast back, so the shard keeps
    its schema."""
    try:
        return table.filter(mask)
    except pa.ArrowNotImplementedError:
        pass
    columns = []
    for field, col in zip(table.schema, table.columns):
        try:
            columns.append(col.filter(mask))
        except pa.ArrowNotImplementedError as exc:
            if str(field.type) not in VIEW_TYPES:
                raise InputError(f"column {field.name!r} of shard {path!r} has type {field.type}, whose rows Arrow "
                                 f"cannot select ({exc}); rewrite the shard with that column in a plain type") from None
            columns.append(without_views(col).filter(mask).cast(field.type))
    return pa.Table.from_arrays(columns, schema=table.schema)


