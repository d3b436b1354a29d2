"""Shard discovery: files, directories and glob patterns -> a sorted list of :class:`Shard`.

Shards are Parquet files or JSON Lines files (optionally .gz/.bz2/.zst
compressed), or one in-memory Arrow table (format ``memory``, see
:func:`memory_shard`: the DataFrame API's input, never written back).

**What a directory input reads.**  Walking a directory (or expanding a glob
pattern) reads the files with a shard extension and skips every file *and
directory* whose name starts with ``.`` or ``_`` (hidden files, ``_SUCCESS``,
Spark's ``_temporary``, gpu_dedup's own ``.gpu_dedup_*`` bookkeeping).  A file
named explicitly on the command line is read whatever its name.  Every input
must be a regular file (symbolic links to one are followed): a FIFO, socket or
device, a broken or looping link and a file name that is not valid UTF-8 are
refused with a message naming the file.  An input URL (``s3://bucket/crawl/``,
``gs://...``, any fsspec URL) names an object, a prefix (read as a directory is) or
a glob (see :func:`gpu_dedup.storage.filesystems.remote_inputs`).
"""

from __future__ import annotations

import errno
import glob
import os
import stat
from dataclasses import dataclass, field, replace

import pyarrow as pa

from gpu_dedup.errors import InputError
from gpu_dedup.storage.filesystems import input_size, is_url, local_path, remote_inputs
from gpu_dedup.storage.identity import PARQUET_EXT, shard_identity

JSONL_EXT = (".jsonl", ".json", ".ndjson")
COMPRESSED_EXT = (".gz", ".bz2", ".zst")


@dataclass(frozen=True)
class Shard:
    path: str  # absolute path of the input file
    name: str  # relative output name
    format: str  # parquet | jsonl | memory
    rows: int = -1  # filled by read()
    size: int = 0  # bytes on disk (memory: bytes of the table)
    data: pa.Table | None = field(default=None, compare=False, repr=False)  # the table of a memory shard
    identity: str = field(default="", compare=False, repr=False)  # shard_identity() when discovered
    text: object = field(default=None, compare=False, repr=False)  # a memory shard's text column on the device

    def with_rows(self, rows: int) -> "Shard":
        return replace(self, rows=rows)


MEMORY_PATH = "<memory>"


def memory_shard(table: pa.Table, name: str = "memory", text=None) -> Shard:
    """A virtual shard over an in-memory Arrow table (read by :func:`read_columns`, never written).
    ``text``: its text column in device memory (a cuDF Series), kept out of ``table``."""
    return Shard(MEMORY_PATH, name, "memory", size=table.nbytes, data=table, text=text)


def _format_of(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    name = path.lower()
    for ext in COMPRESSED_EXT:
        if name.endswith(ext):
            name = name[: -len(ext)]
    if name.endswith(PARQUET_EXT):
        return "parquet"
    if name.endswith(JSONL_EXT):
        return "jsonl"
    raise InputError(
        f"cannot tell the format of {path!r} from its extension; use .parquet or .jsonl[.gz], "
        "or set input.format to parquet or jsonl"
    )


def _is_shard_name(name: str) -> bool:
    low = name.lower()
    for ext in COMPRESSED_EXT:
        if low.endswith(ext):
            low = low[: -len(ext)]
    return low.endswith(PARQUET_EXT + JSONL_EXT) and not _skipped(os.path.basename(low))


def _skipped(name: str) -> bool:
    """Hidden (``.``) and private (``_``: ``_SUCCESS``, ``_temporary``) names are skipped in directory walks."""
    return name.startswith((".", "_"))

def _checked_file(path: str, shown: str) -> int:
    """Size of the regular file ``path``; an InputError naming ``shown`` for anything else."""
    try:
        shown.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"input file name {shown!r} is not valid UTF-8; rename it (e.g. convmv -f latin1 -t utf8) "
                         "or move it out of the input directory") from None
    try:
        st = os.stat(path)
    except OSError as exc:
        if os.path.islink(path):
            kind = "a looping symbolic link" if exc.errno == errno.ELOOP else "a broken symbolic link"
            raise InputError(f"input {shown!r} is {kind} ({exc.strerror}); fix or remove the link") from None
        raise InputError(f"cannot read input {shown!r} ({exc.strerror}); check that it exists and is readable") \
            from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
        raise InputError(f"input {shown!r} is {kind}; gpu_dedup reads regular files only: write the data to a "
                         "file first, or move it out of the input directory")
    return st.st_size


def _walk(root: str) -> list[str]:
    """Shard files under ``root``, skipping hidden / private files and directories (sorted)."""
    files = []
    for dp, dirs, fs in os.walk(root, onerror=None, followlinks=False):
        dirs[:] = [d for d in dirs if not _skipped(d)]
        files += [os.path.join(dp, f) for f in fs if _is_shard_name(f)]
    return sorted(files)


def discover(inputs, fmt: str = "auto") -> list[Shard]:
    """Expand files, directories (recursively) and glob patterns into a sorted shard list
    (a list of Shard objects, e.g. memory shards, is returned as it is); see the module doc for
    what a directory input reads."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    if isinstance(inputs, list) and inputs and all(isinstance(s, Shard) for s in inputs):
        return inputs
    found: list[tuple[str, str]] = []  # (absolute path, relative name)
    for item in inputs:
        item = local_path(str(item) if is_url(item) else os.fspath(item))
        if is_url(item):
            found += remote_inputs(item, _is_shard_name, _skipped)
        elif os.path.isdir(item):
            root = os.path.abspath(item)
            files = _walk(root)
            if not files:
                raise InputError(
                    f"input directory {item!r} holds no .parquet or .jsonl[.gz] files (nor .pq, .json, .ndjson; "
                    "names starting with . or _ are skipped); point at the shard directory"
                )
            found += [(f, os.path.relpath(f, root)) for f in files]
        elif os.path.lexists(item) and not glob.has_magic(item):
            found.append((os.path.abspath(item), os.path.basename(item)))
        elif glob.has_magic(item):
            static = item[: min(item.index(c) for c in "*?[" if c in item)]
            base = os.path.abspath(os.path.dirname(static) if not static.endswith(os.sep) else static)
            files = sorted(f for f in glob.glob(item, recursive=True)
                           if not os.path.isdir(f)
                           and not any(_skipped(p) for p in os.path.relpath(os.path.abspath(f), base).split(os.sep)))
            if not files:
                raise InputError(f"input pattern {item!r} matches no files (names starting with . or _ are skipped)")
            found += [(os.path.abspath(f), os.path.relpath(os.path.abspath(f), base)) for f in files]
        else:
            raise InputError(f"input path {item!r} does not exist; give a file, a directory or a glob pattern")
    if not found:
        raise InputError("no input shards given")
    names: dict[str, str] = {}
    shards = []
    for path, name in found:
        size = input_size(path, path) if is_url(path) else _checked_file(path, path)
        if name in names and names[name] != path:
            raise InputError(
                f"two inputs would be written under the same name {name!r}: {names[name]!r} and {path!r}; "
                "pass their common parent directory instead"
            )
        if name in names:
            continue  # the same file named twice
        names[name] = path
        shards.append(Shard(path, name, _format_of(path, fmt), size=size, identity=shard_identity(path)))
    return shards

