"""Moving frames between Dask workers: one primitive, :func:`route`, over Dask's own shuffle.

A part is a future holding a frame (a dict of 1-D arrays; Arrow arrays for
ids and payloads).  ``route`` adds to each frame its rows' destination and
their origin (source part, position), turns the parts into a Dask DataFrame
(pandas partitions; cuDF ones when the columns live on a GPU) and repartitions
it by destination with ``set_index(divisions=0..n)``, which runs Dask's
peer-to-peer shuffle (``dataframe.shuffle.method``: p2p by default on a
distributed cluster, ``cluster.shuffle`` chooses).  Each destination then
restores the rows' order (by source part, then position), so a route is
deterministic whatever the workers and the arrival order.  The client builds
graphs and holds one future per partition; the rows go from worker to worker.
"""

from __future__ import annotations

import itertools
import operator

import numpy as np

from gpu_dedup.backends import frame_kinds, to_host
from gpu_dedup.stages import frames

TAGS = ("_dest", "_src", "_pos")


def moved(obj) -> tuple:
    """(rows, bytes) a source part hands to a route (its pieces, or its frame for Dask's shuffle)."""
    if isinstance(obj, list):
        return tuple(map(sum, zip((0, 0), *[moved(piece) for piece in obj])))
    if hasattr(obj, "memory_usage"):  # a DataFrame
        return len(obj), int(obj.memory_usage(deep=True).sum())
    return frames.size(obj), sum(int(v.nbytes) for v in obj.values())


def to_df(frame: dict):
    """A frame as a DataFrame: cuDF when its arrays are on the device, else pandas (see backends/frame_kinds.py)."""
    return frame_kinds.for_columns(frame).from_columns(frame)


def from_df(df) -> dict:
    """A DataFrame's columns as a frame (NumPy / CuPy arrays; Arrow arrays for Arrow-backed columns)."""
    return frame_kinds.columns_of(df)


def prepare(obj, src: int, dest, n: int, explode=None, explode_kw=None, **kw):
    """A part ready to move: exploded into a frame if it is none, with ``_dest``, ``_src`` and ``_pos``."""
    frame = explode(obj, **(explode_kw or {})) if explode is not None else obj
    size = frames.size(frame)
    xp = frames.module_of(frame) if frame else np
    d = dest(frame, n, **kw) if size else xp.zeros(0, dtype=xp.int64)
    out = {**frame, "_dest": xp.asarray(d, dtype=xp.int64), "_src": xp.full(size, src, dtype=xp.int64),
           "_pos": xp.arange(size, dtype=xp.int64)}
    return to_df(out)


def empty(df):
    return df.iloc[:0]


def finish(df) -> dict:
    """A routed partition: rows in (source part, position) order, tags dropped."""
    frame = from_df(df.reset_index())
    frame = frames.sort_by(frame, "_src", "_pos")
    return {k: v for k, v in frame.items() if k not in TAGS}


_SUBMITTED = itertools.count(1)


def later() -> int:
    """A Dask task priority above every one handed out before: among the tasks ready on a worker, the one
    submitted last runs first (depth first), so a stage's consumer takes its inputs (routed pieces, gathered
    partitions) as soon as they are ready, and they go, instead of waiting while every earlier task of the
    stage runs and adds its output to the worker's memory.  Results do not depend on the order tasks run in."""
    return next(_SUBMITTED)


DIRECT_PIECES = 256  # up to this many (source, destination) pieces (16 x 16), rows move as futures (see route)


def split(obj, src: int, dest, n: int, explode=None, explode_kw=None, **kw) -> list:
    """A part cut into the ``n`` pieces its rows go to, each in the part's row order (a stable sort by
    destination): no tags, the pieces' order is the rows' order."""
    frame = explode(obj, **(explode_kw or {})) if explode is not None else obj
    size = frames.size(frame)
    xp = frames.module_of(frame) if frame else np
    d = xp.asarray(dest(frame, n, **kw), dtype=xp.int64) if size else xp.zeros(0, dtype=xp.int64)
    order = xp.argsort(d, kind="stable")
    bounds = to_host(xp.searchsorted(d[order], xp.arange(n + 1)))
    return [frames.take(frame, order[bounds[k]:bounds[k + 1]]) for k in range(n)]


def gather_pieces(*pieces) -> dict:
    """One destination's pieces, in source order (each already in its source's row order)."""
    return frames.concat(list(pieces))


def route(client, parts: list, dest, n: int, explode=None, explode_kw=None, shuffle_method=None, account=None,
          **kw) -> list:
    """Rows of ``parts`` to ``n`` partitions by ``dest(frame, n, **kw)``; a list of ``n`` futures.

    Up to DIRECT_PIECES (source, destination) pieces (and unless ``shuffle_method`` names one of Dask's),
    each source is cut into its pieces by one task and each destination gathers its pieces: a few hundred
    small tasks and no DataFrame graph.  Above, Dask's shuffle (p2p by default) moves them.
    ``account(futures)``: receives, per source part, a future of the (rows, bytes) it moves."""
    import dask  # noqa: PLC0415
    import dask.dataframe as dd  # noqa: PLC0415

    if shuffle_method is None and len(parts) * n <= DIRECT_PIECES:
        m = len(parts)
        cut = client.map(split, parts, range(m), dest=dest, n=n, explode=explode, explode_kw=explode_kw, pure=False,
                         priority=later(), **kw)
        if account is not None:  # (rows, bytes) each source moves, gathered when the report is written
            account(client.map(moved, cut, pure=False))
        flat = client.map(operator.getitem, cut * n, [k for k in range(n) for _ in range(m)], pure=False,
                          priority=later())
        # destination k gathers piece k of every source, in source order
        return client.map(gather_pieces, *[[flat[k * m + j] for k in range(n)] for j in range(m)], pure=False,
                          priority=later())
    ready = [client.submit(prepare, p, i, dest, n, explode=explode, explode_kw=explode_kw, pure=False, **kw)
             for i, p in enumerate(parts)]
    if account is not None:
        account(client.map(moved, ready, pure=False))
    meta = client.submit(empty, ready[0], pure=False).result()
    ddf = dd.from_delayed([dask.delayed(f) for f in ready], meta=meta, verify_meta=False)
    with dask.config.set({"dataframe.shuffle.method": shuffle_method} if shuffle_method else {}):
        routed = ddf.set_index("_dest", divisions=list(range(n + 1)), sorted=False)
        out = client.compute(routed.to_delayed())
    if len(out) != n:  # pragma: no cover - set_index keeps the divisions it is given
        raise RuntimeError(f"routing made {len(out)} partitions, not {n}")
    return client.map(finish, out, pure=False)
