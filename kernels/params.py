"""Host-side hash parameters: every random constant derives from ``seed``.

Hash family v2 (specified in ``kernels/hash_scalar.py``).  The draw order is part
of the specification: splitmix64(seed) yields, in order,

1. ``shingle_base``, ``word_base``, ``band_base``: each ``(z & ~7) | 5``
   (odd, ``= 5 mod 8``);
2. ``exact_seed1``, ``exact_seed2``: ``z`` itself;
3. for each permutation ``i``: one ``z`` gives ``a_i = (z & 0xFFFFFFFF) | 1``
   and ``b_i = z >> 32`` (both 32-bit).

The first ``k`` permutations of a longer signature therefore equal a
``k``-permutation signature.  Signature values are always uint32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

HASH_FAMILY = 2  # bump on any change of the hash math: persisted indexes and checkpoints carry it
HASH_FAMILY_NAME = "v2-mix64-poly64-affine32"  # token mixer, shingle polynomial, permutation family
SIGNATURE_BITS = 32
SIGNATURE_DTYPE = np.uint32
SENTINEL = (1 << 32) - 1  # signature value of a document without shingles
MASK64 = (1 << 64) - 1


def splitmix64(seed: int):
    state = seed & MASK64
    while True:
        state = (state + 0x9E3779B97F4A7C15) & MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        yield z ^ (z >> 31)


def _base(z: int) -> int:
    return (z & ~7 & MASK64) | 5


@dataclass(frozen=True)
class HashParams:
    seed: int
    num_perm: int
    shingle_base: int
    word_base: int
    band_base: int
    exact_seed1: int
    exact_seed2: int
    a: np.ndarray  # uint32, odd
    b: np.ndarray  # uint32

    hash_bits = SIGNATURE_BITS  # read-only: family v2 has 32-bit signature values only
    signature_dtype = SIGNATURE_DTYPE
    sentinel = SENTINEL
    family = HASH_FAMILY

    def shingle_base_pow(self, n: int) -> int:
        """shingle_base ** (n - 1) mod 2**64, the rolling-hash factor of the leaving token."""
        return pow(self.shingle_base, max(n - 1, 0), 1 << 64)

    @property
    def word_base2(self) -> int:
        """word_base ** 2 mod 2**64 (the second 8-byte chunk of a word)."""
        return self.word_base * self.word_base & MASK64


@lru_cache(maxsize=64)
def hash_params(seed: int, num_perm: int, hash_bits: int = SIGNATURE_BITS) -> HashParams:
    """Hash constants of family v2 for ``seed`` and ``num_perm`` permutations.

    ``hash_bits`` is accepted for callers that pass ``cfg.minhash.hash_bits``;
    it must be 32 (the signature width of the family).
    """
    if hash_bits != SIGNATURE_BITS:
        raise ValueError(f"hash_bits = {hash_bits!r}: hash family v2 has {SIGNATURE_BITS}-bit signature values only; "
                         "drop the argument")
    rng = splitmix64(seed)
    shingle_base, word_base, band_base = (_base(next(rng)) for _ in range(3))
    exact_seed1, exact_seed2 = next(rng), next(rng)
    a = np.empty(num_perm, np.uint32)
    b = np.empty(num_perm, np.uint32)
    for i in range(num_perm):
        z = next(rng)
        a[i] = (z & 0xFFFFFFFF) | 1
        b[i] = z >> 32
    a.setflags(write=False)
    b.setflags(write=False)
    return HashParams(seed, num_perm, shingle_base, word_base, band_base, exact_seed1, exact_seed2, a, b)
