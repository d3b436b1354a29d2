"""Read stage: every shard's id, text (and score, vector) columns into one corpus table.

The corpus table has the internal columns ``row`` (dense int64), ``shard``
(int32 index into the shard list), ``shard_row`` (int64), ``id`` (the user's
id column verbatim, or a generated int64 = ``row``), ``text`` (large_string)
and, for ``select.keep = score``, ``score``.  Files are found, validated and
parsed by :mod:`gpu_dedup.storage`.

Shards are read in batches of consecutive rows (a Parquet shard a batch of
pages at a time whatever its row groups, a JSONL shard a block of lines at a
time; see :func:`gpu_dedup.storage.iter_columns`), up to one shard per core
(at most ``READERS``) at once, each on its own reader thread a couple of
batches ahead of the caller, so shards decode in parallel and reading overlaps
what is done with each batch; the caller still gets the batches in order.
With ``text`` given, each batch's text column goes to it as soon as it is
read and is not kept (the caller normalizes it and drops the raw text): the
memory the stage takes is then a few batches plus what ``text`` keeps.

With ``hold`` (``output.hold_inputs``, see :func:`hold_inputs`), every column
of each Parquet shard is read and its batches are kept as read (``Corpus.held``)
for the write stage, which then writes the kept rows without reading and
decompressing the shard again, and for the report's sample texts.
"""

from __future__ import annotations

import logging
import os
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import available_memory
from gpu_dedup.backends.arrow_arrays import arrow_array, empty_array
from gpu_dedup.backends.placement import Readers
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.storage import (
    ReadWhole,
    Shard,
    check_id_type,
    discover,
    iter_columns,
    parquet_metadata,
    read_columns,
    read_rows,
)
from gpu_dedup.storage.ahead import ahead_each
from gpu_dedup.storage.parquet import input_bytes
from gpu_dedup.storage.columns import iter_columns_held, text_values
from gpu_dedup.storage.pages import take_pages

log = logging.getLogger("gpu_dedup")
READERS = 8  # shards read at once, at most (one per core below that): each holds a couple of 32 MiB batches
HOLD_SHARE = 0.25  # output.hold_inputs auto: the shards' columns are held when they take at most this share of
# the memory available when the run starts
TEXT_SHARE = 0.5  # cluster.spill_texts auto, one process: normalized texts past this share of the memory available
# when the run starts are kept in a mapped file

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
    device_table: object = None  # the Readers' table reader: every column of every shard in device memory, or None
    text_parts: list | None = None  # what ``read(text=...)`` returned for each batch's text column, in row order
    held: list | None = None  # read(hold=True): per shard the batches of all its columns as read (None: not held)

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


def read(inputs, cfg: InputConfig = InputConfig(), score_column: str | None = None, progress=None,
         readers=None, text=None, hold: bool = False) -> Corpus:
    """Read every shard's id, text (and score) columns into one corpus table.

    ``readers`` (:class:`gpu_dedup.backends.placement.Readers`, the backend's): where its ``text`` reader
    reads the text columns of Parquet shards into device memory (cuDF) instead, the corpus holds those
    columns (``device_text``, one per shard) and its table has no ``text`` column.  Only when
    :func:`device_readable`.
    ``text(column)``: called with the text column of each batch as it is read (a chunked
    large_string / large_binary array); the table then has no ``text`` column and the
    corpus's ``text_parts`` are its results, in row order.
    ``hold``: the batches of every column of each Parquet shard are kept (``Corpus.held``; not where the
    device reads the texts).  A ``table`` reader (with a ``text`` reader): reads every column of all the
    shards into device memory in one call instead of each shard's text column (``Corpus.device_table``,
    whose text column is then the one ``device_text`` column); where it cannot, the ``text`` reader reads
    each shard's text column.
    ``progress(1)`` is called after each shard."""
    shards = inputs if inputs and isinstance(inputs, list) and isinstance(inputs[0], Shard) else discover(inputs, cfg.format)
    readers = readers if readers is not None else Readers()  # pyarrow's
    parts: list = []
    out_shards: list = []
    vector_parts: list = []
    text_parts: list = []
    held: list = []
    hold = hold and readers.on_host
    first_id: tuple | None = None
    row0 = 0
    mine = _Shard(row0)  # the batches of the shard being read
    with closing(_batches(shards, cfg, score_column, not readers.on_host, hold=hold)) as batches:  # reader threads stop
        for i, kind, table in batches:  # one step per batch
            shard = shards[i]
            if kind == "again":  # read whole after some batches (see storage.iter_columns): those are dropped
                mine, first_id = _Shard(row0), mine.first_id
                continue
            if kind == "held":  # the whole batch whose run's columns come next
                mine.held.append(table)
                continue
            if kind == "batch":
                if not mine.seen:
                    mine.first_id = first_id  # the id type the shards before this one fixed
                if table is not None:
                    first_id = _add_batch(mine, shard, cfg, table, i, first_id, score_column, text)
                continue
            # kind == "end": the shard is read
            readers.shard_read(shard, cfg.text_column, mine.rows)  # its text column, where the device reads it
            if progress is not None:
                progress(1)
            if not mine.seen:  # a JSONL shard without records
                out_shards.append(shard.with_rows(0))
                held.append(None)
                mine = _Shard(row0)
                continue
            held.append(mine.held if hold and shard.format == "parquet" else None)
            parts += mine.tables
            text_parts += mine.text
            if cfg.vector_column:
                vector_parts.append((i, row0, pa.chunked_array(mine.vectors, mine.vector_type)))
            out_shards.append(shard.with_rows(mine.rows))
            row0 += mine.rows
            mine = _Shard(row0)
    table = ids_in_one_chunk(pa.concat_tables(parts)) if parts else _empty_table(score_column is not None)
    # the device's text columns (and table), read now where one device read takes every shard's columns
    device_text, device_table = readers.finish(out_shards, table.num_rows, cfg.text_column)
    if (not readers.on_host or text is not None) and "text" in table.column_names:
        table = table.drop_columns(["text"])
    log.debug("read %d documents from %d shard(s)%s", table.num_rows, len(out_shards),
              "" if readers.on_host else " (text columns into device memory)")
    return Corpus(table, out_shards, cfg.text_column, cfg.id_column, score_column,
                  vectors=vector_parts if cfg.vector_column else None, device_text=device_text,
                  text_parts=text_parts if text is not None else None,
                  held=held if hold else None, device_table=device_table)


ONE_CHUNK_BYTES = 2**31 - 1  # the most a string or binary id column's chunks may hold to be joined in one


def ids_in_one_chunk(table: pa.Table) -> pa.Table:
    """``table`` with its ``id`` column in one chunk (one per batch read, as read), where one chunk holds it
    (string and binary offsets are 32 bits): the write stage gathers the ids of its members and their survivors
    row group by row group, and a gather from one array took 0.07 s where one from 160 chunks took 0.3-0.9 s
    (9 row groups of 2^20 of 10^7 ids on 2 cores).  Costs a copy of the ids (0.03 s there), whose chunks are freed
    with the table read (the batches a run holds keep theirs)."""
    col = table.column("id")
    narrow = pa.types.is_string(col.type) or pa.types.is_binary(col.type)
    if col.num_chunks < 2 or (narrow and col.nbytes > ONE_CHUNK_BYTES):
        return table
    return table.set_column(table.schema.get_field_index("id"), table.schema.field("id"),
                            pa.chunked_array([col.combine_chunks()], col.type))


class _Shard:
    """What has been read of one shard so far."""

    def __init__(self, row0: int):
        self.row0, self.rows, self.seen = row0, 0, False
        self.first_id: Any = None  # the id type the shards before this one fixed
        self.tables: list = []
        self.text: list = []
        self.vectors: list = []
        self.vector_type = None
        self.held: list = []  # whole batches as read (read(hold=True))


def _add_batch(mine: _Shard, shard: Shard, cfg: InputConfig, table: pa.Table, i: int, first_id, score_column,
               text) -> tuple:
    """Add one batch of validated columns of shard ``i`` to ``mine``; returns the first id type seen."""
    n = table.num_rows
    mine.seen = True
    start = mine.row0 + mine.rows
    cols = {
        "row": arrow_array(np.arange(start, start + n, dtype=np.int64)),
        "shard": arrow_array(np.full(n, i, np.int32)),
        "shard_row": arrow_array(np.arange(mine.rows, mine.rows + n, dtype=np.int64)),
    }
    if cfg.id_column:
        first_id = check_id_type(shard, cfg.id_column, table.column("id").type, first_id)
        cols["id"] = table.column("id")
    else:
        cols["id"] = cols["row"]
    if "text" in table.column_names:
        if text is not None:
            mine.text.append(text(table.column("text")))
        else:
            cols["text"] = table.column("text")
    if score_column:
        cols["score"] = table.column("score")
    if cfg.vector_column:
        column = table.column("vector")
        mine.vectors += column.chunks
        mine.vector_type = column.type
    mine.tables.append(pa.table(cols))
    mine.rows += n
    return first_id


def _batches(shards, cfg: InputConfig, score_column, skip: bool, readers: int | None = None, hold: bool = False):
    """(shard index, kind, table) for every batch of every shard, in order: kind ``batch`` (table: its
    validated columns, or None for a JSONL shard without records), ``again`` (the shard's batches so far
    are void: it is read whole, see :class:`~gpu_dedup.storage.ReadWhole`), then ``end``; with ``hold``,
    each batch of a Parquet shard as read (kind ``held``: every column) just before its ``batch``.  Up to
    ``readers`` shards (default: one per core, at most READERS) are read at once, each by its own thread
    a couple of batches ahead; ``skip``: the text column is left to the device reader."""
    readers = min(READERS, os.cpu_count() or 1) if readers is None else readers
    return ahead_each([partial(_shard_batches, i, shard, cfg, score_column, skip, hold)
                       for i, shard in enumerate(shards)], readers)


def _shard_batches(i: int, shard: Shard, cfg: InputConfig, score_column, skip: bool, hold: bool = False):
    """:func:`_batches` of shard ``i``."""
    if skip:  # the ids (and score) of the shard; its text goes to the device reader
        yield i, "batch", read_columns(shard, cfg, score_column, skip_text=True)
    elif hold and shard.format == "parquet":
        for table, whole in iter_columns_held(shard, cfg, score_column):  # one step per batch
            yield i, "held", whole
            yield i, "batch", table
    else:
        try:
            for table in iter_columns(shard, cfg, score_column):  # one step per batch
                yield i, "batch", table
        except ReadWhole:
            yield i, "again", None
            yield i, "batch", read_columns(shard, cfg, score_column)
    yield i, "end", None


def spill_texts(setting, text_bytes: int, share: float = TEXT_SHARE) -> bool:
    """Whether one process keeps its normalized texts in a mapped file (``cluster.spill_texts``): ``setting``
    true or false, or for ``auto`` when the texts (``text_bytes``, their size before normalization) are more
    than ``share`` of the memory available now."""
    if setting is True or setting is False:
        return setting
    return text_bytes > share * available_memory()


def hold_inputs(shards, setting, share: float = HOLD_SHARE) -> bool:
    """Whether the read stage keeps the Parquet shards' columns for the write stage (``output.hold_inputs``):
    ``setting`` true or false, or for ``auto`` when their uncompressed size (from the footers) is at most
    ``share`` of the memory available now.  Only Parquet shards are held; the rest are read again."""
    if setting is not True and setting != "auto":
        return False
    parquet = [s for s in shards if s.format == "parquet"]
    if not parquet:
        return False
    if setting is True:
        return True
    return sum(input_bytes(s) for s in parquet) <= share * available_memory()


def text_bytes(shard: Shard, text_column: str, row_groups=None) -> int:
    """About how many bytes ``shard``'s texts take (of ``row_groups`` only, for Parquet): the Parquet text
    column chunks' uncompressed size (footers only; less than the texts where pages are
    dictionary-encoded), else the bytes on disk.  A size to start a buffer with, not a bound."""
    if shard.format != "parquet":
        return shard.size
    meta = parquet_metadata(shard)
    total = 0
    for g in range(meta.num_row_groups) if row_groups is None else row_groups:  # footer data only
        rg = meta.row_group(g)
        for c in range(rg.num_columns):
            col = rg.column(c)
            if col.path_in_schema == text_column or col.path_in_schema.startswith(text_column + "."):
                total += col.total_uncompressed_size
    return total


def held_texts(held: list, text_column: str, rows) -> pa.Array:
    """The text column at ``rows`` (shard-relative, any order) of one shard's held batches."""
    col = pa.chunked_array([c for t in held for c in t.column(text_column).chunks],
                           held[0].schema.field(text_column).type)
    rows = arrow_array(rows, pa.int64())
    try:
        return text_values(col.take(rows)).combine_chunks()  # a few dozen texts cast
    except (pa.ArrowNotImplementedError, pa.ArrowInvalid):  # a view or dictionary type Arrow cannot take from (or
        # whose batches' dictionaries do not fit one of its index type together): the column cast first
        return text_values(col).take(rows).combine_chunks()


def head(inputs, cfg: InputConfig | None = None, limit: int = 10_000) -> pa.Table:
    """The validated ``text`` (and ``id``) columns of the first ``limit`` documents of ``inputs`` (files,
    directories, globs or URLs), in shard order: shards are streamed a batch at a time and reading stops
    at ``limit``, so a shard of any size costs a batch beyond the documents kept (a JSONL shard whose types
    change past its first lines is read whole).  The notebook's own-data cell reads a corpus with it."""
    if limit < 1:
        raise InputError(f"limit = {limit} must be at least 1 document")
    cfg = InputConfig() if cfg is None else cfg
    parts, taken = [], 0
    for shard in discover(inputs, cfg.format):  # one step per shard, until limit documents
        mine, got = [], 0
        try:
            for table in iter_columns(shard, cfg):  # one step per batch
                mine.append(table.slice(0, limit - taken - got))
                got += mine[-1].num_rows
                if taken + got >= limit:
                    break
        except ReadWhole:
            whole = read_columns(shard, cfg)
            mine = [] if whole is None else [whole.slice(0, limit - taken)]
            got = sum(t.num_rows for t in mine)
        parts += mine
        taken += got
        if taken >= limit:
            break
    if not parts:
        raise InputError(f"{inputs!r} holds no documents")
    try:
        return pa.concat_tables(parts, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        raise InputError(f"the shards of {inputs!r} give their columns different types ({exc}); make each column "
                         "one type in every shard") from None


def read_texts(shard: Shard, cfg: InputConfig, rows) -> pa.Array:
    """The text column at ``rows`` (shard-relative, any order, repeats allowed) of one shard, read again (a
    report's examples: a few dozen texts of any shard): from the Parquet pages that hold them
    (:func:`~gpu_dedup.storage.pages.take_pages`), else streamed through the row groups that hold them (or
    the JSONL shard's blocks) up to the last of them, in the memory of a batch."""
    rows = np.asarray(rows, np.int64)
    if shard.format == "memory" or rows.shape[0] == 0:
        return read_rows(shard, cfg, rows).column("text").combine_chunks()
    stream, groups = rows, None  # each row's position in what is read
    if shard.format == "parquet":
        meta = parquet_metadata(shard)
        values = take_pages(shard.path, cfg.text_column, rows, meta)  # only the pages that hold them
        if values is not None:
            return text_values(values).combine_chunks()
        sizes = np.array([meta.row_group(g).num_rows for g in range(meta.num_row_groups)], np.int64)
        starts = np.concatenate(([0], np.cumsum(sizes)))
        group_of = np.searchsorted(starts, rows, side="right") - 1
        groups = np.unique(group_of)
        first = np.concatenate(([0], np.cumsum(sizes[groups])))  # where each read group starts
        stream = rows - starts[group_of] + first[np.searchsorted(groups, group_of)]
    wanted = np.unique(stream)
    parts, pos = [], 0
    try:
        for table in iter_columns(shard, cfg, row_groups=None if groups is None else groups.tolist()):
            n = table.num_rows  # one step per batch, up to the last wanted row
            mine = wanted[(wanted >= pos) & (wanted < pos + n)]
            if mine.shape[0]:
                parts += table.column("text").take(arrow_array(mine - pos, pa.int64())).chunks
            pos += n
            if pos > wanted[-1]:
                break
    except ReadWhole:
        return read_rows(shard, cfg, rows).column("text").combine_chunks()
    if pos <= wanted[-1]:
        raise InputError(f"shard {shard.path!r} has {pos} rows now but had more when read; inputs must not "
                         "change during a run")
    return pa.concat_arrays(parts).take(arrow_array(np.searchsorted(wanted, stream), pa.int64()))


def _empty_table(with_score: bool) -> pa.Table:
    cols = {
        "row": empty_array(pa.int64()),
        "shard": empty_array(pa.int32()),
        "shard_row": empty_array(pa.int64()),
        "id": empty_array(pa.int64()),
        "text": empty_array(pa.large_string()),
    }
    if with_score:
        cols["score"] = empty_array(pa.float64())
    return pa.table(cols)
