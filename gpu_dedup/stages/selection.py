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

from gpu_dedup.backends import (array_module, distinct, flags_fit, get_backend, sorted_find, stable_order,
                                to_host)
from gpu_dedup.backends.arrow_arrays import arrow_array
from gpu_dedup.config import SelectConfig
from gpu_dedup.stages.frames import sort_by, take
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
    row = arrow_array(np.arange(n, dtype=np.int64))
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
    order = stable_order(labels, ranks)
    sl = labels[order]
    start = xp.ones(n, dtype=bool)
    start[1:] = sl[1:] != sl[:-1]
    head = xp.flatnonzero(start)[xp.cumsum(start) - 1]
    out = xp.empty(n, dtype=xp.int64)
    out[order] = order[head]
    return out


class KnownPairs:
    """Similarities already computed for pairs of positions ``0 <= a, b < n`` (either way round: the
    similarity is symmetric), so that a pair is scored once.  ``lookup`` finds them, ``add`` records
    more.  Array code of the positions' module."""

    def __init__(self, xp, n: int, a=None, b=None, sim=None):
        self.xp, self.n = xp, max(int(n), 1)
        self.keys = xp.zeros(0, dtype=xp.int64)
        self.sims = xp.zeros(0, dtype=xp.float64)
        if a is not None and a.shape[0]:
            self.add(a, b, sim)

    def _key(self, a, b):
        xp = self.xp
        return xp.minimum(a, b).astype(xp.int64) * self.n + xp.maximum(a, b).astype(xp.int64)

    def add(self, a, b, sim) -> None:
        """Record ``sim`` for the pairs ``(a[p], b[p])`` (NaN: unknown, not recorded)."""
        xp = self.xp
        sim = xp.asarray(sim, dtype=xp.float64)
        ok = ~xp.isnan(sim)
        keys = xp.concatenate((self.keys, self._key(a[ok], b[ok])))
        sims = xp.concatenate((self.sims, sim[ok]))
        keys, first = xp.unique(keys, return_index=True)  # a pair met twice has one similarity
        self.keys, self.sims = keys, sims[first]

    def lookup(self, a, b):
        """(found, similarity): whether each pair's similarity is known, and it where it is."""
        found, at = sorted_find(self._key(a, b), self.keys)
        return found, self.xp.where(found, self.sims[at] if self.sims.shape[0] else 0.0, 0.0)


class ChainSplit:
    """:func:`split_chains` over one partition of clusters, one round at a time.

    The partition holds whole clusters (every member of a label, and the verified
    edges between them), so ejecting members and re-forming their clusters needs
    nothing from other partitions; only the similarity of members to their
    survivors does.  ``propose()`` returns (member, survivor) positions to score
    (none when the partition is done), ``accept(similarity)`` takes their
    similarity in that order.  One partition holding every node is exactly
    :func:`split_chains`.  ``known`` (:class:`KnownPairs` of positions): similarities already computed
    (the verified edges'); a round's pairs found there are not proposed, and every similarity a round
    takes is added to it.
    """

    def __init__(self, labels, rep, ranks, src, dst, threshold: float, components, known: KnownPairs | None = None,
                 survivor=None):
        xp = self.xp = array_module(labels)
        n = self.n = labels.shape[0]
        self.known = known
        self.idx = xp.arange(n, dtype=xp.int64)
        self.labels = labels.astype(xp.int64, copy=True)
        self.rep, self.ranks, self.src, self.dst = rep, ranks, src, dst
        self.threshold, self.components = threshold, components
        self.movable = rep == self.idx  # exact copies follow their representative
        self.checked = xp.full(n, -1, dtype=xp.int64)  # survivor a member was last found similar enough to
        self.ejected = xp.zeros(n, dtype=bool)
        self.rounds = 0
        # survivor: survivors(labels, ranks) where the caller has them (a copy: the rounds change it)
        self.survivor = survivors(self.labels, ranks) if survivor is None else survivor.copy()
        self.done = False
        self._todo: tuple | None = None  # the round asked: (members, known or None, their similarities)

    def propose(self):
        """(member, survivor) positions whose similarity decides this round and is not known yet (empty:
        done).  Rounds whose pairs are all known are taken here at once."""
        xp = self.xp
        self._todo = None
        while not self.done:
            todo = xp.flatnonzero(self.movable & (self.survivor != self.idx) & (self.checked != self.survivor))
            if todo.shape[0] == 0:
                self.done = True
                break
            if self.known is None:
                self._todo = (todo, None, None)
                return todo, self.survivor[todo]
            found, sims = self.known.lookup(todo, self.survivor[todo])
            ask = todo[~found]
            if ask.shape[0]:
                self._todo = (todo, found, sims)
                return ask, self.survivor[ask]
            self._take(todo, sims)
        return xp.zeros(0, dtype=xp.int64), xp.zeros(0, dtype=xp.int64)

    def accept(self, similarity) -> None:
        if self._todo is None:
            return
        xp = self.xp
        todo, found, sim = self._todo
        self._todo = None
        if found is None or self.known is None:
            sim = xp.asarray(similarity, dtype=xp.float64)
        else:
            asked = xp.asarray(similarity, dtype=xp.float64)
            sim[~found] = asked
            self.known.add(todo[~found], self.survivor[todo[~found]], asked)
        self._take(todo, sim)

    def _take(self, todo, sim) -> None:
        """The round's similarities of (member ``todo``, survivor): the members below the threshold are
        ejected and re-form clusters."""
        xp, n = self.xp, self.n
        ok = sim >= self.threshold
        self.checked[todo[ok]] = self.survivor[todo[ok]]
        bad = todo[~ok]
        if bad.shape[0] == 0:
            self.done = True
            return
        self.rounds += 1
        self.ejected[bad] = True
        is_bad = xp.zeros(n, dtype=bool)
        is_bad[bad] = True
        src, dst, labels = self.src, self.dst, self.labels
        e = is_bad[src] & is_bad[dst] & (labels[src] == labels[dst])
        local = self.components(xp.searchsorted(bad, src[e]), xp.searchsorted(bad, dst[e]), bad.shape[0])
        key = xp.full(n, -1, dtype=xp.int64)
        key[bad] = bad[local]  # smallest member of the re-formed cluster
        key = key[self.rep]  # exact copies follow their representative
        self.labels = xp.unique(labels * (n + 1) + key + 1, return_inverse=True)[1].reshape(-1).astype(xp.int64)
        self.survivor = survivors(self.labels, self.ranks)

    def result(self):
        """(labels, survivor, ejected, rounds) as :func:`split_chains` returns them."""
        return self.labels, self.survivor, self.ejected[self.rep], self.rounds


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
    other node, as a full dedup of index + new documents would eject them.  The
    kept ones rank before every new document, so an ejected one is the survivor
    of the cluster it re-forms and new documents re-form around it; those the
    index holds as removed rank after every new document (they are gone from the
    published outputs: a new document is never removed against one), and the
    edges given join each of them to its index cluster's survivor, so an index
    cluster ejected as a whole re-forms around that survivor.  ``fixed`` (the
    indexed documents) is accepted and ignored: pinning them in place left a new
    document that a full dedup removes as a copy of an indexed document ejected
    from a larger cluster without that document, and kept it.  The rounds are
    those of :class:`ChainSplit`.

    Returns (labels, survivor, ejected, rounds): ``ejected`` marks the
    documents (exact copies included) that left their connected component.
    """
    state = ChainSplit(labels, rep, ranks, src, dst, threshold, components)
    while not state.done:
        left, right = state.propose()
        if left.shape[0]:
            state.accept(similarity(left, right))
    return state.result()


# ---------------------------------------------------------------------------- partition functions


class NodePositions:
    """The position of each of a partition's nodes (distinct doc numbers, NumPy or CuPy) among them: a table
    indexed by doc number where the nodes are dense enough (:func:`flags_fit`; a scatter, then one gather per
    lookup), else a sort of the nodes and a binary search per lookup (:func:`sorted_find`)."""

    def __init__(self, nodes):
        xp = self.xp = array_module(nodes)
        n = nodes.shape[0]
        self.table = None
        if n:
            self.lo = int(nodes.min())
            span = int(nodes.max()) - self.lo + 1
            if flags_fit(span, n) and n < 2**31:
                table, at, rows = xp.full(span, -1, dtype=xp.int32), nodes - self.lo, xp.arange(n, dtype=xp.int32)
                table[at] = rows
                if bool((table[at] == rows).all()):  # each node once: no ties to break
                    self.table = table
        if self.table is None:
            self.by_node = stable_order(nodes)
            self.sorted_nodes = nodes[self.by_node]

    def __call__(self, nodes):
        """Positions of ``nodes`` (every one among this partition's: an error otherwise), int64."""
        xp = self.xp
        nodes = xp.asarray(nodes, dtype=xp.int64)
        if self.table is not None:
            at = nodes - self.lo
            inside = (at >= 0) & (at < self.table.shape[0])
            pos = self.table[xp.where(inside, at, 0)].astype(xp.int64)
            found, got = inside & (pos >= 0), pos
        else:
            found, at = sorted_find(nodes, self.sorted_nodes)
            got = self.by_node[at] if self.sorted_nodes.shape[0] else at
        if not bool(found.all()):
            raise RuntimeError("a cluster's representative or edge end is not among its members")
        return got


class ClusterPart:
    """The clusters of one partition: every member of each of its labels (rows and a prior's documents)
    and the verified edges between them, from connected components to survivors.

    ``members``: frame ``node`` (doc number), ``label`` (component label), ``rank`` (keep policy; a
    prior's documents below every row), ``rep_node`` (the node whose text it has: itself, its exact
    group's representative or the indexed document it is a copy of); a node may appear more than once.
    ``edges``: the verified edges (``src``, ``dst``; ``sim``, where given, their similarity: no pair is
    scored twice, see :class:`KnownPairs`) whose ends carry these labels.  Labels with one
    member are singletons and are dropped here: they keep their document and report nothing.
    Survivors are the best-ranked member of each label, then (``split``) chains are split in rounds
    (:class:`ChainSplit`: ``propose`` / ``accept``); ``similarity_pairs`` / ``outputs`` give each
    removed near duplicate's similarity to its survivor and the frame the write stage reads.
    """

    def __init__(self, members: dict, edges: dict, threshold: float, split: bool, components, first_doc: int):
        xp = self.xp = array_module(members["node"])
        m = sort_by(members, "label", "node")
        if m["node"].shape[0]:
            keep = xp.ones(m["node"].shape[0], dtype=bool)
            keep[1:] = m["node"][1:] != m["node"][:-1]
            if not bool(keep.all()):  # a node that reached the partition twice (no copy where none did)
                m = {k: v[keep] for k, v in m.items()}
        lab = m["label"]
        start = xp.ones(lab.shape[0], dtype=bool)
        start[1:] = lab[1:] != lab[:-1]
        group = xp.cumsum(start) - 1
        sizes = xp.bincount(group) if lab.shape[0] else xp.zeros(0, dtype=xp.int64)
        multi = sizes[group] > 1 if lab.shape[0] else xp.zeros(0, dtype=bool)
        self.clusters_before = int((sizes > 1).sum())  # components with two or more nodes
        if not bool(multi.all()):  # singletons dropped (no copy where there are none)
            m = {k: v[multi] for k, v in m.items()}
        self.node, self.rank = m["node"], m["rank"]
        self.rep_node = m["rep_node"]
        self.first_doc = first_doc
        n = self.node.shape[0]
        position = NodePositions(self.node)  # kept for these lookups only
        # each member's label numbered 0, 1, ... in label order (np.unique's inverse): the rows are in label order
        first = xp.ones(n, dtype=bool)
        first[1:] = m["label"][1:] != m["label"][:-1]
        labels = (xp.cumsum(first) - 1).astype(xp.int64)
        self.rep = position(self.rep_node)
        src, dst = position(edges["src"]), position(edges["dst"])
        sim = edges.get("sim")  # the verified edges' similarities, where the family's are symmetric
        self.known = KnownPairs(xp, n, src, dst, sim) if sim is not None else None
        self.labels, self.survivor = labels, survivors(labels, self.rank)
        self.chain = ChainSplit(labels, self.rep, self.rank, src, dst, threshold, components, self.known,
                                survivor=self.survivor) if split else None
        self.ejected = xp.zeros(n, dtype=bool)
        self.rounds = 0

    @property
    def done(self) -> bool:
        return self.chain is None or self.chain.done

    def propose(self) -> dict:
        """(survivor, member) pairs, as nodes, whose similarity decides the next chain-splitting round."""
        xp = self.xp
        if self.done:
            z = xp.zeros(0, dtype=xp.int64)
            return {"src": z, "dst": z}
        chain = self.chain
        assert chain is not None  # not done: chains are split
        left, right = chain.propose()  # (member, survivor): the survivor first, the end many pairs share
        return {"src": self.node[right], "dst": self.node[left]}

    def accept(self, sim) -> None:
        if self.chain is not None:
            self.chain.accept(sim)

    def finish(self) -> dict:
        """Survivors are final: the (survivor, rep_node) pairs of removed near duplicates to score."""
        if self.chain is not None:
            self.labels, self.survivor, self.ejected, self.rounds = self.chain.result()
        xp = self.xp
        self.kept = self.survivor == xp.arange(self.node.shape[0])
        self.near = ~self.kept & (self.rep != self.survivor)
        todo = xp.flatnonzero(self.near)
        found = sims = None
        if self.known is not None:  # pairs scored before (verified edges, chain splitting) are not scored again
            found, sims = self.known.lookup(self.survivor[todo], self.rep[todo])
        self._todo = (todo, found, sims)
        ask = todo if found is None else todo[~found]
        return {"src": self.node[self.survivor[ask]], "dst": self.rep_node[ask]}

    def outputs(self, sim) -> tuple[dict, dict]:
        """(rows, counts): the frame of this partition's rows (``node``, ``survivor`` node, ``kept``,
        ``multi`` (cluster of two or more), ``exact``, ``similarity``) and its counts for the report."""
        xp = self.xp
        n = self.node.shape[0]
        similarity = xp.ones(n, dtype=xp.float64)
        todo, found, known = self._todo
        if todo.shape[0]:
            if found is None:
                similarity[todo] = xp.asarray(sim, dtype=xp.float64)
            else:
                assert known is not None  # found where the pairs were looked up
                known[~found] = xp.asarray(sim, dtype=xp.float64)
                similarity[todo] = known
        size = xp.bincount(self.labels, minlength=int(self.labels.max()) + 1 if n else 0) if n else \
            xp.zeros(0, dtype=xp.int64)
        multi = size[self.labels] > 1 if n else xp.zeros(0, dtype=bool)
        surv = self.node[self.survivor] if n else self.node
        row = self.node >= self.first_doc
        removed = ~self.kept & row
        exact = self.rep == self.survivor
        counts = {
            "removed": int(removed.sum()), "exact_duplicates": int((removed & exact).sum()),
            "near_duplicates": int((removed & ~exact).sum()), "chain_split_ejected": int(self.ejected.sum()),
            "chain_split_rounds": self.rounds, "clusters": int(distinct(self.labels[row & multi]).shape[0]),
            "removed_against_index": int((removed & (surv < self.first_doc)).sum()),
        }
        rows = {"node": self.node[row], "survivor": surv[row], "kept": self.kept[row], "multi": multi[row],
                "exact": exact[row], "similarity": similarity[row]}
        return rows, counts

    def sizes(self) -> dict:
        """{cluster size: count} over this partition's clusters of two or more nodes."""
        xp = self.xp
        if self.node.shape[0] == 0:
            return {}
        size = to_host(xp.bincount(self.labels))
        values, counts = np.unique(size[size > 1], return_counts=True)
        return {int(v): int(c) for v, c in zip(values, counts)}


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def cluster_start(members: dict, edges: dict, threshold: float, split: bool, backend, first_doc: int,
                  reuse: bool = False):
    """The clusters of one partition; ``reuse``: the edges' similarities (``sim``, NaN where unknown) are
    the family's own for their pairs either way round, and are not computed again."""
    kept = ("src", "dst", "sim") if reuse and "sim" in edges else ("src", "dst")
    return ClusterPart(members, {k: edges[k] for k in kept}, threshold, split, get_backend(backend).components,
                       first_doc)


def cluster_before(part: ClusterPart) -> dict:
    return {"clusters": part.clusters_before}


def cluster_propose(part: ClusterPart):
    return part, part.propose()


def cluster_accept(part: ClusterPart, scored: dict) -> ClusterPart:
    part.accept(scored["sim"])
    return part


def cluster_open(part: ClusterPart) -> dict:
    return {"open": int(not part.done)}


def cluster_finish(part: ClusterPart):
    return part, part.finish()


def cluster_outputs(part: ClusterPart, scored: dict, prior):
    rows, counts = part.outputs(scored["sim"])
    xp = array_module(rows["node"])
    cluster = rows["survivor"].copy()
    if prior.active:  # an indexed survivor: the index's own cluster id of it
        low = cluster < prior.first_doc
        if bool(low.any()):
            cluster[low] = xp.asarray(prior.home(to_host(cluster[low])))
    rows["cluster"] = cluster
    counts = {**counts, "size_counts": part.sizes()}
    return rows, counts


def near_similarity(rows: dict) -> np.ndarray:
    """Similarities of removed near duplicates to their survivors (host), for the report."""
    near = ~rows["kept"] & ~rows["exact"]
    return to_host(rows["similarity"][near])


def block_outputs(selected: dict, first_doc: int) -> dict:
    """A block's members of clusters of two or more documents, in row order, with what the duplicates table
    needs; and the rows it removes."""
    sel = sort_by(selected, "node")
    multi = take(sel, array_module(sel["node"]).flatnonzero(sel["multi"]))
    multi["row"] = multi["node"] - first_doc
    return multi


def removed_rows(out: dict) -> dict:
    xp = array_module(out["row"])
    return {"row": out["row"][xp.flatnonzero(~out["kept"])]}
