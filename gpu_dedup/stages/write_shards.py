"""Write stage: deduplicated shards and tables, every file atomically.

Writing filters each input shard by a keep-mask and writes it under the same
relative name: Parquet keeps its schema (and schema metadata); JSONL keeps
the kept lines byte for byte.  Every file is written to a temporary name in
the output directory and renamed into place.  A write that fails (a full
disk, a read-only directory) removes its temporary file and raises one clear
error (:class:`~gpu_dedup.errors.ResourceError` / :class:`~gpu_dedup.errors.OutputError`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.errors import ConfigError, InputError, OutputError, ResourceError
from gpu_dedup.stages.read_shards import (VIEW_TYPES, Shard, _gather_lines, _jsonl_lines, _read_bytes,
                                         check_unchanged, without_views)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _publish(tmp: str, path: Path) -> None:
    """Give the temporary file the mode a plain open() would (0666 minus umask), then rename it."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def write_error(path, exc: OSError) -> Exception:
    """One clear error for an OS error writing ``path``: disk full, read-only or not permitted; else ``exc``."""
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT) or "No space left" in text or "quota exceeded" in text.lower():
        return ResourceError(f"disk full writing {str(path)!r} ({exc.strerror or text}); the partial file was removed "
                             "and nothing was published for this run: free space (or choose another -o) and rerun")
    if code in (errno.EROFS, errno.EACCES, errno.EPERM) or "Read-only file system" in text \
            or "Permission denied" in text:
        return OutputError(f"cannot write {str(path)!r} ({exc.strerror or text}); the output directory must be "
                           "writable: choose another -o or fix its permissions")
    return exc


def _mkstemp(path: Path, tmp_dir) -> tuple[int, str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=tmp_dir or path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None


def _atomically(path: Path, tmp_dir, write) -> None:
    """``write(fd, tmp)`` fills a temporary file (in ``tmp_dir``, default beside ``path``), which is then
    renamed to ``path``; on any failure the temporary file is removed and an OS error becomes one message."""
    fd, tmp = _mkstemp(path, tmp_dir)
    try:
        write(fd, tmp)
        _publish(tmp, path)
    except BaseException as exc:
        _unlink(tmp)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise


def atomic_write_bytes(path: str | Path, payload: bytes, tmp_dir=None) -> None:
    """Write ``payload`` to a temporary file (in ``tmp_dir``, default beside ``path``), then rename it."""

    def write(fd, tmp):
        with os.fdopen(fd, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())

    _atomically(Path(path), tmp_dir, write)


def atomic_write_parquet(path: str | Path, table: pa.Table, compression: str = "zstd") -> None:
    def write(fd, tmp):
        os.close(fd)
        pq.write_table(table, tmp, compression=None if compression == "none" else compression)

    _atomically(Path(path), None, write)


def file_digest(path) -> dict:
    """Size and SHA-256 of a file (what the output manifest records and ``_SUCCESS`` vouches for)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return {"size": os.path.getsize(path), "sha256": h.hexdigest()}


def _unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


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
        if rows is None or not _same_schema(pq.read_schema(tmp), pq.read_schema(shard.path)):
            _unlink(tmp)
            return None
        _publish(tmp, target)
        return rows
    except BaseException:
        _unlink(tmp)
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
    target = Path(out_dir) / shard.name
    if shard.format == "parquet" and device_writer is not None:
        target.parent.mkdir(parents=True, exist_ok=True)
        rows = _write_parquet_on_device(shard, keep, target, compression, device_writer)
        if rows is not None:
            return rows
    if shard.format == "parquet":
        try:
            table = pq.ParquetFile(shard.path).read()
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
    raw = _read_bytes(shard.path)
    data, starts, ends = _jsonl_lines(raw)
    if starts.shape[0] != keep.shape[0]:
        raise InputError(
            f"shard {shard.path!r} had {keep.shape[0]} records when read and {starts.shape[0]} now; "
            "inputs must not change during a run"
        )
    body = _gather_lines(data, starts[keep], ends[keep])
    atomic_write_bytes(target, _compress_like(shard.path, body))
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


def _compress_like(path: str, body: bytes) -> bytes:
    low = path.lower()
    codec = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd"}.get(os.path.splitext(low)[1])
    if codec is None:
        return body
    sink = pa.BufferOutputStream()
    with pa.CompressedOutputStream(sink, codec) as out:
        out.write(body)
    return sink.getvalue().to_pybytes()


# Column names gpu_dedup gives the documents it reports (duplicates.parquet, the DataFrame API's duplicates,
# index queries): ``row`` numbers documents (0-based, in input order across the shards; it continues an index's
# numbering in a run against an index).  A user's id column keeps its own name beside them.
ROW = "row"
RESERVED_COLUMNS = (ROW, "cluster_id", "kept", "similarity", "match", "survivor_id", "in_index", "shard", "shard_row",
                    "query", "exact")


def check_id_column(name: str | None) -> None:
    """Refuse a user id column whose name gpu_dedup's outputs already use for something else."""
    if name in RESERVED_COLUMNS:
        raise ConfigError(
            f"id column {name!r} has the name of a column gpu_dedup writes ({', '.join(RESERVED_COLUMNS)}); "
            "choose another id column, or none: every document is numbered in the column 'row' anyway")


def duplicates_table(*, rows, shard_starts, shard_names, kept, cluster, similarity, exact, first_row=0, ids=None,
                     survivor_ids=None, id_column=None, in_index=None) -> pa.Table:
    """The duplicates table: one row per member of a cluster of two or more documents, in row order.

    Every argument but the shard layout is per member (host arrays / Arrow):
    ``rows`` the input row (the ``row`` column is ``first_row + rows``: the
    document's number across runs against an index), ``ids`` /
    ``survivor_ids`` the user ids (column ``id_column``) of the member and of
    its survivor, or None when the input has no id column, ``cluster`` the
    survivor's document number, ``exact`` whether it has the survivor's
    normalized text, ``in_index`` (runs against an index) whether the
    survivor is an indexed document.
    """
    rows = np.asarray(rows, np.int64)
    kept = np.asarray(kept, bool)
    shard = np.searchsorted(np.asarray(shard_starts), rows, side="right") - 1
    names = np.array(shard_names or [""], dtype=object)
    match = np.where(kept, "kept", np.where(exact, "exact", "near"))
    cols = {}
    if ids is not None:
        check_id_column(id_column)
        cols[id_column] = ids
    cols[ROW] = pa.array(first_row + rows, pa.int64())
    cols.update({
        "cluster_id": pa.array(np.asarray(cluster, np.int64), pa.int64()),
        "kept": pa.array(kept),
        "similarity": pa.array(np.asarray(similarity).astype(np.float32)),
        "match": pa.array(match, pa.string()),
    })
    if survivor_ids is not None:
        cols["survivor_id"] = survivor_ids
    if in_index is not None:
        cols["in_index"] = pa.array(np.asarray(in_index, bool))
    cols["shard"] = pa.array(names[shard] if rows.shape[0] else [], pa.string())
    cols["shard_row"] = pa.array(rows - np.asarray(shard_starts)[shard] if rows.shape[0] else [], pa.int64())
    return pa.table(cols)
