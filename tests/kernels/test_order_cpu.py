"""kernels/order_cpu.py: one radix pass moves rows stably by one digit, over any number of slices."""

import numpy as np
import pytest

from gpu_dedup.kernels.order_cpu import radix_pass


@pytest.mark.parametrize("slices", [1, 3, 7])
@pytest.mark.parametrize("dtype", [np.uint32, np.uint64])
def test_a_pass_orders_by_its_digit_and_keeps_equal_digits_in_row_order(slices, dtype):
    rng = np.random.default_rng(slices)
    v = rng.integers(0, 1 << 20, 1000).astype(dtype)
    rows = np.arange(1000, dtype=np.uint32)
    bounds = np.linspace(0, 1000, slices + 1).astype(np.int64)
    hist = np.empty((slices, 1 << 6), np.int64)
    shift, mask = np.uint64(5), np.uint64((1 << 6) - 1)
    dv, dr = np.empty_like(v), np.empty_like(rows)
    radix_pass(v, rows, dv, dr, shift, mask, bounds, hist)
    digit = (v.astype(np.uint64) >> shift) & mask
    want = np.argsort(digit, kind="stable")
    assert np.array_equal(dr, want) and np.array_equal(dv, v[want])
    only = np.empty_like(v)
    radix_pass(v, v, only, only, shift, mask, bounds, hist)  # values alone: their own rows, one destination
    assert np.array_equal(only, v[want])
