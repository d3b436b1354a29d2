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
import time

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


def first_touch_seconds(nbytes: int = 512 << 20) -> dict:
    """Seconds to write one byte in every 4 KiB of ``nbytes`` of fresh memory, as NumPy's array (huge pages
    where the kernel gives them) and as :func:`small_pages`.  Both arrays stay alive until both are timed, so
    neither is handed memory the other has just freed."""
    out, held = {}, []
    for name, make in (("numpy", lambda: np.empty(nbytes, np.uint8)), ("small_pages", lambda: small_pages(nbytes))):
        a = make()
        t = time.perf_counter()
        a[::4096] = 1
        out[name] = round(time.perf_counter() - t, 4)
        held.append(a)
    return out


def host_memory() -> dict:
    """What decides the cost of fresh host memory here: the kernel's transparent huge page settings, whether it
    reports free pages to a hypervisor (``page_reporting`` on its command line), whether it runs under one, and
    :func:`first_touch_seconds` of 512 MiB.  Linux; elsewhere the fields it cannot read are left out."""
    info: dict = {}
    for key, path in (("thp_enabled", "/sys/kernel/mm/transparent_hugepage/enabled"),
                      ("thp_defrag", "/sys/kernel/mm/transparent_hugepage/defrag")):
        try:
            with open(path) as f:
                info[key] = f.read().strip()
        except OSError:
            pass
    try:
        with open("/proc/cmdline") as f:
            info["free_page_reporting"] = "page_reporting" in f.read()
        with open("/proc/cpuinfo") as f:
            info["hypervisor"] = " hypervisor" in f.read(1 << 16)
    except OSError:
        pass
    info["first_touch_512mib_seconds"] = first_touch_seconds(512 << 20)
    return info
