"""Signature estimates of Jaccard similarity stay within the binomial bound."""

import math

import numpy as np
import pytest

from gpu_dedup.config import MinHashConfig
from gpu_dedup.evaluation.sample import vocabulary
from gpu_dedup.stages.minhash import estimate_jaccard, signatures
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


@pytest.mark.parametrize("seed", [42, 7])
@pytest.mark.parametrize("shingle,n", [("word", 3), ("char", 5)])
def test_estimates_within_binomial_bound(shingle, n, seed):
    """Each signature value agrees with probability J, independently of the others: the errors are
    within the binomial bound, unbiased, and their spread is the binomial one (correlated
    permutations would inflate it)."""
    cfg = MinHashConfig(num_perm=256, shingle=shingle, ngram=n, seed=seed)
    pairs = _pairs(k=80, seed=seed)
    texts = [t for p in pairs for t in p]
    sig = signatures(texts, cfg).values
    assert sig.dtype == np.uint32
    errors, z2 = [], []
    for i, (a, b) in enumerate(pairs):
        j = ref.jaccard(a, b, shingle, n)
        est = estimate_jaccard(sig[2 * i], sig[2 * i + 1])
        var = max(j * (1 - j), 1e-4) / cfg.num_perm
        bound = 4.5 * math.sqrt(var) + 1e-9
        assert abs(est - j) <= bound, (i, j, est)
        errors.append(est - j)
        if 0.05 < j < 0.95:
            z2.append((est - j) ** 2 / var)
    assert abs(np.mean(errors)) < 0.02  # unbiased on average
    assert len(z2) > 40 and 0.5 < np.mean(z2) < 1.6, np.mean(z2)  # binomial spread: mean z**2 near 1


def test_identical_and_disjoint():
    cfg = MinHashConfig(num_perm=64)
    sig = signatures(["a b c d e f g", "a b c d e f g", "h i j k l m n"], cfg).values
    assert estimate_jaccard(sig[0], sig[1]) == 1.0
    assert estimate_jaccard(sig[0], sig[2]) == 0.0
