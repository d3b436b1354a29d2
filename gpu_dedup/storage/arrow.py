"""Arrow IPC shards (``.arrow``): the files a Hugging Face ``Dataset.save_to_disk`` writes (IPC streams,
``data-00000-of-00003.arrow`` beside ``state.json`` and ``dataset_info.json``), and Arrow IPC files.

A local shard is memory-mapped: its record batches are the file's pages, so reading the text column copies
nothing.  An object in a store is read through its file system.  The kept rows are written back in the
input's IPC flavour (stream or file) with its schema and schema metadata (``datasets``' features), a batch
at a time: a kept file of a saved dataset loads with ``datasets.Dataset.from_file``.

A directory that ``save_to_disk`` wrote is read as the dataset it holds (see
:func:`gpu_dedup.storage.discovery.saved_dataset_files`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpu_dedup.backends.arrow_arrays import arrow_array, filter_rows
from gpu_dedup.errors import InputError, read_error
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import is_url, source

FILE_MAGIC = b"ARROW1"  # an IPC file starts (and ends) with it; a stream does not
BATCH_BYTES = 1 << 25  # tables of about this many bytes of the read columns, as Parquet's streamed batches


def _corrupt(shard: Shard, exc: BaseException) -> Exception:
    return read_error(shard.path, exc, f"shard {shard.path!r} is not a readable Arrow IPC file or stream ({exc}); "
                                       "remove or replace it")


class _Opened:
    """An Arrow shard opened for reading: ``schema``, ``batches()`` in order, ``is_file`` (IPC file, not stream)."""

    def __init__(self, shard: Shard):
        self.shard = shard
        try:
            self.src = pa.memory_map(shard.path) if not is_url(shard.path) else source(shard.path)
            head = self.src.read(len(FILE_MAGIC))
            self.src.seek(0)
            self.is_file = head == FILE_MAGIC
            self.reader = pa.ipc.open_file(self.src) if self.is_file else pa.ipc.open_stream(self.src)
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise _corrupt(shard, exc) from None
        self.schema = self.reader.schema

    def batches(self):
        try:
            if self.is_file:
                for i in range(self.reader.num_record_batches):  # one step per record batch
                    yield self.reader.get_batch(i)
            else:
                yield from self.reader
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise _corrupt(self.shard, exc) from None

    def close(self) -> None:
        self.src.close()


def arrow_schema(shard: Shard) -> pa.Schema:
    opened = _Opened(shard)
    try:
        return opened.schema
    finally:
        opened.close()


def _columns_of(table: pa.Table, columns) -> pa.Table:
    return table if columns is None else table.select(columns)


def read_arrow(shard: Shard, columns=None) -> pa.Table:
    """The whole shard (or ``columns`` of it) as one table: for a local shard, views of the mapped file (the
    mapping lives as long as they do)."""
    opened = _Opened(shard)
    return _columns_of(pa.Table.from_batches(list(opened.batches()), schema=opened.schema), columns)


def iter_arrow(shard: Shard, columns=None, batch_bytes: int | None = None):
    """The shard's rows as tables of consecutive record batches of about ``batch_bytes`` of the read columns
    (default BATCH_BYTES), in order; a shard without rows yields one empty table."""
    limit = batch_bytes or BATCH_BYTES
    opened = _Opened(shard)
    schema = _columns_of(opened.schema.empty_table(), columns).schema
    held, size, yielded = [], 0, False
    for batch in opened.batches():  # one step per record batch (datasets writes them of 1,000 rows)
        batch = batch if columns is None else batch.select(columns)
        held.append(batch)
        size += batch.nbytes
        if size >= limit:
            yield pa.Table.from_batches(held, schema=schema)
            held, size, yielded = [], 0, True
    if held or not yielded:
        yield pa.Table.from_batches(held, schema=schema)


def write_arrow(shard: Shard, keep: np.ndarray, path: str) -> int:
    """The kept rows of an Arrow shard into the file ``path``, in the shard's IPC flavour, schema and schema
    metadata, filtered a record batch at a time; returns the rows written.  Raises InputError when the shard
    no longer has ``len(keep)`` rows."""
    opened = _Opened(shard)
    writer_of = pa.ipc.new_file if opened.is_file else pa.ipc.new_stream
    seen = 0
    with pa.OSFile(str(path), "wb") as sink, writer_of(sink, opened.schema) as writer:
        for batch in opened.batches():  # one step per record batch
            n = batch.num_rows
            if seen + n > keep.shape[0]:
                seen += n
                break
            mine = keep[seen:seen + n]
            seen += n
            if mine.all():
                writer.write_batch(batch)
            elif mine.any():
                writer.write_batch(filter_rows(batch, arrow_array(mine, pa.bool_())))
    opened.close()
    if seen != keep.shape[0]:
        raise InputError(f"shard {shard.path!r} had {keep.shape[0]} rows when read and {seen} now; inputs must not "
                         "change during a run")
    return int(np.count_nonzero(keep))
