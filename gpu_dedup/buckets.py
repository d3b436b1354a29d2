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


def group_buckets(band: np.ndarray, hashes: np.ndarray, doc: np.ndarray) -> Buckets:
    """Group a long frame (band, band hash, doc) into multi-member buckets.

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
    multi = run > 1
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
