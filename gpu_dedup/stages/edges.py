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

from gpu_dedup.backends import array_module, to_host
from gpu_dedup.stages.buckets import Buckets


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
        key = xp.unique((src << 32) | dst)
        return key >> 32, key & 0xFFFFFFFF
    order = xp.argsort(dst, kind="stable")
    order = order[xp.argsort(src[order], kind="stable")]
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
    (verification ``none``).
    """
    xp = array_module(b.members)
    extra = forced.doc if forced is not None else xp.zeros(0, dtype=xp.int64)
    nodes = xp.unique(xp.concatenate((b.members, xp.asarray(extra, dtype=xp.int64))))  # dense ids: a pair packs
    local = xp.searchsorted(nodes, b.members)  # into one int64
    member_bucket = b.member_bucket
    open_ = xp.ones(local.shape[0], dtype=bool)
    keys = xp.zeros(0, dtype=xp.int64)  # scored pairs (small << 32 | large), sorted
    sims = xp.zeros(0, dtype=xp.float64)
    rec_b, rec_r, rec_d = [], [], []
    for r in range(max(rounds, 1)):  # a few rounds of array steps
        fc = xp.full(len(b), -1, dtype=xp.int64)
        if forced is not None:
            at = forced.round == r
            fc[forced.bucket[at]] = xp.searchsorted(nodes, forced.doc[at])
        idx = xp.flatnonzero(open_)
        if idx.shape[0] == 0:
            break
        bk = member_bucket[idx]
        first = xp.ones(idx.shape[0], dtype=bool)
        first[1:] = bk[1:] != bk[:-1]
        group = xp.cumsum(first) - 1
        group_first = idx[first]
        gb = member_bucket[group_first]
        own = fc[gb] < 0  # buckets whose centre is their smallest open member
        if r > 0:
            rec_b.append(gb[own])
            rec_r.append(xp.full(int(own.sum()), r, dtype=xp.int64))
            rec_d.append(nodes[local[group_first[own]]])
        centre = xp.where(own, local[group_first], fc[gb])[group]
        is_centre = first & own[group]
        src, dst = centre[~is_centre], local[idx[~is_centre]]
        open_[idx[is_centre]] = False
        if src.shape[0] == 0:
            continue
        pk = (xp.minimum(src, dst) << 32) | xp.maximum(src, dst)
        uniq = xp.unique(pk)
        unseen = uniq[~xp.isin(uniq, keys)]
        if unseen.shape[0]:
            s = xp.asarray(similarity(nodes[unseen >> 32], nodes[unseen & 0xFFFFFFFF]), dtype=xp.float64)
            keys, sims = xp.concatenate((keys, unseen)), xp.concatenate((sims, s))
            order = xp.argsort(keys, kind="stable")
            keys, sims = keys[order], sims[order]
        accepted = keep_all | (sims[xp.searchsorted(keys, pk)] >= threshold)
        open_[idx[~is_centre][accepted]] = False
    keep = xp.ones(sims.shape[0], dtype=bool) if keep_all else sims >= threshold

    def cat(xs):
        return xp.concatenate(xs).astype(xp.int64) if xs else xp.zeros(0, dtype=xp.int64)

    src_all, dst_all = nodes[keys >> 32], nodes[keys & 0xFFFFFFFF]
    return StarResult(Edges(src_all[keep], dst_all[keep], sims[keep]), Edges(src_all, dst_all, sims),
                      Centres(cat(rec_b), cat(rec_r), cat(rec_d)))
