"""A star round's pairs, and its answers, on the host in one pass each (Numba, parallel).

A round of :class:`gpu_dedup.stages.edges.StarRounds` pairs every open membership of a bucket with the bucket's
centre: its first open member, or the centre a prior forced on it.  As array code that is a dozen passes over
the round's memberships, each making a new array of them (the centre of each, which are centres, the others,
their pairs, the pairs' smaller and larger ends, the packed key); a round 0 of 1.5 x 10^7 memberships made
about 1.2 GB of temporaries, and on the host each fresh array's pages are faulted in as it is first written.
``star_pairs`` writes only what the round hands on: each compared membership and its packed pair, and which
memberships were centres.  The same pairs in the same order as the array code (the device keeps the array
code: its memory comes from a pool).  ``close_accepted`` takes the round's answers in the same way.
"""

import numba
import numpy as np
from numba import prange


@numba.njit(parallel=True, cache=True)
def star_pairs(idx, starts, member_bucket, local, forced, open_):
    """Group ``k`` of a round: positions ``starts[k]:starts[k + 1]`` of ``idx`` (the round's open memberships,
    sorted; empty: every membership, position = membership), all of one bucket.  Its centre is the bucket's
    ``forced`` one (a local id, >= 0), else its first membership's document (``local``), which is then closed
    in ``open_`` and compared with nothing.  Returns (members, keys, own): the memberships compared with their
    centre, in order, each pair packed as ``min << 32 | max`` of the two local ids, and per group whether its
    centre is its own first membership."""
    whole = idx.shape[0] == 0
    groups = starts.shape[0] - 1
    own = np.empty(groups, np.bool_)
    for k in prange(groups):
        j = starts[k] if whole else idx[starts[k]]
        own[k] = forced[member_bucket[j]] < 0
    before = np.empty(groups, np.int64)  # own centres before group k: output rows skipped
    c = 0
    for k in range(groups):
        before[k] = c
        c += own[k]
    total = starts[groups] - starts[0] - c
    members = np.empty(total, np.int64)
    keys = np.empty(total, np.int64)
    for k in prange(groups):
        s, e = starts[k], starts[k + 1]
        j0 = s if whole else idx[s]
        if own[k]:
            centre = local[j0]
            open_[j0] = False
            s_cmp = s + 1
        else:
            centre = forced[member_bucket[j0]]
            s_cmp = s
        p = s - starts[0] - before[k]
        for i in range(s_cmp, e):
            j = i if whole else idx[i]
            d = local[j]
            members[p] = j
            keys[p] = (min(centre, d) << 32) | max(centre, d)
            p += 1
    return members, keys, own


@numba.njit(parallel=True, cache=True)
def close_accepted(keys, sims, pk, members, threshold, keep_all, open_, nodes):
    """A round's answers taken in: membership ``members[i]`` is closed in ``open_`` when its pair ``pk[i]`` (one of
    ``keys``, the sorted pairs scored so far, whose similarities are ``sims``) reaches ``threshold`` (every one
    with ``keep_all``).  What ``open_[members[sims[searchsorted(keys, pk)] >= threshold]] = False`` does, without
    its four arrays of the round's memberships, and without a binary search over all the keys for each: a pair's
    smaller end (its top 32 bits, a local id below ``nodes``) picks the run of keys that share it, counted first,
    and the search is within that run (a few keys: the pairs of one centre)."""
    if keep_all:
        for i in prange(pk.shape[0]):
            open_[members[i]] = False
        return
    n = keys.shape[0]
    first = np.zeros(nodes + 1, np.int64)  # first[v]: the first key whose smaller end is v or more
    for k in range(n):
        first[(keys[k] >> 32) + 1] += 1
    for v in range(nodes):
        first[v + 1] += first[v]
    for i in prange(pk.shape[0]):
        x = pk[i]
        lo, hi = first[x >> 32], first[(x >> 32) + 1]
        while lo < hi:  # the first key >= x in the run (x is one of them)
            mid = (lo + hi) >> 1
            if keys[mid] < x:
                lo = mid + 1
            else:
                hi = mid
        if lo < n and keys[lo] == x and sims[lo] >= threshold:
            open_[members[i]] = False


def warm() -> None:
    """Load (or compile) the kernels with a run's argument types."""
    i64 = np.zeros(0, np.int64)
    open_ = np.ones(2, np.bool_)
    members, keys, _ = star_pairs(i64, np.array([0, 2], np.int64), np.zeros(2, np.int64), np.array([0, 1], np.int64),
                                  np.full(1, -1, np.int64), open_)
    close_accepted(keys, np.ones(1), keys, members, 0.5, False, open_, 2)
