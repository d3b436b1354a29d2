"""Frame helpers shared by the stages (see gpu_dedup/stages/frames.py)."""

import numpy as np

from gpu_dedup.stages.frames import distinct_pairs


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
