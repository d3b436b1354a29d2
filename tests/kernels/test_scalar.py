"""Scalar hash math of ``gpu_dedup.kernels.hash_scalar`` against Python-int math.

Every function is checked twice: as the plain Python source over NumPy
scalars (``scalar``) and as its compiled CPU twin (``cpu.dev``).  Hash family
v2 wraps modulo 2**64 by definition, so the plain source runs with NumPy's
overflow warnings silenced and every other floating-point error raising.
"""

import random

import numpy as np
import pytest
from gpu_dedup.kernels import hash_scalar as scalar
from gpu_dedup.kernels.hash_cpu import dev
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests import reference as ref

M64 = (1 << 64) - 1
U64 = np.uint64

IMPLS = {"python": scalar, "compiled": dev}
IMPL_IDS = list(IMPLS)

HYP = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def call(impl_name, fn, *args):
    impl = IMPLS[impl_name]
    with np.errstate(all="raise", over="ignore"):
        out = getattr(impl, fn)(*(U64(a) for a in args))
    return int(out)


def edge_values(hi):
    """Interesting values in [0, hi] (inclusive)."""
    cands = {
        0, 1, 2, 3, 7, 8, 9, 0x20, 0x21, 0x7F, 0x80, 0xFF, 0x100,
        (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1,
        (1 << 63) - 1, 1 << 63, (1 << 64) - 2, (1 << 64) - 1,
        0x8080808080808080, 0x2020202020202020, 0x7F7F7F7F7F7F7F7F, 0x2121212121212121,
    }
    return sorted(v for v in cands if v <= hi) + [hi]


def ints(hi):
    return st.one_of(st.sampled_from(edge_values(hi)), st.integers(0, hi))


# ------------------------------------------------------------------ mixer, permutations


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(z=ints(M64))
def test_mix64(impl, z):
    assert call(impl, "mix64", z) == ref.mix64(z)


def test_mix64_golden_and_bijective():
    # splitmix64's finalizer: the first output of splitmix64(0) is mix64(0x9E3779B97F4A7C15)
    assert ref.mix64(0x9E3779B97F4A7C15) == 0xE220A8397B1DCDAF
    assert ref.mix64(0) == 0
    sample = [random.Random(1).getrandbits(64) for _ in range(2000)] + list(range(2000))
    assert len({ref.mix64(z) for z in sample}) == len(set(sample))


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(x=ints((1 << 32) - 1), a=ints((1 << 32) - 1), b=ints((1 << 32) - 1))
@example(x=(1 << 32) - 1, a=(1 << 32) - 1, b=(1 << 32) - 1)
def test_permute(impl, x, a, b):
    impl_mod = IMPLS[impl]
    got = impl_mod.permute(np.uint32(x), np.uint32(a), np.uint32(b))
    assert isinstance(got, (np.uint32, int)) and int(got) == ref.permute(x, a, b) == (a * x + b) % (1 << 32)


def test_permute_is_a_bijection_of_32_bit_keys():
    rng = np.random.default_rng(3)
    a, b = np.uint32(rng.integers(0, 2**32) | 1), np.uint32(rng.integers(0, 2**32))
    xs = np.arange(1 << 16, dtype=np.uint32) * np.uint32(65537)  # 2**16 distinct keys spread over 32 bits
    assert len({int(dev.permute(x, a, b)) for x in xs}) == xs.shape[0]


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(h=ints(M64))
def test_perm_key(impl, h):
    assert call(impl, "perm_key", h) == h >> 32


# ------------------------------------------------------------------ byte tricks of the word fast path


@pytest.mark.parametrize("impl", IMPL_IDS)
@HYP
@given(v=ints(M64))
def test_special_bytes_lowest_flag_exact(impl, v):
    got = call(impl, "special_bytes", v)
    specials = [i for i in range(8) if not 0x21 <= (v >> (8 * i)) & 0xFF < 0x80]
    if not specials:
        assert got == 0
    else:  # the lowest flag marks the first special byte exactly; nothing below it
        k = specials[0]
        assert got & ((1 << (8 * k + 8)) - 1) == 0x80 << (8 * k)
        assert got & ~0x8080808080808080 == 0


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_first_flag_shift(impl):
    for k in range(8):
        for higher in (0, 0x80 << 56, 0x8080808080808080):
            f = (0x80 << (8 * k)) | (higher & ~((1 << (8 * k + 8)) - 1) & M64)
            assert call(impl, "first_flag_shift", f) == 8 * k


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_first_special_shift_every_position(impl):
    """The plain source and the CPU twin (trailing-zero counts) agree for a first flag at each of 16 bytes,
    with any flags above it."""
    fn = IMPLS[impl].first_special_shift
    for k in range(16):
        for above in (0, 0x8080808080808080):
            flags = (0x80 << (8 * k)) | (above << (8 * k + 8) if k < 15 else 0)
            flags |= (above << 64) if k < 8 else 0
            f0, f1 = flags & M64, (flags >> 64) & M64
            with np.errstate(over="ignore"):
                assert int(fn(U64(f0), U64(f1))) == 8 * k, (k, hex(f0), hex(f1))


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_load8_little_endian(impl):
    data = np.arange(20, dtype=np.uint8) * np.uint8(13)
    for p in range(13):
        assert int(IMPLS[impl].load8(data, p)) == int.from_bytes(bytes(data[p : p + 8]), "little")


# ------------------------------------------------------------------ tokens


WORDS = ["a", "ab", "hello", "1234567", "12345678", "123456789", "exactly16bytes!!", "fifteen-bytes!!",
         "seventeen_bytes!!", "x" * 40, "naïve", "日本語", "😀ok", "a\x00b", "\x7f", "straße", "e\u0301",
         "\ufffd", "mixed😀" * 5]


def word_tokens(impl, text: str, base: int):
    """Tokens of ``text`` by repeated next_word calls (the document embedded between foreign bytes)."""
    pad = b"\xe2\x82"
    raw = pad + text.encode("utf-8") + pad
    data = np.frombuffer(raw, np.uint8)
    pos, end = len(pad), len(raw) - len(pad)
    out = []
    with np.errstate(over="ignore"):
        while True:
            t, found, pos = impl.next_word(data, pos, end, U64(base), U64(base * base % (1 << 64)))
            if not found:
                break
            out.append(int(t))
    return out


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_next_word_fast_and_general_paths_equal_reference(impl):
    base = ref.params(5, 0)["word_base"]
    for sep in (" ", "  ", "\t", "\n ", "\u3000", "\u00a0", " \x85 "):
        for tail in ("", " ", " " * 20, " and some more words after it"):
            words = WORDS
            text = sep.join(words) + tail
            want = [ref.word_hash(w, base) for w in text.split()]
            assert word_tokens(IMPLS[impl], text, base) == want, (sep, tail)


@pytest.mark.parametrize("impl", IMPL_IDS)
@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.one_of(st.sampled_from(" \t\n\x1c\x85\u00a0\u3000"), st.characters(codec="utf-8")), max_size=60))
def test_next_word_random_text(impl, text):
    base = ref.params(9, 0)["word_base"]
    assert word_tokens(IMPLS[impl], text, base) == [ref.word_hash(w, base) for w in text.split()]


def test_word_hash_definition():
    """W = L + sum_j c_j * base**(j+1) over little-endian 8-byte chunks, then mix64."""
    base = 0x1234567890ABCDE5
    assert ref.word_hash("a", base) == ref.mix64((1 + 0x61 * base) % (1 << 64))
    w = "abcdefghij"
    c0 = int.from_bytes(b"abcdefgh", "little")
    c1 = int.from_bytes(b"ij", "little")
    assert ref.word_hash(w, base) == ref.mix64((10 + c0 * base + c1 * base * base) % (1 << 64))
    # the length tells zero padding from NUL bytes
    assert ref.word_hash("a", base) != ref.word_hash("a\x00", base)


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_next_char_tokens(impl):
    text = "aé日😀\x00"
    data = np.frombuffer(text.encode("utf-8"), np.uint8)
    pos, out = 0, []
    with np.errstate(over="ignore"):
        while pos < data.shape[0]:
            t, pos = IMPLS[impl].next_char(data, pos, data.shape[0])
            out.append(int(t))
    assert out == [ref.mix64(ord(c) + 1) for c in text]


# ------------------------------------------------------------------ band hash and exact key


@pytest.mark.parametrize("impl", IMPL_IDS)
def test_band_and_exact_hash_scalar(impl):
    prm = ref.params(7, 8)
    rng = random.Random(5)
    sig = np.array([rng.randrange(1 << 32) for _ in range(7)] + [(1 << 32) - 1], np.uint32)
    for band, rows in [(0, 4), (1, 4), (0, 8), (2, 2), (3, 2), (7, 1)]:
        with np.errstate(over="ignore"):
            got = IMPLS[impl].band_hash(sig, band, rows, U64(prm["band_base"]))
        assert int(got) == ref.band_hash(sig.tolist(), band, rows, prm["band_base"])
    data = bytes(range(256)) * 2
    buf = np.frombuffer(data, np.uint8)
    for s, e in [(0, 0), (0, 1), (3, 7), (5, 13), (0, 512), (100, 103), (511, 512), (1, 17), (8, 24)]:
        with np.errstate(over="ignore"):
            h1, h2 = IMPLS[impl].exact_hash(buf, s, e, U64(prm["exact_seed1"]), U64(prm["exact_seed2"]))
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
