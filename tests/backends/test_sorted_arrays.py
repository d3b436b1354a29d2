"""The sort-based array helpers of ``gpu_dedup.backends`` against NumPy's own functions: distinct values,
membership in a sorted array, dense ranks (both of its ways), on NumPy and on the GPU's lines (``fake_cupy``)."""

import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.backends import dense_ranks, distinct, on_device, sorted_in
from tests.fake_cupy import fake_cupy

ints = st.lists(st.integers(0, 60), max_size=80).map(lambda v: np.array(v, dtype=np.int64))


@given(ints)
@settings(max_examples=200, deadline=None)
def test_distinct_is_numpy_unique(a):
    got = distinct(a)
    assert np.array_equal(got, np.unique(a)) and got.dtype == a.dtype


@given(ints, ints)
@settings(max_examples=200, deadline=None)
def test_sorted_in_is_isin(a, keys):
    keys = np.unique(keys)
    assert np.array_equal(sorted_in(a, keys), np.isin(a, keys))


@given(ints, ints)
@settings(max_examples=200, deadline=None)
def test_dense_ranks_of_dense_values(a, extra):
    values, ranks = dense_ranks(a, extra)
    assert np.array_equal(values, np.unique(np.concatenate((a, extra))))
    assert np.array_equal(values[ranks], a) and ranks.dtype == np.int64


@pytest.mark.parametrize("top", [10, 1 << 40])  # a flag per value / a sort (values far apart)
def test_dense_ranks_either_way(top):
    rng = np.random.default_rng(1)
    a = rng.integers(0, top, 5000)
    extra = rng.integers(0, top, 100)
    values, ranks = dense_ranks(a, extra)
    assert np.array_equal(values, np.unique(np.concatenate((a, extra))))
    assert np.array_equal(values[ranks], a)
    assert dense_ranks(a[:0])[0].shape == (0,) and dense_ranks(a[:0])[1].shape == (0,)


def test_the_gpu_lines_give_the_same(monkeypatch):
    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    rng = np.random.default_rng(2)
    a = rng.integers(0, 500, 3000)
    keys = np.unique(rng.integers(0, 500, 200))
    da, dk = cp.asarray(a), cp.asarray(keys)
    got = [distinct(da), sorted_in(da, dk), *dense_ranks(da)]
    assert all(on_device(g) for g in got)  # computed where the arrays are
    d, found, values, ranks = (np.asarray(g) for g in got)
    assert np.array_equal(d, np.unique(a)) and np.array_equal(found, np.isin(a, keys))
    assert np.array_equal(values[ranks], a)
