"""Frame helpers shared by the stages (see gpu_dedup/stages/frames.py)."""

import numpy as np
import pyarrow as pa

from gpu_dedup.backends import radix
from gpu_dedup.stages.frames import distinct_pairs, sort_by


def test_distinct_pairs_keeps_each_pair_once_sorted_with_its_first_row():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 6, 200), rng.integers(0, 6, 200)
    got = distinct_pairs({"src": a, "dst": b, "row": np.arange(200)}, "src", "dst")
    want = sorted(set(zip(a.tolist(), b.tolist())))
    assert list(zip(got["src"].tolist(), got["dst"].tolist())) == want
    first = {}
    for i, pair in enumerate(zip(a.tolist(), b.tolist())):
        first.setdefault(pair, i)
    assert got["row"].tolist() == [first[p] for p in want]  # stable: the first copy of each pair


def test_distinct_pairs_of_nothing_is_nothing():
    empty = {"x": np.zeros(0, np.int64), "y": np.zeros(0, np.int64)}
    assert distinct_pairs(empty, "x", "y") is empty


def test_sort_by_keeps_the_columns_of_rows_in_order_already_and_sorts_the_others():
    """A large frame whose rows are in the keys' order comes back in a new frame of its own columns (no gather);
    one row out of place, and the frame is gathered in the stable order, Arrow columns too."""
    n = radix.RADIX_MIN
    rng = np.random.default_rng(5)
    label = np.sort(rng.integers(0, n // 4, n))
    frame = {"label": label, "node": np.arange(n, dtype=np.int64), "id": pa.array(np.arange(n).astype(str))}
    got = sort_by(frame, "label", "node")
    assert got is not frame and all(got[k] is frame[k] for k in frame)
    swapped = dict(frame, node=frame["node"].copy())
    tie = int(np.flatnonzero(label[1:] == label[:-1])[0])  # two rows of one label
    swapped["node"][[tie, tie + 1]] = swapped["node"][[tie + 1, tie]]
    got = sort_by(swapped, "label", "node")
    order = np.lexsort((swapped["node"], label))
    assert not np.array_equal(order, np.arange(n))
    assert np.array_equal(got["node"], swapped["node"][order]) and got["node"] is not swapped["node"]
    assert got["id"].to_pylist() == frame["id"].take(pa.array(order)).to_pylist()
