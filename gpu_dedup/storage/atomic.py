"""Atomic writes: every output file is written to a temporary name, then renamed into place.

A write that fails (a full disk, a read-only directory) removes its temporary
file and raises one clear error (:class:`~gpu_dedup.errors.ResourceError` /
:class:`~gpu_dedup.errors.OutputError`).  A URL (``s3://...``) is uploaded as one
object instead, which the store publishes whole or not at all (see
:mod:`gpu_dedup.storage.filesystems`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.errors import write_error
from gpu_dedup.storage.filesystems import digest, is_url, put_bytes, table_bytes


_BUSY_LOCK = threading.Lock()
_THREAD = threading.local()  # .busy: seconds this thread spent syncing and digesting output files


def _busy(kind: str, since: float) -> None:
    _thread_busy()[kind] += time.perf_counter() - since


def _thread_busy() -> dict:
    mine = getattr(_THREAD, "busy", None)
    if mine is None:
        mine = _THREAD.busy = {"sync": 0.0, "digest": 0.0}
    return mine


def no_busy() -> dict:
    """A :func:`busy_into` total of nothing yet."""
    return {"sync_thread_seconds": 0.0, "digest_thread_seconds": 0.0}


@contextmanager
def busy_into(total: dict):
    """Adds to ``total`` (:func:`no_busy`; threads may share one) the seconds this thread spends inside the block
    syncing output files to the disk (``sync_thread_seconds``) and digesting them (``digest_thread_seconds``): a
    thread's own seconds, so neither another thread of the process (a checkpoint's, another task's) nor another
    worker in the same process counts."""
    mine = _thread_busy()
    before = dict(mine)
    try:
        yield
    finally:
        with _BUSY_LOCK:
            for k, v in mine.items():
                key = f"{k}_thread_seconds"
                total[key] = total.get(key, 0.0) + v - before[k]  # rounded where it is reported


def _umask() -> int:
    """The process's umask, read without setting it: ``os.umask`` can only be read by setting it, which for a
    moment gives every other thread a umask of 0 (a directory the write stage makes beside a checkpoint's publish
    came out 0777); Linux says it in /proc (4.7 and later).  Elsewhere the umask the process had on import."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _UMASK_ON_IMPORT


def _umask_on_import() -> int:
    mask = os.umask(0)  # on import, before the run's threads exist
    os.umask(mask)
    return mask


_UMASK_ON_IMPORT = _umask_on_import()


def publish(tmp: str, path: Path) -> None:
    """Give the temporary file the mode a plain open() would (0666 minus umask), then rename it."""
    os.chmod(tmp, 0o666 & ~_umask())
    os.replace(tmp, path)


def _mkstemp(path: Path, tmp_dir) -> tuple[int, str]:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=tmp_dir or path.parent)
    except OSError as exc:
        raise write_error(path, exc) from None


def atomically(path: Path, tmp_dir, write, durable: bool = False) -> None:
    """``write(fd, tmp)`` fills a temporary file (in ``tmp_dir``, default beside ``path``), which is then
    renamed to ``path``; ``durable``: synced to the disk first (an output: a power loss must not leave a file
    that ``_SUCCESS`` vouches for with its blocks never written; not a checkpoint, whose loss costs a
    recomputation).  On any failure the temporary file is removed and an OS error becomes one message."""
    fd, tmp = _mkstemp(path, tmp_dir)
    try:
        write(fd, tmp)
        if durable:
            sync_file(tmp)
        publish(tmp, path)
    except BaseException as exc:
        unlink(tmp)
        if isinstance(exc, OSError):
            raise write_error(path, exc) from None
        raise


def atomic_write_bytes(path: str | Path, payload: bytes | memoryview, tmp_dir=None, durable: bool = True) -> None:
    """Write ``payload`` to a temporary file (in ``tmp_dir``, default beside ``path``), then rename it;
    ``durable``: synced to the disk first (see :func:`atomically`)."""
    if is_url(path):
        put_bytes(path, payload)
        return

    def write(fd, tmp):
        with os.fdopen(fd, "wb") as f:
            f.write(payload)

    atomically(Path(path), tmp_dir, write, durable)


def atomic_write_recorded(path: str | Path, payload: bytes) -> dict | None:
    """:func:`atomic_write_bytes` (durable) of an output whose bytes are in memory, and its :func:`written_digest`
    taken from ``payload`` instead of reading the file back (its stamp from the file written); None for a URL
    (an object store's commit reads its objects)."""
    atomic_write_bytes(path, payload)
    if is_url(path):
        return None
    return memory_digest(payload, path)


def memory_digest(payload, path) -> dict:
    """:func:`written_digest` of the local file ``path`` just written with ``payload`` (bytes or a buffer), the
    SHA-256 taken from ``payload`` instead of reading the file back."""
    t0 = time.perf_counter()
    try:
        sha = hashlib.sha256(payload).hexdigest()
    finally:
        _busy("digest", t0)
    return {"size": memoryview(payload).nbytes, "sha256": sha, **file_stamp(path)}


def table_codec(compression: str) -> str | None:
    """pyarrow's ``compression`` argument for ``output.compression`` of a table that is no copy of one input
    shard (``same``, the shards' setting, is zstd there; ``none`` is None)."""
    return {"same": "zstd", "none": None}.get(compression, compression)


def sync_file(path) -> None:
    """``path``'s data on the disk (an output before it is published: :func:`atomically`)."""
    t0 = time.perf_counter()
    try:
        _fsync(path)
    finally:
        _busy("sync", t0)


def sync_dir(path) -> None:
    """The entries of directory ``path`` on the disk: the renames into it (and out of it) survive a power loss
    (POSIX asks for this after a rename; some file systems journal renames in order, others do not).  Where the
    system refuses (a directory without ``O_DIRECTORY``, a file system that cannot sync one), nothing."""
    try:
        _fsync(path, getattr(os, "O_DIRECTORY", 0))
    except OSError:
        pass


def _fsync(path, flags: int = 0) -> None:
    fd = os.open(path, os.O_RDONLY | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_parquet(path: str | Path, table: pa.Table, compression: str = "zstd", durable: bool = True,
                         options: dict | None = None) -> None:
    """``table`` written to ``path`` with ``compression`` (see :func:`table_codec`) and pyarrow's other writer
    ``options`` (encodings: :func:`gpu_dedup.stages.write.duplicates_parquet_options`); ``durable``: synced to the
    disk before it is renamed into place (an output; not a part file that is merged and removed:
    :func:`atomically`)."""
    codec = table_codec(compression)
    more = options or {}
    if is_url(path):
        put_bytes(path, table_bytes(lambda sink: pq.write_table(table, sink, compression=codec, **more)))
        return

    def write(fd, tmp):
        os.close(fd)
        pq.write_table(table, tmp, compression=codec, **more)

    atomically(Path(path), None, write, durable)


def row_groups(tables, rows: int, schema: pa.Schema | None = None):
    """The rows of ``tables`` (an iterable of tables of one schema, in order, taken one at a time) as tables of
    ``rows`` rows each but the last, never holding more than one of them and one input table: the row groups
    ``pq.write_table(..., row_group_size=rows)`` writes.  At least one: where there are no rows, one empty table
    (of ``schema`` where there are no tables), the one empty row group ``pq.write_table`` writes."""
    pending: list = []
    count = written = 0
    for t in tables:
        pending.append(t)
        count += t.num_rows
        while count >= rows:
            whole = pa.concat_tables(pending)
            yield whole.slice(0, rows).combine_chunks()
            written += rows
            rest = whole.slice(rows)
            pending, count = [rest], rest.num_rows
    if count or not written:
        yield (pa.concat_tables(pending) if pending else schema.empty_table()).combine_chunks()


def atomic_write_parquet_groups(path: str | Path, groups, compression: str = "zstd", options=None,
                                durable: bool = True) -> int:
    """The tables ``groups`` yields (one schema; at least one, an empty table where there are no rows: see
    :func:`row_groups`), each as one row group, into one Parquet file at ``path``, atomically (as
    :func:`atomic_write_parquet`); ``options``: a function of the first table's schema that gives the writer's
    other options.  Tables of ``n`` rows each but the last give the file ``pq.write_table`` writes with
    ``row_group_size=n``, byte for byte; they are taken one at a time, so whatever makes the next one can run
    while this one is encoded.  An object in a store is built in a local temporary file, then uploaded.
    Returns the rows written."""
    tables = iter(groups)
    first = next(tables)
    codec = table_codec(compression)
    more = options(first.schema) if options is not None else {}
    rows = 0

    def write(fd, tmp):
        nonlocal rows
        os.close(fd)
        with pq.ParquetWriter(tmp, first.schema, compression=codec, **more) as w:
            for t in itertools.chain((first,), tables):
                w.write_table(t, row_group_size=max(1, t.num_rows))
                rows += t.num_rows

    if not is_url(path):
        atomically(Path(path), None, write, durable)
        return rows
    with tempfile.TemporaryDirectory() as tmp:
        local = Path(tmp) / "upload.parquet"
        atomically(local, None, write)
        with pa.memory_map(str(local)) as m:  # uploaded in parts, not read into memory at once
            put_bytes(path, m.read_buffer())
    return rows


def file_digest(path) -> dict:
    """Size and SHA-256 of a file (what the output manifest records and ``_SUCCESS`` vouches for)."""
    if is_url(path):
        return digest(path)
    t0 = time.perf_counter()
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        return {"size": os.path.getsize(path), "sha256": h.hexdigest()}
    finally:
        _busy("digest", t0)


def file_stamp(path) -> dict:
    """What tells, without reading it, that a local file is still the one just written: size, modification
    time and inode (a file written again or replaced changes its modification time or inode)."""
    st = os.stat(path)
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino}


def written_digest(path) -> dict:
    """:func:`file_digest` of a file just written, with its :func:`file_stamp` (local files) so that a later
    check of the same file (:func:`known_digest`) need not read it again."""
    if is_url(path):
        return file_digest(path)
    return {**file_digest(path), **file_stamp(path)}


def known_digest(path, record: dict | None) -> dict | None:
    """Size and SHA-256 of ``path`` from ``record`` (a :func:`written_digest`) when the local file still has
    the recorded stamp; None when it must be read to know (no record, a URL, or the file changed)."""
    if not record or is_url(path) or any(k not in record for k in ("size", "sha256", "mtime_ns", "ino")):
        return None
    try:
        if file_stamp(path) != {k: record[k] for k in ("size", "mtime_ns", "ino")}:
            return None
    except OSError:
        return None
    return {"size": record["size"], "sha256": record["sha256"]}


def unlink(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


