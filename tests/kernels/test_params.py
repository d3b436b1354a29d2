"""Golden values: they pin the hashing specification (hash family v2).

The integers below were computed once with the independent oracle
``tests/reference.py``.  Both the oracle and the package must reproduce them;
any change of parameter derivation, tokenization, shingling, mixer,
permutation, band hash or exact key fails here loudly.  Do not update these
numbers unless the specification is changed on purpose (a format break:
signatures computed before and after are no longer comparable), and then bump
``HASH_FAMILY`` in ``kernels/params.py`` in the same change.
"""

import numpy as np
import pytest
from gpu_dedup.kernels.params import (
    HASH_FAMILY,
    HASH_FAMILY_NAME,
    SENTINEL,
    hash_params,
    splitmix64,
)

from tests import reference as ref

SEED = 42
TEXT = "the quick brown fox jumps over the lazy dog"

BASES = {
    "shingle_base": 13679457532755275413,
    "word_base": 2949826092126892293,
    "band_base": 5139283748462763861,
    "exact_seed1": 6349198060258255764,
    "exact_seed2": 701532786141963250,
}

PERMS = {
    "a": [1015077639, 1161260381, 2661167013, 188579285],
    "b": [3729011194, 938043164, 3438687726, 1459992695],
}

# (kind, n) -> (signature with num_perm=8, band hashes with bands=2, rows=4, shingles, first two shingle values)
SIGNATURES = {
    ("word", 3): (
        [713690690, 84379262, 35119632, 525018731, 884743502, 236861696, 197352644, 31494687],
        [13195954651846488609, 5992493307376542385], 7, [8014125622318982160, 11005120502342345601],
    ),
    ("char", 5): (
        [104992777, 217874336, 90897498, 81089043, 92985647, 40462926, 141080111, 18772125],
        [4058588333269688201, 17520351020931434634], 39, [9323798352783505314, 18429500841033572321],
    ),
    ("word", 5): (
        [610203156, 317310343, 546599949, 1439133005, 1333136933, 1196241255, 24809703, 1998451790],
        [6968862030032936075, 17718360044851073477], 5, [8801799641372189118, 17531658374771729913],
    ),
    ("char", 24): (
        [7359211, 417747798, 98223250, 78814140, 195903877, 914871705, 331156492, 203339541],
        [7074773786335077357, 12285832656633798249], 20, [5641813525609213840, 10937411867178125330],
    ),
}

EXACT_HELLO = (11, 3870718487133624701, 9069684078955326264)
TOKENS = {"quick": 3585400855952381861, "q": 17515028648514699091}  # word token, char token


def test_family_version():
    assert HASH_FAMILY == 2 and HASH_FAMILY_NAME.startswith("v2")
    assert SENTINEL == ref.SENTINEL == 2**32 - 1


def test_splitmix64_first_outputs():
    # Reference splitmix64 stream (Vigna) for seed 0; independent of gpu_dedup.
    rng = splitmix64(0)
    assert [next(rng) for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


def test_golden_params_reference():
    p = ref.params(SEED, 8)
    for name, value in BASES.items():
        assert p[name] == value, name
    assert p["a"][:4] == PERMS["a"]
    assert p["b"][:4] == PERMS["b"]


def test_golden_params_package():
    hp = hash_params(SEED, 8)
    for name, value in BASES.items():
        assert getattr(hp, name) == value, name
    assert [int(x) for x in hp.a[:4]] == PERMS["a"]
    assert [int(x) for x in hp.b[:4]] == PERMS["b"]
    assert hp.a.dtype == np.uint32 and hp.b.dtype == np.uint32
    assert hp.signature_dtype == np.uint32 and hp.hash_bits == 32 and hp.sentinel == 2**32 - 1
    assert hp.word_base2 == BASES["word_base"] ** 2 % 2**64
    assert hp.shingle_base_pow(5) == pow(BASES["shingle_base"], 4, 2**64) and hp.shingle_base_pow(1) == 1


def test_hash_bits_other_than_32_is_refused():
    assert np.array_equal(hash_params(SEED, 8, 32).a, hash_params(SEED, 8).a)
    with pytest.raises(ValueError, match="32-bit"):
        hash_params(SEED, 8, 64)


def test_package_params_match_reference():
    for seed in (0, 1, SEED, 2**63 + 5, 2**64 - 1):
        p = ref.params(seed, 33)
        hp = hash_params(seed, 33)
        for name in BASES:
            assert getattr(hp, name) == p[name]
        assert [int(x) for x in hp.a] == p["a"]
        assert [int(x) for x in hp.b] == p["b"]
        assert all(a % 2 == 1 and a < 2**32 for a in p["a"])
        assert all(0 <= b < 2**32 for b in p["b"])
        assert all(p[name] % 8 == 5 for name in ("shingle_base", "word_base", "band_base"))


def test_params_prefix_property():
    long = ref.params(SEED, 64)
    short = ref.params(SEED, 5)
    assert long["a"][:5] == short["a"] and long["b"][:5] == short["b"]
    hl, hs = hash_params(SEED, 64), hash_params(SEED, 5)
    assert np.array_equal(hl.a[:5], hs.a) and np.array_equal(hl.b[:5], hs.b)


def test_golden_tokens():
    p = ref.params(SEED, 8)
    assert ref.word_hash("quick", p["word_base"]) == TOKENS["quick"]
    assert ref.tokens("q", "char") == [TOKENS["q"]]


@pytest.mark.parametrize(("kind", "n"), list(SIGNATURES))
def test_golden_signature_reference(kind, n):
    sig, bands, count, first = SIGNATURES[(kind, n)]
    p = ref.params(SEED, 8)
    assert ref.signature(TEXT, kind, n, p) == sig
    assert ref.band_hashes(sig, 2, 4, p["band_base"]) == bands
    values = ref.shingle_values(TEXT, kind, n, p)
    assert len(values) == count and values[:2] == first


@pytest.mark.parametrize(("kind", "n"), list(SIGNATURES))
def test_golden_signature_package(kind, n, cpu_backend):
    from gpu_dedup.backends.strings import string_buffers

    sig, bands, count, first = SIGNATURES[(kind, n)]
    hp = hash_params(SEED, 8)
    out, counts = cpu_backend.minhash(string_buffers([TEXT]), hp, kind, n)
    assert out.dtype == np.uint32
    assert out[0].tolist() == sig
    assert counts.tolist() == [count]
    bh = cpu_backend.band_hashes(out, 2, 4, hp.band_base)
    assert bh.dtype == np.uint64
    assert bh[0].tolist() == bands
    offsets, values = cpu_backend.shingle_sets(string_buffers([TEXT]), hp, kind, n)
    assert set(first) <= set(values.tolist())


def test_golden_exact_key():
    p = ref.params(SEED, 8)
    assert ref.exact_key(b"hello world", p) == EXACT_HELLO


def test_golden_exact_key_package(cpu_backend):
    from gpu_dedup.backends.strings import string_buffers

    hp = hash_params(SEED, 8)
    out = cpu_backend.exact_hashes(string_buffers(["hello world"]), hp.exact_seed1, hp.exact_seed2)
    assert out.tolist() == [list(EXACT_HELLO[1:])]
