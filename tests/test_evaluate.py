import itertools

import numpy as np

from gpu_dedup.evaluate import cluster_pairs, pair_precision, pair_recall


def test_cluster_pairs_equal_brute_force():
    rng = np.random.default_rng(0)
    labels = rng.integers(-1, 15, 120)
    left, right = cluster_pairs(labels, ignore=-1)
    brute = {(i, j) for i, j in itertools.combinations(range(120), 2) if labels[i] == labels[j] != -1}
    assert set(zip(left.tolist(), right.tolist())) == brute and len(left) == len(brute)


def test_recall_and_precision():
    truth = np.array([0, 0, 0, 1, 1, -1])
    pred = np.array([0, 0, 2, 3, 3, 5])
    left, right = cluster_pairs(truth, ignore=-1)
    assert pair_recall(pred, left, right) == 2 / 4
    assert pair_precision(pred, truth, ignore=-1) == 1.0
    assert pair_precision(np.array([0, 0, 0, 0, 4, 4]), truth, ignore=-1) == 3 / 7
