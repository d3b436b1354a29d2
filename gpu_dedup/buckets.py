"""Buckets (shuffle) and candidate edges (reduce).

``buckets`` groups documents by (band, band hash) and keeps only buckets with
two or more members, as CSR arrays.  ``edges`` turns each bucket into a star
around its smallest member: a bucket of ``k`` documents costs ``k - 1`` edges,
never ``k * (k - 1) / 2``, so a boilerplate bucket of 10 M documents costs
10 M edges.  Edges found in several bands are emitted once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Buckets:
    """Multi-member buckets: members of bucket ``i`` are ``members[offsets[i]:offsets[i+1]]``
    (ascending); ``band[i]`` and ``hash[i]`` name the bucket."""

    band: np.ndarray  # int32
    hash: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len = buckets + 1
    members: np.ndarray  # int64 document indices

    def __len__(self) -> int:
        return self.band.shape[0]

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def to_frame(self):
        """Long frame (band, band_hash, doc), one row per bucket membership."""
        import pandas as pd

        sizes = self.sizes
        return pd.DataFrame(
            {"band": np.repeat(self.band, sizes), "band_hash": np.repeat(self.hash, sizes), "doc": self.members}
        )


@dataclass(frozen=True)
class Edges:
    src: np.ndarray  # int64, src < dst
    dst: np.ndarray
    similarity: np.ndarray | None = None  # float64 once verified

    def __len__(self) -> int:
        return self.src.shape[0]

    def to_frame(self):
        import pandas as pd

        cols = {"src": self.src, "dst": self.dst}
        if self.similarity is not None:
            cols["similarity"] = self.similarity
        return pd.DataFrame(cols)


def group_buckets(band: np.ndarray, hashes: np.ndarray, doc: np.ndarray, min_size: int = 2) -> Buckets:
    """Group a long frame (band, band hash, doc) into buckets of at least ``min_size`` members.

    The one grouping implementation: the single-process stage calls it per
    band, the Dask path per shuffle partition.  Members ascend inside a bucket
    and buckets are ordered by (band, hash), whatever the input order.
    """
    n = doc.shape[0]
    if n == 0:
        return Buckets(np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(1, np.int64), np.zeros(0, np.int64))
    order = np.lexsort((doc, hashes, band))
    b, h, d = band[order], hashes[order], doc[order]
    start = np.ones(n, bool)
    start[1:] = (h[1:] != h[:-1]) | (b[1:] != b[:-1])
    starts = np.flatnonzero(start)
    run = np.diff(np.append(starts, n))
    multi = run >= min_size
    sizes = run[multi]
    offsets = np.zeros(sizes.shape[0] + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return Buckets(b[starts[multi]].astype(np.int32), h[starts[multi]].astype(np.uint64), offsets,
                   d[np.repeat(multi, run)].astype(np.int64))


def concat_buckets(parts: list) -> Buckets:
    parts = [p for p in parts if len(p)]
    if not parts:
        return group_buckets(np.zeros(0, np.int32), np.zeros(0, np.uint64), np.zeros(0, np.int64))
    sizes = np.concatenate([p.sizes for p in parts])
    offsets = np.zeros(sizes.shape[0] + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return Buckets(np.concatenate([p.band for p in parts]), np.concatenate([p.hash for p in parts]), offsets,
                   np.concatenate([p.members for p in parts]))


def buckets(band_hashes: np.ndarray) -> Buckets:
    """Group rows of an (n, bands) band-hash matrix by (band, hash); drop singletons."""
    n, num_bands = band_hashes.shape
    doc = np.arange(n, dtype=np.int64)
    parts = [  # one sort per band (bounded memory): O(bands) Python steps, not O(documents)
        group_buckets(np.full(n, band, np.int32), band_hashes[:, band], doc) for band in range(num_bands)
    ]
    return concat_buckets(parts)


def unique_pairs(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct (src, dst) pairs sorted by (src, dst)."""
    if src.shape[0] == 0:
        return src.astype(np.int64), dst.astype(np.int64)
    if max(int(src.max()), int(dst.max())) < 2**31:  # pack both into one sortable key
        key = np.unique((src.astype(np.int64) << 32) | dst.astype(np.int64))
        return key >> 32, key & 0xFFFFFFFF
    order = np.lexsort((dst, src))
    s, d = src[order], dst[order]
    keep = np.ones(s.shape[0], bool)
    keep[1:] = (s[1:] != s[:-1]) | (d[1:] != d[:-1])
    return s[keep].astype(np.int64), d[keep].astype(np.int64)


def edges(b: Buckets) -> Edges:
    """Star edges (smallest member -> every other member) of every bucket, deduplicated."""
    sizes = b.sizes
    if sizes.shape[0] == 0:
        e = np.zeros(0, np.int64)
        return Edges(e, e)
    centers = np.repeat(b.members[b.offsets[:-1]], sizes - 1)
    not_center = np.ones(b.members.shape[0], bool)
    not_center[b.offsets[:-1]] = False
    src, dst = unique_pairs(centers, b.members[not_center])
    return Edges(src, dst)


@dataclass(frozen=True)
class Centres:
    """Centres chosen by :func:`star_rounds` at rounds >= 1: bucket index, round, document."""

    bucket: np.ndarray
    round: np.ndarray
    doc: np.ndarray


def star_rounds(b: Buckets, similarity, threshold: float, rounds: int = 1, keep_all: bool = False,
                forced: Centres | None = None):
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
    (verification ``none``).  Returns (verified Edges, pairs scored, Centres
    chosen among the members at rounds >= 1).
    """
    extra = forced.doc if forced is not None else np.zeros(0, np.int64)
    nodes = np.unique(np.concatenate([b.members, extra]))  # dense ids: a pair packs into one int64
    local = np.searchsorted(nodes, b.members)
    member_bucket = np.repeat(np.arange(len(b), dtype=np.int64), b.sizes)
    open_ = np.ones(local.shape[0], bool)
    keys = np.zeros(0, np.int64)  # scored pairs (small << 32 | large), sorted
    sims = np.zeros(0, np.float64)
    rec_b, rec_r, rec_d = [], [], []
    for r in range(max(rounds, 1)):  # a few rounds of array steps
        fc = np.full(len(b), -1, np.int64)
        if forced is not None:
            at = forced.round == r
            fc[forced.bucket[at]] = np.searchsorted(nodes, forced.doc[at])
        idx = np.flatnonzero(open_)
        if idx.shape[0] == 0:
            break
        bk = member_bucket[idx]
        first = np.r_[True, bk[1:] != bk[:-1]]
        group_first = idx[first]
        gb = member_bucket[group_first]
        own = fc[gb] < 0  # buckets whose centre is their smallest open member
        if r > 0:
            rec_b.append(gb[own])
            rec_r.append(np.full(int(own.sum()), r, np.int64))
            rec_d.append(nodes[local[group_first[own]]])
        centre = np.where(own, local[group_first], fc[gb])[np.cumsum(first) - 1]
        is_centre = first & own[np.cumsum(first) - 1]
        src, dst = centre[~is_centre], local[idx[~is_centre]]
        open_[idx[is_centre]] = False
        if src.shape[0] == 0:
            continue
        pk = (np.minimum(src, dst) << 32) | np.maximum(src, dst)
        uniq = np.unique(pk)
        unseen = uniq[~np.isin(uniq, keys)]
        if unseen.shape[0]:
            s = similarity(nodes[unseen >> 32], nodes[unseen & 0xFFFFFFFF])
            keys, sims = np.r_[keys, unseen], np.r_[sims, s]
            order = np.argsort(keys, kind="stable")
            keys, sims = keys[order], sims[order]
        accepted = keep_all | (sims[np.searchsorted(keys, pk)] >= threshold)
        open_[idx[~is_centre][accepted]] = False
    keep = np.ones(sims.shape[0], bool) if keep_all else sims >= threshold
    cat = (lambda xs: np.concatenate(xs).astype(np.int64)) if rec_b else (lambda xs: np.zeros(0, np.int64))
    centres = Centres(cat(rec_b), cat(rec_r), cat(rec_d))
    return Edges(nodes[keys[keep] >> 32], nodes[keys[keep] & 0xFFFFFFFF], sims[keep]), int(keys.shape[0]), centres
