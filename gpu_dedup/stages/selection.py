"""Select stage: one survivor per cluster, by a stated policy.

Policies rank every document (0 = best); ties always go to the earlier row
(input order), so the choice is deterministic:

- ``first``: input order (shards sorted by path, rows in file order);
- ``longest``: most code points in the original text;
- ``lowest_id``: smallest value of the id column;
- ``score``: highest value of ``select.score_column`` (nulls rank last).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpu_dedup.backends import array_module
from gpu_dedup.config import SelectConfig
from gpu_dedup.stages.normalize import repair_utf8


def policy_ranks(table: pa.Table, cfg: SelectConfig = SelectConfig()) -> np.ndarray:
    """Rank of every document under the policy (a permutation of 0..n-1)."""
    length = None
    if cfg.keep == "longest" and table.num_rows:
        length = text_lengths(table.column("text"))
    ids = table.column("id") if cfg.keep == "lowest_id" else None
    score = table.column("score") if cfg.keep == "score" else None
    return ranks_from_keys(cfg.keep, table.num_rows, length=length, ids=ids, score=score)


def text_lengths(text) -> pa.Array:
    """Code points of each original text (-1 for nulls): the ``longest`` policy's key."""
    return pc.fill_null(pc.utf8_length(_as_text(text)), -1)


def ranks_from_keys(keep: str, n: int, length=None, ids=None, score=None) -> np.ndarray:
    """Ranks from the policy's key column (rows break ties; nulls rank last)."""
    if keep == "first" or n == 0:
        return np.arange(n, dtype=np.int64)
    row = pa.array(np.arange(n, dtype=np.int64))
    if keep == "longest":
        keys = pa.table({"k": length, "row": row})
        order = pc.sort_indices(keys, sort_keys=[("k", "descending"), ("row", "ascending")])
    elif keep == "lowest_id":
        keys = pa.table({"k": ids, "row": row})
        order = pc.sort_indices(keys, sort_keys=[("k", "ascending"), ("row", "ascending")])  # nulls last (default)
    else:  # score
        keys = pa.table({"k": score, "row": row})
        order = pc.sort_indices(keys, sort_keys=[("k", "descending"), ("row", "ascending")])  # nulls last (default)
    ranks = np.empty(n, np.int64)
    ranks[np.asarray(order)] = np.arange(n, dtype=np.int64)
    return ranks


def _as_text(col):
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        return repair_utf8(col)[0]
    return col


def survivors(labels, ranks):
    """For each document, the index of the best-ranked document with the same label (NumPy or CuPy)."""
    xp = array_module(labels)
    n = labels.shape[0]
    if n == 0:
        return xp.zeros(0, dtype=xp.int64)
    order = xp.argsort(ranks, kind="stable")
    order = order[xp.argsort(labels[order], kind="stable")]
    sl = labels[order]
    start = xp.ones(n, dtype=bool)
    start[1:] = sl[1:] != sl[:-1]
    head = xp.flatnonzero(start)[xp.cumsum(start) - 1]
    out = xp.empty(n, dtype=xp.int64)
    out[order] = order[head]
    return out


def split_chains(labels, rep, ranks, src, dst, similarity, threshold: float, components, fixed=None):
    """Break chained clusters: every member must reach ``threshold`` similarity to its survivor.

    Connected components chain (A~B and B~C put C with A even when J(A, C) is
    low).  Here, after survivors are chosen, each representative (``rep[i] ==
    i``; exact copies follow their representative) whose ``similarity(members,
    survivors)`` is below ``threshold`` is ejected.  The ejected members of one
    cluster re-form clusters among themselves: the connected components of the
    verified edges (``src``, ``dst``) that join two of them (``components(src,
    dst, n)``, the backend's), each with a new survivor by the same ``ranks``.
    This repeats until no member is ejected; an ejected member with no verified
    edge to another ejected member ends as a singleton (kept).  Survivors never
    change cluster, so every round splits at least one cluster and the loop
    ends; the result is deterministic.

    Documents of an index the run deduplicates against are ejected like any
    other node, as a full dedup of index + new documents would eject them: they
    rank before every new document, so an ejected one is the survivor of the
    cluster it re-forms and is never removed, and new documents re-form around
    it.  ``fixed`` (those documents) is accepted and ignored: pinning them in
    place left a new document that a full dedup removes as a copy of an indexed
    document ejected from a larger cluster without that document, and kept it.

    Returns (labels, survivor, ejected, rounds): ``ejected`` marks the
    documents (exact copies included) that left their connected component.
    """
    xp = array_module(labels)
    n = labels.shape[0]
    idx = xp.arange(n, dtype=xp.int64)
    labels = labels.astype(xp.int64, copy=True)
    movable = rep == idx
    checked = xp.full(n, -1, dtype=xp.int64)  # survivor a member was last found similar enough to
    ejected = xp.zeros(n, dtype=bool)
    rounds = 0
    survivor = survivors(labels, ranks)
    while True:  # a few rounds: each splits at least one cluster
        todo = xp.flatnonzero(movable & (survivor != idx) & (checked != survivor))
        if todo.shape[0] == 0:
            break
        sim = xp.asarray(similarity(todo, survivor[todo]), dtype=xp.float64)
        ok = sim >= threshold
        checked[todo[ok]] = survivor[todo[ok]]
        bad = todo[~ok]
        if bad.shape[0] == 0:
            break
        rounds += 1
        ejected[bad] = True
        is_bad = xp.zeros(n, dtype=bool)
        is_bad[bad] = True
        e = is_bad[src] & is_bad[dst] & (labels[src] == labels[dst])
        local = components(xp.searchsorted(bad, src[e]), xp.searchsorted(bad, dst[e]), bad.shape[0])
        key = xp.full(n, -1, dtype=xp.int64)
        key[bad] = bad[local]  # smallest member of the re-formed cluster
        key = key[rep]  # exact copies follow their representative
        labels = xp.unique(labels * (n + 1) + key + 1, return_inverse=True)[1].reshape(-1).astype(xp.int64)
        survivor = survivors(labels, ranks)
    return labels, survivor, ejected[rep], rounds
