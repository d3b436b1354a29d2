"""Evaluation helpers: pairs from cluster labels, recall and precision against a truth.

Pairs are enumerated per distinct cluster size (a handful of NumPy steps),
never per document.
"""

from __future__ import annotations

import numpy as np


def cluster_pairs(labels, ignore=None, max_pairs: int = 50_000_000):
    """All (i, j), i < j, with labels[i] == labels[j]; rows labelled ``ignore`` are skipped."""
    labels = np.asarray(labels)
    idx = np.arange(labels.shape[0]) if ignore is None else np.flatnonzero(labels != ignore)
    if idx.shape[0] == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = idx[np.argsort(labels[idx], kind="stable")]
    sl = labels[order]
    start = np.flatnonzero(np.r_[True, sl[1:] != sl[:-1]])
    size = np.diff(np.r_[start, order.shape[0]])
    total = int((size * (size - 1) // 2).sum())
    if total > max_pairs:
        raise ValueError(f"{total:,} pairs exceed max_pairs = {max_pairs:,}; evaluate on a sample")
    lefts, rights = [], []
    for m in np.unique(size[size > 1]):  # one step per distinct cluster size
        groups = order[start[size == m][:, None] + np.arange(m)[None, :]]
        a, b = np.triu_indices(int(m), 1)
        lefts.append(groups[:, a].ravel())
        rights.append(groups[:, b].ravel())
    if not lefts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    left, right = np.concatenate(lefts), np.concatenate(rights)
    swap = left > right
    left[swap], right[swap] = right[swap], left[swap]
    return left.astype(np.int64), right.astype(np.int64)


def pair_recall(pred_labels, left, right) -> float:
    """Fraction of the pairs (left, right) that share a predicted label."""
    pred_labels = np.asarray(pred_labels)
    if len(left) == 0:
        return 1.0
    return float(np.mean(pred_labels[left] == pred_labels[right]))


def pair_precision(pred_labels, true_labels, ignore=None) -> float:
    """Fraction of predicted same-cluster pairs that share a true label (``ignore``: no true cluster)."""
    left, right = cluster_pairs(pred_labels)
    if left.shape[0] == 0:
        return 1.0
    t = np.asarray(true_labels)
    ok = t[left] == t[right]
    if ignore is not None:
        ok &= t[left] != ignore
    return float(np.mean(ok))
