"""Moving frames between Dask workers: one primitive, :func:`route`.

A part is a future holding a frame (a dict of 1-D arrays; Arrow arrays for
ids and payloads).  Up to DIRECT_PIECES (source, gathering worker) pieces a
route moves rows as futures: each source is cut, stably by destination, into
one piece per worker that gathers destinations, one task on that worker holds
the pieces it receives (up to HELD_FROM_SOURCES sources each destination takes
them itself), and each destination takes its rows from them in source order.
The steps a route is given (``before``, ``after``) run inside its cutting and
gathering tasks.  Beyond (or when ``cluster.shuffle`` names one), Dask's own
shuffle moves them (``cluster.shuffle: device``: the band hashes' and the edges' routes only, as frames of
device arrays): ``route`` adds to each frame its rows' destination and
origin (source part, position), turns the parts into a Dask DataFrame (pandas
partitions; cuDF ones when the columns live on a GPU), repartitions it with
``set_index(divisions=0..n)`` (p2p by default on a distributed cluster), and
each destination restores the rows' order.  Either way a route is
deterministic whatever the workers and the arrival order.  The client builds
graphs and holds one future per partition; the rows go from worker to worker.
A direct route's destinations may stay pending on the client (:class:`Later`):
the task that takes one first (the next route's cut, a map's task) gathers it
itself, so a chain of routes costs one task, and one scheduler round trip, per
move of its rows.
"""

from __future__ import annotations

import itertools
import operator
import threading

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import ByArrays, array_module, frame_kinds, get_backend, host_frame, to_device, to_host
from gpu_dedup.stages import frames

TAGS = ("_dest", "_src", "_pos")


def moved(frame: dict) -> tuple:
    """(rows, bytes) of the frame a source part hands to a route (its columns, before any routing tags)."""
    return frames.size(frame), sum(int(v.nbytes) for v in frame.values())


_MOVED: dict = {}  # worker-global: account key (run, stage) -> [rows, bytes] the sources handed to routes
_MOVED_LOCK = threading.Lock()


def _count(account, frame) -> None:
    """Adds a source's (rows, bytes) to this worker's tally for ``account`` (a route needs no task for it)."""
    if account is None:
        return
    rows, size = moved(frame)
    with _MOVED_LOCK:
        tally = _MOVED.setdefault(account, [0, 0])
        tally[0] += rows
        tally[1] += size


def take_moved(run: str) -> dict:
    """This worker's tallies of run ``run``, by stage, handed over once (and forgotten)."""
    with _MOVED_LOCK:
        mine = [k for k in _MOVED if k[0] == run]
        return {k[1]: _MOVED.pop(k) for k in mine}


def to_df(frame: dict):
    """A frame as a DataFrame: cuDF when its arrays are on the device, else pandas (see backends/frame_kinds.py)."""
    return frame_kinds.for_columns(frame).from_columns(frame)


def from_df(df) -> dict:
    """A DataFrame's columns as a frame (NumPy / CuPy arrays; Arrow arrays for Arrow-backed columns)."""
    return frame_kinds.columns_of(df)


def prepare(obj, src: int, dest, n: int, explode=None, explode_kw=None, account=None, device=None, **kw):
    """A part ready to move: exploded into a frame if it is none, with ``_dest``, ``_src`` and ``_pos``;
    ``device`` (a backend name): its columns moved to that backend's arrays first (a GPU worker's device), so
    the DataFrame it becomes is cuDF there."""
    frame = explode(obj, **(explode_kw or {})) if explode is not None else obj
    _count(account, frame)
    if device is not None:
        frame = on_backend(frame, device)
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


def on_backend(frame: dict, backend: str) -> dict:
    """``frame``'s array columns as arrays of ``backend`` (a counted copy to a GPU worker's device; nothing on
    CPU workers or under the CUDA simulator, whose GPU arrays are NumPy); Arrow columns as they are."""
    xp = get_backend(backend).xp
    return {k: v if isinstance(v, (pa.Array, pa.ChunkedArray)) else to_device(v, xp) for k, v in frame.items()}


class Later:
    """A route's destination task not submitted yet (its gather, then its ``after`` step): the task that takes
    it as an input first (the next route's cutting task, a map's task) runs it inside itself, so a chain of
    routes is one task per partition between two moves of its rows, not two, and one scheduler round trip
    less per route on the chain's path (on 2 CPU workers each round trip was a few milliseconds, the work of
    the task around it a fraction of one).  Anything else that asks for it, or a second consumer, gets it
    as a task of its own (:meth:`future`; run again then: a destination's work is a gather and one step,
    and no consumer takes a destination twice on the stages' own paths).  Never sent to a worker."""

    def __init__(self, client, fn, args: tuple, priority: int, where):
        self.client, self.fn, self.args, self.priority, self.where = client, fn, args, priority, where
        self._future = None
        self._taken = False
        self._lock = threading.Lock()

    def take(self):
        """The task as ``(fn, args, kw)`` for the first consumer that runs it inside its own task (None: it
        was taken, or submitted, already)."""
        with self._lock:
            if self._taken or self._future is not None:
                return None
            self._taken = True
            return self.fn, self.args, {}

    def future(self):
        """The task, submitted (once)."""
        with self._lock:
            if self._future is None:
                self._future = self.client.submit(self.fn, *self.args, pure=False, priority=self.priority,
                                                  **placed(self.where))
            return self._future

    def __reduce__(self):
        raise TypeError("a route's pending destination (routing.Later) goes to a task as its future (real())")


def real(part):
    """A part as Dask takes it: a :class:`Later`'s future, anything else as it is."""
    return part.future() if isinstance(part, Later) else part


def reals(parts):
    """:func:`real` of each part; ``parts`` itself when none is a :class:`Later` (its identity kept: the
    executor knows its blocks by it)."""
    if parts is None or not any(isinstance(p, Later) for p in parts):
        return parts
    return [real(p) for p in parts]


def real_step(step):
    """``step`` with its other parts real (:func:`reals`); ``step`` itself when they are."""
    if step is None:
        return None
    others = tuple(reals(o) for o in step.others)
    if all(a is b for a, b in zip(others, step.others)):
        return step
    return type(step)(step.fn, *others, index=step.index, **step.kw)


def made(task: tuple):
    """The value of a taken :class:`Later`'s task ``(fn, args, kw)``."""
    fn, args, kw = task
    return fn(*args, **kw)


def made_then(task: tuple, then, /, *args, **kw):
    """``then(made(task), *args, **kw)``: a taken :class:`Later` and its consumer in one task."""
    return then(made(task), *args, **kw)


def call_made(fn, made_at: tuple, /, *args, **kw):
    """``fn(*args, **kw)`` with the arguments at positions ``made_at`` (taken :class:`Later` tasks) made first."""
    return fn(*[made(a) if k in made_at else a for k, a in enumerate(args)], **kw)


_SUBMITTED = itertools.count(1)


def later() -> int:
    """A Dask task priority above every one handed out before: among the tasks ready on a worker, the one
    submitted last runs first (depth first), so a stage's consumer takes its inputs (routed pieces, gathered
    partitions) as soon as they are ready, and they go, instead of waiting while every earlier task of the
    stage runs and adds its output to the worker's memory.  Results do not depend on the order tasks run in."""
    return next(_SUBMITTED)


# Up to this many sources, each destination takes its pieces straight from the sources' cuts: no holding task
# (collect) between them, one scheduler round trip less on a route's path; its graph has sources x
# destinations edges, few at this size.
HELD_FROM_SOURCES = 8

# Up to this many (source, gathering worker) pieces, rows move as futures (see route): a route is then
# sources x (workers + 1) + workers + destinations tasks.  On 2 workers the direct route beat Dask's p2p
# shuffle at every size measured (20 blocks: a 2 x 10^6-document run in 32 s against 78 s; 500 blocks: 274 s
# against more than 900 s); above, its tasks per route grow as sources x workers, p2p's as sources + destinations.
DIRECT_PIECES = 4096


def destination_order(d, n: int):
    """The positions of ``d`` (destinations in ``0..n-1``) sorted by destination, stably: a radix sort on the
    host (NumPy sorts integers of 16 bits or fewer by radix, eight times faster than int64 at 1.6 M rows)."""
    xp = array_module(d)
    return xp.argsort(_RADIX_KEYS.pick(xp)(d, n), kind="stable")


def _radix_keys_host(d, n: int):
    return d.astype(np.uint16) if n <= 1 << 16 else d


_RADIX_KEYS = ByArrays(lambda d, n: d, host=_radix_keys_host)  # a device sorts int64 keys as fast


def split(obj, src: int, dest, n: int, explode=None, explode_kw=None, groups=None, account=None, **kw) -> list:
    """A part cut into one piece per group of destinations (``groups``: lists of destinations, by default
    each alone): a piece is ``(frame, counts)``, the rows of its destinations one destination after another
    (in the group's order), each destination's rows in the part's row order; no tags."""
    frame = explode(obj, **(explode_kw or {})) if explode is not None else obj
    _count(account, frame)
    size = frames.size(frame)
    xp = frames.module_of(frame) if frame else np
    d = xp.asarray(dest(frame, n, **kw), dtype=xp.int64) if size else xp.zeros(0, dtype=xp.int64)
    order = destination_order(d, n)
    bounds = to_host(xp.searchsorted(d[order], xp.arange(n + 1)))
    pieces = []
    for group in groups if groups is not None else [[k] for k in range(n)]:
        idx = [order[bounds[k]:bounds[k + 1]] for k in group]
        rows = idx[0] if len(idx) == 1 else xp.concatenate(idx)
        pieces.append((frames.take(frame, rows), [int(bounds[k + 1] - bounds[k]) for k in group]))
    return pieces


def _run_step(step: tuple | None, obj):
    """``step`` (a :meth:`gpu_dedup.run.contract.Step.at`: fn, args, kw) applied to ``obj``; None: ``obj``."""
    if step is None:
        return obj
    fn, args, kw = step
    return fn(obj, *args, **kw)


def step_and_split(obj, step: tuple | None, *args, **kw) -> list:
    """:func:`split` of ``obj`` once ``step`` ran on it."""
    return split(_run_step(step, obj), *args, **kw)


def step_and_split_one(obj, step: tuple | None, *args, **kw) -> tuple:
    """The one piece of :func:`step_and_split` when every destination is gathered on one worker (no getitem
    task)."""
    return step_and_split(obj, step, *args, **kw)[0]


def step_and_prepare(obj, step: tuple | None, *args, **kw):
    return prepare(_run_step(step, obj), *args, **kw)


def collect(*pieces) -> list:
    """The pieces a worker gathers, held as one list (references, not copies): a destination then depends on
    this one task, not on every source, so a route has (sources x workers) + destinations edges, not
    (sources x destinations)."""
    return list(pieces)


def gather_pieces(at: int, pieces: list, step: tuple | None = None) -> dict:
    """One destination's rows: the ``at``-th destination's rows of each source's piece, in source order
    (then ``step`` run on them)."""
    out = []
    for frame, counts in pieces:
        lo = sum(counts[:at])
        out.append(frames.rows_between(frame, lo, lo + counts[at]))
    return _run_step(step, frames.concat(out))


def gather_direct(at: int, step: tuple | None, *pieces) -> dict:
    """:func:`gather_pieces` of pieces handed to the task itself (a route of few sources: no holding task)."""
    return gather_pieces(at, list(pieces), step)


def gather_group(at: int, group: int, step: tuple | None, *cuts) -> dict:
    """:func:`gather_direct` of the ``group``-th piece of each source's whole cut, handed to the task itself (a
    small route: no task that takes a piece out of a cut in between)."""
    return gather_pieces(at, [c[group] for c in cuts], step)


def finish_and_step(df, step: tuple | None = None, host: bool = False) -> dict:
    """A routed partition with ``step`` run on it (on the arrays it arrived as: cuDF's CuPy columns on a device
    route), handed on as host arrays when ``host``."""
    out = _run_step(step, finish(df))
    return host_frame(out) if host else out


def destination_groups(homes: list) -> tuple:
    """(groups, place): the destinations grouped by the worker they are gathered on (``homes[k]``, None:
    anywhere), and for each destination its (group, position in the group)."""
    by_home: dict = {}
    for k, h in enumerate(homes):
        by_home.setdefault(h, []).append(k)
    groups = list(by_home.values())
    place = {k: (g, i) for g, members in enumerate(groups) for i, k in enumerate(members)}
    return groups, [place[k] for k in range(len(homes))]


def placed(workers) -> dict:
    """Placement of a task: loosely on ``workers`` (another worker runs it when they are gone), or anywhere."""
    return {"workers": workers, "allow_other_workers": True} if workers else {}


def _home(homes, k: int):
    return [homes[k]] if homes is not None and homes[k] else None


def route(client, parts: list, dest, n: int, explode=None, explode_kw=None, shuffle_method=None, account=None,
          homes=None, before=None, after=None, source_homes=None, whole_cuts: bool = False, device=None,
          lazy: bool = False, **kw) -> list:
    """Rows of ``parts`` to ``n`` partitions by ``dest(frame, n, **kw)``; a list of ``n`` futures.

    Up to DIRECT_PIECES (source, gathering worker) pieces (and unless ``shuffle_method`` names one of Dask's),
    each source is cut by one task into one piece per worker that gathers destinations (``homes[k]``: the
    worker destination ``k`` is gathered on, loosely; None: anywhere); one task per such worker holds the
    pieces it receives (:func:`collect`), and each destination takes its rows from them: (sources x workers)
    pieces moved as futures, a graph with as many edges, not (sources x destinations), and no DataFrame
    graph.  Above, Dask's shuffle (p2p by default) moves them.  ``account``: a key under which each
    source's worker tallies the (rows, bytes) it hands over (:func:`take_moved`).  ``before`` / ``after``
    (:class:`gpu_dedup.run.contract.Step`): what each source task runs on its part before cutting it, and
    each destination task on its rows once gathered; ``source_homes[i]``: the workers source ``i``'s task
    should run on (where a block its step reads is); ``whole_cuts`` (a small route, up to HELD_FROM_SOURCES
    sources): each destination takes its group's piece out of every source's whole cut itself, one scheduler
    round trip less on the route's path for (workers) times the bytes moved (``cluster.small_route_rows``).
    ``lazy``: the destinations come back as :class:`Later` (the moved rows' route only), each made inside the
    task that takes it first; a source that is one is made inside the task that cuts it.

    ``device`` (a backend name, ``cluster.shuffle: device``): the rows go through Dask's p2p shuffle (or the
    method Dask's ``dataframe.shuffle.method`` names in this process) as frames of that backend's arrays (cuDF frames between GPU workers, pandas on CPU workers): each source's frame moves
    to the device in its own task, each destination's ``after`` step runs on the device arrays it receives, and
    its result goes on as host arrays."""
    if device is not None:  # Dask's p2p shuffle, unless this process's Dask config names its method
        import dask  # noqa: PLC0415

        shuffle_method = dask.config.get("dataframe.shuffle.method", None) or "p2p"
    groups, place = destination_groups(list(homes) if homes is not None else [None] * n)
    m = len(parts)
    before, after = real_step(before), real_step(after)
    steps = [before.at(i) if before is not None else None for i in range(m)]
    where = list(source_homes) if source_homes is not None else [None] * m
    ends = [after.at(k) if after is not None else None for k in range(n)]
    if shuffle_method is None and m * len(groups) <= DIRECT_PIECES:
        cutter = step_and_split if len(groups) > 1 else step_and_split_one
        src_priority = later()

        def cut_one(i: int, p):
            task = p.take() if isinstance(p, Later) else None  # a route's destination: made in this task
            fn, head = (made_then, (task, cutter)) if task is not None else (cutter, (real(p),))
            at = where[i] if where[i] or task is None else p.where
            return client.submit(fn, *head, steps[i], i, dest=dest, n=n, explode=explode, explode_kw=explode_kw,
                                 groups=groups, account=account, pure=False, priority=src_priority, **placed(at),
                                 **kw)

        cut = [cut_one(i, p) for i, p in enumerate(parts)]

        def end(fn, k: int, *args, priority: int):
            if lazy:
                return Later(client, fn, args, priority, _home(homes, k))
            return client.submit(fn, *args, pure=False, priority=priority, **placed(_home(homes, k)))

        if whole_cuts and len(groups) > 1 and m <= HELD_FROM_SOURCES:
            first = later()
            return [end(gather_group, k, i, g, ends[k], *cut, priority=first) for k, (g, i) in enumerate(place)]
        pieces = [client.map(operator.getitem, cut, [g] * m, pure=False, priority=later())
                  for g in range(len(groups))] if len(groups) > 1 else [cut]
        first = later()
        if m <= HELD_FROM_SOURCES:
            return [end(gather_direct, k, i, ends[k], *pieces[g], priority=first) for k, (g, i) in enumerate(place)]
        held = [client.submit(collect, *pieces[g], pure=False, priority=first, **placed(_home(homes, members[0])))
                for g, members in enumerate(groups)]
        return [end(gather_pieces, k, i, held[g], ends[k], priority=first) for k, (g, i) in enumerate(place)]
    parts = reals(parts)
    import dask  # noqa: PLC0415  Dask's shuffle only: importing dask.dataframe takes the client about 1 s
    import dask.dataframe as dd  # noqa: PLC0415
    from dask.delayed import delayed

    if device is not None:
        try:  # cuDF frames on GPU workers: their empty meta reaches this process, and Dask dispatches on its type
            import dask_cudf  # noqa: F401,PLC0415
        except ImportError:  # CPU workers (and the simulator's): pandas frames
            pass

    ready = [client.submit(step_and_prepare, p, steps[i], i, dest, n, explode=explode, explode_kw=explode_kw,
                           account=account, device=device, pure=False, **placed(where[i]), **kw)
             for i, p in enumerate(parts)]
    meta = client.submit(empty, ready[0], pure=False).result()
    ddf = dd.from_delayed([delayed(f) for f in ready], meta=meta, verify_meta=False)
    with dask.config.set({"dataframe.shuffle.method": shuffle_method} if shuffle_method else {}):
        routed = ddf.set_index("_dest", divisions=list(range(n + 1)), sorted=False)
        out = client.compute(routed.to_delayed())
    if len(out) != n:  # pragma: no cover - set_index keeps the divisions it is given
        raise RuntimeError(f"routing made {len(out)} partitions, not {n}")
    return [client.submit(finish_and_step, o, ends[k], host=device is not None, pure=False)
            for k, o in enumerate(out)]
