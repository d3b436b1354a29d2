"""Host-side hash parameters: every random constant derives from ``seed``.

The draw order is part of the specification (see ``kernels/scalar.py``):
splitmix64(seed) yields, in order, the shingle base, the word base, the band
base and the two exact-hash bases (each ``2 + z mod (P61 - 3)``), then for
each permutation ``i`` the pair ``a_i = 1 + z mod (P - 1)``, ``b_i = z mod P``
with ``P = 2**61 - 1`` (64-bit mode) or ``2**31 - 1`` (32-bit mode).  The first
``k`` permutations of a longer signature equal a ``k``-permutation signature.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

P61 = (1 << 61) - 1
P31 = (1 << 31) - 1
MASK64 = (1 << 64) - 1


def splitmix64(seed: int):
    state = seed & MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


@dataclass(frozen=True)
class HashParams:
    seed: int
    num_perm: int
    hash_bits: int
    shingle_base: int
    word_base: int
    band_base: int
    exact_base1: int
    exact_base2: int
    a: np.ndarray
    b: np.ndarray

    @property
    def prime(self) -> int:
        return P61 if self.hash_bits == 64 else P31

    def shingle_base_pow(self, n: int) -> int:
        """shingle_base ** (n - 1) mod P61, the rolling-hash factor of the leaving token."""
        return pow(self.shingle_base, n - 1, P61)

    @property
    def signature_dtype(self):
        return np.uint64 if self.hash_bits == 64 else np.uint32


@lru_cache(maxsize=64)
def hash_params(seed: int, num_perm: int, hash_bits: int = 64) -> HashParams:
    rng = splitmix64(seed)
    bases = [2 + next(rng) % (P61 - 3) for _ in range(5)]
    prime = P61 if hash_bits == 64 else P31
    a = np.empty(num_perm, np.uint64)
    b = np.empty(num_perm, np.uint64)
    for i in range(num_perm):
        a[i] = 1 + next(rng) % (prime - 1)
        b[i] = next(rng) % prime
    a.setflags(write=False)
    b.setflags(write=False)
    return HashParams(seed, num_perm, hash_bits, *bases, a, b)
