"""One pass of a least-significant-digit radix sort on the host (Numba, parallel over slices of the rows).

``radix_pass`` moves ``(value, row)`` pairs from ``src`` to ``dst`` by the digit ``(value >> shift) & mask``:
each thread counts the digits of its slice of the rows, one exclusive prefix over (digit, slice) gives every
slice its place in every digit's run, and each thread then writes its slice's pairs in order.  Equal digits keep
their order (the slices are in row order and each is read in order), so passes from the lowest digit up sort
stably.  ``hist`` is scratch of (slices, mask + 1) counts.  Values alone move as their own rows, into one
destination (each place then written twice with one value).
"""

import numba
import numpy as np
from numba import prange


@numba.njit(parallel=True, cache=True)
def _places(src_v, shift, mask, bounds, hist):
    """Each slice's first place in each digit's run (``hist[slice, digit]``): counts, then one exclusive prefix."""
    slices = bounds.shape[0] - 1
    for t in prange(slices):
        h = hist[t]
        h[:] = 0
        for j in range(bounds[t], bounds[t + 1]):
            h[(np.uint64(src_v[j]) >> shift) & mask] += 1
    total = 0
    for d in range(hist.shape[1]):
        for t in range(slices):
            c = hist[t, d]
            hist[t, d] = total
            total += c


@numba.njit(parallel=True, cache=True)
def radix_pass(src_v, src_i, dst_v, dst_i, shift, mask, bounds, hist):
    """(value, row) pairs from ``src`` to ``dst`` by the digit ``(value >> shift) & mask`` (uint64 scalars)."""
    _places(src_v, shift, mask, bounds, hist)
    for t in prange(bounds.shape[0] - 1):
        h = hist[t]
        for j in range(bounds[t], bounds[t + 1]):
            v = src_v[j]
            d = (np.uint64(v) >> shift) & mask
            p = h[d]
            dst_v[p] = v
            dst_i[p] = src_i[j]
            h[d] = p + 1
