"""Signatures stage (map): shingles -> shingle hash -> num_perm permutations -> min.

The kernel reads the Arrow string buffers (offsets + UTF-8 bytes) directly;
the math is specified in ``kernels/scalar.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .backend import get_backend
from .config import MinHashConfig
from .hashing import hash_params
from .strings import string_buffers


@dataclass(frozen=True)
class Signatures:
    values: np.ndarray  # (documents, permutations): uint64 (64-bit mode) or uint32 (32-bit mode)
    shingles: np.ndarray  # shingles per document (with repeats); 0: empty, signature is all sentinel

    def __len__(self) -> int:
        return self.values.shape[0]


def signatures(texts, cfg: MinHashConfig = MinHashConfig(), *, num_perm: int | None = None, docs=None,
               backend="cpu") -> Signatures:
    """MinHash signatures of ``texts`` (Arrow/pandas/list of str; normalize first).

    ``docs`` restricts the work to those row indices (rows of the result follow
    ``docs``); ``num_perm`` computes only the first permutations (a prefix of
    the full signature).
    """
    params = hash_params(cfg.seed, cfg.num_perm, cfg.hash_bits)
    buffers = texts if hasattr(texts, "offsets") else string_buffers(texts)
    values, counts = get_backend(backend).minhash(buffers, params, cfg.shingle, cfg.ngram, num_perm, docs)
    return Signatures(values, counts)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of equal signature values: an unbiased estimate of the Jaccard similarity."""
    return float(np.mean(np.asarray(sig_a) == np.asarray(sig_b)))
