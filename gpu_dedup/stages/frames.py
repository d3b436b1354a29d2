"""Frames: the unit of per-document state between stages, and how their rows are routed.

A frame is a dict of equal-length 1-D arrays (NumPy on the host, CuPy on a GPU),
one partition of a table.  The stage sequence moves rows between partitions
only by :meth:`Executor.route <gpu_dedup.run.contract.Executor.route>` with one
of the destinations below, so a table routed by the same key in two places
lands in the same partitions on every executor: :func:`hash_dest` (a
specified 64-bit mix of the key columns, modulo the partition count) and
:func:`block_dest` (the corpus block holding a row).  One partition (one
process) routes nothing.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import array_module, order_or_none, stable_order
from gpu_dedup.backends.arrow_arrays import arrow_array

_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB


def size(frame: dict) -> int:
    """Rows of ``frame`` (0 for a frame without columns)."""
    for v in frame.values():
        return int(len(v))
    return 0


def module_of(frame: dict):
    return array_module(*frame.values())


def take(frame: dict, idx) -> dict:
    """Rows ``idx`` (positions or a bool mask) of every column; Arrow columns (ids, payloads) too."""
    return {k: _take(v, idx) for k, v in frame.items()}


def _take(v, idx):
    if isinstance(v, (pa.Array, pa.ChunkedArray)):
        idx = np.asarray(idx)
        return v.filter(arrow_array(idx)) if idx.dtype == bool else v.take(arrow_array(idx, pa.int64()))
    return v[idx]


def rows_between(frame: dict, lo: int, hi: int) -> dict:
    """Rows ``lo`` to ``hi`` (exclusive) of every column, without a copy."""
    return {k: v.slice(lo, hi - lo) if isinstance(v, (pa.Array, pa.ChunkedArray)) else v[lo:hi]
            for k, v in frame.items()}


def concat(frames: list, like: dict | None = None) -> dict:
    """Rows of ``frames`` in order (``like``: the columns of an empty result)."""
    frames = [f for f in frames if f]
    if not frames:
        return {k: v[:0] for k, v in (like or {}).items()}
    xp = module_of(frames[0])
    return {k: pa.concat_arrays([f[k] for f in frames]) if isinstance(frames[0][k], pa.Array)
            else xp.concatenate([f[k] for f in frames]) for k in frames[0]}


def mix64(x):
    """splitmix64's finalizer of uint64 values (wrapping arithmetic): the routing hash."""
    xp = array_module(x)
    x = x.astype(xp.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> xp.uint64(30)
        x *= xp.uint64(_M1)
        x ^= x >> xp.uint64(27)
        x *= xp.uint64(_M2)
        x ^= x >> xp.uint64(31)
    return x


def key_hash(frame: dict, on) -> np.ndarray:
    """uint64 hash of the columns ``on`` (a name or a tuple of names) of every row."""
    on = (on,) if isinstance(on, str) else tuple(on)
    xp = module_of(frame)
    h = xp.zeros(size(frame), dtype=xp.uint64)
    with np.errstate(over="ignore"):
        for name in on:
            h = mix64(h ^ mix64(frame[name].astype(xp.int64).view(xp.uint64)) + xp.uint64(0x9E3779B97F4A7C15))
    return h


def hash_dest(frame: dict, n: int, on) -> np.ndarray:
    """Partition of every row by the hash of its ``on`` columns."""
    xp = module_of(frame)
    if n == 1:
        return xp.zeros(size(frame), dtype=xp.int64)
    return (key_hash(frame, on) % xp.uint64(n)).astype(xp.int64)


def block_dest(frame: dict, n: int, on: str, starts, first_doc: int = 0) -> np.ndarray:
    """Corpus block of the row (or doc number ``first_doc + row``) in column ``on``; documents of a prior
    (doc numbers below ``first_doc``) go to block 0, whose functions look them up in the index."""
    xp = module_of(frame)
    if n == 1:
        return xp.zeros(size(frame), dtype=xp.int64)
    rows = frame[on] - first_doc
    starts = xp.asarray(np.asarray(starts, np.int64))
    return xp.clip(xp.searchsorted(starts[1:], rows, side="right"), 0, n - 1).astype(xp.int64)


def sort_by(frame: dict, *names) -> dict:
    """Rows sorted by ``names`` (first name most significant), stably: a new frame, whose columns are the
    given frame's own where its rows are in that order already (one process's rows after a lookup, which sent
    them nowhere: 1.3 s of gathers at 10^7 rows on 2 cores)."""
    if size(frame) == 0:
        return frame
    order = order_or_none(*(frame[name] for name in names))
    return dict(frame) if order is None else take(frame, order)


def lookup(keys, table_keys, table_values, default):
    """For each of ``keys``: the value of ``table_values`` at the same key in ``table_keys`` (unique keys,
    any order), else ``default``."""
    xp = array_module(keys)
    out = xp.full(keys.shape[0], default, dtype=table_values.dtype)
    if table_keys.shape[0] == 0 or keys.shape[0] == 0:
        return out
    order = stable_order(table_keys)
    sk = table_keys[order]
    pos = xp.clip(xp.searchsorted(sk, keys), 0, sk.shape[0] - 1)
    hit = sk[pos] == keys
    out[hit] = table_values[order[pos[hit]]]
    return out


def member(keys, table_keys):
    """Whether each of ``keys`` is among ``table_keys``."""
    xp = array_module(keys)
    if table_keys.shape[0] == 0:
        return xp.zeros(keys.shape[0], dtype=bool)
    return xp.isin(keys, table_keys)


def distinct_pairs(part: dict, a: str, b: str) -> dict:
    """The rows of ``part`` with distinct (``a``, ``b``), each once, sorted by (``a``, ``b``)."""
    xp = array_module(part[a])
    if part[a].shape[0] == 0:
        return part
    order = stable_order(part[a], part[b])
    x, y = part[a][order], part[b][order]
    keep = xp.ones(x.shape[0], dtype=bool)
    keep[1:] = (x[1:] != x[:-1]) | (y[1:] != y[:-1])
    return {k: v[order][keep] for k, v in part.items()}


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def rows_count(part: dict, column: str = "row") -> dict:
    return {"rows": int(part[column].shape[0])}


def tag_part(part: dict, part_index: int) -> dict:
    """``part`` with its partition ``_part`` and row position ``_i`` (to come back after a lookup)."""
    xp = module_of(part)
    n = size(part)
    return {**part, "_part": xp.full(n, part_index, dtype=xp.int64), "_i": xp.arange(n, dtype=xp.int64)}


def join_values(left: dict, right: dict, on: str, value: str, out: str) -> dict:
    """``left`` with column ``out``: ``right[value]`` at the row of ``right`` whose ``node`` is ``left[on]``
    (right's nodes are unique), else ``left[on]`` itself."""
    xp = module_of(left)
    res = dict(left)
    vals = lookup(left[on], right["node"], right[value], -1)
    res[out] = xp.where(member(left[on], right["node"]), vals, left[on])
    return res


def identity(obj):
    return obj


def part_dest(frame: dict, n: int) -> np.ndarray:
    return frame["_part"]


def untag_part(part: dict) -> dict:
    """Rows back in their original order (``_i``), tags and the lookup key dropped."""
    part = sort_by(part, "_i")
    return {k: v for k, v in part.items() if k not in ("_part", "_i", "_key")}


def concat_parts(*parts) -> dict:
    return concat(list(parts))


def merge_counts(parts: list) -> dict:
    out: dict = {}
    for p in parts:
        for k, v in p.items():
            out[int(k)] = out.get(int(k), 0) + int(v)
    return dict(sorted(out.items()))
