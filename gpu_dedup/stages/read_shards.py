"""Read shards into one corpus table; write deduplicated shards atomically.

Shards are Parquet files or JSON Lines files (optionally .gz/.bz2/.zst
compressed), or one in-memory Arrow table (format ``memory``, see
:func:`memory_shard`: the DataFrame API's input, never written back).  The
corpus table has the internal columns ``row`` (dense int64),
``shard`` (int32 index into the shard list), ``shard_row`` (int64), ``id``
(the user's id column verbatim, or a generated int64 = ``row``), ``text``
(large_string) and, for ``select.keep = score``, ``score``.

Writing filters each input shard by a keep-mask and writes it under the same
relative name: Parquet keeps its schema (and schema metadata); JSONL keeps
the kept lines byte for byte.  Every file is written to a temporary name in
the output directory and renamed into place.

**What a directory input reads.**  Walking a directory (or expanding a glob
pattern) reads the files with a shard extension and skips every file *and
directory* whose name starts with ``.`` or ``_`` (hidden files, ``_SUCCESS``,
Spark's ``_temporary``, gpu_dedup's own ``.gpu_dedup_*`` bookkeeping).  A file
named explicitly on the command line is read whatever its name.  Every input
must be a regular file (symbolic links to one are followed): a FIFO, socket or
device, a broken or looping link and a file name that is not valid UTF-8 are
refused with a message naming the file.

**Input identity.**  :func:`shard_identity` digests a file's size,
modification time and content that changes with any rewrite (a Parquet
file's footer; the first and last 64 KiB of any other file).  It is taken when
the shard is discovered and checked again before anything is published: a
file replaced during a run fails the run instead of ending in outputs that
belong to neither version.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import logging
import os
import re
import stat
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson
import pyarrow.parquet as pq

from gpu_dedup.backends.strings import arrow_column
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError, ResourceError
from gpu_dedup.kernels.lines import gather_lines, nonblank_lines

log = logging.getLogger("gpu_dedup")

PARQUET_EXT = (".parquet", ".pq")
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


IDENTITY_BLOCK = 1 << 16  # bytes hashed at each end of a non-Parquet file
FOOTER_MAX = 1 << 22  # a Parquet footer larger than this is hashed by its last FOOTER_MAX bytes


def shard_identity(path: str) -> str:
    """Cheap digest of a file's identity: size, mtime and the bytes a rewrite changes (see module doc)."""
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            h = hashlib.sha256(f"{st.st_size}\0{st.st_mtime_ns}\0".encode())
            size = st.st_size
            footer = 0
            if size >= 12 and path.lower().endswith(PARQUET_EXT):
                f.seek(size - 8)
                tail = f.read(8)
                if tail[4:] == b"PAR1":
                    footer = min(int.from_bytes(tail[:4], "little") + 8, size, FOOTER_MAX)
            if footer:
                f.seek(size - footer)
                h.update(f.read(footer))
            else:
                h.update(f.read(IDENTITY_BLOCK))
                if size > IDENTITY_BLOCK:
                    f.seek(max(IDENTITY_BLOCK, size - IDENTITY_BLOCK))
                    h.update(f.read(IDENTITY_BLOCK))
    except OSError as exc:
        raise InputError(f"cannot read input {path!r} ({exc.strerror}); check that it exists and is readable") \
            from None
    return h.hexdigest()[:32]


def check_unchanged(shards) -> None:
    """Raise InputError when an input file changed since it was discovered (identity differs)."""
    for s in shards:
        if s.identity and s.format != "memory" and shard_identity(s.path) != s.identity:
            raise InputError(
                f"input shard {s.path!r} changed during the run (its size, modification time or content differ "
                "from when it was read); nothing was published for this run: rerun once the inputs are stable")


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
        item = os.fspath(item)
        if os.path.isdir(item):
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
        size = _checked_file(path, path)
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


# --------------------------------------------------------------------------- JSONL


def _read_bytes(path: str):
    """The shard's (decompressed) bytes as an Arrow buffer: memory-mapped when uncompressed."""
    try:
        if not path.lower().endswith(COMPRESSED_EXT):
            with pa.memory_map(path) as f:
                return f.read_buffer()
        with pa.input_stream(path, compression="detect") as f:
            return f.read_buffer()
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(path, exc, f"cannot read shard {path!r}: {exc}") from None


def _jsonl_lines(raw):
    """(data, starts, ends) of the non-blank lines of a JSON Lines buffer (one Numba pass)."""
    data = np.frombuffer(raw, np.uint8)
    starts, ends = nonblank_lines(data)
    return data, starts, ends


def _gather_lines(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, newline=True) -> np.ndarray:
    """Concatenate data[starts[i]:ends[i]] (+ b'\\n') into one uint8 array (one Numba pass)."""
    return gather_lines(data, starts, ends, newline)


JSON_BLOCK = 1 << 24  # bytes per parse block (pyarrow parses blocks on its thread pool)
SAMPLE_BYTES = 1 << 20  # lines read first to learn the wanted fields' types


def _parse_json(body, parse_options=None) -> pa.Table:
    return pajson.read_json(pa.BufferReader(body), read_options=pajson.ReadOptions(block_size=JSON_BLOCK),
                            parse_options=parse_options)


def _wanted_schema(data, starts, ends, wanted: dict) -> pa.Schema | None:
    """Types of the ``wanted`` fields ({"text": name, "id": name, "score": name}) from the
    first lines, or None when a sample cannot fix them (a field absent or all null there,
    or a text that is not a string)."""
    stop = int(np.searchsorted(starts, starts[0] + SAMPLE_BYTES)) + 1
    lines = _gather_lines(data, starts[:stop], ends[:stop])
    try:
        sample = _parse_json(lines).schema
    except pa.ArrowInvalid:  # e.g. an unwanted field of mixed types: infer the wanted ones alone
        sample = _sample_schema(lines, list(wanted.values()))
    types = {}
    for role, name in wanted.items():
        if name not in sample.names:
            return None
        t = sample.field(name).type
        if role == "text":
            if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
                return None
            t = pa.large_string()
        elif pa.types.is_null(t):
            return None
        elif role == "score" and (pa.types.is_integer(t) or pa.types.is_floating(t)):
            t = pa.float64()  # read_columns casts the score to float64 anyway
        types.setdefault(name, t)
    return pa.schema(list(types.items()))


def _sample_schema(lines, names) -> pa.Schema:
    """Arrow types of ``names`` over a sample of JSON lines, by Python's json (the sample only:
    at most SAMPLE_BYTES); a name no line has is left out."""
    import json

    values = {name: [] for name in names}
    for line in bytes(lines).decode("utf-8", "replace").splitlines():  # the sample's lines, bounded
        if line.strip():
            try:
                record = json.loads(line)
            except ValueError:  # the full parse reports it
                continue
            for name in names:
                if isinstance(record, dict) and name in record:
                    values[name].append(record[name])
    fields = []
    for name, vals in values.items():
        if vals:
            try:
                fields.append(pa.field(name, pa.array(vals).type))
            except (pa.ArrowException, TypeError, ValueError):
                pass
    return pa.schema(fields)


def _read_jsonl(shard: Shard, wanted: dict | None = None) -> pa.Table | None:
    """Parse the non-blank lines of a JSONL shard (None when it has none).

    ``wanted`` ({"text": name, "id": name, "score": name}): only those fields are
    built, with their types learned from the first lines; the other fields are
    parsed (the JSON must be valid) but not kept.  A shard whose sample cannot fix
    the types, or whose later lines disagree with them, is read with full type
    inference instead (every field, more memory).  The buffer is parsed where it
    lies: pyarrow skips the blank (whitespace-only) lines as this reader does.
    """
    raw = _read_bytes(shard.path)
    data, starts, ends = _jsonl_lines(raw)
    if starts.shape[0] == 0:
        return None
    body = raw
    table = None
    if wanted:
        try:
            schema = _wanted_schema(data, starts, ends, wanted)
            if schema is not None:
                table = _parse_json(body, pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore",
                                                              newlines_in_values=False))
        except pa.ArrowException:
            table = None
    if table is None:
        try:
            table = _parse_json(body)
        except pa.ArrowException as exc:
            raise InputError(f"shard {shard.path!r} is not valid JSON Lines: {_bad_line(data, starts, ends, exc)}") \
                from None
    if table.num_rows != starts.shape[0]:
        raise InputError(
            f"shard {shard.path!r}: {starts.shape[0]} non-blank lines but {table.num_rows} JSON records; "
            "each line must hold exactly one JSON object"
        )
    return table


def _bad_line(data, starts, ends, exc) -> str:
    """Where a JSON Lines buffer fails to parse: ``line N: <the parser's reason>; fix or remove that line``.
    Found by halving the non-blank lines (pyarrow's own row number counts records of its parse block);
    when no single line fails (fields whose types disagree across lines) the parser's message as it is."""
    def fails(lo, hi):
        try:
            _parse_json(pa.py_buffer(_gather_lines(data, starts[lo:hi], ends[lo:hi])))
            return None
        except pa.ArrowException as e:
            return e

    lo, hi = 0, starts.shape[0]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fails(lo, mid) is not None:
            hi = mid
        elif fails(mid, hi) is not None:
            lo = mid
        else:
            return f"{exc}; fields must keep one type across lines"
    err = fails(lo, hi)  # the one line left (a shard without lines returns before parsing)
    if err is None:
        return str(exc)
    line = int(np.count_nonzero(data[: starts[lo]] == 0x0A)) + 1
    reason = re.sub(r"\.? in row \d+$", "", str(err).strip())
    return f"line {line}: {reason}; fix or remove that line"


VIEW_TYPES = {"string_view": pa.large_string(), "binary_view": pa.large_binary()}  # Arrow's views -> the same bytes


def without_views(col):
    """A column of an Arrow view type (string_view, binary_view), which many Arrow kernels (take, filter,
    count) lack, as the large string / binary of the same values; any other column as it is."""
    plain = VIEW_TYPES.get(str(col.type))
    return col if plain is None else col.cast(plain)


def _check_json_float_ids(shard: Shard, column: str, ids) -> None:
    """JSON integers beyond int64 are parsed as doubles, which keep only 53 bits: such ids would not be
    kept verbatim (distinct ids could even collapse into one), so they are refused."""
    big = pc.max(pc.abs(ids)).as_py()
    if big is not None and big >= 2.0**53:
        raise InputError(
            f"id column {column!r} of shard {shard.path!r} holds numbers as large as {big:.6g}, beyond what a JSON "
            "reader keeps exactly (integers beyond 2**63 are read as floating point, losing digits); write the ids "
            "as JSON strings, or use --no-id-column to name documents by row")


# --------------------------------------------------------------------------- Parquet


def read_error(path: str, exc: BaseException, message: str) -> Exception:
    """The error to raise for ``exc`` while reading ``path``: running out of memory (or disk) is the
    machine's limit, not the shard's fault; anything else is the shard's (``message``)."""
    if isinstance(exc, MemoryError):  # pa.ArrowMemoryError too
        return ResourceError(f"ran out of memory reading shard {path!r} ({exc}); the shard itself may be fine: "
                             "free memory, raise the memory limit, or split the input into smaller shards "
                             "(with --workers: lower cluster.block_rows)")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOMEM, errno.ENOSPC):
        return ResourceError(f"out of resources reading shard {path!r} ({exc.strerror}); the shard itself may be "
                             "fine: free memory or disk space and rerun")
    return InputError(message)


def _parquet_schema(shard: Shard) -> pa.Schema:
    try:
        return pq.read_schema(shard.path)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is not a readable Parquet file ({exc}); remove or "
                         "replace it") from None


def _read_parquet(shard: Shard, columns: list[str], row_groups=None) -> pa.Table:
    try:
        f = pq.ParquetFile(shard.path)
        return f.read(columns=columns) if row_groups is None else f.read_row_groups(list(row_groups), columns=columns)
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is corrupt or truncated ({exc}); remove or "
                         "replace it") from None


def read_rows(shard: Shard, cfg: InputConfig, rows) -> pa.Table:
    """The columns of rows ``rows`` (shard-relative, any order) of one shard, in that order.  A Parquet
    shard reads only the row groups that hold them (a report's examples: a few dozen rows)."""
    rows = np.asarray(rows, np.int64)
    if shard.format == "memory" and shard.text is not None:  # only these rows leave the device
        table = read_columns(shard, cfg, skip_text=True).take(pa.array(rows))
        return table.add_column(0, "text", arrow_column(shard.text, rows))
    if shard.format != "parquet":
        return read_columns(shard, cfg).take(pa.array(rows))
    try:
        meta = pq.ParquetFile(shard.path).metadata
    except (OSError, pa.ArrowException, MemoryError) as exc:
        raise read_error(shard.path, exc, f"shard {shard.path!r} is corrupt or truncated ({exc}); remove or "
                         "replace it") from None
    sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)  # per row group
    starts = np.concatenate(([0], np.cumsum(sizes)))
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    table = read_columns(shard, cfg, row_groups=groups.tolist())
    first = np.concatenate(([0], np.cumsum(sizes[groups])))  # where each read group starts in ``table``
    k = np.searchsorted(groups, group_of)
    return table.take(pa.array(rows - starts[group_of] + first[k]))


# --------------------------------------------------------------------------- corpus


@dataclass
class Corpus:
    """The documents of all shards, in shard order, with internal row ids."""

    table: pa.Table  # row, shard, shard_row, id, text[, score]
    shards: list[Shard]
    text_column: str
    id_column: str | None  # None: ids were generated
    score_column: str | None = None
    vectors: list | None = None  # input.vector_column: (shard index, first row, column) per shard read
    device_text: list | None = None  # text columns in device memory, one per shard (a device reader's)

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def text(self) -> pa.ChunkedArray:
        return self.table.column("text")

    @property
    def ids(self) -> pa.ChunkedArray:
        return self.table.column("id")

    @property
    def id_generated(self) -> bool:
        return self.id_column is None


def _missing(shard: Shard, what: str, name: str, names) -> InputError:
    setting = {"text": "input.text_column (--text-column)", "id": "input.id_column (--id-column)",
               "score": "select.score_column", "vector": "input.vector_column (--vector-column)"}[what]
    return InputError(
        f"{what} column {name!r} is not in shard {shard.path!r}; its columns are: "
        f"{', '.join(map(repr, names)) or '(none)'}. Set {setting} to one of them"
    )


def _text_type_ok(t: pa.DataType) -> bool:
    return any(f(t) for f in (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                              pa.types.is_large_binary, pa.types.is_null))


def read_columns(shard: Shard, cfg: InputConfig, score_column: str | None = None, row_groups=None,
                 skip_text: bool = False):
    """The validated text (and id, score) columns of one shard, or of some of its
    Parquet row groups, as a table with columns ``text``[, ``id``][, ``score``];
    None for a JSONL shard without records.  ``skip_text``: the text column is checked
    to be there but not read (a device reader reads it; see :func:`device_readable`)."""
    wanted = {"text": cfg.text_column}
    if cfg.id_column:
        wanted["id"] = cfg.id_column
    if score_column:
        wanted["score"] = score_column
    if cfg.vector_column:
        wanted["vector"] = cfg.vector_column
    # with a vector column the text is optional (shown in the report when present)
    optional = {"text"} if cfg.vector_column else set()
    if shard.format == "memory":
        table = shard.data
        if shard.text is not None and not skip_text:  # the device column, copied to the host
            table = table.append_column(cfg.text_column, arrow_column(shard.text))
        if skip_text:
            wanted.pop("text")
        wanted = _present(wanted, optional, table.column_names)
        for key, col in wanted.items():
            if col not in table.column_names:
                raise _missing(shard, key, col, table.column_names)
        if row_groups is not None:
            raise InputError("in-memory input has no row groups; it runs in one process")
    elif shard.format == "parquet":
        names = _parquet_schema(shard).names
        wanted = _present(wanted, optional, names)
        for key, col in wanted.items():
            if col not in names:
                raise _missing(shard, key, col, names)
        _check_unique(shard, names, wanted)
        if skip_text:  # present and unique: the device reader reads it
            wanted.pop("text")
        table = _read_parquet(shard, list(dict.fromkeys(wanted.values())), row_groups)
    else:
        table = _read_jsonl(shard, wanted)
        if table is None:  # no records
            return None
        wanted = _present(wanted, optional, table.column_names)
        for key, col in wanted.items():
            if col not in table.column_names:
                raise _missing(shard, key, col, table.column_names)
    if shard.format != "parquet":
        _check_unique(shard, table.column_names, wanted)
    cols = {}
    if not skip_text:
        if "text" not in wanted:
            text = pa.chunked_array([pa.nulls(table.num_rows, pa.large_string())])
        else:
            text = _decoded(table.column(cfg.text_column))
        text = without_views(text)
        if not _text_type_ok(text.type):
            raise InputError(f"text column {cfg.text_column!r} of shard {shard.path!r} has type {text.type}; "
                             "it must be a string column: convert it to strings, or set input.text_column "
                             "(--text-column) to the column that holds the text")
        cols["text"] = _as_large_text(text)
    if cfg.id_column:
        ids = _decoded(table.column(cfg.id_column))
        if pa.types.is_nested(ids.type) or pa.types.is_null(ids.type):
            raise InputError(
                f"id column {cfg.id_column!r} of shard {shard.path!r} has type {ids.type}; ids must be scalars "
                "(integers or strings): choose another --id-column, or --no-id-column to name documents by row")
        ids = without_views(ids)
        if shard.format == "jsonl" and pa.types.is_floating(ids.type):
            _check_json_float_ids(shard, cfg.id_column, ids)
        cols["id"] = ids
    if score_column:
        score = _decoded(table.column(score_column))
        if not (pa.types.is_integer(score.type) or pa.types.is_floating(score.type)):
            raise InputError(
                f"score column {score_column!r} of shard {shard.path!r} has type {score.type}; it must be numeric"
            )
        cols["score"] = pc.cast(score, pa.float64())
    if cfg.vector_column:
        cols["vector"] = table.column(cfg.vector_column)
    return pa.table(cols) if cols else rows_only(table.num_rows)


def rows_only(n: int) -> pa.Table:
    """A table of ``n`` rows holding no data (one all-null column, so that it can still be sliced
    and taken from): what is left when every wanted column is read elsewhere."""
    return pa.table({"_rows": pa.nulls(n)})


def _check_unique(shard: Shard, names, wanted: dict) -> None:
    for key, col in wanted.items():
        count = list(names).count(col)
        if count > 1:
            raise InputError(f"shard {shard.path!r} has {count} columns named {col!r} (the {key} column); "
                             "column names must be unique: rename or drop the extra ones")


def _decoded(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column (e.g. a pandas categorical) as its plain values."""
    if pa.types.is_dictionary(col.type):
        return pc.cast(col, col.type.value_type)
    return col


def _present(wanted: dict, optional: set, names) -> dict:
    """``wanted`` without the optional columns the shard does not have."""
    return {k: v for k, v in wanted.items() if k not in optional or v in names}


def check_id_type(shard: Shard, id_column: str, id_type, first: tuple | None):
    """Raise when the id column's type differs from the first shard's; returns the (type, path) to compare with."""
    if first is None:
        return (id_type, shard.path)
    if id_type != first[0]:
        raise InputError(
            f"id column {id_column!r} has type {id_type} in shard {shard.path!r} but {first[0]} in "
            f"{first[1]!r}; mixed schemas across shards: make the id column one type in every shard"
        )
    return first


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
        schema = _parquet_schema(shard)
        if schema.names.count(cfg.text_column) != 1:
            return False  # missing or repeated: the host read reports it
        text_type = schema.field(cfg.text_column).type  # UTF-8 only: binary, dictionary, null go to the host
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            return False
    return True


def read(inputs, cfg: InputConfig = InputConfig(), score_column: str | None = None, progress=None,
         text_reader=None) -> Corpus:
    """Read every shard's id, text (and score) columns into one corpus table.

    ``text_reader(path, column)``: reads the text column of a Parquet shard into device
    memory (cuDF) instead; the corpus then holds those columns (``device_text``, one per
    shard) and its table has no ``text`` column.  Only when :func:`device_readable`.
    ``progress(1)`` is called after each shard."""
    shards = inputs if inputs and isinstance(inputs, list) and isinstance(inputs[0], Shard) else discover(inputs, cfg.format)
    parts, out_shards, vector_parts, device_text = [], [], [], []
    first_id = None
    row0 = 0
    for i, shard in enumerate(shards):  # one step per shard file
        table = read_columns(shard, cfg, score_column, skip_text=text_reader is not None)
        if text_reader is not None:
            column = shard.text if shard.format == "memory" else text_reader(shard.path, cfg.text_column)
            rows = len(column)
            if rows != table.num_rows:
                raise InputError(f"shard {shard.path!r} gave {table.num_rows} rows to pyarrow but {rows} text rows "
                                 "to cuDF; it changed while being read or is corrupt: rerun, or set "
                                 "gpu.reader: pyarrow")
            device_text.append(column)
        if progress is not None:
            progress(1)
        if table is None:
            out_shards.append(shard.with_rows(0))
            continue
        n = table.num_rows
        cols = {
            "row": pa.array(np.arange(row0, row0 + n, dtype=np.int64)),
            "shard": pa.array(np.full(n, i, np.int32)),
            "shard_row": pa.array(np.arange(n, dtype=np.int64)),
        }
        if cfg.id_column:
            first_id = check_id_type(shard, cfg.id_column, table.column("id").type, first_id)
            cols["id"] = table.column("id")
        else:
            cols["id"] = cols["row"]
        if text_reader is None:
            cols["text"] = table.column("text")
        if score_column:
            cols["score"] = table.column("score")
        if cfg.vector_column:
            vector_parts.append((i, row0, table.column("vector")))
        parts.append(pa.table(cols))
        out_shards.append(shard.with_rows(n))
        row0 += n
    table = pa.concat_tables(parts) if parts else _empty_table(score_column is not None)
    if text_reader is not None and "text" in table.column_names:
        table = table.drop_columns(["text"])
    log.info("read %d documents from %d shard(s)%s", table.num_rows, len(out_shards),
             " (text columns into device memory)" if text_reader is not None else "")
    return Corpus(table, out_shards, cfg.text_column, cfg.id_column, score_column,
                  vectors=vector_parts if cfg.vector_column else None,
                  device_text=device_text if text_reader is not None else None)


def _as_large_text(text: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_null(text.type):  # JSONL shard whose texts are all null
        return pc.cast(text, pa.large_string())
    if pa.types.is_string(text.type):
        return pc.cast(text, pa.large_string())
    if pa.types.is_binary(text.type):
        return pc.cast(text, pa.large_binary())
    return text


def _empty_table(with_score: bool) -> pa.Table:
    cols = {
        "row": pa.array([], pa.int64()),
        "shard": pa.array([], pa.int32()),
        "shard_row": pa.array([], pa.int64()),
        "id": pa.array([], pa.int64()),
        "text": pa.array([], pa.large_string()),
    }
    if with_score:
        cols["score"] = pa.array([], pa.float64())
    return pa.table(cols)
