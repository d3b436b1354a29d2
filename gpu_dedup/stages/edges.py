"""Edges (reduce): buckets -> star edges, linear in bucket size, verified in rounds.

``edges`` turns each bucket into a star around its smallest member: a bucket of
``k`` documents costs ``k - 1`` edges, never ``k * (k - 1) / 2``.
``star_rounds`` scores the star edges and re-stars the members a centre
rejects.  Edges found in several bands are emitted (and scored) once.  Array
code of the buckets' module (NumPy or CuPy).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_dedup.backends import ByArrays, array_module, dense_ranks, distinct, sorted_in, stable_order, to_host
from gpu_dedup.kernels.edges_cpu import close_accepted, star_pairs
from gpu_dedup.stages.buckets import Buckets
from gpu_dedup.stages.frames import distinct_pairs


HOST_PASS: bool | None = None  # a round's pairs and answers: kernels/edges_cpu.py on host arrays (None), or the
#                                array code (False: the device's, which NumPy runs too; tests compare the two)


@dataclass(frozen=True)
class Edges:
    src: np.ndarray  # int64, src < dst
    dst: np.ndarray
    similarity: np.ndarray | None = None  # float64 once verified

    def __len__(self) -> int:
        return self.src.shape[0]

    def to_host(self) -> "Edges":
        return Edges(to_host(self.src), to_host(self.dst),
                     None if self.similarity is None else to_host(self.similarity))

    def to_frame(self):
        import pandas as pd

        h = self.to_host()
        cols = {"src": h.src, "dst": h.dst}
        if h.similarity is not None:
            cols["similarity"] = h.similarity
        return pd.DataFrame(cols)


def unique_pairs(src, dst):
    """Distinct (src, dst) pairs sorted by (src, dst)."""
    xp = array_module(src, dst)
    src = src.astype(xp.int64)
    dst = dst.astype(xp.int64)
    if src.shape[0] == 0:
        return src, dst
    if max(int(src.max()), int(dst.max())) < 2**31:  # pack both into one sortable key
        key = distinct((src << 32) | dst)
        return key >> 32, key & 0xFFFFFFFF
    order = stable_order(src, dst)
    s, d = src[order], dst[order]
    keep = xp.ones(s.shape[0], dtype=bool)
    keep[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    return s[keep], d[keep]


def edges(b: Buckets) -> Edges:
    """Star edges (smallest member -> every other member) of every bucket, deduplicated."""
    xp = array_module(b.members)
    if len(b) == 0:
        e = xp.zeros(0, dtype=xp.int64)
        return Edges(e, e)
    centre = b.members[b.offsets[:-1]][b.member_bucket]
    not_centre = xp.ones(b.members.shape[0], dtype=bool)
    not_centre[b.offsets[:-1]] = False
    src, dst = unique_pairs(centre[not_centre], b.members[not_centre])
    return Edges(src, dst)


@dataclass(frozen=True)
class Centres:
    """Centres chosen by :func:`star_rounds` at rounds >= 1: bucket index, round, document."""

    bucket: np.ndarray
    round: np.ndarray
    doc: np.ndarray


@dataclass(frozen=True)
class StarResult:
    verified: Edges  # pairs at or above the threshold (all scored pairs with keep_all), with similarity
    scored: Edges  # every candidate pair scored, with its similarity
    centres: Centres  # centres chosen among the members at rounds >= 1 (the index records them)


class StarRounds:
    """:func:`star_rounds` over one partition of buckets, one round at a time.

    ``propose()`` opens the next round and returns the (src, dst) document pairs
    it needs scored (pairs this partition scored earlier are not asked again);
    ``accept(similarity)`` takes their similarity, in that order, and closes the
    round.  An executor runs every partition's round together, scoring the union
    of their pairs once where the texts live; one partition holding every bucket
    is exactly :func:`star_rounds`.
    """

    def __init__(self, b: Buckets, threshold: float, rounds: int = 1, keep_all: bool = False,
                 forced: Centres | None = None):
        xp = self.xp = array_module(b.members)
        self.b, self.threshold, self.rounds, self.keep_all, self.forced = b, threshold, max(rounds, 1), keep_all, forced
        extra = forced.doc if forced is not None else xp.zeros(0, dtype=xp.int64)
        # dense ids: a pair packs into one int64
        self.nodes, self.local = dense_ranks(b.members, xp.asarray(extra, dtype=xp.int64))
        self.member_bucket = b.member_bucket
        self.open_ = xp.ones(self.local.shape[0], dtype=bool)
        self.keys = xp.zeros(0, dtype=xp.int64)  # scored pairs (small << 32 | large), sorted
        self.sims = xp.zeros(0, dtype=xp.float64)
        self.rec_b: list = []
        self.rec_r: list = []
        self.rec_d: list = []
        self.round = 0
        self.done = False
        self._pending: tuple | None = None

    def propose(self):
        """(src, dst) document pairs of the next round that need a similarity (possibly none)."""
        xp, b, forced = self.xp, self.b, self.forced
        empty = xp.zeros(0, dtype=xp.int64)
        self._pending = None
        if self.done or self.round >= self.rounds:
            self.done = True
            return empty, empty
        r = self.round
        self.round += 1
        fc = xp.full(len(b), -1, dtype=xp.int64)
        if forced is not None:
            at = forced.round == r
            fc[forced.bucket[at]] = xp.searchsorted(self.nodes, forced.doc[at])
        return _PROPOSE.pick(xp, HOST_PASS)(self, r, fc, empty)

    def _propose_lines(self, r: int, fc, empty):
        """:meth:`propose`'s round ``r`` as array code (the device's; NumPy runs it too)."""
        xp, b = self.xp, self.b
        if r == 0 and self._buckets_whole():  # every membership open: its groups are the buckets, in order
            idx = xp.arange(self.open_.shape[0], dtype=xp.int64)
            group, group_first = self.member_bucket, b.offsets[:-1]
            first = xp.zeros(idx.shape[0], dtype=bool)
            first[group_first] = True
            gb = xp.arange(len(b), dtype=xp.int64)
        else:  # the open memberships, grouped by bucket
            found = self._open_groups()
            if found is None:
                return empty, empty
            idx, first = found
            group = xp.cumsum(first) - 1
            group_first = idx[first]
            gb = self.member_bucket[group_first]
        own = fc[gb] < 0  # buckets whose centre is their smallest open member
        if r > 0:
            self._record(gb[own], r, group_first[own])
        centre = xp.where(own, self.local[group_first], fc[gb])[group]
        is_centre = first & own[group]
        others = ~is_centre
        members = idx[others]  # the open memberships this round compares with their centre
        src, dst = centre[others], self.local[members]
        self.open_[idx[is_centre]] = False
        if src.shape[0] == 0:
            return empty, empty
        pk = (xp.minimum(src, dst) << 32) | xp.maximum(src, dst)
        return self._unseen(members, pk)

    def _propose_host(self, r: int, fc, empty):
        """:meth:`propose`'s round ``r`` on host arrays: the groups' bounds, then every pair in one pass."""
        b = self.b
        if r == 0 and self._buckets_whole():
            idx, starts = empty, b.offsets.astype(np.int64, copy=False)
        else:
            found = self._open_groups()
            if found is None:
                return empty, empty
            idx, first = found
            starts = np.append(np.flatnonzero(first), idx.shape[0])
        members, pk, own = star_pairs(idx, starts, self.member_bucket.astype(np.int64, copy=False),
                                      self.local.astype(np.int64, copy=False), fc, self.open_)
        if r > 0:
            group_first = idx[starts[:-1]]
            self._record(self.member_bucket[group_first][own], r, group_first[own])
        if pk.shape[0] == 0:
            return empty, empty
        return self._unseen(members, pk)

    def _open_groups(self):
        """The open memberships (ascending) and whether each is its bucket's first open one; None, the rounds
        done, where none is open."""
        xp = self.xp
        idx = xp.flatnonzero(self.open_)
        if idx.shape[0] == 0:
            self.done = True
            return None
        bk = self.member_bucket[idx]
        first = xp.ones(idx.shape[0], dtype=bool)
        first[1:] = bk[1:] != bk[:-1]
        return idx, first

    def _record(self, buckets, r: int, first_members) -> None:
        """The centres a round ``r`` >= 1 chose among the members: their buckets and documents."""
        self.rec_b.append(buckets)
        self.rec_r.append(self.xp.full(buckets.shape[0], r, dtype=self.xp.int64))
        self.rec_d.append(self.nodes[self.local[first_members]])

    def _unseen(self, members, pk):
        """The round's pairs not scored before, as (src, dst) documents; the round's state kept for accept."""
        uniq = distinct(pk)
        unseen = uniq[~sorted_in(uniq, self.keys)]
        self._pending = (members, pk, unseen)
        return self.nodes[unseen >> 32], self.nodes[unseen & 0xFFFFFFFF]

    def _buckets_whole(self) -> bool:
        """Some membership, and every bucket with one (the groups of a round with every membership open)."""
        offsets = self.b.offsets
        return self.open_.shape[0] > 0 and bool((offsets[1:] > offsets[:-1]).all())

    def accept(self, similarity) -> None:
        """The similarity of the pairs :meth:`propose` returned, in that order."""
        if self._pending is None:
            return
        xp = self.xp
        members, pk, unseen = self._pending
        self._pending = None
        if unseen.shape[0]:
            s = xp.asarray(similarity, dtype=xp.float64)
            keys, sims = xp.concatenate((self.keys, unseen)), xp.concatenate((self.sims, s))
            order = stable_order(keys)
            self.keys, self.sims = keys[order], sims[order]
        _ACCEPT.pick(xp, HOST_PASS)(self, members, pk)

    def _accept_lines(self, members, pk) -> None:
        """Close the memberships whose pair reached the threshold, as array code (the device's)."""
        accepted = self.keep_all | (self.sims[self.xp.searchsorted(self.keys, pk)] >= self.threshold)
        self.open_[members[accepted]] = False

    def _accept_host(self, members, pk) -> None:
        """:meth:`_accept_lines` in one pass on the host (kernels/edges_cpu.py)."""
        close_accepted(self.keys, self.sims, pk, members, float(self.threshold), bool(self.keep_all), self.open_,
                       self.nodes.shape[0])

    def result(self) -> StarResult:
        xp = self.xp
        keep = xp.ones(self.sims.shape[0], dtype=bool) if self.keep_all else self.sims >= self.threshold

        def cat(xs):
            return xp.concatenate(xs).astype(xp.int64) if xs else xp.zeros(0, dtype=xp.int64)

        src_all, dst_all = self.nodes[self.keys >> 32], self.nodes[self.keys & 0xFFFFFFFF]
        return StarResult(Edges(src_all[keep], dst_all[keep], self.sims[keep]), Edges(src_all, dst_all, self.sims),
                          Centres(cat(self.rec_b), cat(self.rec_r), cat(self.rec_d)))


_PROPOSE = ByArrays(StarRounds._propose_lines, host=StarRounds._propose_host)  # a round's pairs
_ACCEPT = ByArrays(StarRounds._accept_lines, host=StarRounds._accept_host)  # a round's answers taken in


def star_rounds(b: Buckets, similarity, threshold: float, rounds: int = 1, keep_all: bool = False,
                forced: Centres | None = None) -> StarResult:
    """Verified star edges of every bucket, re-starring what a centre rejects.

    Round 0 links each bucket's smallest member to the others.  Members whose
    similarity to their centre is below ``threshold`` stay open; in the next
    round each bucket's open members form a star around the smallest of them,
    and so on for ``rounds`` rounds.  A member is closed once a centre accepts
    it, and a centre once it has served, so each round costs at most the open
    memberships of the last: total work <= rounds x memberships.  A bucket with
    a single open member makes it the round's centre without edges: it would
    be the centre if more documents shared the bucket (the index records it).

    ``forced`` gives centres from outside the bucket's members (an index's
    documents, which precede every member) for some (bucket, round); there the
    forced centre serves and all open members are compared with it.
    ``similarity(src, dst)`` scores arrays of document pairs; a pair shared by
    several buckets is scored once.  ``keep_all`` keeps every scored pair
    (verification ``none``).  The rounds are those of :class:`StarRounds`.
    """
    state = StarRounds(b, threshold, rounds, keep_all, forced)
    while not state.done:
        src, dst = state.propose()
        state.accept(similarity(src, dst) if src.shape[0] else None)
    return state.result()


# ---------------------------------------------------------------------------- partition functions


def forced_centres(bk: dict, centres: dict | None) -> Centres | None:
    """A prior's centres of one partition's buckets (``bucket``, ``round``, ``doc``), or None."""
    if centres is None:
        return None
    return Centres(centres["bucket"], centres["round"], centres["doc"])


def star_start(bk: dict, centres: dict | None, threshold: float, rounds: int, keep_all: bool) -> StarRounds:
    return StarRounds(Buckets(bk["band"], bk["hash"], bk["offsets"], bk["members"]), threshold, rounds, keep_all,
                      forced_centres(bk, centres))


def star_propose(state: StarRounds):
    src, dst = state.propose()
    return state, {"src": src, "dst": dst}


def star_accept(state: StarRounds, scored: dict) -> StarRounds:
    state.accept(scored["sim"])
    return state


def star_open(state: StarRounds) -> dict:
    return {"open": int(not state.done)}


def star_outputs(state: StarRounds):
    """(verified, scored, centres) frames of one partition: edges ``src``, ``dst``, ``sim`` and the centres
    of rounds >= 1 as ``band``, ``hash``, ``round``, ``doc``."""
    res = state.result()
    b = state.b
    xp = state.xp
    c = res.centres
    return ({"src": res.verified.src, "dst": res.verified.dst, "sim": res.verified.similarity},
            {"src": res.scored.src, "dst": res.scored.dst, "sim": res.scored.similarity},
            {"band": b.band[c.bucket].astype(xp.int32), "hash": b.hash[c.bucket], "round": c.round, "doc": c.doc})


def unique_edges(part: dict) -> dict:
    """Edges of one partition (every copy of a pair is there) once each, sorted by (src, dst)."""
    return distinct_pairs(part, "src", "dst")


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def pair_count(pairs: dict) -> dict:
    """The pairs (``src``, ``dst``) one partition asks to score."""
    return {"pairs": int(pairs["src"].shape[0])}


def edge_counts(scored: dict, verified: dict) -> dict:
    return {"scored": int(scored["src"].shape[0]), "verified": int(verified["src"].shape[0])}
