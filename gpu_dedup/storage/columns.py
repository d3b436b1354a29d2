"""The validated columns of one shard: ``text``[, ``id``][, ``score``][, ``vector``], whatever its format.

Column names come from :class:`~gpu_dedup.config.InputConfig`; a missing,
repeated or mistyped column is one :class:`~gpu_dedup.errors.InputError`
naming the shard, the column and the setting to change.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup.backends.arrow_arrays import arrow_array, plain_type
from gpu_dedup.backends.strings import arrow_column
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.storage.arrow import arrow_schema, iter_arrow, read_arrow
from gpu_dedup.storage.discovery import Shard
from gpu_dedup.storage.jsonl import iter_jsonl, open_stream, read_jsonl
from gpu_dedup.storage.parquet import (
    iter_parquet,
    parquet_metadata,
    parquet_schema,
    read_parquet,
)

log = logging.getLogger(__name__)


def without_views(col):
    """A column of an Arrow view type (string_view, binary_view, also inside lists and structs), which many Arrow
    kernels (take, filter, count) lack, as the large string / binary of the same values
    (:func:`~gpu_dedup.backends.arrow_arrays.plain_type`); any other column as it is."""
    plain = plain_type(col.type)
    return col if plain == col.type else col.cast(plain)


def read_rows(shard: Shard, cfg: InputConfig, rows) -> pa.Table:
    """The columns of rows ``rows`` (shard-relative, any order) of one shard, in that order.  A Parquet
    shard reads only the row groups that hold them (a report's examples: a few dozen rows)."""
    rows = np.asarray(rows, np.int64)
    if shard.format == "memory" and shard.text is not None:  # only these rows leave the device
        table = read_columns(shard, cfg, skip_text=True).take(arrow_array(rows))
        return table.add_column(0, "text", arrow_column(shard.text, rows))
    if shard.format != "parquet":
        return read_columns(shard, cfg).take(arrow_array(rows))
    meta = parquet_metadata(shard)
    sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)  # per row group
    starts = np.concatenate(([0], np.cumsum(sizes)))
    group_of = np.searchsorted(starts, rows, side="right") - 1
    groups = np.unique(group_of)
    table = read_columns(shard, cfg, row_groups=groups.tolist())
    first = np.concatenate(([0], np.cumsum(sizes[groups])))  # where each read group starts in ``table``
    k = np.searchsorted(groups, group_of)
    return table.take(arrow_array(rows - starts[group_of] + first[k], pa.int64()))



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


def _wanted(cfg: InputConfig, score_column: str | None):
    """({role: column name}, the optional roles) of the columns a run reads."""
    wanted = {"text": cfg.text_column}
    if cfg.id_column:
        wanted["id"] = cfg.id_column
    if score_column:
        wanted["score"] = score_column
    if cfg.vector_column:
        wanted["vector"] = cfg.vector_column
    # with a vector column the text is optional (shown in the report when present)
    optional = {"text"} if cfg.vector_column else set()
    return wanted, optional


def _schema_wanted(shard: Shard, names, wanted: dict, optional: set) -> dict:
    """The wanted columns a shard of these column ``names`` has (checked present and unique)."""
    wanted = _present(wanted, optional, names)
    for key, col in wanted.items():
        if col not in names:
            raise _missing(shard, key, col, names)
    _check_unique(shard, names, wanted)
    return wanted


def _parquet_wanted(shard: Shard, wanted: dict, optional: set, skip_text: bool) -> dict:
    """The wanted columns a Parquet shard has (checked present and unique), less the text when skipped."""
    wanted = _schema_wanted(shard, parquet_schema(shard).names, wanted, optional)
    if skip_text:  # present and unique: the device reader reads it
        wanted.pop("text")
    return wanted


def _arrow_wanted(shard: Shard, wanted: dict, optional: set) -> dict:
    """The wanted columns an Arrow shard has (checked present and unique), from its schema."""
    return _schema_wanted(shard, arrow_schema(shard).names, wanted, optional)


def read_columns(shard: Shard, cfg: InputConfig, score_column: str | None = None, row_groups=None,
                 skip_text: bool = False):
    """The validated text (and id, score) columns of one shard, or of some of its
    Parquet row groups, as a table with columns ``text``[, ``id``][, ``score``];
    None for a JSONL shard without records.  ``skip_text``: the text column is checked
    to be there but not read (a device reader reads it; see :func:`device_readable`)."""
    wanted, optional = _wanted(cfg, score_column)
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
        wanted = _parquet_wanted(shard, wanted, optional, skip_text)
        table = read_parquet(shard, list(dict.fromkeys(wanted.values())), row_groups)
    elif shard.format == "arrow":
        wanted = _arrow_wanted(shard, wanted, optional)
        table = read_arrow(shard, list(dict.fromkeys(wanted.values())))
    else:
        table = read_jsonl(shard, wanted)
        if table is None:  # no records
            return None
        wanted = _present(wanted, optional, table.column_names)
        for key, col in wanted.items():
            if col not in table.column_names:
                raise _missing(shard, key, col, table.column_names)
    return _validated(shard, cfg, table, wanted, score_column, skip_text)


def iter_columns(shard: Shard, cfg: InputConfig, score_column: str | None = None, skip_text: bool = False,
                 batch_bytes: int | None = None, row_groups=None):
    """:func:`read_columns` of one shard as tables of consecutive rows, in order, each about
    ``batch_bytes`` of input: a Parquet shard streamed a batch of pages at a time (whatever its row
    groups), a JSONL shard a block of lines at a time, a memory shard in one table.  A Parquet shard
    without rows yields one empty table, a JSONL shard without records nothing.

    A JSONL shard whose later lines do not fit the types its first lines fixed raises
    :class:`ReadWhole` (maybe after some tables): its tables are those of :func:`read_columns`,
    which infers every field's type from the whole file."""
    if shard.format == "memory" or (row_groups is not None and shard.format != "parquet"):
        yield read_columns(shard, cfg, score_column, row_groups, skip_text)
        return
    wanted, optional = _wanted(cfg, score_column)
    if shard.format == "parquet":
        wanted = _parquet_wanted(shard, wanted, optional, skip_text)
        for table in iter_parquet(shard, list(dict.fromkeys(wanted.values())), batch_bytes, row_groups):
            yield _validated(shard, cfg, table, wanted, score_column, skip_text)
        return
    if shard.format == "arrow":
        wanted = _arrow_wanted(shard, wanted, optional)
        for table in iter_arrow(shard, list(dict.fromkeys(wanted.values())), batch_bytes):
            yield _validated(shard, cfg, table, wanted, score_column, skip_text)
        return
    for table in iter_jsonl(shard, wanted, batch_bytes):
        present = _present(wanted, optional, table.column_names)
        for key, col in present.items():
            if col not in table.column_names:
                raise _missing(shard, key, col, table.column_names)
        yield _validated(shard, cfg, table, present, score_column, skip_text)


def iter_columns_held(shard: Shard, cfg: InputConfig, score_column: str | None = None, row_groups=None):
    """:func:`iter_columns` of a Parquet shard that reads every column: per batch, (the run's validated
    columns, the whole batch as read), the batches :func:`~gpu_dedup.storage.parquet.iter_parquet` gives
    the write stage, so that it can write the kept rows without reading the shard again.  ``row_groups``
    (None: all): a block's part of the shard on a cluster; the batches of consecutive row groups, in order,
    hold the same rows and types as the whole shard's."""
    wanted, optional = _wanted(cfg, score_column)
    wanted = _parquet_wanted(shard, wanted, optional, False)
    for table in iter_parquet(shard, None, row_groups=row_groups):
        yield _validated(shard, cfg, table, wanted, score_column, False), table


def text_values(column) -> pa.ChunkedArray:
    """A text column as the run reads it (plain large strings or binaries), e.g. of a held batch."""
    if not isinstance(column, pa.ChunkedArray):
        column = pa.chunked_array([column])
    return _as_large_text(without_views(_decoded(column)))


def _validated(shard: Shard, cfg: InputConfig, table: pa.Table, wanted: dict, score_column, skip_text: bool):
    """The run's columns of ``table`` (read from ``shard``), checked and in the run's types."""
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
        cols["id"] = id_values(without_views(ids))
    if score_column:
        score = _decoded(table.column(score_column))
        if pa.types.is_null(score.type):  # no value at all (a shard of no rows, a JSON field always null): ranked last
            score = pa.chunked_array([pa.nulls(len(score), pa.float64())])
        if not (pa.types.is_integer(score.type) or pa.types.is_floating(score.type)):
            raise InputError(
                f"score column {score_column!r} of shard {shard.path!r} has type {score.type}; it must be numeric"
            )
        cols["score"] = _float_scores(score, score_column, shard)
    if cfg.vector_column:
        vector = table.column(cfg.vector_column)
        if shard.format == "jsonl":
            vector = json_vectors(vector)
        cols["vector"] = vector
    return pa.table(cols) if cols else rows_only(table.num_rows)


def json_vectors(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A JSON Lines vector column as float vectors: JSON has one number type, so embeddings written as whole
    numbers (``[1, 0, 2]``) are inferred as integer lists; they become float64 lists (the nearest float64 beyond
    2**53, as every value becomes a float32 anyway).  Any other column as it is (the vector stage checks it)."""
    t = column.type
    if (pa.types.is_list(t) or pa.types.is_large_list(t)) and pa.types.is_integer(t.value_type):
        return pc.cast(column, pa.large_list(pa.float64()) if pa.types.is_large_list(t) else pa.list_(pa.float64()),
                       safe=False)
    return column


EXACT_IN_FLOAT64 = 2 ** 53  # integers of larger magnitude are not all float64 values


def _float_scores(score: pa.ChunkedArray, name: str, shard: Shard) -> pa.ChunkedArray:
    """A numeric score column as float64, the type every shard's scores are ranked in.  Integers beyond 2**53 in
    magnitude (nanosecond timestamps, hashes) become the nearest float64: scores that differ by less than its
    spacing (256 at 2**61) tie, and ties go to the earlier row; one warning says so (Arrow's checked cast refused
    them)."""
    if pa.types.is_integer(score.type) and score.length() - score.null_count:
        lo, hi = (v.as_py() for v in pc.min_max(score).values())
        if max(abs(lo), abs(hi)) > EXACT_IN_FLOAT64:
            log.warning("score column %r of shard %r holds integers beyond 2**53 (from %d to %d), which are ranked "
                        "by their nearest float64: scores closer than its spacing tie, and ties go to the earlier "
                        "row; scale the column (e.g. nanoseconds to seconds) for an exact order", name, shard.path,
                        lo, hi)
            return pc.cast(score, pa.float64(), safe=False)
    return pc.cast(score, pa.float64())


def id_type(t: pa.DataType) -> pa.DataType:
    """The type ids of type ``t`` are read as: one per kind, so that shards whose id columns differ only in
    physical type (string / large_string, int32 / int64, as different writers store them) join into one
    column with every value as it was: strings and binaries as their large types, integers of up to 32 bits
    (signed or not) as int64.  Other types as they are."""
    if pa.types.is_string(t):
        return pa.large_string()
    if pa.types.is_binary(t):
        return pa.large_binary()
    if pa.types.is_integer(t) and t.bit_width < 64:
        return pa.int64()
    return t


def id_values(ids):
    """``ids`` as :func:`id_type` says (values unchanged)."""
    want = id_type(ids.type)
    return ids if want == ids.type else pc.cast(ids, want)


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
            f"{first[1]!r}; mixed schemas across shards: make the id column one type in every shard, or pass "
            "--no-id-column to name documents by row number"
        )
    return first



def _as_large_text(text: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_null(text.type):  # JSONL shard whose texts are all null
        return pc.cast(text, pa.large_string())
    if pa.types.is_string(text.type):
        return pc.cast(text, pa.large_string())
    if pa.types.is_binary(text.type):
        return pc.cast(text, pa.large_binary())
    return text


_ABSENT = object()
_UNKNOWN = object()
_HEAD = 1 << 16  # bytes of a JSONL shard whose records say which fields it has
_FIRST_LINE = 1 << 28  # a first record longer than the head is read whole, up to this


def _peek_id(shard: Shard, name: str):
    """Column ``name`` of a shard without reading its rows: a Parquet shard's type (views and dictionaries
    as their plain type) or, for a JSONL shard, the value of the first record holding the field among
    those in its first 64 KiB (at least its first record, however long; bytes that are not UTF-8 read as
    U+FFFD here).  ``_ABSENT`` when it has no such column, ``_UNKNOWN`` when that cannot be told here (an
    unreadable shard: the run reports it)."""
    try:
        if shard.format == "parquet":
            schema = parquet_schema(shard)
            if name not in schema.names:
                return _ABSENT
            t = plain_type(schema.field(name).type)
            return t.value_type if pa.types.is_dictionary(t) else t
        if shard.format == "arrow":
            schema = arrow_schema(shard)
            if name not in schema.names:
                return _ABSENT
            t = plain_type(schema.field(name).type)
            return t.value_type if pa.types.is_dictionary(t) else t
        if shard.format == "jsonl":
            with open_stream(shard.path) as f:
                head = f.read(_HEAD)
                if b"\n" not in head and len(head) == _HEAD:  # one long first record
                    head += f.readline(_FIRST_LINE)
            head = head.removeprefix(b"\xef\xbb\xbf")  # a byte order mark
            lines = head.split(b"\n")
            lines = lines[:-1] if len(lines) > 1 else lines  # complete records only (or the whole file)
            seen = False
            for line in lines:
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8", "replace"))
                except (ValueError, RecursionError):  # nested deeper than Python's json takes: the read names it
                    continue  # the read names a line that is not JSON
                seen = True
                if isinstance(record, dict) and name in record:
                    return record[name]
            return _ABSENT if seen else _UNKNOWN
    except (OSError, ValueError, pa.ArrowException, InputError):
        pass
    return _UNKNOWN


def id_column_type(shard: Shard, name: str) -> str | None:
    """The type of column ``name`` in a shard: a Parquet shard's schema type, as :func:`id_type` reads it
    (nested and null types too: :func:`auto_id_column` refuses them); for a JSONL shard 'any' when a
    record holds a scalar value for it (JSON's types are told when it is read), 'struct' / 'list' for an
    object or array.  None when the shard has no such column, or when that cannot be told here."""
    t = _peek_id(shard, name)
    if t is _ABSENT or t is _UNKNOWN:
        return None
    if isinstance(t, pa.DataType):
        return str(id_type(t))
    return "struct" if isinstance(t, dict) else "list" if isinstance(t, list) else "any"


def auto_id_column(shards, name: str) -> str | None:
    """``name`` when every shard has a column ``name`` that names its documents as it is (scalars of one
    type: 'any' for JSONL, whose values' types the read checks); None when no shard has one.  Otherwise
    an :class:`InputError` naming the shards and the fix: ids are never dropped without a word."""
    found, absent = {}, []
    for s in shards:
        t = _peek_id(s, name)
        if t is _UNKNOWN:
            continue  # unreadable: the run says so
        if t is _ABSENT:
            absent.append(s.path)
        else:
            found[s.path] = id_column_type(s, name)
    if not found:
        return None
    fix = ("pass --no-id-column to name every document by its row number (duplicates.parquet's 'row', "
           "'shard' and 'shard_row'), or --id-column COLUMN for another column")
    first = next(iter(found))
    if absent:
        more = f" and {len(absent) - 1} other shard(s)" if len(absent) > 1 else ""
        raise InputError(f"input column {name!r} names the documents of shard {first!r} (ids found by themselves) "
                         f"but shard {absent[0]!r}{more} has no such column, so some documents would have no id: "
                         f"add the column to every shard, or {fix}")
    for path, t in found.items():
        if t in ("struct", "list", "null") or t.startswith(("struct<", "list<", "large_list<", "fixed_size_list<",
                                                             "map<", "dense_union", "sparse_union")):
            raise InputError(f"input column {name!r} of shard {path!r} has type {t}, which cannot name documents "
                             f"(ids must be scalars: integers, strings, ...); {fix}")
    typed = {path: t for path, t in found.items() if t != "any"}
    if len(set(typed.values())) > 1:
        a, ta = next(iter(typed.items()))
        b, tb = next((p, t) for p, t in typed.items() if t != ta)
        raise InputError(f"input column {name!r} (ids found by themselves) has type {ta} in shard {a!r} but {tb} "
                         f"in shard {b!r}; make it one type in every shard, or {fix}")
    return name


def id_kind(t) -> str | None:
    """The kind of an id type (``string``, ``binary``, ``integer``, ``float``), or None for another type."""
    for kind, test in (("string", lambda t: pa.types.is_string(t) or pa.types.is_large_string(t)),
                       ("binary", lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t)),
                       ("integer", pa.types.is_integer), ("float", pa.types.is_floating)):
        if test(t):
            return kind
    return None


def shard_id_kind(shard: Shard, name: str) -> str | None:
    """The :func:`id_kind` of column ``name`` in a shard without reading it (see :func:`_peek_id`); None when
    that cannot be told here (the read says what is wrong)."""
    t = _peek_id(shard, name)
    if isinstance(t, pa.DataType):
        return id_kind(t)
    return {str: "string", int: "integer", float: "float"}.get(type(t))
