"""The direct (position-parallel) shingle functions the GPU kernels use, on the CPU.

``char_start`` / ``word_start`` / ``shingle_at`` let every thread decide on its
own whether a token starts at its byte and hash that shingle without the
rolling state of the CPU loop.  Here they are checked, plain and compiled with
``numba.njit``, against Python's own UTF-8 decoding and the reference oracle:
the set of token starts, and the multiset of shingle values, must be exactly
those of the sequential definition, including ill-formed UTF-8.
"""

import numpy as np
import pytest
from gpu_dedup.kernels import hash_scalar as scalar
from gpu_dedup.kernels.hash_cpu import dev
from gpu_dedup.kernels.params import hash_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import reference as ref
from tests.kernels.test_cpu import BAD_BYTES, TEXTS

IMPLS = {"python": scalar, "compiled": dev}
HYP = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SEED = 99


def code_points(data: bytes):
    """(start byte, code point) of each decoded code point, by the sequential decoder."""
    arr = np.frombuffer(data, np.uint8)
    out, pos = [], 0
    while pos < len(data):
        cp, nxt = scalar.decode_utf8(arr, pos, len(data))
        out.append((pos, int(cp)))
        pos = int(nxt)
    return out


def expected_starts(data: bytes):
    cps = code_points(data)
    chars = [p for p, _ in cps]
    words = [p for i, (p, c) in enumerate(cps) if not chr(c).isspace() and (i == 0 or chr(cps[i - 1][1]).isspace())]
    return chars, words


def padded(data: bytes, pad: bytes = b"\xe2\x82"):
    """The document embedded between foreign bytes: kernels must respect [start, end)."""
    arr = np.frombuffer(pad + data + pad, np.uint8).copy()
    return arr, len(pad), len(pad) + len(data)


def check_starts(impl, data: bytes):
    arr, start, end = padded(data)
    chars, words = expected_starts(data)
    got_c = [p - start for p in range(start, end) if impl.char_start(arr, start, p, end)]
    got_w = [p - start for p in range(start, end) if impl.word_start(arr, start, p, end)]
    assert got_c == chars, data
    assert got_w == words, data


def check_shingles(impl, data: bytes, kind: str, n: int):
    hp = hash_params(SEED, 4)
    prm = ref.params(SEED, 4)
    arr, start, end = padded(data)
    word_mode = kind == "word"
    full, first = [], None
    with np.errstate(over="ignore"):  # the family wraps mod 2**64 by definition
        for p in range(start, end):
            h, m, token = impl.shingle_at(arr, start, p, end, word_mode, n, np.uint64(hp.shingle_base),
                                          np.uint64(hp.word_base), np.uint64(hp.word_base2))
            if not token:
                continue
            if first is None:
                first = (int(h), int(m))
            if m == n:
                full.append(int(h))
    want = ref.shingle_values(ref.decode(data), kind, n, prm)
    if full:
        assert full == want, (data, kind, n)
    elif first is not None:  # fewer than n tokens: one shingle of all of them, from the first token
        assert first[1] < n and [first[0]] == want
    else:
        assert want == []


@pytest.mark.parametrize("impl", list(IMPLS))
def test_token_starts_fixed_texts(impl):
    for doc in [t.encode() for t in TEXTS] + BAD_BYTES:
        check_starts(IMPLS[impl], doc)


@pytest.mark.parametrize("impl", list(IMPLS))
@HYP
@given(data=st.binary(max_size=40))
def test_token_starts_random_bytes(impl, data):
    check_starts(IMPLS[impl], data)


@HYP
@given(data=st.lists(st.sampled_from([b"a", b" ", b"\x80", b"\xc2", b"\xa0", b"\xe2", b"\x80\x83", b"\xf0\x9f",
                                      b"\x98\x80", b"\xed", b"\xe3\x80\x80", b"\xc0", b"\xff", b"\x85"]),
                     max_size=20).map(b"".join))
def test_token_starts_adversarial_bytes(data):
    check_starts(dev, data)


@pytest.mark.parametrize("n", (1, 2, 3, 5))
@pytest.mark.parametrize("kind", ("char", "word"))
def test_direct_shingles_equal_reference(kind, n):
    for doc in [t.encode() for t in TEXTS] + BAD_BYTES:
        check_shingles(dev, doc, kind, n)


def test_direct_shingles_plain_python_fixed_texts():
    """The plain source (what the CUDA simulator runs) on the fixed texts, both modes."""
    for doc in [t.encode() for t in TEXTS[:20]] + BAD_BYTES:
        for kind in ("char", "word"):
            check_shingles(scalar, doc, kind, 3)


@HYP
@given(data=st.one_of(st.binary(max_size=40), st.text(max_size=30).map(str.encode)),
       kind=st.sampled_from(("char", "word")), n=st.sampled_from((1, 2, 3)))
def test_direct_shingles_random(data, kind, n):
    check_shingles(dev, data, kind, n)
    check_shingles(scalar, data, kind, n)
