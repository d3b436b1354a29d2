"""Buckets (shuffle): documents grouped by (band, band hash).

``group_buckets`` groups a long frame (band, band hash, doc) and keeps the
buckets with at least ``min_size`` members, as CSR arrays; ``buckets`` does it
for an (n, bands) band-hash matrix, one band at a time.  Both are array code
of their inputs' module (NumPy on the CPU backend, CuPy on the GPU backend):
stable sorts and run boundaries, no Python loop over documents.  The Dask
executor calls ``group_buckets`` on every shuffle partition.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from gpu_dedup.backends import ByArrays, array_module, stable_order, to_host
from gpu_dedup.kernels.buckets_cpu import host_threads, maybe_shared


@dataclass(frozen=True)
class Buckets:
    """Multi-member buckets: members of bucket ``i`` are ``members[offsets[i]:offsets[i+1]]``
    (ascending); ``band[i]`` and ``hash[i]`` name the bucket.  Arrays of one module (NumPy or CuPy)."""

    band: np.ndarray  # int32
    hash: np.ndarray  # uint64
    offsets: np.ndarray  # int64, len = buckets + 1
    members: np.ndarray  # int64 document indices

    def __len__(self) -> int:
        return self.band.shape[0]

    @property
    def sizes(self):
        return self.offsets[1:] - self.offsets[:-1]

    @property
    def member_bucket(self):
        """Bucket index of every membership."""
        return _MEMBER_BUCKET.pick(array_module(self.offsets))(self.offsets, self.members.shape[0])

    def to_frame(self):
        """Long frame (band, band_hash, doc), one row per bucket membership (pandas, host memory)."""
        import pandas as pd


        mb = to_host(self.member_bucket)
        return pd.DataFrame({"band": to_host(self.band)[mb], "band_hash": to_host(self.hash)[mb],
                             "doc": to_host(self.members)})


def _member_bucket_lines(offsets, m: int):
    xp = array_module(offsets)
    return xp.searchsorted(offsets[1:], xp.arange(m, dtype=xp.int64), side="right")


def _member_bucket_host(offsets, m: int):
    """Each bucket's number repeated by its size: one pass, where a search per membership costs 10x more."""
    return np.repeat(np.arange(offsets.shape[0] - 1, dtype=np.int64), np.diff(offsets))


_MEMBER_BUCKET = ByArrays(_member_bucket_lines, host=_member_bucket_host)


def empty_buckets(xp=np) -> Buckets:
    return Buckets(xp.zeros(0, dtype=xp.int32), xp.zeros(0, dtype=xp.uint64), xp.zeros(1, dtype=xp.int64),
                   xp.zeros(0, dtype=xp.int64))


def _runs(xp, band, hashes, doc, min_size: int) -> Buckets:
    """Buckets of (band, hash, doc) rows already sorted by (band, hash, doc)."""
    n = doc.shape[0]
    start = xp.ones(n, dtype=bool)
    start[1:] = (hashes[1:] != hashes[:-1]) | (band[1:] != band[:-1])
    starts = xp.flatnonzero(start)
    run = xp.diff(xp.concatenate((starts, xp.asarray([n], dtype=starts.dtype))))
    multi = run >= min_size
    sizes = run[multi]
    offsets = xp.zeros(sizes.shape[0] + 1, dtype=xp.int64)
    offsets[1:] = xp.cumsum(sizes)
    in_multi = multi[xp.cumsum(start) - 1]
    return Buckets(band[starts[multi]].astype(xp.int32), hashes[starts[multi]].astype(xp.uint64), offsets,
                   doc[in_multi].astype(xp.int64))


BAND_MIX = np.uint64(0xD6E8FEB86659FD93)  # an odd constant: the band number spread over the key's bits


def group_buckets(band, hashes, doc, min_size: int = 2) -> Buckets:
    """Group a long frame (band, band hash, doc) into buckets of at least ``min_size`` members.

    Members ascend inside a bucket and buckets are ordered by (band, hash),
    whatever the input order.
    """
    xp = array_module(band, hashes, doc)
    if doc.shape[0] == 0:
        return empty_buckets(xp)
    if min_size >= 2:  # on the host, only rows whose (band, hash) another row may share are sorted
        band, hashes, doc = _SHARED_ROWS.pick(xp)(band, hashes, doc)
    order = stable_order(band, hashes, doc)
    return _runs(xp, band[order], hashes[order], doc[order], min_size)


def _shared_rows_host(band, hashes, doc) -> tuple:
    """The rows whose (band, hash) another row may share (a bitmap pass, kernels/buckets_cpu.py)."""
    key = hashes.astype(np.uint64) ^ (band.astype(np.uint64) * BAND_MIX)  # equal pairs, equal keys
    keep = np.flatnonzero(maybe_shared(key.reshape(-1, 1))[0])
    return band[keep], hashes[keep], doc[keep]


def _all_rows(*arrays) -> tuple:
    return arrays


def _no_bitmap(band_hashes) -> None:
    return None


# the host's bitmap pass before the sorts; a GPU sorts every row at once
_SHARED_ROWS = ByArrays(_all_rows, host=_shared_rows_host)
_SHARED_BANDS = ByArrays(_no_bitmap, host=maybe_shared)
_BAND_THREADS = ByArrays(lambda: 1, host=host_threads)  # the bands sorted at once: a GPU sorts one after another


def concat_buckets(parts: list) -> Buckets:
    """Buckets of several parts, one after another (the parts' module; NumPy when there are none)."""
    xp = array_module(parts[0].members) if parts else np
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_buckets(xp)
    sizes = xp.concatenate([p.sizes for p in parts])
    offsets = xp.zeros(sizes.shape[0] + 1, dtype=xp.int64)
    offsets[1:] = xp.cumsum(sizes)
    return Buckets(xp.concatenate([p.band for p in parts]), xp.concatenate([p.hash for p in parts]), offsets,
                   xp.concatenate([p.members for p in parts]))


def buckets(band_hashes, docs=None, min_size: int = 2) -> Buckets:
    """Group rows of an (n, bands) band-hash matrix by (band, hash); drop buckets below ``min_size``.

    ``docs``: the document number of each row (ascending; default: the row).
    One stable sort per band (bounded memory): O(bands) steps, not O(documents); on the host only of the
    rows that can share the band's hash with another row (:func:`maybe_shared`), when ``min_size`` >= 2.
    """
    xp = array_module(band_hashes)
    n, num_bands = band_hashes.shape
    doc = xp.arange(n, dtype=xp.int64) if docs is None else xp.asarray(docs, dtype=xp.int64)
    if n == 0:
        return empty_buckets(xp)
    # on the host, rows sharing no band hash with another row are dropped before the sorts (a bitmap pass per
    # band, kernels/buckets_cpu.py): they make no bucket of ``min_size`` >= 2; a GPU sorts them all at once
    shared = _SHARED_BANDS.pick(xp)(band_hashes) if min_size >= 2 else None

    def one_band(band: int) -> Buckets:
        col, d = band_hashes[:, band], doc
        if shared is not None:
            keep = np.flatnonzero(shared[band])
            col, d = col[keep], d[keep]
        order = xp.argsort(col, kind="stable")  # rows ascend, so members ascend within a bucket
        return _runs(xp, xp.full(col.shape[0], band, dtype=xp.int32), col[order], d[order], min_size)

    # a band a core: NumPy's sort of one band's 64-bit hashes beside the others' (it releases the GIL) beats the
    # radix sort's passes of every one in turn (stable_order: 0.76-1.19 s against 0.46-0.73 s for 10^6 rows of
    # 16 bands on 2 cores); the radix sort's Numba threads may not run from several threads at once
    threads = min(_BAND_THREADS.pick(xp)(), num_bands)
    if threads > 1:
        with ThreadPoolExecutor(threads) as pool:
            parts = list(pool.map(one_band, range(num_bands)))  # in band order
    else:
        parts = [one_band(band) for band in range(num_bands)]  # one sort per band
    return concat_buckets(parts) if any(len(p) for p in parts) else empty_buckets(xp)


# ---------------------------------------------------------------------------- partition functions


def long_frame(part: dict, first_doc: int = 0, bands: tuple | None = None) -> dict:
    """A block's band hashes as the long frame ``band``, ``hash``, ``doc`` (one row per band of each row
    with a signature; ``doc = first_doc + row``): the rows the buckets shuffle moves.  ``bands``: only the
    bands ``lo <= band < hi`` (one round of :func:`band_rounds`)."""
    bh = part["band_hashes"]
    xp = array_module(bh)
    lo, hi = bands if bands is not None else (0, bh.shape[1])
    bh = bh[:, lo:hi]
    nb = hi - lo
    rows = part["lsh_row"]
    return {"band": xp.tile(xp.arange(lo, hi, dtype=xp.int32), rows.shape[0]), "hash": bh.reshape(-1),
            "doc": xp.repeat(rows + first_doc, nb)}


def band_rounds(bands: int, blocks: int, workers: int) -> list:
    """The bands ``(lo, hi)`` of each round of the buckets shuffle: as many rounds as a worker holds blocks
    (at most one a band), so that a round moves about ``bands`` band hashes for each row of one block per
    worker, whatever the corpus size, rather than every band hash of the worker's share at once.  Each
    partition's buckets of the rounds, concatenated in round order, are the buckets of one round: they are
    ordered by (band, hash) and every row's partition depends only on its (band, hash)."""
    rounds = max(1, min(bands, -(-blocks // max(1, workers))))
    edges = [bands * r // rounds for r in range(rounds + 1)]
    return [(edges[r], edges[r + 1]) for r in range(rounds)]


def bucket_dest(frame: dict, n: int):
    """The partition of each row of a long frame: its band hash (already a 64-bit hash) salted by its band,
    modulo ``n``, so every member of a bucket meets in one partition (one pass: the generic
    :func:`~gpu_dedup.stages.frames.hash_dest` mixes both columns twice)."""
    h = frame["hash"]
    xp = array_module(h)
    if n == 1:
        return xp.zeros(h.shape[0], dtype=xp.int64)
    salted = h.view(xp.uint64) ^ (frame["band"].astype(xp.uint64) * xp.uint64(0x9E3779B97F4A7C15))
    return (salted % xp.uint64(n)).astype(xp.int64)


def bucket_part(part: dict, min_size: int, first_doc: int = 0) -> dict:
    """Buckets of one partition with at least ``min_size`` members, as the CSR arrays of
    :class:`Buckets` (``band``, ``hash``, ``offsets``, ``members``: doc numbers).  ``part`` is a block of
    band hashes (``lsh_row``, ``band_hashes``: one process, grouped band by band) or a long frame that the
    buckets shuffle brought together (every row of a (band, hash) is in one partition)."""
    if "band_hashes" in part:
        bk = buckets(part["band_hashes"], docs=part["lsh_row"] + first_doc, min_size=min_size)
    else:
        bk = group_buckets(part["band"], part["hash"], part["doc"], min_size=min_size)
    return as_dict(bk)


def concat_bucket_parts(*parts: dict) -> dict:
    """One partition's buckets of every round (:func:`band_rounds`), in round order."""
    return as_dict(concat_buckets([from_dict(p) for p in parts]))


def as_dict(bk: Buckets) -> dict:
    return {"band": bk.band, "hash": bk.hash, "offsets": bk.offsets, "members": bk.members}


def from_dict(d: dict) -> Buckets:
    return Buckets(d["band"], d["hash"], d["offsets"], d["members"])


def bucket_sizes(bk: dict) -> dict:
    """Exact size counts of one partition's buckets ({size: count}), for the report."""
    sizes = to_host(bk["offsets"][1:] - bk["offsets"][:-1])
    values, counts = np.unique(sizes, return_counts=True)
    return {int(v): int(c) for v, c in zip(values, counts)}


# ---------------------------------------------------------------------------- per part, for the stage sequence
# (one part each: run/sequence.py maps them over the executor's parts; a Dask worker runs them)


def bucket_centres(bk: dict, prior) -> dict | None:
    """The prior's centres of one partition's buckets (None without a prior)."""
    if not prior.active:
        return None
    xp = array_module(bk["members"])
    q, r, d = prior.bucket_centres(to_host(bk["band"]), to_host(bk["hash"]))
    return {"bucket": xp.asarray(q, dtype=xp.int64), "round": xp.asarray(r, dtype=xp.int64),
            "doc": xp.asarray(d, dtype=xp.int64)}


def bucket_counts(bk: dict, centres: dict | None) -> dict:
    xp = array_module(bk["members"])
    sizes = bk["offsets"][1:] - bk["offsets"][:-1]
    candidate = sizes > 1
    if centres is not None:  # a bucket with one new document counts when the index has a centre for it
        candidate |= xp.isin(xp.arange(sizes.shape[0]), centres["bucket"])
    return {"buckets": int(sizes.shape[0]), "memberships": int(bk["members"].shape[0]),
            "candidate_buckets": int(candidate.sum())}
