"""Signatures stage (map): shingles -> shingle hash -> num_perm permutations -> min.

The kernel reads the Arrow string buffers (offsets + UTF-8 bytes) directly;
the math is specified in ``kernels/hash_scalar.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from gpu_dedup.backends import get_backend
from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import MinHashConfig
from gpu_dedup.kernels.params import hash_params


@dataclass(frozen=True)
class Signatures:
    values: np.ndarray  # (documents, permutations) uint32
    shingles: np.ndarray  # shingles per document (with repeats); 0: no shingle, the row is all SENTINEL (2**32 - 1)

    def __len__(self) -> int:
        return self.values.shape[0]


def signatures(texts, cfg: MinHashConfig = MinHashConfig(), *, num_perm: int | None = None, docs=None,
               backend="cpu") -> Signatures:
    """MinHash signatures of ``texts`` (Arrow/pandas/list of str; normalize first).

    ``docs`` restricts the work to those row indices (rows of the result follow
    ``docs``); ``num_perm`` computes only the first permutations (a prefix of
    the full signature).
    """
    params = hash_params(cfg.seed, cfg.num_perm)
    buffers = texts if hasattr(texts, "offsets") else string_buffers(texts)
    values, counts = get_backend(backend).minhash(buffers, params, cfg.shingle, cfg.ngram, num_perm, docs)
    return Signatures(values, counts)


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> float:
    """Fraction of equal signature values: an unbiased estimate of the Jaccard similarity."""
    return float(np.mean(np.asarray(sig_a) == np.asarray(sig_b)))
