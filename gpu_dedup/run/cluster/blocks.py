"""Blocks on Dask workers: planning them from shard metadata, reading them, and what each block computes.

A block is up to ``cluster.block_rows`` consecutive rows of the corpus:
consecutive Parquet row groups of one shard, or consecutive small shards (of
one schema) whole, read in one task.  Its columns and normalized texts (device arrays
on a GPU worker) stay on the worker that read it; these functions run there.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from gpu_dedup import storage
from gpu_dedup.storage.ahead import ahead_each
from gpu_dedup.storage.columns import iter_columns_held
from gpu_dedup.storage.parquet import input_bytes
from gpu_dedup.backends import (
    ByArrays,
    array_module,
    get_backend,
    host_frame,
    on_device,
    stable_order,
    to_device,
    to_host,
    traits,
)
from gpu_dedup.backends.arrow_arrays import arrow_array
from gpu_dedup.backends.strings import (
    StringBuffers,
    arrow_strings,
    code_point_lengths,
    raw_text,
    string_buffers,
    take_arrow,
)
from gpu_dedup.config import Config, parse_size
from gpu_dedup.errors import InputError, ResourceError
from gpu_dedup.stages import frames
from gpu_dedup.stages.exact import exact_keys, stored_keys
from gpu_dedup.stages.families import RowData, family_for
from gpu_dedup.stages.normalize import BatchNormalizer
from gpu_dedup.stages.projections import NULL_ROW
from gpu_dedup.stages.read import HOLD_SHARE, READERS, read_texts, text_bytes
from gpu_dedup.stages.selection import text_lengths
from gpu_dedup.stages.vectors import Vectors

# --------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class Piece:
    """A block's rows of one shard."""

    shard_index: int
    shard_row0: int  # the piece's first row inside the shard
    rows: int
    row_groups: tuple | None  # Parquet row groups; None: the whole shard


@dataclass(frozen=True)
class Block:
    index: int
    row0: int  # global row of the block's first document
    rows: int
    pieces: tuple  # Piece of each shard the block reads, in corpus order

    @property
    def shard_indices(self) -> list:
        return [p.shard_index for p in self.pieces]


def inspect_shard(shard: storage.Shard, cfg: Config) -> dict:
    """Rows, id type and row-group sizes of one shard; validates its columns."""
    score = cfg.select.score_read
    if shard.format == "parquet":
        table = storage.read_columns(shard, cfg.input, score, row_groups=[])  # validates names and types, 0 rows
        meta = storage.parquet_metadata(shard)  # the footer read_columns read (one read per process)
        groups = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        id_type = table.column("id").type if cfg.input.id_column else None
        return {"rows": int(sum(groups)), "row_groups": groups, "id_type": id_type, "schema": table.schema}
    table = storage.read_columns(shard, cfg.input, score)
    if table is None:
        return {"rows": 0, "row_groups": None, "id_type": None, "schema": None}
    return {"rows": table.num_rows, "row_groups": None,
            "id_type": table.column("id").type if cfg.input.id_column else None, "schema": table.schema}


def plan_blocks(infos: list, block_rows: int) -> list:
    """Blocks of consecutive rows, ``ceil(rows / block_rows)`` of them (more where shards of other column
    types meet: a block is one table), as even as whole Parquet row groups (and whole shards without row
    groups) allow: each cut at the row-group boundary nearest to its share of the rows.  A shard's row
    groups are cut into blocks, and consecutive small shards share one, so a corpus of many small files makes
    as few blocks as one of large files, and the tasks and routed pieces (a few hundred tasks a block) follow
    the rows, not the files."""
    units = []  # (shard, row group or None: the whole shard, rows, its first row in the shard), in corpus order
    for s, info in enumerate(infos):
        if info["rows"]:
            groups = info["row_groups"] or [info["rows"]]
            starts = np.cumsum([0] + groups[:-1])
            units += [(s, g if info["row_groups"] else None, n, int(r)) for g, (n, r) in enumerate(zip(groups, starts))]
    if not units:
        return []
    ends = np.cumsum([u[2] for u in units])
    total = int(ends[-1])
    k = -(-total // block_rows)
    cuts = set()  # a block ends after these units
    for j in range(1, k):  # the boundary nearest to j/k of the rows (ties: the earlier), metadata only
        target = total * j / k
        i = int(np.searchsorted(ends, target))
        if i > 0 and (i == len(ends) or target - ends[i - 1] <= ends[i] - target):
            i -= 1
        cuts.add(int(np.searchsorted(ends, ends[i], side="right")) - 1)  # after the last unit ending there
    for i in range(len(units) - 1):
        s, t = units[i][0], units[i + 1][0]
        if s != t and not _same_schema(infos[s].get("schema"), infos[t].get("schema")):
            cuts.add(i)
    cuts.add(len(units) - 1)
    blocks: list = []
    lo, row0 = 0, 0
    for hi in sorted(cuts):
        pieces = _pieces(units[lo:hi + 1])
        rows = sum(p.rows for p in pieces)
        if rows:
            blocks.append(Block(len(blocks), row0, rows, tuple(pieces)))
        row0, lo = row0 + rows, hi + 1
    return blocks


def _pieces(units: list) -> list:
    """The pieces of a block's units (consecutive units of one shard make one piece)."""
    pieces: list = []
    for s, g, n, start in units:
        if pieces and pieces[-1][0] == s:
            pieces[-1][2].append(g)
            pieces[-1][3].append(n)
        else:
            pieces.append([s, start, [g], [n]])
    return [Piece(s, start, sum(ns), None) if gs == [None] else Piece(s, start, sum(ns), tuple(gs))
            for s, start, gs, ns in pieces]


def _same_schema(a, b) -> bool:
    return a is not None and b is not None and a.equals(b)


def spread_blocks(rows: list, workers: list, capacity: dict | None = None, load: dict | None = None) -> list:
    """The worker each block is read on: the largest blocks first, each to the worker with the fewest rows so
    far (ties: the first), so every worker holds about its share of the corpus, whatever order the workers
    become free in.  ``capacity``: the threads of each worker (its rows so far are weighed per thread);
    ``load``: the rows each worker has already (e.g. the shards it writes from held batches)."""
    load = {w: (load or {}).get(w, 0) for w in workers}
    homes: list = [None] * len(rows)
    for k in sorted(range(len(rows)), key=lambda k: -rows[k]):  # stable: equal blocks in order
        w = min(load, key=lambda v: load[v] / (capacity[v] if capacity else 1)) if load else None
        if w is not None:
            load[w] += rows[k]
        homes[k] = w
    return homes


# --------------------------------------------------------------------------- a block on its worker


@dataclass
class BlockData:
    """A block on its worker: its columns, then its normalized texts."""

    block: Block
    table: pa.Table  # text[, id][, score]; no text where the device read it (``raw_text``)
    strings: Any = None  # normalized StringBuffers (device arrays on a GPU worker), unless in a file
    invalid_utf8: int = 0
    vectors: Vectors | None = None  # input.vector_column
    null: np.ndarray | None = None
    text_file: str | None = None  # the normalized texts' file (spill_texts): ``.offsets`` and ``.data``
    text_bytes: int = 0
    texts_on_host: bool = False  # a GPU worker's texts kept in host memory (spill_texts, device_memory_limit)
    # per piece, the batches of every column of its Parquet rows as read, for the write stage (None: not held;
    # output.hold_inputs, read_block); a shard's write takes them out of the block (take_held)
    held: list | None = None
    # a GPU worker's original texts as libcudf read them into device memory (RawText), until normalized
    raw_text: Any = None
    text_reader: str = "pyarrow"  # which read the texts: cudf (raw_text) or pyarrow

    def texts(self):
        """The normalized texts: in memory, or mapped from the block's file for as long as the caller holds
        them (the mapping goes with the arrays, and the pages a task read with it)."""
        if self.strings is not None or self.text_file is None:
            return self.strings
        offsets = np.memmap(self.text_file + ".offsets", np.int64, "r").view(np.ndarray)
        data = np.memmap(self.text_file + ".data", np.uint8, "r").view(np.ndarray) if self.text_bytes else \
            np.zeros(0, np.uint8)
        return StringBuffers(offsets, data)

    def rows(self) -> RowData:
        return RowData(strings=self.texts(), vectors=self.vectors)

    def __sizeof__(self) -> int:
        """Bytes the block holds (columns, normalized texts, vectors; device bytes on a GPU worker): what Dask
        weighs it by (``dask.sizeof`` falls back to ``sys.getsizeof``) when it places a task that reads the
        block and when it spills.  Weighed as an empty object, a block was copied to whichever worker held the
        small frame a task paired it with, and one worker ended up holding every block."""
        n = object.__sizeof__(self) + (self.table.nbytes if self.table is not None else 0) + held_bytes(self)
        arrays = [self.null]
        if self.strings is not None:
            arrays += [self.strings.offsets, self.strings.data]
        if self.vectors is not None:
            arrays += [self.vectors.matrix, self.vectors.status]
        if self.raw_text is not None:
            arrays += [self.raw_text.offsets, self.raw_text.chars, self.raw_text.valid]
        return n + sum(int(a.nbytes) for a in arrays if a is not None)

    @property
    def norm(self) -> pa.Array:
        """Normalized texts as host Arrow (copied from the device on a GPU worker)."""
        texts = self.texts()
        return arrow_strings(to_host(texts.offsets), to_host(texts.data))

    def norm_rows(self, rows: np.ndarray) -> pa.Array:
        """The normalized texts of the block's ``rows`` (positions in the block) as host Arrow: on a GPU worker
        gathered on the device first, so only their bytes cross to the host.  (``norm.take`` copied all the
        block's texts to the host for a few rows: twice per block in every round of verify's and select's
        scoring, 3.9 s of verify at 10^6 documents on an H200 where texts in host memory took 0.96 s.)"""
        return take_arrow(self.texts(), rows)


def read_piece(piece: Piece, shard, cfg: Config, skip_text: bool = False) -> pa.Table:
    """The run's columns of one piece of a block, read from its shard (which must still hold the piece's rows);
    ``skip_text``: all but the text column (the device reads it, :func:`device_text`)."""
    table = storage.read_columns(shard, cfg.input, cfg.select.score_read, piece.row_groups, skip_text=skip_text)
    if table is None or table.num_rows != piece.rows:
        raise _changed(shard, 0 if table is None else table.num_rows, piece.rows)
    return table


def _changed(shard, got: int, expected: int) -> InputError:
    return InputError(f"shard {shard.path!r} changed during the run ({got} rows, expected {expected}); "
                      "inputs must not change during a run")


def concat_rows(tables: list) -> pa.Table:
    """The pieces' tables as one, with all their rows: pieces without a column left (their texts normalized, and
    no id or score column) are concatenated by Arrow into a table of 0 rows."""
    if len(tables) == 1:
        return tables[0]
    if tables and not tables[0].num_columns:
        return pa.table({"_": pa.nulls(sum(t.num_rows for t in tables))}).drop_columns(["_"])
    return pa.concat_tables(tables)


def piece_readers(pieces: int) -> int:
    """Pieces of a block read at once: up to the size of the worker's Arrow pool (the worker's share of the
    cores on a cluster gpu_dedup starts, :func:`~gpu_dedup.run.cluster.connection.worker_pools`; 1 under Dask's
    own OMP_NUM_THREADS=1), at most READERS, as one process reads its shards (stages/read.py).  A Parquet text
    column decodes on one thread, so the pieces of a block (a shard each, 4 of a 10^6-document corpus's
    250,000-row blocks) decoded one after another on the worker's one task thread where one process decodes
    its shards side by side."""
    return max(1, min(READERS, pieces, pa.cpu_count()))


def load_block(block: Block, shards: list, cfg: Config, dim: int | None = None) -> BlockData:
    """A block read from ``shards`` (the shard of each of its pieces), its pieces side by side
    (:func:`piece_readers`).  On a GPU worker with cuDF, the pieces' text column is read into device memory
    by one libcudf read (:func:`device_text`) and pyarrow reads the rest (ids, scores)."""
    raw = device_text(block, shards, cfg)
    readers = piece_readers(len(block.pieces))
    if readers > 1:
        with ThreadPoolExecutor(readers, thread_name_prefix="gpu-dedup-piece") as pool:
            tables = list(pool.map(lambda ps: read_piece(ps[0], ps[1], cfg, raw is not None),
                                   zip(block.pieces, shards)))
    else:
        tables = [read_piece(p, shard, cfg, raw is not None) for p, shard in zip(block.pieces, shards)]
    if raw is not None:
        table = concat_rows(tables)
        if cfg.select.keep == "longest":  # the policy's key, counted on the device (normalize_block drops nothing)
            table = table.append_column(LENGTH, _raw_lengths(raw))
        return BlockData(block, table, null=np.asarray(to_host(raw.null(array_module(raw.offsets))), bool),
                         raw_text=raw, text_reader="cudf")
    vecs = None
    if cfg.input.vector_column:
        vecs = _block_vectors(family_for(cfg), [t.column("vector") for t in tables], block.pieces, shards, dim)
        tables = [t.drop_columns(["vector"]) for t in tables]
    table = concat_rows(tables)
    data = BlockData(block, table, vectors=vecs)
    data.null = np.asarray(family_for(cfg).null_rows(table, vecs), bool)
    return data


def _block_vectors(family, columns: list, pieces, shards: list, dim: int | None) -> Vectors:
    """The vectors of a block's pieces (bad rows named by shard and row, per cosine.bad_vectors), of one
    length: ``dim``, else the first non-null row's, as one process reads them."""
    got = []
    for col, piece, shard in zip(columns, pieces, shards):
        v = family.load_vectors(col, shard.path, piece.shard_row0, dim)
        if dim is None and (v.status != NULL_ROW).any():
            dim = v.dim
        got.append(v)
    if len(got) == 1:
        return got[0]
    got = [v if dim is None or v.dim == dim else family.load_vectors(col, shard.path, piece.shard_row0, dim)
           for v, col, piece, shard in zip(got, columns, pieces, shards)]  # pieces of null rows before the first
    return Vectors(np.concatenate([v.matrix for v in got]), np.concatenate([v.status for v in got]))


def device_text(block: Block, shards: list, cfg: Config):
    """The block's original texts in device memory (a :class:`~gpu_dedup.backends.strings.RawText` of the
    worker's device arrays), read by the backend's block text reader (libcudf: every piece's row groups in one
    read, decoded on the device, the compressed column chunks what crosses the bus); None where the worker's
    backend has none (CPU workers, no cuDF, ``gpu.reader: pyarrow``), where a piece is not Parquet with a UTF-8
    text column (:func:`~gpu_dedup.storage.device_readable`), or where libcudf cannot read the pieces as one
    (pyarrow then reads them, as it does every block's without cuDF)."""
    if not family_for(cfg).uses_text or not block.pieces:
        return None
    backend = get_backend(cfg.backend)
    reader = backend.block_text_reader(cfg)
    if reader is None or not storage.device_readable(shards, cfg.input, cfg.select.score_read):
        return None
    got = reader(shards, row_groups=[p.row_groups for p in block.pieces])
    if got is None:
        return None
    if got.num_rows != block.rows:
        raise InputError(f"the shards of block {block.index} ({', '.join(repr(str(s.path)) for s in shards)}) gave "
                         f"{got.num_rows} text rows to cuDF, expected {block.rows}; inputs must not change during a "
                         "run: rerun, or set gpu.reader: pyarrow")
    return raw_text([got.column(cfg.input.text_column)], backend.xp)


def block_dim(data: BlockData) -> int | None:
    """The vector length of a block (None: no vector column, or only null rows)."""
    v = data.vectors
    if v is None or not (v.status != NULL_ROW).any():
        return None
    return v.dim


def block_docs(data: BlockData) -> dict:
    b = data.block
    return {"row": np.arange(b.row0, b.row0 + b.rows, dtype=np.int64), "null": data.null}


ID_SEED = 0x1D5  # the ids' hash seed (not the exact keys' seed, so the two never share lanes)
NULL_ID = (-0x2545F4914F6CDD1D, 0x1D)  # the lanes of a null id: nulls are one id, as pc.count_distinct counts them


def id_hashes(data: BlockData, backend: str = "cpu") -> dict:
    """Two 64-bit hashes of each id of a block: the frame that counts repeated ids.  String and binary ids:
    their exact keys (byte length folded into the first lane; collisions ~2**-128) from the worker's own
    exact-key kernel, the same keys on every backend (a GPU worker's ids, a host Arrow column, go to the device
    and their keys come back: 250,000 ids took pandas' hash 0.10 s there, the CPU kernel 0.008 s); integer ids:
    the routing hash of the value, which is one to one; other types: pandas' hash of each value."""
    ids = data.table.column("id").combine_chunks()
    t = ids.type
    if _byte_ids(t):
        keys = to_host(exact_keys(ids, seed=ID_SEED, backend=backend))
        h1, h2 = (keys[:, 1] ^ frames.mix64(keys[:, 0])).view(np.int64), keys[:, 2].view(np.int64)
    elif pa.types.is_integer(t):
        values = ids.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        h1, h2 = frames.mix64(values).view(np.int64), np.zeros(len(ids), np.int64)
    else:
        import pandas as pd  # noqa: PLC0415  the Dask executor's frames: a one-process run does not import pandas

        values = pd.Series(pd.arrays.ArrowExtensionArray(ids))
        h1 = pd.util.hash_pandas_object(values, index=False, hash_key="gpu_dedup_ids_01").to_numpy(np.uint64)
        h2 = pd.util.hash_pandas_object(values, index=False, hash_key="gpu_dedup_ids_02").to_numpy(np.uint64)
        h1, h2 = h1.view(np.int64), h2.view(np.int64)
    if ids.null_count:
        null = np.asarray(ids.is_null(), bool)
        h1, h2 = np.where(null, NULL_ID[0], h1), np.where(null, NULL_ID[1], h2)
    return {"h1": np.ascontiguousarray(h1), "h2": np.ascontiguousarray(h2)}


def _byte_ids(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)


def warm_id_hashes(backend: str) -> None:
    """Loads the exact-key kernel :func:`id_hashes` runs on string ids, in a worker's prepare: the backend's
    prepare loads it only for the texts' exact keys (``exact_dedup``), and without them a GPU worker would
    compile it inside the read stage."""
    id_hashes(BlockData(Block(0, 0, 2, ()), pa.table({"id": pa.array(["id", None], pa.large_string())})), backend)


def distinct_pairs(part: dict) -> dict:
    """Distinct (h1, h2) of one partition (every copy of a pair is there)."""
    return {"distinct": frames.size(frames.distinct_pairs(part, "h1", "h2"))}


LENGTH = "_length"  # the original texts' lengths (the ``longest`` policy's key), kept when the texts go


def normalize_block(data: BlockData, cfg: Config, run: str | None = None) -> BlockData:
    """The block with its normalized texts, and without its original texts: nothing after normalization reads
    them but the ``longest`` policy's key (their lengths, kept) and the report's few sample texts (read from
    the shard again, :func:`original_texts`).  Where the texts are kept: :func:`_kept`.  CPU workers read and
    normalize a block in one step instead (:func:`read_block`); this is the GPU workers' second step."""
    if not family_for(cfg).uses_text:
        return data
    raw = data.raw_text
    text = raw if raw is not None else data.table.column("text")
    strings, invalid = get_backend(cfg.backend).normalize_column(text, cfg.normalize)
    table = data.table.drop_columns(["text"]) if raw is None else data.table
    if cfg.select.keep == "longest" and raw is None:  # (texts the device read: their lengths came with them)
        lengths = text_lengths(text)
        table = table.append_column(LENGTH, lengths.combine_chunks() if isinstance(lengths, pa.ChunkedArray)
                                    else lengths)
    out = replace(data, table=table, strings=strings, invalid_utf8=invalid, text_bytes=int(strings.nbytes),
                  raw_text=None)
    return _kept(out, cfg, run)


def _raw_lengths(raw) -> pa.Array:
    """Code points of each of a block's texts read into device memory (-1 for nulls), counted there: what
    :func:`text_lengths` gives of the same texts read by pyarrow (as ``large_string``, so int64)."""
    return arrow_array(to_host(code_point_lengths(raw, array_module(raw.offsets))), pa.int64())


def streams_text(cfg: Config) -> bool:
    """Whether a block is read and normalized batch by batch in one task (:func:`read_block`): text on CPU
    workers.  GPU workers normalize a loaded block on the device (:func:`normalize_block`)."""
    return traits(cfg.backend).host and family_for(cfg).uses_text and not cfg.input.vector_column


def read_block(block: Block, shards: list, cfg: Config, run: str | None = None, hold: bool | str = False) -> BlockData:
    """A block read and normalized in one pass, as one process reads its corpus: each batch of a Parquet piece
    normalized as soon as it is decoded and its original texts dropped, so that the worker never holds the
    block's original texts (a JSONL piece is read whole, then normalized); what :func:`load_block` then
    :func:`normalize_block` give.  ``hold`` (``output.hold_inputs`` of a run that writes shards, else False):
    where :func:`_holds` says so, the batches of every column of its Parquet pieces are read instead and kept
    as read (``BlockData.held``), as one process keeps them, for the write stage to write the kept rows from."""
    keep = _holds(block, shards, hold, run)
    hook = BatchNormalizer(cfg.normalize, text_lengths if cfg.select.keep == "longest" else None,
                           capacity=sum(text_bytes(shard, cfg.input.text_column, piece.row_groups)
                                        for piece, shard in zip(block.pieces, shards)))
    parts, tables = [], []
    rows = 0
    held: list = [[] if keep and shard.format == "parquet" else None for shard in shards]
    sources = [partial(_piece_batches, k, piece, shard, cfg, held[k] is not None)
               for k, (piece, shard) in enumerate(zip(block.pieces, shards))]
    # the pieces decoded side by side (piece_readers), each a couple of batches ahead; normalized here, in order
    for k, table, whole in ahead_each(sources, piece_readers(len(sources))):
        if table is None:  # the piece's end
            piece, shard = block.pieces[k], shards[k]
            if rows != piece.rows:
                raise _changed(shard, rows, piece.rows)
            rows = 0
            continue
        if whole is not None:
            held[k].append(whole)
        parts.append(hook(table.column("text")))
        tables.append(table.drop_columns(["text"]))
        rows += table.num_rows
    table = concat_rows(tables)
    null = BatchNormalizer.null(parts)
    if cfg.select.keep == "longest":
        table = table.append_column(LENGTH, BatchNormalizer.lengths(parts).combine_chunks())
    strings, invalid, _ = hook.join(parts)
    data = BlockData(block, table, strings=strings, invalid_utf8=invalid, null=null, text_bytes=int(strings.nbytes),
                     held=held if keep else None)
    return _kept(data, cfg, run)


def _piece_batches(k: int, piece: Piece, shard, cfg: Config, hold: bool = False):
    """(k, table, the whole batch as read or None) for each batch of piece ``k`` of a block (:func:`read_block`),
    then (k, None, None).  ``hold`` (a Parquet piece): every column read, through the reader one process holds
    its shards with (:func:`~gpu_dedup.storage.columns.iter_columns_held`), so the bytes written are the same."""
    if hold:
        for table, whole in iter_columns_held(shard, cfg.input, cfg.select.score_read, row_groups=piece.row_groups):
            yield k, table, whole
    else:
        batches = storage.iter_columns(shard, cfg.input, cfg.select.score_read, row_groups=piece.row_groups) \
            if shard.format == "parquet" else [read_piece(piece, shard, cfg)]
        for table in batches:
            yield k, table, None
    yield k, None, None


_HELD_INPUTS: dict = {}  # worker-global: run -> input bytes (footers) of the batches its blocks hold in this worker


def _holds(block: Block, shards: list, setting: bool | str, run: str | None) -> bool:
    """Whether a block keeps its Parquet pieces' batches (``output.hold_inputs``: ``setting``): true always,
    false never; ``auto`` while this run's blocks on this worker hold at most HOLD_SHARE of the worker's
    memory limit (the machine's memory where it has none) in input bytes (the pieces' uncompressed size, from
    the footers, as one process weighs its shards), this block's included.  Released at the run's end
    (:func:`drop_texts`)."""
    if setting is False or not any(s.format == "parquet" for s in shards):
        return False
    size = sum(input_bytes(s, p.row_groups) for p, s in zip(block.pieces, shards) if s.format == "parquet")
    with _HELD_LOCK:
        held = _HELD_INPUTS.get(run, 0)
        if setting is not True and held + size > HOLD_SHARE * _worker_memory():
            return False
        _HELD_INPUTS[run] = held + size
    return True


def held_bytes(data: BlockData) -> int:
    """Bytes of the input batches a block holds (:attr:`BlockData.held`)."""
    return sum(t.nbytes for batches in data.held or () if batches for t in batches)


def block_held(data: BlockData) -> list:
    """The pieces (positions in the block) whose batches the block holds: per-block metadata for the client,
    which sends each shard's write to a worker holding all of its pieces."""
    return [k for k, batches in enumerate(data.held or ()) if batches is not None]


def take_held(data: BlockData, k: int) -> list | None:
    """The batches of piece ``k``, taken out of the block (None: not held), so that the write that empties the
    list frees them: the block references them no more."""
    if data.held is None or data.held[k] is None:
        return None
    batches, data.held[k] = data.held[k], None
    return batches


def drop_held(data: BlockData) -> int:
    """Frees what input batches a block still holds (pieces of shards written without them); the batches freed."""
    count = sum(len(b) for b in data.held or () if b)
    data.held = None
    return count


SPILL_SHARE = 0.25  # spill_texts: auto keeps a run's texts in a worker's memory up to this share of its limit
_HELD: dict = {}  # worker-global: run -> bytes of normalized texts its blocks keep in this worker's memory
_HELD_LOCK = threading.Lock()


def _kept(data: BlockData, cfg: Config, run: str | None) -> BlockData:
    """The block with its normalized texts where ``cluster.spill_texts`` keeps them (``run`` given): texts in
    host memory in memory, or in a file of the worker's local directory (:func:`_kept_on_host`); texts in
    device memory (a GPU worker's normalized block) on the device or in host memory (:func:`_kept_on_device`).
    Where the texts are decides (:data:`_KEEP`, by array type), not the backend's name (a backend named
    ``cpu`` may be the GPU's, as under ``pytest --backend gpu``); host arrays of a backend whose kernels are not
    the host's (the GPU's under the CUDA simulator) are a GPU worker's texts too."""
    if run is None or data.strings is None:
        return data
    xp = array_module(data.strings.offsets)
    return _KEEP.pick(xp, fast=xp is np and traits(cfg.backend).host)(data, cfg, run)


def _kept_on_host(data: BlockData, cfg: Config, run: str) -> BlockData:
    """A block's texts in host memory: in memory, or (``spill_texts`` true, or ``auto`` past SPILL_SHARE of the
    worker's memory limit for this run's texts on this worker) in a file of the worker's local directory
    (:func:`text_dir`) that each task reading them maps, so that the worker holds the texts of the blocks its
    running tasks read, not of all its blocks."""
    if cfg.cluster.spill_texts is False:
        return data
    size = int(data.strings.nbytes)
    with _HELD_LOCK:
        held = _HELD.get(run, 0)
        if cfg.cluster.spill_texts == "auto" and held + size <= SPILL_SHARE * _worker_memory():
            _HELD[run] = held + size
            return data
    directory = text_dir(run)
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"block-{data.block.index:06d}-{uuid.uuid4().hex[:8]}")
    np.ascontiguousarray(data.strings.offsets, np.int64).tofile(path + ".offsets")
    np.ascontiguousarray(data.strings.data).tofile(path + ".data")
    return replace(data, strings=None, text_file=path)


DEVICE_TEXT_SHARE = 0.5  # GPU workers: a run's normalized texts take at most this share of the device memory limit


def _kept_on_device(data: BlockData, cfg: Config, run: str) -> BlockData:
    """A GPU worker's block with its normalized texts on the device while this run's texts on the worker stay
    within DEVICE_TEXT_SHARE of its device memory limit (:func:`device_text_limit`), the rest of the device left
    to the kernels' scratch and the tables; past it, ``cluster.spill_texts`` decides: ``auto`` keeps the block's
    texts in host memory (each task that reads them copies them to the device), ``false`` stops the run with
    an error naming the settings; ``true`` keeps every block's texts in host memory."""
    spill = cfg.cluster.spill_texts
    size = int(data.strings.nbytes)
    if spill is not True:
        limit = device_text_limit(cfg)
        with _HELD_LOCK:
            held = _HELD.get(run, 0)
            if limit is None or held + size <= limit:
                _HELD[run] = held + size
                return data
        if spill is False:
            raise ResourceError(
                f"the normalized texts of the blocks on GPU worker {_worker_name()} need {_size(held + size)} of "
                f"device memory, over the {_size(limit)} they may take there "
                f"({DEVICE_TEXT_SHARE:.0%} of cluster.device_memory_limit = {cfg.cluster.device_memory_limit}"
                f"{'' if cfg.cluster.device_memory_limit != 'auto' else ', 80 % of its share of the GPU'}); raise "
                "cluster.device_memory_limit, run more GPU workers (--workers), or set cluster.spill_texts: auto "
                "to keep the texts past it in host memory")
    host = StringBuffers(to_host(data.strings.offsets), to_host(data.strings.data))
    return replace(data, strings=host, texts_on_host=True)


_KEEP = ByArrays(_kept_on_device, host=_kept_on_host)  # texts on the device, or in host memory


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:,.1f} {unit}"
    return f"{int(n)} bytes"


def device_text_limit(cfg: Config) -> float | None:
    """Bytes of normalized texts a GPU worker keeps on the device: DEVICE_TEXT_SHARE of
    ``cluster.device_memory_limit``, whose ``auto`` is the worker's own Dask-CUDA ``device_memory_limit`` (a
    cluster that a run joins says what it gave each worker), else 80 % of its share of its GPU (the device's
    memory over ``cluster.workers_per_gpu``); None where none says (``auto`` under the CUDA simulator)."""
    c = cfg.cluster
    if c.device_memory_limit != "auto":
        return DEVICE_TEXT_SHARE * parse_size(c.device_memory_limit)
    own = _dask_cuda_device_limit()
    if own:
        return DEVICE_TEXT_SHARE * own
    total = get_backend(cfg.backend).device_memory()
    return DEVICE_TEXT_SHARE * 0.8 * total / c.workers_per_gpu if total else None


def _dask_cuda_device_limit() -> float | None:
    """The ``device_memory_limit`` of the Dask-CUDA worker running this task (its DeviceHostFile's device
    buffer), None elsewhere."""
    try:
        from distributed import get_worker  # noqa: PLC0415  the Dask executor's workers only

        buffer = getattr(get_worker().data, "device_buffer", None)
    except (ImportError, ValueError):
        return None
    n = getattr(buffer, "n", None)  # zict.Buffer's limit; a plain dict (no limit) has none
    return float(n) if isinstance(n, (int, float)) and n > 0 else None


def _worker_name() -> str:
    try:
        from distributed import get_worker  # noqa: PLC0415  the Dask executor's workers only

        worker = get_worker()
        return f"{worker.name} ({worker.address})"
    except (ImportError, ValueError):
        return "(not a Dask worker)"


def _worker_memory() -> float:
    """The memory limit of the worker running this task (the machine's memory where it has none)."""
    import psutil  # noqa: PLC0415  a Dask dependency: the workers have it

    return float(worker_memory_limit() or psutil.virtual_memory().total)


def worker_memory_limit() -> int | None:
    """The Dask memory limit of the worker running this task; None where it has none (or no worker runs it)."""
    try:
        from distributed import get_worker  # noqa: PLC0415  the Dask executor's workers only

        return get_worker().memory_manager.memory_limit or None
    except (ImportError, ValueError, AttributeError):
        return None


def text_dir(run: str, worker=None) -> str:
    """The directory of run ``run``'s spilled texts in the local directory of ``worker`` (by default the one
    running this task)."""
    if worker is None:
        from distributed import get_worker  # noqa: PLC0415  the Dask executor's workers only

        worker = get_worker()
    return os.path.join(worker.local_directory, "gpu_dedup-texts", run)


def drop_texts(run: str, dask_worker=None) -> int:
    """Removes run ``run``'s spilled texts from a worker (``Client.run`` passes it, at the end of the run), and
    releases what its blocks' texts and input batches counted against the worker's memory: the files it removed."""
    with _HELD_LOCK:
        _HELD.pop(run, None)
        _HELD_INPUTS.pop(run, None)
    path = text_dir(run, dask_worker)
    if not os.path.isdir(path):
        return 0
    count = len(os.listdir(path))
    shutil.rmtree(path, ignore_errors=True)
    try:  # the directory of every run's texts, when no other run's are left in it
        os.rmdir(os.path.dirname(path))
    except OSError:
        pass
    return count


def block_norm_info(data: BlockData) -> dict:
    return {"invalid_utf8": data.invalid_utf8, "text_bytes": data.text_bytes,
            "spilled_bytes": data.text_bytes if data.text_file is not None or data.texts_on_host else 0,
            "spilled_blocks": int(data.text_file is not None or data.texts_on_host)}


def register_device_blocks() -> bool:
    """Tells Dask-CUDA (on a GPU worker) that a block whose texts are on the device is a device object: its
    ``device_memory_limit`` then counts it, and past the limit spills it to host memory (a block is weighed by
    its bytes, :meth:`BlockData.__sizeof__`), as it spills the device arrays of the band hashes.  False where
    Dask-CUDA is not installed (CPU workers, the simulator)."""
    try:
        from dask_cuda.is_device_object import is_device_object  # noqa: PLC0415
    except ImportError:
        return False

    @is_device_object.register(BlockData)
    def _block_on_device(data):
        return data.strings is not None and on_device(data.strings.data)

    return True


def block_keys(data: BlockData, family) -> dict:
    keys = to_host(family.exact_keys(data.rows(), family.cfg.backend))
    return {"k0": keys[:, 0], "k1": keys[:, 1], "k2": keys[:, 2]}


def block_stats(data: BlockData, family):
    return family.stats(data.rows(), family.cfg.backend)


def block_signatures(data: BlockData, rows: dict, family) -> dict:
    r = rows["row"]
    sig = family.signatures(data.rows(), r - data.block.row0, backend=family.cfg.backend)
    xp = array_module(sig.values)
    return {"row": r, "values": sig.values, "features": xp.asarray(sig.features), "usable": xp.asarray(sig.usable)}


def block_signed(data: BlockData, rows: dict, family, device_bands: bool = False) -> dict:
    """A block's signatures and band hashes in one task: what the signature stage counts (``row``,
    ``features``, ``usable``) and, under ``bands``, the band hashes (see :func:`block_bands`).  The signature
    values (``signature_perms`` x 4 bytes a row, the largest table a block makes) never wait in a worker's
    memory for their band hashes; they go as soon as the bands are made (unless the family keeps them).
    ``device_bands`` (``cluster.shuffle: device``): the band hashes stay where the kernel made them (the device
    of a GPU worker), for the buckets shuffle to move as device frames."""
    sig = block_signatures(data, rows, family)
    bands = block_bands(sig, family)
    out = host_frame({"row": sig["row"], "features": sig["features"], "usable": sig["usable"]})
    if not device_bands:
        return {**out, "bands": host_frame(bands)}
    xp = array_module(bands["band_hashes"])  # every column beside them (lsh_row is the host rows' pick)
    return {**out, "bands": {k: to_device(v, xp) for k, v in bands.items()}}


def signed_bands(signed: dict) -> dict:
    return signed["bands"]


def block_bands(sig: dict, family) -> dict:
    """Band hashes (and, when the family keeps them, the values) of a block's rows with a signature."""
    xp = array_module(sig["values"])
    pick = xp.flatnonzero(xp.asarray(sig["usable"]))
    values = sig["values"][pick]
    part = {"lsh_row": sig["row"][to_device(to_host(pick), array_module(sig["row"]))],
            "band_hashes": xp.asarray(family.band_hashes(values, family.cfg.backend))}
    if family.keep_signatures:
        part["signatures"] = values
    return part


# --------------------------------------------------------------------------- what rows carry when they move


def text_payload(data: BlockData, part: dict, column: str, first_doc: int, prior) -> dict:
    """``part`` with ``{column}_data``: the normalized text of the node in ``column`` (this block's row, or a
    prior's document) as UTF-8 bytes (an Arrow column)."""
    nodes = to_host(part[column])
    rows = nodes - first_doc
    own = nodes >= first_doc
    values = pa.nulls(nodes.shape[0], pa.large_binary())
    pieces, order = [], []
    if own.any():
        pieces.append(data.norm_rows(rows[own] - data.block.row0).cast(pa.large_binary()))
        order.append(np.flatnonzero(own))
    if (~own).any():
        pieces.append(prior.texts(nodes[~own]).cast(pa.large_string()).cast(pa.large_binary()))
        order.append(np.flatnonzero(~own))
    if pieces:
        values = pa.concat_arrays(pieces)
        inverse = np.empty(nodes.shape[0], np.int64)
        inverse[np.concatenate(order)] = np.arange(nodes.shape[0])
        values = values.take(pa.array(inverse))
    return {**part, f"{column}_data": values}


def vector_payload(data: BlockData, part: dict, column: str, first_doc: int, prior) -> dict:
    """``part`` with ``{column}_data``: the node's vector as float32 bytes."""
    nodes = to_host(part[column])
    own = nodes >= first_doc
    dim = data.vectors.matrix.shape[1] if data.vectors is not None else 1
    mat = np.zeros((nodes.shape[0], dim), np.float32)
    if own.any():
        assert data.vectors is not None  # a vector family's block
        mat[own] = data.vectors.matrix[nodes[own] - first_doc - data.block.row0]
    if (~own).any():
        mat[~own] = prior.vectors(nodes[~own]).matrix
    return {**part, f"{column}_data": _fixed_binary(np.ascontiguousarray(mat, np.float32))}


def signature_payload(bands: dict, part: dict, column: str, first_doc: int, prior) -> dict:
    """``part`` with ``{column}_data``: the node's signature row (from its block's bands) as bytes."""
    nodes = to_host(part[column])
    sig = to_host(bands["signatures"])
    own = nodes >= first_doc
    out = np.zeros((nodes.shape[0], sig.shape[1]), sig.dtype)
    if own.any():
        out[own] = sig[np.searchsorted(to_host(bands["lsh_row"]), nodes[own] - first_doc)]
    if (~own).any():
        out[~own] = prior.signatures(nodes[~own])
    return {**part, f"{column}_data": _fixed_binary(np.ascontiguousarray(out))}


def _fixed_binary(matrix: np.ndarray) -> pa.Array:
    width = matrix.shape[1] * matrix.dtype.itemsize
    flat = pa.py_buffer(matrix.tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), matrix.shape[0], [None, flat]).cast(pa.large_binary())


def indexed_similarity(values: pa.Array, left, right, family, method: str) -> np.ndarray:
    """Similarity of the pairs (``left[i]``, ``right[i]``) of rows of ``values``: payloads (normalized texts,
    signature rows or vectors as bytes, see the payload functions above), each row once however many pairs
    it is in."""
    be = family.cfg.backend
    if method != "exact":
        sim = family.pair_similarity(None, _matrix(values, family.empty_values().dtype), left, right, be)
    elif family.uses_text:
        sim = family.pair_similarity(RowData(strings=string_buffers(values.cast(pa.large_string()))), None, left,
                                     right, be)
    else:
        x = _matrix(values, np.float32)
        sim = family.pair_similarity(RowData(vectors=Vectors(x, np.zeros(len(values), np.int8))), None, left, right,
                                     be)
    return np.asarray(to_host(sim), np.float64)


def score_at_block(data, part: dict, answers: dict, payload, family, method: str, first_doc: int, prior) -> dict:
    """Similarities of the pairs ``part`` (``src``, ``dst``, ``_part``, ``_i``) that reached the block of their
    second ends, ``data`` (a block, or its bands for verification by signature): the second ends' payloads
    are the block's own, the first ends' came in ``answers`` (``node``, ``node_data``: each first end these
    pairs need, once)."""
    m = part["src"].shape[0]
    if m == 0:
        return {"sim": np.zeros(0, np.float64), "_part": part["_part"], "_i": part["_i"]}
    dst_nodes, right = np.unique(to_host(part["dst"]), return_inverse=True)
    own = payload(data, {"node": dst_nodes}, column="node", first_doc=first_doc, prior=prior)["node_data"]
    src_nodes = to_host(answers["node"])  # distinct: each asked once, answered by its one block
    order = stable_order(src_nodes)
    left = order[np.searchsorted(src_nodes[order], to_host(part["src"]))]
    values = pa.concat_arrays([answers["node_data"].cast(pa.large_binary()), own.cast(pa.large_binary())])
    sim = indexed_similarity(values, left, right.reshape(-1) + src_nodes.shape[0], family, method)
    return {"sim": sim, "_part": part["_part"], "_i": part["_i"]}


def _matrix(col: pa.Array, dtype) -> np.ndarray:
    """The fixed-width rows of a binary column as a matrix of ``dtype``."""
    col = col.cast(pa.large_binary())
    buf = np.frombuffer(col.buffers()[2], np.uint8) if len(col) else np.zeros(0, np.uint8)
    offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset: col.offset + len(col) + 1]
    data = buf[offsets[0]: offsets[-1]]
    width = int(offsets[1] - offsets[0]) if len(col) else 0
    return np.ascontiguousarray(data).view(dtype).reshape(len(col), -1) if width else \
        np.zeros((len(col), 0), dtype)


def take_ids(data: BlockData, part: dict, column: str) -> dict:
    """``part`` with ``id``: the id of the row in ``column`` (this block's rows)."""
    rows = to_host(part[column]) - data.block.row0
    return {**part, "id": data.table.column("id").take(pa.array(rows.astype(np.int64))).combine_chunks()}


def take_column(data: BlockData, rows: np.ndarray, column: str) -> pa.Array:
    """``column`` of the block's ``rows``: a column the block keeps (ids; a normalized block has no original
    texts: :func:`original_texts` reads them)."""
    if column not in data.table.schema.names:  # pragma: no cover - a block keeps every column the run reads
        raise ValueError(f"a block holds no column {column!r}")
    at = np.asarray(rows, np.int64) - data.block.row0
    return data.table.column(column).take(pa.array(at)).combine_chunks()


def original_texts(shard, rows: np.ndarray, cfg: Config) -> pa.Array:
    """The original texts of one shard's ``rows`` (shard-relative, any order), read again from the shard: the
    text column alone, through the row groups that hold them only, as one process reads its examples.  It
    needs no block, so any worker reads it."""
    return read_texts(shard, replace(cfg.input, id_column=None), rows)


def block_id_type(data: BlockData, ids: bool) -> pa.DataType:
    """The type of a block's ids (generated ids: int64)."""
    names = data.table.schema.names
    return data.table.schema.field("id").type if ids and "id" in names else pa.int64()


def write_index_segment(data: BlockData, keys: dict, bands: dict, dup: dict, centres: dict, plan: dict, *, writer,
                        first_doc: int, bands_count: int, id_type, ids: bool, texts: bool, dim: int | None) -> dict:
    """The index segment of one block (its documents ``first_doc + row``) published at ``plan`` by ``writer``
    (the index's own segment writer): the same columns one process writes for these rows.  Returns its files'
    checksums (see :meth:`gpu_dedup.index.Index.append_segments`)."""
    b = data.block
    n, row0 = b.rows, b.row0
    kept = np.ones(n, bool)
    survivor = first_doc + row0 + np.arange(n, dtype=np.int64)
    rows = to_host(dup["row"]) - row0
    kept[rows] = to_host(dup["kept"])
    survivor[rows] = to_host(dup["cluster"])
    lsh_row = to_host(bands["lsh_row"])
    full = None
    if "signatures" in bands:  # as one process stores them: zeros for rows without a signature
        sig = to_host(bands["signatures"])
        full = np.zeros((n, sig.shape[1]), sig.dtype)
        full[lsh_row - row0] = sig
    vectors = None
    if data.vectors is not None:
        vectors = to_host(data.vectors.matrix)
        if dim is not None and vectors.shape[1] != dim:  # a block of null vectors only: zeros of the corpus's length
            vectors = np.zeros((n, dim), np.float32)
    if not ids:
        id_values = pa.array(first_doc + row0 + np.arange(n, dtype=np.int64), pa.int64())
    else:
        id_values = data.table.column("id").combine_chunks() if n else pa.array([], id_type)
    key = stored_keys(keys, data.null)
    return writer(
        plan, ids=id_values, kept=kept, survivor=survivor,
        keys=key,
        texts=data.norm if texts else None, band_docs=first_doc + lsh_row, band_hashes=to_host(bands["band_hashes"]),
        centres=(to_host(centres["band"]), to_host(centres["hash"]), to_host(centres["round"]),
                 to_host(centres["doc"])),
        signatures=full, vectors=vectors, bands=bands_count, id_type=id_type)


def block_rank_key(data: BlockData, keep: str) -> pa.Array:
    t = data.table
    if keep == "longest" and LENGTH in t.schema.names:  # a normalized block: its original texts' lengths
        return t.column(LENGTH).combine_chunks()
    if keep == "longest":
        lengths = text_lengths(t.column("text"))
        return lengths.combine_chunks() if isinstance(lengths, pa.ChunkedArray) else lengths
    if keep == "lowest_id" and "id" not in t.schema.names:  # no id column: one process ranks by the row numbers
        return pa.array(np.arange(data.block.row0, data.block.row0 + data.block.rows, dtype=np.int64))
    if keep == "lowest_id":
        return t.column("id").combine_chunks()
    return t.column("score").combine_chunks()
