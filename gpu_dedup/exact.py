"""Exact-duplicate stage: documents whose normalized text is byte-identical.

Each document gets a key (byte length, two independent 61-bit polynomial
hashes); documents with equal keys form a group and the group's
representative is its best-ranked member.  Only representatives go on to the
MinHash stages; the others follow their representative's cluster.
"""

from __future__ import annotations

import numpy as np

from .backend import get_backend
from .hashing import hash_params
from .strings import string_buffers


def exact_keys(texts, seed: int = 42, backend="cpu") -> np.ndarray:
    """(n, 3) uint64 keys: byte length, hash 1, hash 2."""
    params = hash_params(seed, 0)
    buffers = texts if hasattr(texts, "offsets") else string_buffers(texts)
    hashes = get_backend(backend).exact_hashes(buffers, params.exact_base1, params.exact_base2)
    return np.column_stack([buffers.lengths.astype(np.uint64), hashes])


def exact_groups(keys: np.ndarray, ranks: np.ndarray, eligible: np.ndarray | None = None) -> np.ndarray:
    """Representative of every document: the best-ranked document with the same key.

    Documents outside ``eligible`` (e.g. null texts) represent themselves.
    """
    n = keys.shape[0]
    rep = np.arange(n, dtype=np.int64)
    idx = rep if eligible is None else np.flatnonzero(eligible)
    if idx.shape[0] < 2:
        return rep
    k = keys[idx]
    order = np.lexsort((ranks[idx], k[:, 2], k[:, 1], k[:, 0]))
    sk = k[order]
    new_group = np.ones(order.shape[0], bool)
    new_group[1:] = np.any(sk[1:] != sk[:-1], axis=1)
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(order.shape[0]), 0))
    rep[idx[order]] = idx[order[group_start]]
    return rep
