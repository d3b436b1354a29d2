import bisect
import unicodedata

import pytest
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.config import NormalizeConfig
from gpu_dedup.kernels.unicode_tables import PUNCTUATION_RANGES, UNICODE_VERSION
from gpu_dedup.normalize import clean, normalize, repair_utf8

_STARTS = [lo for lo, _ in PUNCTUATION_RANGES]


def _is_punct(c):
    i = bisect.bisect_right(_STARTS, ord(c)) - 1
    return i >= 0 and ord(c) <= PUNCTUATION_RANGES[i][1]


def _ref_clean(text, punctuation=True, whitespace=True):
    chars = [c for c in text if not (punctuation and _is_punct(c))]
    text = "".join(chars)
    return " ".join(text.split()) if whitespace else text


def test_default_normalization():
    a = pa.array(["Hello,  World!\u00a0Ｆｕｌｌ\u3000width — dash", None, "  x\u2028y  ", "don't", "!!!", ""])
    assert normalize(a).to_pylist() == ["hello world full width dash", "", "x y", "dont", "", ""]


def test_each_switch():
    a = pa.array(["Ａ, b  C"])
    assert normalize(a, NormalizeConfig("none", False, False, False)).to_pylist() == ["Ａ, b  C"]
    assert normalize(a, NormalizeConfig("NFKC", False, False, False)).to_pylist() == ["A, b  C"]
    assert normalize(a, NormalizeConfig("none", True, False, False)).to_pylist() == ["ａ, b  c"]
    assert normalize(a, NormalizeConfig("none", False, True, False)).to_pylist() == ["Ａ b  C"]
    assert normalize(a, NormalizeConfig("none", False, False, True)).to_pylist() == ["Ａ, b C"]


@pytest.mark.skipif(unicodedata.unidata_version != UNICODE_VERSION, reason="table pinned to another Unicode version")
def test_pinned_punctuation_table_is_unicode_category_p():
    assert all(_is_punct(chr(c)) == unicodedata.category(chr(c)).startswith("P") for c in range(0x110000))


@settings(max_examples=300, deadline=None)
@given(st.text(), st.booleans(), st.booleans())
def test_clean_kernel_equals_python(text, punctuation, whitespace):
    got = clean(pa.array([text], pa.large_string()), punctuation, whitespace).to_pylist()[0]
    assert got == _ref_clean(text, punctuation, whitespace)


def test_repair_replaces_maximal_subparts_like_python():
    raw = [b"ok", b"bad\xff\xfeend", b"\xe2\x82", b"\xef\xbf\xbd", b"\xf0\x9f\x98", None]
    fixed, bad = repair_utf8(pa.array(raw, pa.large_binary()))
    assert fixed.to_pylist() == [r.decode("utf-8", "replace") if r is not None else None for r in raw]
    assert bad == 3


def test_valid_text_passes_through_unchanged():
    a = pa.array(["plain", "ünïcödé", None])
    fixed, bad = repair_utf8(a)
    assert bad == 0 and fixed.to_pylist() == a.to_pylist()
