"""The host's radix sort: stable orders and sorted copies of integer keys (``backends.stable_order``,
``backends.sorted_copy``, which every stage groups rows with).

NumPy's stable sort of 64-bit values is a merge sort (1.8 s for 1.3 x 10^7 values on 2 cores, 2026-11-30) and its
plain sort a quicksort (0.9 s); a least-significant-digit radix sort (``kernels/order_cpu.py``: parallel passes
of up to 11 bits) takes 0.1 to 0.4 s, and only over the bits that vary: each key is taken relative to its
smallest value, and keys whose varying bits add up to 64 or fewer are packed into one value and sorted at once
(into 32-bit values where they fit); more keys are sorted one after another, the least significant first.
(A device's sorts are CuPy's radix sorts already.)

It needs 24 bytes a row of scratch (two buffers of values and two of 32-bit row numbers) beside 8 for each key's
offsets: it sorts from ``RADIX_MIN`` rows up where that fits a quarter of the memory available, integer and
boolean keys, one thread at a time; :func:`order` and :func:`sort` return None otherwise, and the caller sorts
with NumPy, with the same result.
"""

from __future__ import annotations

import threading

import numpy as np

RADIX_MIN = 1 << 16  # rows from which the host sorts by radix
DIGIT_BITS = 11  # the widest digit of a pass (2,048 counts a slice: they stay in the core's cache)
SIGN = np.uint64(1 << 63)
# one radix sort at a time: Numba's default thread pool (workqueue) may not be entered from two threads at once,
# so a sort asked for while another thread sorts (a thread pool's task) takes NumPy's, with the same result
_RADIX = threading.Lock()


def order(keys, available) -> np.ndarray | None:
    """The stable order (int64) of the rows by ``keys`` (NumPy arrays, ``keys[0]`` most significant), or None
    where this sort does not take them; ``available()``: the bytes of memory available now."""
    n = int(keys[0].shape[0])
    if not _fits(keys, n, available) or not _RADIX.acquire(blocking=False):
        return None
    try:
        return _order(keys, n)
    finally:
        _RADIX.release()


def sort(a: np.ndarray, available) -> np.ndarray | None:
    """The values of ``a`` ascending, or None where this sort does not take them (see :func:`order`)."""
    if not _fits((a,), int(a.shape[0]), available) or not _RADIX.acquire(blocking=False):
        return None
    try:
        return _sorted(a)
    finally:
        _RADIX.release()


# ---------------------------------------------------------------------------- the host's radix sort


def _fits(keys, n: int, available) -> bool:
    if n < RADIX_MIN or n >= 1 << 32:
        return False
    if not all(k.dtype.kind in "biu" and k.dtype.itemsize <= 8 for k in keys):
        return False
    return (24 + 8 * len(keys)) * n <= available() // 4  # the keys' offsets, and the sort's buffers


def _digits(key) -> tuple[np.ndarray, int, np.uint64]:
    """(offsets, bits, low): the key as uint64 values relative to its smallest (order kept: a signed key's sign
    bit flipped first), how many bits they take, and the smallest (to give the values back)."""
    if key.dtype.kind == "i":
        u = np.ascontiguousarray(key).astype(np.int64, copy=False).view(np.uint64) ^ SIGN  # a new array
    else:
        u = np.array(key, dtype=np.uint64)  # a copy
    low = u.min()
    bits = int(u.max() - low).bit_length()
    u -= low
    return u, bits, low


def _slices(n: int) -> np.ndarray:
    import numba

    slices = max(1, min(int(numba.get_num_threads()), n // 4096 or 1))
    return np.linspace(0, n, slices + 1).astype(np.int64)


def _passes(bits: int) -> list[tuple[int, int]]:
    """(shift, width) of each pass over ``bits`` bits, the widths even and at most DIGIT_BITS."""
    if bits == 0:
        return []
    count = -(-bits // DIGIT_BITS)
    width = -(-bits // count)
    return [(s, min(width, bits - s)) for s in range(0, bits, width)]


def _narrow(v: np.ndarray, bits: int) -> np.ndarray:
    return v.astype(np.uint32) if bits <= 32 else v


def _radix(v: np.ndarray, rows: np.ndarray | None, bits: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``v`` and ``rows`` (None: the values alone) reordered by ``v``, stably: the radix passes over its ``bits``
    low bits.  The values alone move as their own rows, into one buffer (each place written twice, one value)."""
    from gpu_dedup.kernels.order_cpu import radix_pass

    passes = _passes(bits)
    if not passes:
        return v, rows
    bounds = _slices(v.shape[0])
    hist = np.empty((bounds.shape[0] - 1, 1 << max(w for _, w in passes)), np.int64)
    v2 = np.empty_like(v)
    r2 = v2 if rows is None else np.empty_like(rows)
    for shift, width in passes:
        src, dst = (v, v2) if rows is None else (rows, r2)
        radix_pass(v, src, v2, dst, np.uint64(shift), np.uint64((1 << width) - 1), bounds, hist)
        v, v2 = v2, v
        if rows is not None:
            rows, r2 = r2, rows
    return v, rows


def _order(keys, n: int) -> np.ndarray:
    digits = [_digits(k)[:2] for k in keys]
    rows = np.arange(n, dtype=np.uint32)
    total = sum(b for _, b in digits)
    if total <= 64:  # one packed value: the first key in the highest bits
        packed = np.zeros(n, np.uint64)
        for v, b in digits:
            if b:
                packed <<= np.uint64(b)
                packed |= v
        digits.clear()  # their memory goes back before the sort's buffers are made
        rows = _radix(_narrow(packed, total), rows, total)[1]
    else:  # from the least significant key up, each sort stable
        for i, (v, b) in enumerate(reversed(digits)):
            v = v if i == 0 else v[rows]
            rows = _radix(_narrow(v, b), rows, b)[1]
    return rows.astype(np.int64)


def _sorted(a: np.ndarray) -> np.ndarray:
    v, bits, low = _digits(a)
    v = _radix(_narrow(v, bits), None, bits)[0]
    u = v.astype(np.uint64, copy=False)
    u += low
    if a.dtype.kind == "i":
        u ^= SIGN
        return u.view(np.int64).astype(a.dtype, copy=False)
    return u.astype(a.dtype, copy=False)


def warm() -> None:
    """Load (or compile) the radix pass with the argument types a run gives it."""
    from gpu_dedup.kernels.order_cpu import radix_pass

    bounds, hist = np.array([0, 2], np.int64), np.zeros((1, 2), np.int64)
    shift, mask = np.uint64(0), np.uint64(1)
    for dtype in (np.uint32, np.uint64):
        v = np.array([1, 0], dtype)
        for rows in (np.arange(2, dtype=np.uint32), v):  # (value, row) pairs; values alone
            radix_pass(v, rows, np.empty_like(v), np.empty_like(rows), shift, mask, bounds, hist)
