"""Write stage: the duplicates table, and the id-column names it may not take.

The deduplicated shards themselves are written by :func:`gpu_dedup.storage.write_shard`
(each input shard's kept rows, under its name, atomically).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import array_module, to_host
from gpu_dedup.backends.arrow_arrays import arrow_array, string_array
from gpu_dedup.errors import ConfigError

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
    match = np.where(kept, 0, np.where(exact, 1, 2))
    cols = {}
    if ids is not None:
        check_id_column(id_column)
        cols[id_column] = ids
    cols[ROW] = arrow_array(first_row + rows, pa.int64())
    cols.update({
        "cluster_id": arrow_array(cluster, pa.int64()),
        "kept": arrow_array(kept),
        "similarity": arrow_array(similarity, pa.float32()),
        "match": string_array(["kept", "exact", "near"], match),
    })
    if survivor_ids is not None:
        cols["survivor_id"] = survivor_ids
    if in_index is not None:
        cols["in_index"] = arrow_array(in_index, pa.bool_())
    cols["shard"] = string_array(list(shard_names or [""]), shard)
    cols["shard_row"] = arrow_array(rows - np.asarray(shard_starts, np.int64)[shard], pa.int64())
    return pa.table(cols)


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def survivor_rows(dup: dict, first_doc: int) -> dict:
    """Survivor rows of a block's members whose survivor is a row of this run (the ids to look up)."""
    xp = array_module(dup["survivor"])
    s = dup["survivor"]
    return {"row": xp.where(s >= first_doc, s - first_doc, 0)}


def survivor_id_column(dup: dict, ids: dict, prior) -> pa.Array:
    """Survivor ids of a block's members: a row's id, or the index's id of an indexed survivor's cluster."""
    col = ids["id"]
    if not prior.active:
        return col
    s = to_host(dup["survivor"])
    low = s < prior.first_doc
    if not low.any():
        return col
    pos = np.empty(s.shape[0], np.int64)
    pos[~low] = np.arange(int((~low).sum()))
    pos[low] = (~low).sum() + np.arange(int(low.sum()))
    index_ids = prior.ids(to_host(dup["cluster"])[low])
    return pa.concat_arrays([col.filter(arrow_array(~low)), index_ids.cast(col.type)]).take(arrow_array(pos))


def duplicates_part(dup: dict, ids: dict | None, survivor_ids, *, first_doc, starts, names, id_column,
                    prior) -> pa.Table:
    """One block's rows of the duplicates table; against an index (``prior``), whether each survivor is an
    indexed document (``in_index``)."""
    rows = to_host(dup["row"])
    return duplicates_table(
        ids=None if ids is None else ids["id"], survivor_ids=survivor_ids, rows=rows, first_row=first_doc,
        shard_starts=starts, shard_names=names, id_column=id_column, kept=to_host(dup["kept"]),
        cluster=to_host(dup["cluster"]), similarity=to_host(dup["similarity"]), exact=to_host(dup["exact"]),
        in_index=(to_host(dup["survivor"]) < first_doc) if prior.active else None)


# duplicates.parquet's encodings (both executors: one process writes the table whole, a cluster merges its blocks'
# parts with the same options, so the two files are the same).  pyarrow's defaults dictionary-encode every column:
# for the unique or nearly unique columns (row, shard_row, the ids; cluster_id, one value per cluster) that is a hash
# of every value and a dictionary that overflows and falls back to plain pages, so only the columns of few values
# keep one; the ascending numbers (row, shard_row) and cluster_id are delta-encoded (DELTA_BINARY_PACKED, an
# encoding of the Parquet format since 2.0; tests/stages/test_write.py reads it back).  A synthetic table of 10^7 rows: 1.1 s of the writing thread's CPU instead
# of 1.6 s, 22 MB instead of 70 MB (docs/scale.md).
DICTIONARY_COLUMNS = ("similarity", "match", "shard")
DUPLICATES_ROW_GROUP = 1024 * 1024  # rows per row group: pyarrow's write_table default, whichever way the file is made
DELTA_COLUMNS = (ROW, "cluster_id", "shard_row")


def duplicates_parquet_options(schema: pa.Schema) -> dict:
    """pyarrow's Parquet writer options (beside the codec) of a duplicates table of ``schema``: dictionaries for
    the columns of few values only, delta encoding for the int64 document numbers (see above); a user's id
    column and the survivor ids are plain."""
    names = set(schema.names)
    return {"use_dictionary": [c for c in DICTIONARY_COLUMNS if c in names],
            "column_encoding": {c: "DELTA_BINARY_PACKED" for c in DELTA_COLUMNS
                                if c in names and schema.field(c).type == pa.int64()}}


def table_rows(table: pa.Table) -> dict:
    return {"rows": table.num_rows}


def removed_by_shard(removed: dict, starts) -> np.ndarray:
    rows = to_host(removed["row"])
    shard = np.searchsorted(np.asarray(starts), rows, side="right") - 1
    return np.bincount(shard, minlength=len(starts) - 1).astype(np.int64)
