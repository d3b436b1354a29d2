"""Read stage: every shard's id, text (and score, vector) columns into one corpus table.

The corpus table has the internal columns ``row`` (dense int64), ``shard``
(int32 index into the shard list), ``shard_row`` (int64), ``id`` (the user's
id column verbatim, or a generated int64 = ``row``), ``text`` (large_string)
and, for ``select.keep = score``, ``score``.  Files are found, validated and
parsed by :mod:`gpu_dedup.shards`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.storage import Shard, check_id_type, discover, read_columns

log = logging.getLogger("gpu_dedup")

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
