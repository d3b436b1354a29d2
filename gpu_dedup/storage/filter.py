"""Kept rows of one input shard, written under its name: Parquet keeps its schema (and schema metadata)
and, with ``output.compression: same``, its codec; JSONL keeps the kept lines byte for byte, in the
input's compression; Arrow IPC keeps its flavour (stream or file), schema and schema metadata.  All are
streamed: the shard is read a batch (a block of lines, a record batch) at a time while the kept rows are
written."""

from __future__ import annotations

import io
import logging
import os
import tempfile
import time
from contextlib import closing
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array, filter_rows, numpy_array
from gpu_dedup.errors import InputError, ResourceError
from gpu_dedup.storage.ahead import ahead
from gpu_dedup.storage.arrow import write_arrow
from gpu_dedup.storage.atomic import (
    atomically,
    busy_into,
    memory_digest,
    no_busy,
    publish,
    sync_file,
    unlink,
    written_digest,
)
from gpu_dedup.storage.content import schema_difference
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import as_path, is_url, put_bytes
from gpu_dedup.storage.identity import check_unchanged
from gpu_dedup.storage.jsonl import STREAM_BLOCK, codec_of, gather_lines_of, jsonl_blocks, nonblank_lines
from gpu_dedup.storage.parquet import footer, input_bytes, iter_parquet, parquet_metadata, shard_codec

log = logging.getLogger("gpu_dedup")


_SAID: set = set()  # the device writer's set-aside reasons already logged by this process


def _set_aside(shard: Shard, why: str, every: bool = False) -> None:
    """Say once per reason that the device writer's shard (``every``: all of them) was set aside and pyarrow
    writes it."""
    if every:
        log.warning("gpu.writer: %s; pyarrow writes every shard", why)
        return
    if why not in _SAID:
        _SAID.add(why)
        log.warning("gpu.writer cudf: the shard cuDF wrote for %s would change its logical schema (%s), so "
                    "pyarrow writes it again; shards like it cost both writers: set gpu.writer: pyarrow",
                    shard.path, why)


def _write_parquet_on_device(shard: Shard, keep, target: Path, compression: str, writer) -> int | None:
    """The GPU backend's Parquet writer (cuDF: read, filter and write in device memory) into a
    temporary file, published when the written schema is the input's; None (nothing written)
    when the writer cannot write this codec or the schema would change."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    try:
        rows = writer(shard, keep, tmp, compression)  # the shard: its footer is held
        why = None if rows is None else schema_difference(pq.read_schema(tmp), footer(shard).schema)
        if rows is None or why is not None:
            if why is not None:
                _set_aside(shard, why)
            unlink(tmp)
            return None
        sync_file(tmp)
        publish(tmp, target)
        return rows
    except BaseException:
        unlink(tmp)
        raise


def write_shards_on_device(shards: list, keep: np.ndarray, starts, out_dir, compression: str, table, writer,
                           streams: int = 1, times: dict | None = None, host_sink: bool = False) -> dict:
    """Every shard's kept rows written by the device, ``writer(table, starts, keep, paths, codec, streams, after)``
    (the GPU backend's :meth:`~gpu_dedup.backends.gpu.GPUBackend.write_table`: ``table`` holds every column of all
    ``shards``, shard ``k`` at rows ``starts[k]:starts[k+1]``; ``streams`` 1: in one call, more: a file per CUDA
    stream, that many at once), into temporary files; each file is published under its shard's name when its
    content is the input's kind (the same logical schema and the kept row count, see
    :mod:`gpu_dedup.storage.content`), else removed (said once per reason).  Returns ``{k: record}`` of the
    shards published, each with its :func:`~gpu_dedup.storage.atomic.written_digest` taken on the thread that
    checked it: the caller writes the others on the host.  Nothing is written where the shards do not share one
    codec the writer can write, or the output is an object store.  ``times``: given (a :func:`~gpu_dedup.storage.
    no_busy`), it gets ``device_write_seconds``, the seconds until the writer handed over its first file (with
    ``streams`` 1: libcudf's write of every file), ``device_files_seconds``, the seconds after that until the last
    file was checked, synced and digested, and the threads' seconds syncing and digesting them added
    (:func:`~gpu_dedup.storage.busy_into`).  ``host_sink``: the writer encodes each file into host memory (an
    ``io.BytesIO``), and each file's thread writes those bytes, syncs and checks the file and takes its SHA-256
    from them: nothing is read back from the disk (where the writer's own file writes bypass the page cache, the
    digests read every file back from the disk), for host memory as large as the files."""
    out = as_path(out_dir)
    if not shards or is_url(out) or any(s.format != "parquet" for s in shards):
        return {}
    codecs = [resolve_codec(compression, s) for s in shards]  # a name, or {column: name} where columns differ
    if any(not isinstance(c, str) for c in codecs) or len(set(codecs)) != 1:
        return {}
    codec = codecs[0]
    check_unchanged(shards)  # the rows to keep were decided on what was read then
    out.mkdir(parents=True, exist_ok=True)
    tmps = []
    for s in shards:
        fd, tmp = tempfile.mkstemp(prefix=f".{s.name}.", suffix=".device.tmp", dir=out)
        os.close(fd)
        tmps.append(tmp)
    done: dict = {}
    first: list = []  # when the writer handed over its first file
    sinks: list = [io.BytesIO() for _ in shards] if host_sink else tmps

    busy = times if times is not None else no_busy()

    def written(k: int, rows: int) -> None:  # on the thread that wrote (or was given) file k
        if not first:
            first.append(time.perf_counter())
        shard = shards[k]
        data = None
        if host_sink:  # the file's bytes, in memory: on the disk now, digested from memory below
            data, sinks[k] = sinks[k].getbuffer(), None
            with open(tmps[k], "wb") as f:
                f.write(data)
        why = written_difference(tmps[k], shard, rows)
        if why is None:
            with busy_into(busy):
                sync_file(tmps[k])
                publish(tmps[k], out / shard.name)
                record = written_digest(out / shard.name) if data is None else memory_digest(data, out / shard.name)
                done[k] = {"name": shard.name, **record}
        else:
            _set_aside(shard, why)

    t0 = time.perf_counter()
    try:
        try:
            writer(table, starts, keep, sinks, codec, streams, written)
            if times is not None:
                t1 = time.perf_counter()
                handed = first[0] if first else t1
                times.update(device_write_seconds=round(handed - t0, 4),
                             device_files_seconds=round(t1 - handed, 4))
        except (MemoryError, RuntimeError, ValueError, TypeError, NotImplementedError, AttributeError) as exc:
            _set_aside(shards[0], f"cuDF could not write them ({type(exc).__name__}: {str(exc)[:200]})", every=True)
            for k in list(done):  # a file another stream had published: written again on the host, as the others
                unlink(out / shards[k].name)
            return {}
        return dict(sorted(done.items()))
    finally:
        for tmp in tmps:
            unlink(tmp)


def written_difference(path, shard: Shard, rows: int) -> str | None:
    """Why the file the device wrote at ``path`` is not ``shard``'s kind with ``rows`` rows (its logical schema,
    its row count, or a file that cannot be read back), or None."""
    try:
        why = schema_difference(pq.read_schema(path), footer(shard).schema)
        written = pq.read_metadata(path).num_rows
    except (OSError, pa.ArrowException) as exc:
        return f"its file cannot be read back ({exc})"
    return why if why is not None or written == rows else f"{written} rows written, {rows} kept"


def resolve_codec(compression: str, shard: Shard):
    """The Parquet codec to write ``shard``'s kept rows with: ``compression``, or for ``same`` the
    shard's own (see :func:`~gpu_dedup.storage.parquet.shard_codec`; a name, or {column: name})."""
    if compression != "same":
        return compression
    try:
        return shard_codec(footer(shard).metadata)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _unreadable(shard, exc) from None


def write_shard(shard: Shard, keep: np.ndarray, out_dir: str | Path, compression: str = "same",
                device_writer=None, held: list | None = None, wrote: list | None = None) -> int:
    """Write the kept rows of one input shard under its name in ``out_dir``; return rows written.

    ``compression``: the Parquet codec, or ``same`` (the input shard's; JSONL keeps its own
    compression whatever it is).  A memory shard is not written: its kept rows are the caller's to take
    (``shard.data.filter(keep)``).  ``device_writer(shard, keep, tmp, compression)``: the GPU
    backend's Parquet writer (cuDF), tried first for Parquet shards; returns the rows written
    or None where it cannot keep the codec or schema (pyarrow writes the shard then).  ``held``: the
    shard's batches as the read stage read them (every column; a list, emptied by this call): the kept rows
    are taken from them, and the shard is not read again (the same bytes are written).  ``wrote``: a list that
    the writer of a Parquet shard offered to ``device_writer`` is appended to (``cudf``, or ``pyarrow`` where the
    device declined it)."""
    if shard.format == "memory":
        return int(np.count_nonzero(keep))
    check_unchanged([shard])  # the rows to keep were decided on what was read then
    target = as_path(out_dir) / shard.name  # a local path, or a URL (uploaded: the device writer writes files)
    if shard.format == "parquet":
        codec = resolve_codec(compression, shard)
        # device branch (tools/device_branches.py): the run's placement chose the device writer (gpu.writer, no
        # device table held) and passes it, or None; a shard it cannot write keeps the host writer
        if device_writer is not None and isinstance(codec, str) and not is_url(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            rows = _write_parquet_on_device(shard, keep, target, codec, device_writer)
            if wrote is not None:
                wrote.append("pyarrow" if rows is None else "cudf")
            if rows is not None:
                return rows
        return _write_parquet(shard, keep, target, codec, held)
    if shard.format == "arrow":
        return write_arrow_shard(shard, keep, target)
    return write_jsonl_shard(shard, keep, target)


def write_arrow_shard(shard: Shard, keep: np.ndarray, target: Path) -> int:
    """The kept rows of an Arrow IPC shard (see :func:`gpu_dedup.storage.arrow.write_arrow`), synced and
    published as every written file."""

    def write(fd, tmp):
        os.close(fd)
        write_arrow(shard, keep, tmp)

    _published(target, write)
    return int(np.count_nonzero(keep))


def _published(target, write) -> None:
    """``write(fd, tmp)`` fills a temporary file that becomes ``target``: synced to the disk and renamed into
    place (a power loss must not leave a shard that ``_SUCCESS`` vouches for with its blocks never written), or
    for a URL uploaded as one object (from a local temporary file, removed afterwards)."""
    if not is_url(target):
        atomically(target, None, write, durable=True)
        return
    fd, tmp = tempfile.mkstemp(prefix=".gpu-dedup-upload.", suffix=".tmp")
    held = _nameless(fd, tmp)
    try:
        path = tmp if held is None else f"/proc/self/fd/{held}"
        write(fd, path)
        with pa.memory_map(path) as f:
            put_bytes(target, f.read_buffer())
    finally:
        if held is None:
            unlink(tmp)
        else:
            os.close(held)


def _nameless(fd: int, tmp: str) -> int | None:
    """A second descriptor of the temporary file ``tmp`` (open as ``fd``) whose name is removed at once, so that
    nothing is left in the temporary directory even when the process is killed (the kernel frees the file with
    its last descriptor); the file is reopened by its ``/proc/self/fd`` link.  None where there is no such link
    (not Linux): the file keeps its name until it is uploaded."""
    link = f"/proc/self/fd/{fd}"
    if not os.path.exists(link):
        return None
    held = os.dup(fd)
    try:
        os.close(os.open(f"/proc/self/fd/{held}", os.O_RDONLY))  # the link reopens the file
        os.unlink(tmp)
    except OSError:
        os.close(held)
        return None
    return held


def _changed(shard: Shard, then: int, now: int, what: str = "rows") -> InputError:
    return InputError(f"shard {shard.path!r} had {then} {what} when read and {now} now; "
                      "inputs must not change during a run")


def _unreadable(shard: Shard, exc: BaseException) -> Exception:
    if isinstance(exc, MemoryError):
        return ResourceError(f"ran out of memory reading shard {shard.path!r} to write its kept rows ({exc}); "
                             "the shard itself may be fine: free memory or split the input")
    return InputError(f"shard {shard.path!r} became unreadable during the run ({exc})")


ROW_GROUP_ROWS = 1024 * 1024  # pyarrow's default rows per written row group
WRITE_COPIES = 3  # copies of one written row group's bytes a Parquet shard's write holds at its peak (2.65 measured)
STREAMED_WRITE_BYTES = 64 << 20  # what a JSONL or Arrow shard's write holds: a block or a batch at a time


def write_memory(shard: Shard) -> int:
    """About the most memory :func:`write_shard` takes for ``shard`` (from its footer): a Parquet shard's write
    holds a batch or two read, the kept rows of one output row group and their copy into one array per column
    (:func:`_write_parquet`): :data:`WRITE_COPIES` times the bytes of one row group of its rows."""
    if shard.format != "parquet":
        return STREAMED_WRITE_BYTES
    try:
        rows, total = parquet_metadata(shard).num_rows, input_bytes(shard)
    except InputError:  # the write itself says what is wrong with the shard
        return STREAMED_WRITE_BYTES
    return WRITE_COPIES * total * min(rows, ROW_GROUP_ROWS) // rows if rows else STREAMED_WRITE_BYTES


def concurrent_writes(needs: list, threads: int, available: int, share: float = 0.5) -> int:
    """How many shard writes of peak memory ``needs`` (:func:`write_memory`) to run at once: at most ``threads``,
    and only as many as fit together in ``share`` of the ``available`` memory should the largest run together;
    one at least.  A shard per core at once wrote shards of a row group of 10^6 rows (gigabytes each) as many
    at a time as the machine had cores."""
    k = max(1, min(threads, len(needs)))
    largest = sorted(needs, reverse=True)
    while k > 1 and sum(largest[:k]) > share * available:
        k -= 1
    return k


def _write_parquet(shard: Shard, keep: np.ndarray, target: Path, codec, held: list | None = None) -> int:
    """The kept rows, streamed: the shard is read a batch at a time and each batch filtered (on a reader
    thread, a batch ahead), and the kept rows are written as a whole-table ``pq.write_table`` writes
    them: row groups of ``ROW_GROUP_ROWS``, each column of a row group handed to the writer as one
    run of values (the writer cuts its pages and dictionary fallbacks by where its write batches
    fall, so this is what makes the file byte for byte the one a whole read, filter and write gives).
    Memory: a batch or two read, plus the kept rows of one output row group (their pieces are
    copied into each column's one run and dropped piece by piece).  ``held``: the batches the read stage
    kept (the same ones :func:`iter_parquet` gives), taken instead of reading the shard, each dropped
    once filtered."""
    if held is None:
        try:
            meta = footer(shard).metadata
        except (OSError, pa.ArrowException, MemoryError) as exc:
            raise _unreadable(shard, exc) from None
        if meta.num_rows != keep.shape[0]:
            raise _changed(shard, keep.shape[0], meta.num_rows)
    elif sum(t.num_rows for t in held) != keep.shape[0]:  # pragma: no cover - the read stage counted them
        raise RuntimeError(f"shard {shard.path!r}: {sum(t.num_rows for t in held)} rows held, {keep.shape[0]} read")
    kept_rows = int(np.count_nonzero(keep))
    group = min(kept_rows, ROW_GROUP_ROWS)

    def batches():
        if held is None:
            yield from iter_parquet(shard, None)  # read errors: one InputError / ResourceError
            return
        while held:
            yield held.pop(0)

    def kept_batches():  # on the reader thread: read and filtered a batch ahead of the writer
        start = 0
        for batch in batches():
            n = batch.num_rows
            yield _filter_rows(batch, arrow_array(keep[start:start + n], pa.bool_()), shard.path)
            start += n
        if start != keep.shape[0]:
            raise _changed(shard, keep.shape[0], start)

    def write(fd, tmp):
        os.close(fd)
        writer = None
        pieces, held = [], 0  # the current row group's kept rows
        try:
            with closing(ahead(kept_batches())) as batches:  # the reader thread stops even on an error
                for kept in batches:
                    if writer is None:
                        writer = pq.ParquetWriter(tmp, kept.schema, compression=_codec_arg(codec))
                    while kept.num_rows:  # one step per batch, two where a row group ends in it
                        take = kept.slice(0, group - held)
                        kept = kept.slice(take.num_rows)
                        pieces.append(take)
                        held += take.num_rows
                        if held == group:
                            _write_group(writer, pieces)
                            pieces, held = [], 0
            if held:  # the last, shorter row group
                _write_group(writer, pieces)
            if kept_rows == 0:  # the schema and one empty row group, as pq.write_table of no rows writes
                writer.write_table(writer.schema.empty_table())
        finally:
            if writer is not None:
                writer.close()

    _published(target, write)
    return kept_rows


def _codec_arg(codec):
    if isinstance(codec, dict):  # per column ("none" by name: a column's codec cannot be None)
        return codec
    return None if codec == "none" else codec


def _write_group(writer, pieces: list) -> None:
    """One row group of the rows of ``pieces`` (tables, emptied by this call), each column one array."""
    schema = pieces[0].schema
    dictionaries = _joined_dictionaries(schema, pieces)
    if dictionaries is None:  # each record batch its own row group, as the input's row groups were
        for batch in (b for t in pieces for b in t.to_batches()):
            writer.write_batch(batch)
        pieces.clear()
        return
    columns = [[c for t in pieces for c in t.column(i).chunks] if i not in dictionaries else None
               for i in range(len(schema))]
    pieces.clear()
    arrays = []
    for i, field in enumerate(schema):  # one step per column
        if i in dictionaries:
            arrays.append(dictionaries.pop(i))
            continue
        chunks, columns[i] = columns[i], None
        arrays.append(_one_array(chunks, field.type))
    writer.write_table(pa.Table.from_arrays(arrays, schema=schema), row_group_size=max(1, len(arrays[0])))


def _joined_dictionaries(schema: pa.Schema, pieces: list) -> dict | None:
    """Each dictionary column of ``pieces`` as one array, by column number; None where the values of one do not
    fit its index type together: a row group is read back as one dictionary of that type (pandas' int8 codes,
    each batch written with its own categories, can hold more values in all than 127)."""
    joined = {}
    for i, field in enumerate(schema):
        if pa.types.is_dictionary(field.type):
            try:
                joined[i] = pa.concat_arrays([c for t in pieces for c in t.column(i).chunks])
            except pa.ArrowInvalid:
                return None
    return joined


def _one_array(chunks: list, type_: pa.DataType) -> pa.Array:
    """The chunks (a list, emptied by this call) as one array.  Strings, binaries and fixed-width
    values are copied into buffers of the final size, each chunk dropped once copied (the memory this
    takes is the column plus one chunk); other types are concatenated by Arrow."""
    n = sum(len(c) for c in chunks)
    large = pa.types.is_large_string(type_) or pa.types.is_large_binary(type_)
    variable = large or pa.types.is_string(type_) or pa.types.is_binary(type_)
    fixed = not variable and pa.types.is_primitive(type_) and not pa.types.is_boolean(type_)
    if len(chunks) == 1 or not (variable or fixed):
        out = pa.concat_arrays(chunks) if chunks else empty_array(type_)
        chunks.clear()
        return out
    nulls = sum(c.null_count for c in chunks)
    pool = pa.default_memory_pool()
    valid = np.empty(n if nulls else 0, bool)
    if variable:
        offsets = np.empty(n + 1, np.int64 if large else np.int32)
        offsets[0] = 0
        data = np.empty(sum(_value_bytes(c, large) for c in chunks), np.uint8)
    else:
        width = type_.bit_width // 8
        data = np.empty(n * width, np.uint8)
    row = pos = 0
    while chunks:  # one step per chunk
        c = chunks.pop(0)
        m = len(c)
        if nulls:
            valid[row:row + m] = numpy_array(c.is_valid())
        bufs = c.buffers()
        if variable:
            off = np.frombuffer(bufs[1], np.int64 if large else np.int32)[c.offset:c.offset + m + 1]
            nb = int(off[-1] - off[0])
            if nb:
                data[pos:pos + nb] = np.frombuffer(bufs[2], np.uint8)[off[0]:off[-1]]
            offsets[row + 1:row + m + 1] = off[1:] - off[0] + pos
        else:
            nb = m * width
            if nb:
                data[pos:pos + nb] = np.frombuffer(bufs[1], np.uint8)[c.offset * width:c.offset * width + nb]
        row, pos = row + m, pos + nb
        del c, bufs
        pool.release_unused()  # the chunk's memory back to the system now, not when Arrow next allocates
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    buffers = [validity, pa.py_buffer(offsets), pa.py_buffer(data)] if variable else [validity, pa.py_buffer(data)]
    return pa.Array.from_buffers(type_, n, buffers, null_count=nulls)


def _value_bytes(chunk: pa.Array, large: bool) -> int:
    if len(chunk) == 0:
        return 0
    off = np.frombuffer(chunk.buffers()[1], np.int64 if large else np.int32)
    return int(off[chunk.offset + len(chunk)] - off[chunk.offset])


def write_jsonl_shard(shard: Shard, keep: np.ndarray, target: Path) -> int:
    """The kept lines of a JSONL shard, byte for byte, in its compression: read, filtered and
    written (compressed) a block of lines at a time."""
    codec = codec_of(shard.path)

    def write(fd, tmp):
        seen = 0
        with pa.PythonFile(os.fdopen(fd, "wb"), mode="w") as raw:
            out = pa.CompressedOutputStream(raw, codec) if codec else raw
            with out:
                blocks = jsonl_blocks(shard.path)  # read errors: InputError / ResourceError
                if shard.size > STREAM_BLOCK // 8:  # the next block read and decompressed while this one is written
                    blocks = ahead(blocks)  # (a smaller file is one block: a thread to start for nothing)
                with closing(blocks) as blocks:
                    for block in blocks:
                        data = np.frombuffer(block, np.uint8)
                        starts, ends = nonblank_lines(data)
                        mine = keep[seen:seen + starts.shape[0]]
                        seen += starts.shape[0]
                        if seen > keep.shape[0]:
                            break
                        out.write(gather_lines_of(data, starts[mine], ends[mine]))
        if seen != keep.shape[0]:
            raise _changed(shard, keep.shape[0], seen, "records")

    _published(target, write)
    return int(np.count_nonzero(keep))


def _filter_rows(table: pa.Table, mask: pa.Array, path: str) -> pa.Table:
    """``table.filter(mask)``, view types too (:func:`~gpu_dedup.backends.arrow_arrays.filter_rows`: filtered as
    large strings / binaries and cast back, so the shard keeps its schema); a column of a type whose rows Arrow
    cannot select at all is named in one error."""
    try:
        return filter_rows(table, mask)
    except pa.ArrowNotImplementedError as exc:
        for field, col in zip(table.schema, table.columns):
            try:
                filter_rows(pa.Table.from_arrays([col.slice(0, 0)], schema=pa.schema([field])), mask.slice(0, 0))
            except pa.ArrowNotImplementedError:
                raise InputError(f"column {field.name!r} of shard {path!r} has type {field.type}, whose rows Arrow "
                                 f"cannot select ({exc}); rewrite the shard with that column in a plain type") from None
        raise


