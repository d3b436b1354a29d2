"""Connected components over verified edges (an array algorithm, no Python loop over edges)."""

from __future__ import annotations

import numpy as np

from gpu_dedup.backends import array_module, distinct, get_backend, stable_order, to_host
from gpu_dedup.stages.edges import Edges
from gpu_dedup.stages.frames import concat, distinct_pairs, lookup


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
    nodes = xp.concatenate((y, distinct(x)))
    mins = xp.concatenate((m, _first_min(x, m, xp)))
    keep = nodes != mins
    return {"x": nodes[keep], "y": mins[keep]}


def _group_min(part: dict, include_self: bool):
    """Edges sorted by (x, y), and for each edge the smallest ``y`` (and, ``include_self``, ``x``) of its ``x``."""
    xp = array_module(part["x"])
    x, y = part["x"], part["y"]
    if x.shape[0] == 0:
        return xp, x, y, y
    order = stable_order(x, y)
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
    order = stable_order(x, y)
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
    order = stable_order(nodes)
    nodes, labels = nodes[order], labels[order]
    keep = xp.ones(nodes.shape[0], dtype=bool)
    keep[1:] = nodes[1:] != nodes[:-1]
    return {"node": nodes[keep], "label": labels[keep]}


def local_components(part: dict, backend) -> dict:
    """Union-find of one partition holding every edge (``src``, ``dst``): ``node``, ``label``."""
    xp = array_module(part["src"])
    nodes = distinct(xp.concatenate((part["src"], part["dst"])))
    comp = get_backend(backend).components(xp.searchsorted(nodes, part["src"]), xp.searchsorted(nodes, part["dst"]),
                                           int(nodes.shape[0]))
    return {"node": nodes, "label": nodes[comp] if nodes.shape[0] else nodes}


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def home_edges(edges: dict, prior) -> dict:
    """Edges with each indexed end replaced by its home (an index cluster acts as its survivor)."""
    if not prior.active:
        return {"src": edges["src"], "dst": edges["dst"]}
    xp = array_module(edges["src"])
    return {"src": home_nodes(edges["src"], prior, xp), "dst": home_nodes(edges["dst"], prior, xp)}


def home_nodes(nodes, prior, xp):
    f = prior.first_doc
    out = nodes.copy()
    low = nodes < f
    if bool(low.any()):
        out[low] = xp.asarray(prior.home(to_host(nodes[low])))
    return out


def member_rows(docs: dict, in_edges: dict, prior) -> tuple[dict, dict]:
    """A block's rows that belong to a cluster of two or more nodes, in two frames:

    - rows labelled here (``node``, ``label``, ``rank``, ``rep_node``): rows with an edge (their component
      label) and representatives of exact copies without one (their own node);
    - copies (``node``, ``rank``, ``rep_node``, ``_key``: the node whose label they take): exact copies of
      a row or of an indexed document, whose label lives with their representative."""
    xp = array_module(docs["row"])
    node = docs["row"] + prior.first_doc
    match = docs["match"]
    rep_node = xp.where(match >= 0, match, docs["rep"] + prior.first_doc)
    label = lookup(node, in_edges["node"], in_edges["label"], -1)
    has_edge = label >= 0
    mine = (rep_node == node) & (has_edge | docs["has_copies"])
    local = {"node": node[mine], "label": xp.where(has_edge[mine], label[mine], node[mine]),
             "rank": docs["rank"][mine], "rep_node": rep_node[mine]}
    cp = rep_node != node
    copies = {"node": node[cp], "rank": docs["rank"][cp], "rep_node": rep_node[cp],
              "_key": home_nodes(rep_node[cp], prior, xp)}
    return local, copies


def index_nodes(docs: dict, centres: dict | None) -> dict:
    """Indexed documents this partition involves: exact matches of its rows and the centres of its buckets."""
    xp = array_module(docs["match"]) if docs is not None else array_module(centres["doc"])
    parts = []
    if docs is not None:
        parts.append(docs["match"][docs["match"] >= 0])
    if centres is not None:
        parts.append(centres["doc"])
    nodes = distinct(xp.concatenate(parts)) if parts else xp.zeros(0, dtype=xp.int64)
    return {"node": nodes}


def index_members(part: dict, prior) -> dict:
    """The indexed documents of one partition (with duplicates) and their homes, as members: ``node``,
    ``rank``, ``rep_node`` (itself), ``_key`` (its home, whose label it takes)."""
    xp = array_module(part["node"])
    docs = distinct(part["node"])
    homes = home_nodes(docs, prior, xp)
    nodes = distinct(xp.concatenate((docs, homes)))
    return {"node": nodes, "rank": xp.asarray(prior.ranks(to_host(nodes))), "rep_node": nodes,
            "_key": home_nodes(nodes, prior, xp)}


def index_home_edges(part: dict, prior) -> dict:
    """An edge from each indexed document of one partition to its home (the survivor of its index cluster),
    with the lookup key of their label (the home): splitting chains, an index cluster whose members leave a
    larger cluster together re-forms around its home, as its documents' own edges joined it in the index."""
    xp = array_module(part["node"])
    docs = distinct(part["node"])
    homes = home_nodes(docs, prior, xp)
    away = homes != docs
    unknown = xp.full(int(away.sum()), xp.nan, dtype=xp.float64)  # joined by the index, not scored
    return {"src": homes[away], "dst": docs[away], "sim": unknown, "_key": homes[away]}


MEMBER_COLUMNS = ("node", "label", "rank", "rep_node")


def cluster_members(*parts) -> dict:
    """The members that reached one partition of clusters, from each source, as one frame."""
    return concat([{k: p[k] for k in MEMBER_COLUMNS} for p in parts])


def edge_labels(edges: dict, prior) -> dict:
    """Verified edges (with their similarity) and the lookup key of their label: the home of their first end."""
    xp = array_module(edges["src"])
    return {"src": edges["src"], "dst": edges["dst"], "sim": edges["sim"], "_key": home_nodes(edges["src"], prior, xp)}
