"""Connected components over verified edges (an array algorithm, no Python loop over edges)."""

from __future__ import annotations

import numpy as np

from gpu_dedup.backends import array_module, get_backend
from gpu_dedup.stages.frames import distinct_pairs
from gpu_dedup.stages.edges import Edges


def components(edges: Edges, n: int, backend="cpu") -> np.ndarray:
    """Component label of each of ``n`` nodes: the smallest node index in its component."""
    return get_backend(backend).components(np.asarray(edges.src), np.asarray(edges.dst), n)


# ---------------------------------------------------------------------------- partition functions
# Connected components over partitions: alternating large-star / small-star (Kiveris et al., "Connected
# Components in MapReduce and Beyond", 2014; BigCode's near-deduplication job runs it on Spark).  Each step
# groups the edges by one end (every edge of a node in one partition after routing by that end) and
# re-points them at the smallest node seen; the edge set converges to a star around each component's
# smallest node in O(log n) rounds.  One process uses the backend's union-find instead.


def both_directions(part: dict) -> dict:
    """Every edge as (x, y) and (y, x)."""
    xp = array_module(part["src"])
    return {"x": xp.concatenate((part["src"], part["dst"])), "y": xp.concatenate((part["dst"], part["src"]))}


def large_star(part: dict) -> dict:
    """Edges grouped by ``x`` (all of a node's edges here): each neighbour ``y > x`` of ``x`` points at the
    smallest of ``x`` and its neighbours."""
    xp, x, y, m = _group_min(part, include_self=True)
    keep = y > x
    return {"x": y[keep], "y": m[keep]}


def small_star_orient(part: dict) -> dict:
    """Each edge (x, y) as (larger, smaller)."""
    xp = array_module(part["x"])
    return {"x": xp.maximum(part["x"], part["y"]), "y": xp.minimum(part["x"], part["y"])}


def small_star(part: dict) -> dict:
    """Oriented edges grouped by ``x`` (its smaller neighbours here): ``x`` and each of them point at the
    smallest of them, except that node itself."""
    xp, x, y, m = _group_min(part, include_self=True)
    nodes = xp.concatenate((y, xp.unique(x)))
    mins = xp.concatenate((m, _first_min(x, m, xp)))
    keep = nodes != mins
    return {"x": nodes[keep], "y": mins[keep]}


def _group_min(part: dict, include_self: bool):
    """Edges sorted by (x, y), and for each edge the smallest ``y`` (and, ``include_self``, ``x``) of its ``x``."""
    xp = array_module(part["x"])
    x, y = part["x"], part["y"]
    if x.shape[0] == 0:
        return xp, x, y, y
    order = xp.argsort(y, kind="stable")
    order = order[xp.argsort(x[order], kind="stable")]
    x, y = x[order], y[order]
    start = xp.ones(x.shape[0], dtype=bool)
    start[1:] = x[1:] != x[:-1]
    group = xp.cumsum(start) - 1
    gmin = y[start]  # sorted by y inside each x: the first is the smallest
    if include_self:
        gmin = xp.minimum(gmin, x[start])
    return xp, x, y, gmin[group]


def _first_min(x, m, xp):
    """For each distinct ``x`` (sorted), its group's minimum."""
    if x.shape[0] == 0:
        return m
    start = xp.ones(x.shape[0], dtype=bool)
    start[1:] = x[1:] != x[:-1]
    return m[start]


def unique_pairs_part(part: dict) -> dict:
    """Distinct (x, y) of one partition (every copy of a pair is here)."""
    return distinct_pairs({"x": part["x"], "y": part["y"]}, "x", "y")


def changed_pairs(old: dict, new: dict) -> dict:
    """How many pairs one of two distinct pair sets of a partition has and the other not."""
    xp = array_module(old["x"])
    x = xp.concatenate((old["x"], new["x"]))
    y = xp.concatenate((old["y"], new["y"]))
    if x.shape[0] == 0:
        return {"changed": 0}
    order = xp.argsort(y, kind="stable")
    order = order[xp.argsort(x[order], kind="stable")]
    x, y = x[order], y[order]
    common = int(((x[1:] == x[:-1]) & (y[1:] == y[:-1])).sum())  # a pair of both sets sits next to its twin
    return {"changed": int(x.shape[0]) - 2 * common}


def star_labels(part: dict) -> dict:
    """Labels from the converged star edges (x, smallest node of its component) of one partition routed by
    ``x``: ``node`` (each x and each centre) and ``label``."""
    xp = array_module(part["x"])
    nodes = xp.concatenate((part["x"], part["y"]))
    labels = xp.concatenate((part["y"], part["y"]))
    if nodes.shape[0] == 0:
        return {"node": nodes, "label": labels}
    order = xp.argsort(nodes, kind="stable")
    nodes, labels = nodes[order], labels[order]
    keep = xp.ones(nodes.shape[0], dtype=bool)
    keep[1:] = nodes[1:] != nodes[:-1]
    return {"node": nodes[keep], "label": labels[keep]}


def local_components(part: dict, backend) -> dict:
    """Union-find of one partition holding every edge (``src``, ``dst``): ``node``, ``label``."""
    xp = array_module(part["src"])
    nodes = xp.unique(xp.concatenate((part["src"], part["dst"])))
    comp = get_backend(backend).components(xp.searchsorted(nodes, part["src"]), xp.searchsorted(nodes, part["dst"]),
                                           int(nodes.shape[0]))
    return {"node": nodes, "label": nodes[comp] if nodes.shape[0] else nodes}
