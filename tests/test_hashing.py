"""Golden values: they pin the hashing specification.

The integers below were computed once with the independent oracle
``tests/reference.py``.  Both the oracle and the package must reproduce them;
any change of parameter derivation, tokenization, shingling, finalizer,
permutation, band hash or exact key fails here loudly.  Do not update these
numbers unless the specification is changed on purpose (a format break:
signatures computed before and after are no longer comparable).
"""

import numpy as np
import pytest

from gpu_dedup.hashing import P31, P61, hash_params, splitmix64
from tests import reference as ref

SEED = 42
TEXT = "the quick brown fox jumps over the lazy dog"

BASES = {
    "shingle_base": 2150242486686805675,
    "word_base": 643983082913198345,
    "band_base": 527597730035375964,
    "exact_base1": 1737512041830867870,
    "exact_base2": 701532786141963252,
}

PERMS = {
    64: {
        "a": [2180923070380825363, 933993271705612209, 2185608355395893175, 2176516313820057797],
        "b": [1723021703563930974, 1658934859185094103, 1473928642212600256, 247114729376335594],
    },
    32: {
        "a": [898736893, 1383532395, 584242329, 1038645503],
        "b": [889863062, 961081028, 1615068756, 102375931],
    },
}

# (kind, n, hash_bits) -> (signature with num_perm=8, band hashes with bands=2, rows=4)
SIGNATURES = {
    ("word", 3, 64): (
        [188635023704212584, 38671569736620146, 307618950872166296, 161330421220742431,
         97890121227605844, 119777134958515265, 159262111479414606, 19256568291694223],
        [1824654585364160147, 2235670407114340505],
    ),
    ("char", 5, 64): (
        [30186013455822820, 18290903619371424, 107472293576734569, 16874741779398519,
         39132180698380680, 120126615109786618, 28913485303710919, 23116320332911461],
        [1419538711386525833, 1247593846205051607],
    ),
    ("word", 3, 32): (
        [298119429, 590245152, 148203903, 25354129, 184550076, 6295062, 57233144, 76131985],
        [434758339906633455, 2060640350689444612],
    ),
    ("char", 5, 32): (
        [118847116, 24882169, 71401200, 88828005, 9286325, 652814, 8029143, 20243381],
        [567646318740996818, 1317201569554488063],
    ),
}
SHINGLE_COUNTS = {"word": 7, "char": 39}

EXACT_HELLO = (11, 1443440855190204210, 1962062571396569126)

FINALIZE = {0: 0, 1: 1960437387343774615, (1 << 61) - 2: 850565348747735939}


def test_constants():
    assert P61 == ref.P61 == 2**61 - 1
    assert P31 == ref.P31 == 2**31 - 1


def test_splitmix64_first_outputs():
    # Reference splitmix64 stream (Vigna) for seed 0; independent of gpu_dedup.
    rng = splitmix64(0)
    assert [next(rng) for _ in range(3)] == [
        0xE220A8397B1DCDAF,
        0x6E789E6AA1B965F4,
        0x06C45D188009454F,
    ]


@pytest.mark.parametrize("bits", [64, 32])
def test_golden_params_reference(bits):
    p = ref.params(SEED, 8, bits)
    for name, value in BASES.items():
        assert p[name] == value, name
    assert p["a"][:4] == PERMS[bits]["a"]
    assert p["b"][:4] == PERMS[bits]["b"]


@pytest.mark.parametrize("bits", [64, 32])
def test_golden_params_package(bits):
    hp = hash_params(SEED, 8, bits)
    for name, value in BASES.items():
        assert getattr(hp, name) == value, name
    assert [int(x) for x in hp.a[:4]] == PERMS[bits]["a"]
    assert [int(x) for x in hp.b[:4]] == PERMS[bits]["b"]
    assert hp.a.dtype == np.uint64 and hp.b.dtype == np.uint64
    assert hp.prime == (P61 if bits == 64 else P31)
    assert hp.signature_dtype == (np.uint64 if bits == 64 else np.uint32)


@pytest.mark.parametrize("bits", [64, 32])
def test_package_params_match_reference(bits):
    for seed in (0, 1, SEED, 2**63 + 5, 2**64 - 1):
        p = ref.params(seed, 33, bits)
        hp = hash_params(seed, 33, bits)
        for name in BASES:
            assert getattr(hp, name) == p[name]
        assert [int(x) for x in hp.a] == p["a"]
        assert [int(x) for x in hp.b] == p["b"]
        prime = P61 if bits == 64 else P31
        assert all(1 <= a < prime for a in p["a"])
        assert all(0 <= b < prime for b in p["b"])
        assert all(2 <= p[name] < P61 for name in BASES)


def test_params_prefix_property():
    long = ref.params(SEED, 64)
    short = ref.params(SEED, 5)
    assert long["a"][:5] == short["a"] and long["b"][:5] == short["b"]
    hl, hs = hash_params(SEED, 64), hash_params(SEED, 5)
    assert np.array_equal(hl.a[:5], hs.a) and np.array_equal(hl.b[:5], hs.b)


def test_golden_finalize():
    for x, y in FINALIZE.items():
        assert ref.finalize61(x) == y


@pytest.mark.parametrize(("kind", "n", "bits"), list(SIGNATURES))
def test_golden_signature_reference(kind, n, bits):
    sig, bands = SIGNATURES[(kind, n, bits)]
    p = ref.params(SEED, 8, bits)
    assert ref.signature(TEXT, kind, n, p) == sig
    assert ref.band_hashes(sig, 2, 4, p["band_base"]) == bands
    assert len(ref.shingle_values(TEXT, kind, n, p)) == SHINGLE_COUNTS[kind]


@pytest.mark.parametrize(("kind", "n", "bits"), list(SIGNATURES))
def test_golden_signature_package(kind, n, bits, cpu_backend):
    from gpu_dedup.strings import string_buffers

    sig, bands = SIGNATURES[(kind, n, bits)]
    hp = hash_params(SEED, 8, bits)
    out, counts = cpu_backend.minhash(string_buffers([TEXT]), hp, kind, n)
    assert out.dtype == hp.signature_dtype
    assert out[0].tolist() == sig
    assert counts.tolist() == [SHINGLE_COUNTS[kind]]
    bh = cpu_backend.band_hashes(out, 2, 4, hp.band_base)
    assert bh.dtype == np.uint64
    assert bh[0].tolist() == bands


def test_golden_exact_key():
    p = ref.params(SEED, 8)
    assert ref.exact_key(b"hello world", p) == EXACT_HELLO


def test_golden_exact_key_package(cpu_backend):
    from gpu_dedup.strings import string_buffers

    hp = hash_params(SEED, 8)
    out = cpu_backend.exact_hashes(string_buffers(["hello world"]), hp.exact_base1, hp.exact_base2)
    assert out.tolist() == [list(EXACT_HELLO[1:])]
