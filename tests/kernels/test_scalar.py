"""Scalar hash math of ``gpu_dedup.kernels.scalar`` against Python-int math.

Every function is checked twice: as the plain Python source over NumPy
scalars (``scalar``) and as its compiled CPU twin (``cpu.dev``).  The plain
source runs under ``np.errstate(all="raise")`` so that any uint64 wrap-around
(the spec says no operation ever overflows 64 bits) raises instead of
silently wrapping.
"""

import random

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpu_dedup.kernels import scalar
from gpu_dedup.kernels.cpu import dev
from tests import reference as ref

P61 = (1 << 61) - 1
P31 = (1 << 31) - 1
U64 = np.uint64

IMPLS = {"python": scalar, "compiled": dev}
IMPL_IDS = list(IMPLS)

HYP = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def call(impl_name, fn, *args):
    impl = IMPLS[impl_name]
    with np.errstate(all="raise"):
        out = getattr(impl, fn)(*(U64(a) for a in args))
    return int(out)


def edge_values(hi):
    """Interesting values in [0, hi] (inclusive)."""
    cands = {
        0, 1, 2, 3, 7, 8, 9,
        (1 << 29) - 1, 1 << 29, (1 << 31) - 2, P31, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1,
        (1 << 60) - 1, 1 << 60, P61 - 2, P61 - 1, P61, P61 + 1,
        (1 << 61) | 0xFFFFFFFF, (1 << 62) - 1, 1 << 63, (1 << 64) - 2, (1 << 64) - 1,
        0x1FFFFFFF_FFFFFFFF ^ 0xFFFFFFFF, 0xFFFFFFFF << 29,
    }
    return sorted(v for v in cands if v <= hi) + [hi]


def ints(hi):
    return st.one_of(st.sampled_from(edge_values(hi)), st.integers(0, hi))


# 61-bit operands: mulmod61 accepts anything below 2**61 (2**61 - 1 == P61 included)
MAX61 = (1 << 61) - 1


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(a=ints(MAX61), b=ints(MAX61))
@example(a=MAX61, b=MAX61)
@example(a=P61 - 1, b=P61 - 1)
@example(a=0, b=MAX61)
def test_mulmod61(impl, a, b):
    r = call(impl, "mulmod61", a, b)
    assert r == (a * b) % P61
    assert 0 <= r < P61


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_mulmod61_edge_grid(impl):
    vals = edge_values(MAX61)
    rng = random.Random(61)
    vals += [rng.randrange(1 << 61) for _ in range(40)]
    for a in vals:
        for b in vals:
            assert call(impl, "mulmod61", a, b) == (a * b) % P61, (a, b)


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(a=ints(P61 - 1), b=ints(P61 + 1))
@example(a=P61 - 1, b=P61 + 1)
@example(a=P61 - 1, b=P61)
@example(a=0, b=P61)
def test_addmod61(impl, a, b):
    r = call(impl, "addmod61", a, b)
    assert r == (a + b) % P61
    assert 0 <= r < P61


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(a=ints(P61 - 1), b=ints(P61 - 1))
@example(a=0, b=P61 - 1)
@example(a=P61 - 1, b=0)
def test_submod61(impl, a, b):
    r = call(impl, "submod61", a, b)
    assert r == (a - b) % P61
    assert 0 <= r < P61


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(x=ints((1 << 64) - 1))
@example(x=(1 << 64) - 1)
@example(x=P31)
@example(x=2 * P31)
@example(x=P31 * P31)
def test_mod31(impl, x):
    r = call(impl, "mod31", x)
    assert r == x % P31
    assert 0 <= r < P31


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(h=ints(P61 - 1), t=ints(P61), base=ints(P61 - 1))
@example(h=P61 - 1, t=P61, base=P61 - 1)
def test_poly_step(impl, h, t, base):
    assert call(impl, "poly_step", h, t, base) == (h * base + t) % P61


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(h=ints(MAX61))
@example(h=0)
@example(h=P61 - 1)
@example(h=MAX61)
def test_finalize61(impl, h):
    r = call(impl, "finalize61", h)
    assert r == ref.finalize61(h)
    assert 0 <= r < P61


def test_finalize61_injective_on_small_range():
    # Not required to be a bijection, but it must not collapse nearby inputs.
    out = {ref.finalize61(h) for h in range(20000)}
    assert len(out) == 20000
    assert {call("compiled", "finalize61", h) for h in range(0, 20000, 97)} <= out


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(x=ints(P61 - 1), a=ints(P61 - 1), b=ints(P61 - 1))
@example(x=P61 - 1, a=P61 - 1, b=P61 - 1)
def test_perm61(impl, x, a, b):
    r = call(impl, "perm61", x, a, b)
    assert r == (a * x + b) % P61
    assert 0 <= r < P61


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(x=ints(P31 - 1), a=ints(P31 - 1), b=ints(P31 - 1))
@example(x=P31 - 1, a=P31 - 1, b=P31 - 1)
def test_perm31(impl, x, a, b):
    r = call(impl, "perm31", x, a, b)
    assert r == (a * x + b) % P31
    assert 0 <= r < P31


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_band_and_exact_hash_scalar(impl):
    prm = ref.params(7, 8)
    rng = random.Random(5)
    sig = np.array([rng.randrange(P61) for _ in range(7)] + [P61], np.uint64)
    for band, rows in [(0, 4), (1, 4), (0, 8), (2, 2), (3, 2), (7, 1)]:
        with np.errstate(all="raise"):
            got = IMPLS[impl].band_hash(sig, band, rows, U64(prm["band_base"]))
        assert int(got) == ref.band_hash(sig.tolist(), band, rows, prm["band_base"])
    data = bytes(range(256)) * 2
    buf = np.frombuffer(data, np.uint8)
    for s, e in [(0, 0), (0, 1), (3, 7), (5, 13), (0, 512), (100, 103), (511, 512)]:
        with np.errstate(all="raise"):
            h1, h2 = IMPLS[impl].exact_hash(buf, s, e, U64(prm["exact_base1"]), U64(prm["exact_base2"]))
        assert (e - s, int(h1), int(h2)) == ref.exact_key(data[s:e], prm)


# ------------------------------------------------------------------ UTF-8


def decode_all(impl_name, data: bytes, start=0, end=None):
    """Code points of data[start:end] via repeated decode_utf8 calls."""
    impl = IMPLS[impl_name]
    buf = np.frombuffer(data, np.uint8) if data else np.zeros(0, np.uint8)
    end = len(data) if end is None else end
    pos = start
    cps = []
    while pos < end:
        cp, nxt = impl.decode_utf8(buf, pos, end)
        nxt = int(nxt)
        assert pos < nxt <= end, (data, pos, nxt)
        assert 1 <= nxt - pos <= 4
        cps.append(int(cp))
        pos = nxt
    return cps


def py_codepoints(data: bytes):
    return [ord(c) for c in data.decode("utf-8", errors="replace")]


TRICKY = [
    b"\x80", b"\xbf", b"\xc0\x80", b"\xc1\xbf", b"\xc2", b"\xc2\x80", b"\xdf\xbf", b"\xe0\x80\x80",
    b"\xe0\x9f\xbf", b"\xe0\xa0\x80", b"\xe0\xa0", b"\xed\x9f\xbf", b"\xed\xa0\x80", b"\xed\xbf\xbf",
    b"\xef\xbf\xbd", b"\xef\xbf\xbf", b"\xf0\x80\x80\x80", b"\xf0\x8f\xbf\xbf", b"\xf0\x90\x80\x80",
    b"\xf0\x90\x80", b"\xf0\x90", b"\xf4\x8f\xbf\xbf", b"\xf4\x90\x80\x80", b"\xf5\x80\x80\x80",
    b"\xf8\x88\x80\x80\x80", b"\xfe", b"\xff", b"\xe2\x82\xac", b"\xe2\x82", b"\xf0\x9f\x98\x80",
]

utf8_chunks = st.one_of(
    st.binary(max_size=6),
    st.text(max_size=4).map(lambda s: s.encode("utf-8")),
    st.sampled_from(TRICKY),
)
mixed_bytes = st.lists(utf8_chunks, max_size=12).map(b"".join)


@pytest.mark.parametrize("impl", IMPL_IDS)
@settings(max_examples=300, deadline=None)
@given(data=st.one_of(st.binary(max_size=64), mixed_bytes))
def test_decode_utf8_random_bytes(impl, data):
    assert decode_all(impl, data) == py_codepoints(data)


@pytest.mark.parametrize("impl", IMPL_IDS)
@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_decode_utf8_well_formed(impl, text):
    data = text.encode("utf-8")
    assert decode_all(impl, data) == [ord(c) for c in text]


@settings(max_examples=200, deadline=None)
@given(data=mixed_bytes, cut=st.data())
def test_decode_utf8_respects_bounds(data, cut):
    """Decoding data[s:e] inside a larger buffer never reads past ``end``."""
    s = cut.draw(st.integers(0, len(data)))
    e = cut.draw(st.integers(s, len(data)))
    assert decode_all("compiled", data, s, e) == py_codepoints(data[s:e])


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_decode_utf8_tricky(impl):
    for t in TRICKY:
        for data in (t, b"a" + t + b"z", t + t, t[:-1] + b"a"):
            assert decode_all(impl, data) == py_codepoints(data), data


def test_decode_utf8_exhaustive_two_bytes():
    for b0 in range(256):
        for b1 in range(256):
            data = bytes((b0, b1))
            assert decode_all("compiled", data) == py_codepoints(data), data


def test_decode_utf8_exhaustive_three_byte_leads():
    thirds = (0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC2, 0xE0, 0xF0, 0xFF)
    for b0 in range(0xC0, 0x100):
        for b1 in range(256):
            for b2 in thirds:
                data = bytes((b0, b1, b2))
                assert decode_all("compiled", data) == py_codepoints(data), data


def test_decode_utf8_all_code_points_round_trip():
    """Every scalar value encodes and decodes back to itself (compiled twin)."""
    text = "".join(chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF)
    data = text.encode("utf-8")
    buf = np.frombuffer(data, np.uint8)
    pos, end, i = 0, len(data), 0
    decode = dev.decode_utf8
    out = []
    append = out.append
    while pos < end:
        cp, pos = decode(buf, pos, end)
        append(cp)
        i += 1
    assert out == [ord(c) for c in text]


# ------------------------------------------------------------------ is_space


def test_is_space_all_code_points_compiled():
    is_space = dev.is_space
    got = [c for c in range(0x110000) if is_space(c)]
    want = [c for c in range(0x110000) if chr(c).isspace()]
    assert got == want


def test_is_space_all_code_points_python():
    is_space = scalar.is_space
    got = [c for c in range(0x110000) if is_space(c)]
    want = [c for c in range(0x110000) if chr(c).isspace()]
    assert got == want


def test_is_space_agrees_with_str_split():
    # Word mode splits like str.split(): the spaces are exactly the isspace chars.
    spaces = "".join(chr(c) for c in range(0x110000) if chr(c).isspace())
    assert ("a" + "a".join(spaces) + "a").split() == ["a"] * (len(spaces) + 1)
