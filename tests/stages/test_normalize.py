import bisect
import mmap
import unicodedata

import pyarrow as pa
import pytest
from gpu_dedup.kernels.unicode_tables import PUNCTUATION_RANGES, UNICODE_VERSION
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_dedup.config import NormalizeConfig
from gpu_dedup.stages.normalize import clean, normalize, repair_utf8

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


# ----------------------------------------------------------------------------- the one-pass kernel
# Oracle: the definition as pyarrow computes it (repair, utf8proc form, utf8proc lowercase), then
# punctuation removal and whitespace collapse by RE2 over explicit code-point classes.

import numpy as np
import pyarrow.compute as pc
from gpu_dedup.kernels import text_scalar as tk

from gpu_dedup.backends import textnorm
from gpu_dedup.backends.textnorm import pyarrow_composes
from gpu_dedup.stages.normalize import normalize_counted, raw_buffers

FORMS = ("NFKC", "NFC", "NFKD", "NFD", "none")
_WS = [0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0x1F, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
       0x2028, 0x2029, 0x202F, 0x205F, 0x3000]
_PUNCT_CLASS = "[" + "".join(f"\\x{{{lo:x}}}-\\x{{{hi:x}}}" for lo, hi in PUNCTUATION_RANGES) + "]"
_WS_CLASS = "[" + "".join(f"\\x{{{c:x}}}" for c in _WS) + "]+"


def _normal_form(arr, form):
    """pyarrow's utf8proc; up to pyarrow 25 it does not compose (apache/arrow#51225): then unicodedata2."""
    if form not in ("NFC", "NFKC") or pyarrow_composes():
        return pc.utf8_normalize(arr, form=form)
    ud = pytest.importorskip("unicodedata2", reason=f"pyarrow {pa.__version__} does not compose {form}: the "
                                                    "oracle needs unicodedata2 (pip install unicodedata2)")
    return pa.array([ud.normalize(form, s) for s in arr.to_pylist()], arr.type)


def _oracle(arr, cfg):
    arr, _ = repair_utf8(arr)
    arr = arr.fill_null("")
    if cfg.unicode != "none":
        arr = _normal_form(arr, cfg.unicode)
    if cfg.lowercase:
        arr = pc.utf8_lower(arr)
    if cfg.punctuation:
        arr = pc.replace_substring_regex(arr, _PUNCT_CLASS, "")
    if cfg.whitespace:
        arr = pc.utf8_trim(pc.replace_substring_regex(arr, _WS_CLASS, " "), " ")
    return arr


def _all_code_points():
    return [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]


def _fast_path(arr, cfg):
    """The kernel alone: (outputs of the documents it normalized by itself, their indices)."""
    from gpu_dedup.kernels import text_cpu

    data, starts, ends = raw_buffers(arr)
    n = starts.shape[0]
    out = np.empty(data.shape[0], np.uint8)
    lengths = np.empty(n, np.int64)
    status = np.empty(n, np.int64)
    s1, s2 = tk.property_table(cfg.unicode)
    text_cpu.normalize_texts(data, starts, ends, text_cpu.byte_tasks(starts, ends, 8), s1, s2,
                             tk.ascii_actions(cfg.lowercase, cfg.punctuation, cfg.whitespace),
                             tk.need_mask(cfg.unicode, cfg.lowercase), cfg.lowercase, cfg.punctuation,
                             cfg.whitespace, out, starts, lengths, status)
    done = np.flatnonzero((status & (tk.UNSTABLE | tk.OVERFLOW)) == 0)
    return [bytes(out[starts[k] : starts[k] + lengths[k]]).decode() for k in done], done


def test_regex_oracle_equals_python_reference():
    texts = ["a, b\u3000\u3000c!", " ¿qué? ", "x\u2028\u2029y", "«a» — b", "", "\u00a0"]
    got = _oracle(pa.array(texts), NormalizeConfig("none", False, True, True)).to_pylist()
    assert got == [_ref_clean(t) for t in texts]


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("lowercase", [True, False])
def test_every_code_point_alone_equals_pyarrow(form, lowercase):
    cfg = NormalizeConfig(form, lowercase, True, True)
    arr = pa.array(_all_code_points(), pa.large_string())
    want = _oracle(arr, cfg)
    assert normalize(arr, cfg).equals(want)
    fast, idx = _fast_path(arr, cfg)
    assert fast == want.take(pa.array(idx)).to_pylist()
    assert len(idx) > 260_000  # the kernel handles (nearly) every assigned code point by itself


# neighbours that compose, reorder or decompose: letters that start compositions, Hangul L / V / LV
# jamo and syllables, Indic vowel signs that compose onto a preceding letter, combining marks
_NEIGHBOURS = ["a", "E", "\u1100", "\u1161", "\uac00", "\u0b47", "\u0b3e", "\u09c7", "\u0cd5", "\u0301", "\u0323",
               "\u3099", "\u0345", "\u00e9", " ", ",", "\u0130", "\u03a3"]


@pytest.mark.parametrize("form", FORMS)
def test_every_code_point_between_neighbours_equals_pyarrow(form):
    cps = _all_code_points()
    cfg = NormalizeConfig(form, True, True, True)
    rng = np.random.default_rng(7)
    left = rng.integers(0, len(_NEIGHBOURS), len(cps))
    right = rng.integers(0, len(_NEIGHBOURS), len(cps))
    # every code point after and before every neighbour (two fixed pairings) plus a random pairing
    texts = [_NEIGHBOURS[i % len(_NEIGHBOURS)] + c + _NEIGHBOURS[(i * 7 + 3) % len(_NEIGHBOURS)]
             for i, c in enumerate(cps)]
    texts += [_NEIGHBOURS[lo] + c + _NEIGHBOURS[hi] for lo, hi, c in zip(left, right, cps)]
    arr = pa.array(texts, pa.large_string())
    want = _oracle(arr, cfg)
    assert normalize(arr, cfg).equals(want)
    fast, idx = _fast_path(arr, cfg)
    assert fast == want.take(pa.array(idx)).to_pylist()


_ALPHABET = st.one_of(
    st.characters(max_codepoint=0x7F),
    st.characters(max_codepoint=0x3FF),
    st.sampled_from(_NEIGHBOURS + ["\ufb01", "\u212b", "\u2126", "\u023a", "\u1e9e", "\uff21", "\ud55c", "\u11a8"]),
    st.characters(exclude_categories=("Cs",)),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(_ALPHABET, max_size=40), min_size=1, max_size=8), st.sampled_from(FORMS), st.booleans(),
       st.booleans(), st.booleans())
def test_random_strings_equal_pyarrow(texts, form, lowercase, punctuation, whitespace):
    _equals_pyarrow(texts, NormalizeConfig(form, lowercase, punctuation, whitespace))


def _equals_pyarrow(texts, cfg):
    """The stage and the kernel alone (on the documents it takes by itself) give the oracle's texts; returns the
    indices of the documents the kernel took by itself."""
    arr = pa.array(texts, pa.large_string())
    want = _oracle(arr, cfg)
    assert normalize(arr, cfg).to_pylist() == want.to_pylist()
    fast, idx = _fast_path(arr, cfg)
    assert fast == want.take(pa.array(idx)).to_pylist()
    return idx


# mostly letters, digits and single spaces, so that most 8-byte windows take the kernel's eight-bytes-at-once
# path; the rest end it at every offset (a space after a space, a leading one, punctuation, other whitespace,
# non-ASCII, eight capitals, the bytes next to the ranges of letters, digits and the space)
_WORDISH = st.one_of(st.sampled_from("aqzAQZ09 "), st.sampled_from("aqzAQZ09 "), st.sampled_from("aqzAQZ09 "),
                     st.sampled_from([" ", ".", ",", "\t", "\n", "\u00e9", "\u0130", "\u00a0", "\u3000", "\x00", "\x7f",
                                      "HELLOWOR", "\x1f", "!", "/", ":", "@", "[", "`", "{"]))  # next to each range


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_WORDISH, max_size=48).map("".join), min_size=1, max_size=8), st.sampled_from(FORMS),
       st.booleans(), st.booleans(), st.booleans())
def test_plain_ascii_runs_equal_pyarrow(texts, form, lowercase, punctuation, whitespace):
    _equals_pyarrow(texts, NormalizeConfig(form, lowercase, punctuation, whitespace))


def test_plain_ascii_words_at_every_offset():
    """A run of plain words starting at every offset of the 8-byte windows, after each kind of byte that ends one."""
    cfg = NormalizeConfig()
    words = "The Quick brown FOX jumps over 12 lazy dogs  and  THEN some"
    texts = [lead + " " * k + words[j:] + tail for lead in ("", " ", ".", "\u00e9", "\t") for k in range(3)
             for j in range(9) for tail in ("", " ", "  ", ".", " .")]
    assert len(_equals_pyarrow(texts, cfg)) == len(texts)  # every one by the kernel alone


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(max_size=24), min_size=1, max_size=8), st.sampled_from(FORMS), st.booleans())
def test_ill_formed_utf8_is_repaired_and_counted(raw, form, lowercase):
    cfg = NormalizeConfig(form, lowercase, True, True)
    arr = pa.array(raw, pa.large_binary())
    got, bad = normalize_counted(arr, cfg)
    assert got.to_pylist() == _oracle(arr, cfg).to_pylist()
    assert bad == sum(r.decode("utf-8", "replace").encode() != r for r in raw)


def test_chunks_nulls_and_slices():
    cfg = NormalizeConfig()
    a = pa.chunked_array([pa.array(["A  b", None, "ÉCOLE, ﬁn"]), pa.array([], pa.string()),
                          pa.array(["x\u0301y", None, "  ", "Ｆ!"]).slice(1)])
    want = _oracle(pa.array(a.to_pylist(), pa.large_string()), cfg)
    got, bad = normalize_counted(a, cfg)
    assert got.to_pylist() == want.to_pylist() == ["a b", "", "école fin", "", "", "f"] and bad == 0


def test_slow_result_longer_than_its_document():
    # NFKC of U+FDFA is 18 code points: the slow path result does not fit in the document's room
    a = pa.array(["\ufdfa", "plain text", "\u0130stanbul \ufb03"])
    cfg = NormalizeConfig()
    assert normalize(a, cfg).to_pylist() == _oracle(a, cfg).to_pylist()


def test_property_table_is_pinned():
    from gpu_dedup.kernels import unicode_props

    assert unicode_props.UNICODE_VERSION == "17.0.0" and unicode_props.BASELINE_VERSION == "14.0.0"
    for form in FORMS:
        s1, s2 = tk.property_table(form)
        assert s1.shape == (0x110000 >> 7,) and s2.shape[0] % 128 == 0
        # block 0 is ASCII: stage2[b] is byte b's entry
        assert all(((int(s2[b]) >> 8) & 0xFFFFFF) - tk.DELTA_BIAS == (32 if 65 <= b <= 90 else 0) for b in range(128))
    # NBSP and fullwidth letters map to one stable code point under NFKC, not under NFC
    s1, s2 = tk.property_table("NFKC")
    e = int(s2[int(s1[0xA0 >> 7]) * 128 + (0xA0 & 127)])
    assert e & tk.MAPPED and ((e >> 32) & 0xFFFFFF) - tk.DELTA_BIAS == 0x20 - 0xA0
    s1, s2 = tk.property_table("NFC")
    assert not int(s2[int(s1[0xA0 >> 7]) * 128 + (0xA0 & 127)]) & tk.MAPPED


@pytest.mark.parametrize("spill", [False, True], ids=["memory", "file"])
@pytest.mark.parametrize("capacity", [0, 700, 10**6], ids=["no-capacity", "grown", "enough"])
def test_batches_normalized_then_joined_equal_the_whole_column(capacity, spill, tmp_path):
    """Whatever the buffer starts with (grown with a copy past it), and where a text grows when normalized
    (U+023A lowercased: 2 bytes to 3, gathered from the slow path's own buffer); in memory or in a mapped
    file, which leaves nothing in its directory."""
    from gpu_dedup.backends.strings import string_buffers
    from gpu_dedup.config import NormalizeConfig
    from gpu_dedup.stages.normalize import BatchNormalizer, normalize_counted

    texts = ["A, b!", None, "\ufb01ne  Caf\u00e9", "", "\uff26\uff55\uff4c\uff4c", None, "x" * 300,
             "\u023a\u023a\u023a"] * 50
    column = pa.chunked_array([pa.array(texts, pa.large_string())])
    whole, bad = normalize_counted(column, NormalizeConfig())
    hook = BatchNormalizer(NormalizeConfig(), lengths=pc.utf8_length, capacity=capacity,
                           spill_dir=tmp_path if spill else None)
    assert hook.spilled == spill
    cuts = [0, 0, 7, 100, 101, 400]
    parts = [hook(column.slice(a, b - a)) for a, b in zip(cuts[:-1], cuts[1:])]
    assert BatchNormalizer.null(parts).tolist() == [t is None for t in texts]
    assert BatchNormalizer.lengths(parts).to_pylist() == [None if t is None else len(t) for t in texts]
    joined, invalid, seconds = hook.join(parts)
    assert parts == [] and invalid == bad == 0 and seconds >= 0
    want = string_buffers(whole)
    assert np.array_equal(joined.offsets, want.offsets - want.offsets[0])
    assert joined.data.tobytes() == want.data[want.offsets[0]:want.offsets[-1]].tobytes()
    assert list(tmp_path.iterdir()) == []  # the mapped file has no name
    base = joined.data
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.obj if isinstance(base, memoryview) else base.base
    assert isinstance(base, mmap.mmap)  # in memory: an anonymous mapping (small pages, see BatchNormalizer._buffer)
    try:
        base.size()  # the size of the file behind the mapping; an anonymous one has none
        in_file = True
    except OSError:
        in_file = False
    assert in_file == spill  # grown into a file too


@pytest.mark.skipif(not pyarrow_composes(), reason=f"pyarrow {pa.__version__} does not compose: no oracle to check "
                                                   "the composing fallback against")
@pytest.mark.parametrize("form", ["NFC", "NFKC"])
def test_composing_fallback_for_a_pyarrow_that_does_not_compose(form, monkeypatch, caplog):
    """With pyarrow <= 25, the documents the kernel hands back are decomposed by pyarrow (NFD/NFKD) and
    composed by unicodedata2 (the tables' Unicode version): the same bytes as pyarrow 26's NFC/NFKC, every
    code point alone and between neighbours."""
    ud = pytest.importorskip("unicodedata2")
    cps = _all_code_points()
    # between neighbours, assigned code points only: utf8proc gives a few that Unicode 17 leaves unassigned
    # (U+10EF6, U+1D127, ...) a combining class, unicodedata2 none
    texts = cps + [_NEIGHBOURS[i % len(_NEIGHBOURS)] + c + _NEIGHBOURS[(i * 7 + 3) % len(_NEIGHBOURS)]
                   for i, c in enumerate(cps) if ud.category(c) != "Cn"]
    arr = pa.array(texts, pa.large_string())
    cfg = NormalizeConfig(form, True, True, True)
    want = _oracle(arr, cfg)
    monkeypatch.setattr(textnorm, "pyarrow_composes", lambda: False)
    textnorm._unicodedata.cache_clear()
    try:
        got = normalize(arr, cfg)
    finally:
        textnorm._unicodedata.cache_clear()
    assert got.equals(want)
    assert "does not compose" in caplog.text


def test_a_small_batch_is_normalized_on_the_calling_thread_alone_and_a_large_one_on_all(monkeypatch, request):
    """Numba's whole pool woken for a batch of a few bytes cost about a millisecond beside busy reader threads:
    a read of thousands of one-document shards spent most of its time there."""
    import sys
    from functools import partial

    import numba

    from gpu_dedup.stages.normalize import BatchNormalizer

    stage = sys.modules["gpu_dedup.stages.normalize"]  # the package's name ``normalize`` is the function

    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("Numba has one thread here")
    request.addfinalizer(partial(numba.set_num_threads, numba.get_num_threads()))
    threads = 2
    numba.set_num_threads(threads)  # (another test may have left this thread at one)
    seen = []
    real = stage.normalize_segments

    def recording(column, cfg, **kw):
        seen.append(numba.get_num_threads())
        return real(column, cfg, **kw)

    monkeypatch.setattr(stage, "normalize_segments", recording)
    cfg = NormalizeConfig()
    small = pa.chunked_array([pa.array(["a few words"], pa.large_string())])
    large = pa.chunked_array([pa.array(["word " * 1000] * 40, pa.large_string())])  # 200 KB
    batches = BatchNormalizer(cfg)
    got = [batches(small), batches(large), batches(small)]
    assert seen == [1, threads, 1]
    assert numba.get_num_threads() == threads  # restored
    monkeypatch.setattr(stage, "normalize_segments", real)
    texts = batches.join(got)[0]
    assert bytes(texts.data[texts.offsets[0]:texts.offsets[-1]]) == \
        (b"a few words" + b" ".join([b"word"] * 1000) * 40 + b"a few words")
