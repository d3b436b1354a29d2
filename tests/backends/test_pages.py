"""Host arrays on small pages: what np.empty gives, on a mapping that asks for no huge pages."""

import mmap
import os

import numpy as np
import pytest

from gpu_dedup.backends.pages import small_pages


def _mapping_fields(address: int) -> dict:
    """The /proc/self/smaps fields of the mapping that holds ``address``."""
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if "-" in head[0] and ":" not in head[0]:  # a mapping's first line: its address range
                lo, hi = (int(x, 16) for x in head[0].split("-"))
                if inside:
                    break
                inside = lo <= address < hi
            elif inside:
                fields[head[0].rstrip(":")] = head[1]
    return fields


@pytest.mark.parametrize("dtype", [np.uint8, np.int64, np.uint64])
def test_an_array_of_the_asked_length_and_type_that_holds_what_is_written(dtype):
    a = small_pages(1_000_003, dtype)
    assert a.dtype == dtype and a.shape == (1_000_003,) and a.flags.writeable and a.flags.c_contiguous
    a[:] = np.arange(a.shape[0]).astype(dtype)
    b = small_pages(1_000_003, dtype)
    b[:] = 7
    assert np.array_equal(a, np.arange(a.shape[0]).astype(dtype)) and (b == 7).all()
    base = a.base
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.obj if isinstance(base, memoryview) else base.base
    assert isinstance(base, mmap.mmap)


def test_no_items_is_an_empty_array():
    a = small_pages(0, np.int64)
    assert a.shape == (0,) and a.dtype == np.int64


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or not hasattr(mmap, "MADV_NOHUGEPAGE"),
                    reason="Linux's smaps and madvise tell whether a mapping may take huge pages")
def test_the_mapping_takes_no_huge_pages():
    a = small_pages(64 << 20)
    a[:] = 1
    fields = _mapping_fields(a.ctypes.data + a.nbytes // 2)
    assert fields, "the array's mapping is in smaps"
    assert int(fields["Rss"]) >= 60 << 10  # kB: the pages written are there
    assert fields.get("AnonHugePages", "0") == "0"
    if "THPeligible" in fields:
        assert fields["THPeligible"] == "0"

