"""Parquet shards: schema reads, whole and streamed reads with one clear error, each shard's codec,
and whether a device reader can read the text columns.

Streamed reads (:func:`iter_parquet`) decode a shard's pages as they arrive, a batch of rows at a
time (``ParquetFile.iter_batches`` over a buffered stream, nothing read ahead), so the memory they
take is a batch's, whatever the shard's row groups: one row group of a million documents reads in
the same memory as a hundred small ones.

**Each shard's footer is read once per process.**  Its FileMetaData (and the Arrow schema pyarrow makes
of it) is kept in :data:`FOOTERS`, keyed by the shard's path and its identity (size, modification time
and footer bytes of a file; size and ETag or generation of an object, see
:mod:`gpu_dedup.storage.identity`), and every open of an input shard (:func:`open_parquet`) hands it to
pyarrow, which then reads no footer: the read stage's sizes, the read itself, the report's samples and
the write stage share one footer read, which on an object store is a round trip or more.  A rewritten
shard has another identity and so is never served its old footer; a shard without an identity (one not
found by discovery) is not cached.  The cache is bounded (:class:`FooterCache`): least recently used
footers go first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends import register_footer_reader
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError, read_error
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.filesystems import source
from gpu_dedup.storage.identity import check_unchanged

BATCH_BYTES = 1 << 25  # about this many bytes of the read columns per streamed batch (32 MiB)
BUFFER_BYTES = 1 << 22  # read buffer per column chunk when streaming (pages are decoded as they arrive)
MIN_BATCH_ROWS, MAX_BATCH_ROWS = 1024, 1 << 20

# Parquet's codec names (column chunk metadata) -> pyarrow's writer names; a codec pyarrow cannot write
# (LZO, Hadoop's framed LZ4) is absent and its shards are written with zstd
CODECS = {"UNCOMPRESSED": "none", "SNAPPY": "snappy", "GZIP": "gzip", "BROTLI": "brotli", "ZSTD": "zstd",
          "LZ4_RAW": "lz4", "LZ4": "lz4"}
FALLBACK_CODEC = "zstd"


FOOTER_CACHE_BYTES = 64 << 20  # serialized footer bytes kept per process (in memory: up to ~8x, with statistics)
FOOTER_CACHE_ENTRIES = 16384  # footers kept per process


@dataclass(frozen=True)
class Footer:
    """A Parquet shard's footer as pyarrow read it."""

    metadata: pq.FileMetaData
    schema: pa.Schema  # the Arrow schema pyarrow's reader gives (ARROW:schema applied), as pq.read_schema reads it

    @property
    def size(self) -> int:
        return int(self.metadata.serialized_size)


class FooterCache:
    """Footers by (path, identity), least recently used dropped first once they hold more than
    ``max_bytes`` serialized bytes or number more than ``max_entries`` (a footer larger than ``max_bytes``
    alone is not kept).  Thread-safe: the read stage's reader threads and a Dask worker's tasks share it;
    threads that want the same missing footer wait for one read (:meth:`filling`)."""

    def __init__(self, max_bytes: int = FOOTER_CACHE_BYTES, max_entries: int = FOOTER_CACHE_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self._footers: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._filling: dict = {}  # key -> [lock, holders]: one read of each missing footer at a time

    def get(self, key) -> Footer | None:
        with self._lock:
            footer = self._footers.get(key)
            if footer is not None:
                self._footers.move_to_end(key)
            return footer

    def put(self, key, footer: Footer) -> None:
        with self._lock:
            old = self._footers.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            if footer.size > self.max_bytes or self.max_entries < 1:
                return
            self._footers[key] = footer
            self._bytes += footer.size
            while self._bytes > self.max_bytes or len(self._footers) > self.max_entries:
                _, dropped = self._footers.popitem(last=False)
                self._bytes -= dropped.size

    def clear(self) -> None:
        with self._lock:
            self._footers.clear()
            self._bytes = 0

    def __len__(self) -> int:
        return len(self._footers)

    @property
    def nbytes(self) -> int:
        """Serialized bytes of the footers held."""
        return self._bytes

    def filling(self, key) -> _Filling:
        """A context holding ``key``'s fill lock: the first thread to miss reads the footer, the others wait
        for it and find it kept."""
        return _Filling(self, key)


class _Filling:
    def __init__(self, cache: FooterCache, key):
        self.cache, self.key = cache, key

    def __enter__(self):
        with self.cache._lock:
            entry = self.cache._filling.setdefault(self.key, [threading.Lock(), 0])
            entry[1] += 1
        entry[0].acquire()
        return self

    def __exit__(self, *exc):
        with self.cache._lock:
            entry = self.cache._filling[self.key]
            entry[0].release()
            entry[1] -= 1
            if entry[1] == 0:
                del self.cache._filling[self.key]
        return False


FOOTERS = FooterCache()  # this process's footers of input shards


def _key(shard: Shard):
    """The cache key of a shard's footer, or None (not cached): no identity to tell a rewrite by."""
    return (shard.path, shard.identity) if shard.identity and shard.format == "parquet" else None


def _read_footer(shard: Shard, key, options: dict) -> tuple[Footer, pq.ParquetFile | None]:
    """The shard's footer from the cache (and None), else read by opening the shard with ``options``, kept,
    and the open file."""
    found = FOOTERS.get(key)
    if found is not None:
        return found, None
    with FOOTERS.filling(key):
        found = FOOTERS.get(key)
        if found is not None:  # another thread read it meanwhile
            return found, None
        f = pq.ParquetFile(source(shard.path), **options)  # the one footer read of this shard
        found = Footer(f.metadata, f.schema_arrow)
        FOOTERS.put(key, found)
        return found, f


def _open(shard: Shard, **options) -> pq.ParquetFile:
    """``pq.ParquetFile`` of the shard given its cached footer (read and kept on the first open); pyarrow's
    errors as they are."""
    key = _key(shard)
    if key is None:
        return pq.ParquetFile(source(shard.path), **options)
    found, f = _read_footer(shard, key, options)
    return f if f is not None else pq.ParquetFile(source(shard.path), metadata=found.metadata, **options)


def footer(shard: Shard) -> Footer:
    """The shard's footer: from the cache, else read (and kept); pyarrow's errors as they are."""
    key = _key(shard)
    if key is None:
        f = pq.ParquetFile(source(shard.path))
        return Footer(f.metadata, f.schema_arrow)
    return _read_footer(shard, key, {})[0]


def parquet_schema(shard: Shard) -> pa.Schema:
    """The shard's Arrow schema (as ``pq.read_schema`` gives it), from its footer."""
    try:
        return footer(shard).schema
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _failed(shard, exc, f"shard {shard.path!r} is not a readable Parquet file ({exc}); remove or "
                      "replace it") from None


def _corrupt(shard: Shard, exc: BaseException) -> Exception:
    return _failed(shard, exc, f"shard {shard.path!r} is corrupt or truncated ({exc}); remove or replace it")


def _failed(shard: Shard, exc: BaseException, message: str) -> Exception:
    """The error for ``exc`` reading ``shard``: that it changed since it was found (a footer kept from before
    does not fit it), else :func:`~gpu_dedup.errors.read_error`'s."""
    if not isinstance(exc, MemoryError):
        try:
            check_unchanged([shard])
        except InputError as changed:
            return changed
    return read_error(shard.path, exc, message)


def parquet_metadata(shard: Shard) -> pq.FileMetaData:
    try:
        return footer(shard).metadata
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


register_footer_reader(parquet_metadata)  # the GPU backend's device readers take the same footers


def input_bytes(shard: Shard, row_groups=None) -> int:
    """How many bytes ``shard``'s columns take in memory: a Parquet shard's uncompressed size (its footer only;
    of ``row_groups`` alone where given: a cluster block's piece), any other shard's bytes on disk."""
    if shard.format != "parquet":
        return shard.size or 0
    meta = parquet_metadata(shard)
    groups = range(meta.num_row_groups) if row_groups is None else row_groups
    return sum(meta.row_group(g).total_byte_size for g in groups)


def open_parquet(shard: Shard, **options) -> pq.ParquetFile:
    """The shard opened by ``pq.ParquetFile`` with its footer read once per process (see the module); a shard
    that cannot be opened is one error naming it.  ``options``: how to read (``buffer_size``, ``pre_buffer``),
    not what types to read as: the kept schema is the one pyarrow's default reader gives."""
    try:
        return _open(shard, **options)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


def read_parquet(shard: Shard, columns: list[str], row_groups=None) -> pa.Table:
    f = open_parquet(shard)
    try:
        return f.read(columns=columns) if row_groups is None else f.read_row_groups(list(row_groups), columns=columns)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise _corrupt(shard, exc) from None


def open_streamed(shard: Shard) -> pq.ParquetFile:
    """The shard opened for streamed reads: column chunks read through a small buffer, nothing pre-read."""
    return open_parquet(shard, buffer_size=BUFFER_BYTES, pre_buffer=False)


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
