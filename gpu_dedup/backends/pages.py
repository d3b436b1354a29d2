"""Host arrays on the system's small pages.

NumPy asks the kernel for transparent huge pages for every large array.  Where a virtual machine hands the
memory its guest frees back to the host (free page reporting, as on Firecracker), the first touch of each
fresh huge page waits on the host: on such a 2-core machine, touching 1.6 GB of fresh huge pages took
3.2-3.5 s of system time, against 0.5 s for the same bytes in small pages, and 0.2 s for huge pages that the
process had touched before.  Large buffers that are written once and then read in order gain nothing from
huge pages (their page walks are few and prefetched), so they are mapped here; arrays read at random keep
NumPy's huge pages, which pay there (verify's set lookups took 20 % longer without them).
"""

from __future__ import annotations

import mmap

import numpy as np


def small_pages(n: int, dtype=np.uint8) -> np.ndarray:
    """An uninitialized array of ``n`` items on a private anonymous mapping of small pages (its pages are
    allocated as they are first written, like ``np.empty``'s); freed when the last view of it goes."""
    dtype = np.dtype(dtype)
    size = int(n) * dtype.itemsize
    if size == 0:
        return np.empty(int(n), dtype)
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):  # Linux: small pages even where the kernel gives huge ones unasked
        m.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(m, dtype)

