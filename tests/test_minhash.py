"""Signature estimates of Jaccard similarity stay within the binomial bound."""

import math

import numpy as np
import pytest

from gpu_dedup.config import MinHashConfig
from gpu_dedup.minhash import estimate_jaccard, signatures
from gpu_dedup.sample import vocabulary
from tests import reference as ref


def _pairs(k=40, seed=0):
    rng = np.random.default_rng(seed)
    words = [w.decode() for w in vocabulary(3000, seed)]
    out = []
    for _ in range(k):
        base = [words[i] for i in rng.integers(0, len(words), 300)]
        other = list(base)
        rate = rng.uniform(0, 0.3)
        for j in np.flatnonzero(rng.random(300) < rate):
            other[j] = words[rng.integers(0, len(words))]
        out.append((" ".join(base), " ".join(other)))
    return out


@pytest.mark.parametrize("bits", [64, 32])
@pytest.mark.parametrize("shingle,n", [("word", 3), ("char", 5)])
def test_estimates_within_binomial_bound(bits, shingle, n):
    cfg = MinHashConfig(num_perm=256, shingle=shingle, ngram=n, hash_bits=bits)
    pairs = _pairs()
    texts = [t for p in pairs for t in p]
    sig = signatures(texts, cfg).values
    errors = []
    for i, (a, b) in enumerate(pairs):
        j = ref.jaccard(a, b, shingle, n)
        est = estimate_jaccard(sig[2 * i], sig[2 * i + 1])
        bound = 4.5 * math.sqrt(max(j * (1 - j), 1e-4) / cfg.num_perm) + 1e-9
        assert abs(est - j) <= bound, (i, j, est)
        errors.append(est - j)
    assert abs(np.mean(errors)) < 0.02  # unbiased on average


def test_identical_and_disjoint():
    cfg = MinHashConfig(num_perm=64)
    sig = signatures(["a b c d e f g", "a b c d e f g", "h i j k l m n"], cfg).values
    assert estimate_jaccard(sig[0], sig[1]) == 1.0
    assert estimate_jaccard(sig[0], sig[2]) == 0.0
