"""Which band hashes can be in a bucket of two or more rows (Numba, parallel over bands).

Most rows of a corpus share none of their band hashes with another row: they
are in no candidate bucket.  ``maybe_shared`` finds the rows that *can* share
one, without sorting: per band, each hash picks one bit of a bitmap of
``2**log2_slots`` bits (Fibonacci hashing of the 64-bit hash, so band hashes
with few significant bits still spread); a first pass marks the bits hit once
and twice, a second reads back whether a row's bit was hit twice.  Rows with
equal hashes always share their bit, so every member of a bucket of two or more
rows is marked; a row whose bit another hash hit by chance is marked too (with
``32 * rows`` bits, about 3 % of the singletons), which costs only time: the
caller groups the marked rows by sorting and drops the runs of one.

The two bitmaps are sized from the rows of one call (8 MiB per band at 10^6
rows); each thread holds those of the band it works on.  The slots are
computed first for all bands, as a (bands, rows) uint32 matrix (4 bytes a
band hash, freed on return).  The result is ``(bands, rows)``: one contiguous
row of flags per band, so threads write apart.
"""

import numba
import numpy as np
from numba import prange

FIBONACCI = np.uint64(0x9E3779B97F4A7C15)  # 2**64 / golden ratio: spreads every input bit to the top bits
SLOTS_PER_ROW = 32  # bitmap bits per row (a power of two)
MAX_BITS = 32  # slots are uint32: past 2**27 rows a call gets fewer bits per row (more rows marked, same result)
ROW_BLOCK = 2048  # rows per task of the slot pass


def log2_slots(rows: int) -> int:
    """Bitmap size (log2 of its bits) for ``rows`` rows: SLOTS_PER_ROW bits a row, between 2**12 and 2**MAX_BITS."""
    return min(MAX_BITS, max(12, int(rows * SLOTS_PER_ROW - 1).bit_length()))


@numba.njit(parallel=True, cache=True)
def _maybe_shared(band_hashes, bits):
    n, nb = band_hashes.shape
    out = np.zeros((nb, n), np.bool_)
    words = (1 << bits) >> 6
    shift = np.uint64(64 - bits)
    six, low, one = np.uint64(6), np.uint64(63), np.uint64(1)
    # every row's bitmap slot in each band, as (bands, rows): the (rows, bands) input is read once, by row
    # blocks, rather than once per band down a strided column
    slots = np.empty((nb, n), np.uint32)
    for c in prange((n + ROW_BLOCK - 1) // ROW_BLOCK):
        for i in range(c * ROW_BLOCK, min(n, (c + 1) * ROW_BLOCK)):
            for j in range(nb):
                slots[j, i] = np.uint32((band_hashes[i, j] * FIBONACCI) >> shift)
    for j in prange(nb):
        once = np.zeros(words, np.uint64)
        twice = np.zeros(words, np.uint64)
        col = slots[j]
        for i in range(n):
            s = np.uint64(col[i])
            w = s >> six
            bit = one << (s & low)
            if once[w] & bit:
                twice[w] |= bit
            else:
                once[w] |= bit
        flags = out[j]
        for i in range(n):
            s = np.uint64(col[i])
            flags[i] = (twice[s >> six] & (one << (s & low))) != 0
    return out


def maybe_shared(band_hashes: np.ndarray) -> np.ndarray:
    """(bands, rows) bool: ``out[j, i]`` is False only where row ``i``'s hash in band ``j`` is no other row's
    hash in band ``j`` (see the module doc).  ``band_hashes``: (rows, bands) uint64."""
    bh = np.ascontiguousarray(band_hashes, dtype=np.uint64)
    return _maybe_shared(bh, log2_slots(bh.shape[0]))


def host_threads() -> int:
    """Threads the host's array work may use at once: Numba's (``NUMBA_NUM_THREADS``, else every core)."""
    return max(1, numba.get_num_threads())
