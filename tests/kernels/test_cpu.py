"""CPU kernels (through the backend API) bit-exact against the oracle.

``tests/reference.py`` evaluates every shingle directly with Python ints; the
CPU kernels hash with a rolling polynomial in batches, so documents longer
than one batch (128 shingles) also check the rolling update and the batch
hand-over.
"""

import random

import numpy as np
import pyarrow as pa
import pytest
from gpu_dedup.kernels.params import hash_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_dedup.backends.strings import string_buffers
from tests import reference as ref

SENTINEL = (1 << 32) - 1  # signature value of a document without shingles

KINDS = ("char", "word")
NGRAMS = (1, 2, 3, 5, 24)
NUM_PERM = 16
SEED = 1234

LOREM = (
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt ut "
    "labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation ullamco "
    "laboris nisi ut aliquip ex ea commodo consequat. "
)

TEXTS = [
    "",
    " ",
    "   \t\n  ",
    "\u3000\u00a0\u2028\u2029\x85\x1c\x1d\x1e\x1f\x0b\x0c\r",
    "a",
    "é",
    "日",
    "😀",
    "ab",
    "abcd",
    "hello",
    "hello world",
    "  leading and trailing spaces  ",
    "the quick brown fox jumps over the lazy dog",
    "the quick brown fox jumps over the lazy cat",
    "日本語のテキストです。中文文本，還有한국어 텍스트도 있습니다。",
    "emoji 👍🏽 family 👨\u200d👩\u200d👧\u200d👦 flag 🇫🇷 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 math",
    "combining e\u0301 a\u0308 n\u0303 vs precomposed é ä ñ",
    "alpha\u3000beta\u00a0gamma\u2028delta\u2029eps\x1cz\x85w\u180ex\u200by\u2007q\u202fr\u205fs",
    "tabs\tand\nnewlines\r\nand\x0bvertical\x0cfeeds",
    "nul\x00byte and \x7f del",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ab" * 150,
    "word " * 200,
    LOREM * 6,
    (LOREM * 3).replace(" ", "\u3000"),
    " ".join(f"w{i % 37}" for i in range(400)),
    "".join(chr(0x4E00 + (i * 7919) % 3000) for i in range(500)),
]

BAD_BYTES = [
    b"\xff\xfe",
    b"abc\x80def",
    b"\xe2\x82",
    b"caf\xc3",
    b"\xed\xa0\x80 surrogate half",
    b"\xf0\x9f\x98 truncated emoji",
    b"ok \xc0\xaf ok",
    b"\xf4\x90\x80\x80 beyond",
    b"mixed \xe2\x82\xac euro \xe2\x82 broken \xf0\x9f\x98\x80 ok",
    b"\x80\x80\x80\x80\x80",
    b"space\xc2\xa0nbsp\xc2 broken\xc2\x85nel",
    b"",
    b"valid only",
]


def buffers(docs):
    """StringBuffers of str documents (large_string) or bytes (large_binary)."""
    if docs and isinstance(docs[0], bytes):
        return string_buffers(pa.array(docs, pa.large_binary()))
    return string_buffers(pa.array(docs, pa.large_string()))


def ref_text(doc):
    return ref.decode(doc) if isinstance(doc, bytes) else doc


def check_minhash(be, docs, kind, n, num_perm=NUM_PERM, seed=SEED):
    hp = hash_params(seed, num_perm)
    prm = ref.params(seed, num_perm)
    sig, counts = be.minhash(buffers(docs), hp, kind, n)
    assert sig.shape == (len(docs), num_perm)
    assert sig.dtype == np.uint32
    assert counts.shape == (len(docs),)
    for k, doc in enumerate(docs):
        text = ref_text(doc)
        values = ref.shingle_values(text, kind, n, prm)
        want = ref.signature(text, kind, n, prm)
        got = [int(v) for v in sig[k]]
        assert got == want, (kind, n, text[:80])
        assert int(counts[k]) == len(values), (kind, n, text[:80])
        if not values:
            assert got == [SENTINEL] * num_perm
    return sig


def check_shingle_sets(be, docs, kind, n, seed=SEED):
    hp = hash_params(seed, 4)
    prm = ref.params(seed, 4)
    offsets, values = be.shingle_sets(buffers(docs), hp, kind, n)
    assert offsets.shape == (len(docs) + 1,) and offsets[0] == 0
    assert values.dtype == np.uint64
    assert offsets[-1] == values.shape[0]
    for k, doc in enumerate(docs):
        want = sorted(set(ref.shingle_values(ref_text(doc), kind, n, prm)))
        got = values[offsets[k] : offsets[k + 1]].tolist()
        assert got == want, (kind, n, ref_text(doc)[:80])
    return offsets, values


# ------------------------------------------------------------------ signatures


@pytest.mark.parametrize("n", NGRAMS)
@pytest.mark.parametrize("kind", KINDS)
def test_minhash_matches_reference(cpu_backend, kind, n):
    check_minhash(cpu_backend, TEXTS, kind, n)


@pytest.mark.parametrize("n", (1, 3, 5))
@pytest.mark.parametrize("kind", KINDS)
def test_minhash_invalid_utf8(cpu_backend, kind, n):
    check_minhash(cpu_backend, BAD_BYTES, kind, n)


@pytest.mark.parametrize("num_perm", (1, 31, 32, 40, 128, 260))
@pytest.mark.parametrize("kind", KINDS)
def test_minhash_permutation_counts(cpu_backend, kind, num_perm):
    """The sweep's 32-lane vector path, its scalar tail and documents of every length up to and past the
    eight-key groups (short, exactly 8, 9, 17 shingles, long)."""
    docs = TEXTS[:16] + [" ".join(f"w{i}" for i in range(k)) for k in (8, 9, 12, 13, 20, 21, 40)]
    check_minhash(cpu_backend, docs, kind, 5, num_perm=num_perm)


def test_minhash_binary_equals_string_for_valid_text(cpu_backend):
    hp = hash_params(SEED, NUM_PERM)
    for kind in KINDS:
        a, ca = cpu_backend.minhash(buffers(TEXTS), hp, kind, 3)
        b, cb = cpu_backend.minhash(buffers([t.encode("utf-8") for t in TEXTS]), hp, kind, 3)
        assert np.array_equal(a, b) and np.array_equal(ca, cb)


def test_minhash_repaired_bytes_equal_replaced_text(cpu_backend):
    """Ill-formed bytes hash exactly like their errors="replace" decoding."""
    hp = hash_params(SEED, NUM_PERM)
    for kind in KINDS:
        a, _ = cpu_backend.minhash(buffers(BAD_BYTES), hp, kind, 2)
        b, _ = cpu_backend.minhash(buffers([ref.decode(d) for d in BAD_BYTES]), hp, kind, 2)
        assert np.array_equal(a, b)


def test_minhash_seed_changes_signature(cpu_backend):
    docs = ["the quick brown fox jumps over the lazy dog"]
    a, _ = cpu_backend.minhash(buffers(docs), hash_params(1, NUM_PERM), "word", 2)
    b, _ = cpu_backend.minhash(buffers(docs), hash_params(2, NUM_PERM), "word", 2)
    assert not np.array_equal(a, b)
    for seed in (0, 2**64 - 1):
        check_minhash(cpu_backend, docs + TEXTS[:6], "char", 3, seed=seed)


def test_minhash_empty_batch(cpu_backend):
    hp = hash_params(SEED, NUM_PERM)
    empty = string_buffers(pa.array([], pa.large_string()))
    sig, counts = cpu_backend.minhash(empty, hp, "word", 3)
    assert sig.shape == (0, NUM_PERM) and counts.shape == (0,)
    offsets, values = cpu_backend.shingle_sets(empty, hp, "word", 3)
    assert offsets.tolist() == [0] and values.shape == (0,)


def test_minhash_all_empty_documents(cpu_backend):
    hp = hash_params(SEED, NUM_PERM)
    for docs in (["", "", ""], [None, "", None]):
        sig, counts = cpu_backend.minhash(string_buffers(pa.array(docs, pa.string())), hp, "char", 3)
        assert sig.dtype == np.uint32 and (sig == SENTINEL).all() and (counts == 0).all()


def test_minhash_nulls_read_as_empty(cpu_backend):
    hp = hash_params(SEED, NUM_PERM)
    docs = ["abc def", None, "ghi", None]
    sig, counts = cpu_backend.minhash(string_buffers(pa.array(docs, pa.string())), hp, "word", 1)
    want = [ref.signature(d or "", "word", 1, ref.params(SEED, NUM_PERM)) for d in docs]
    assert sig.tolist() == want
    assert counts.tolist() == [2, 0, 1, 0]


def test_minhash_sliced_arrow_array(cpu_backend):
    """An Arrow slice (non-zero offset) reads its own documents only."""
    hp = hash_params(SEED, NUM_PERM)
    arr = pa.array(TEXTS, pa.string()).slice(5, 9)
    sig, _ = cpu_backend.minhash(string_buffers(arr), hp, "char", 2)
    prm = ref.params(SEED, NUM_PERM)
    assert sig.tolist() == [ref.signature(t, "char", 2, prm) for t in TEXTS[5:14]]


def test_minhash_docs_subset(cpu_backend):
    hp = hash_params(SEED, NUM_PERM)
    buf = buffers(TEXTS)
    full, full_counts = cpu_backend.minhash(buf, hp, "word", 2)
    docs = np.array([3, 0, 13, 13, len(TEXTS) - 1, 7], np.int64)
    sub, sub_counts = cpu_backend.minhash(buf, hp, "word", 2, docs=docs)
    assert sub.dtype == full.dtype
    assert np.array_equal(sub, full[docs])
    assert np.array_equal(sub_counts, full_counts[docs])
    prm = ref.params(SEED, NUM_PERM)
    assert sub.tolist() == [ref.signature(TEXTS[d], "word", 2, prm) for d in docs]
    none, none_counts = cpu_backend.minhash(buf, hp, "word", 2, docs=np.zeros(0, np.int64))
    assert none.shape == (0, NUM_PERM) and none_counts.shape == (0,)
    # docs given as a plain list works too
    lst, _ = cpu_backend.minhash(buf, hp, "word", 2, docs=[13, 0])
    assert np.array_equal(lst, full[[13, 0]])


@pytest.mark.parametrize("kind", KINDS)
def test_signature_prefix_property(cpu_backend, kind):
    buf = buffers(TEXTS)
    long_params = hash_params(SEED, 64)
    full, _ = cpu_backend.minhash(buf, long_params, kind, 3)
    for k in (1, 5, 16):
        prefix, _ = cpu_backend.minhash(buf, long_params, kind, 3, num_perm=k)
        assert np.array_equal(prefix, full[:, :k])
        short, _ = cpu_backend.minhash(buf, hash_params(SEED, k), kind, 3)
        assert np.array_equal(short, full[:, :k])
    prm = ref.params(SEED, 64)
    assert full[13].tolist() == ref.signature(TEXTS[13], kind, 3, prm)
    assert ref.signature(TEXTS[13], kind, 3, prm, num_perm=5) == full[13, :5].tolist()


def big_document(target_bytes=1_000_000, seed=0):
    """~1 MB of text from a small vocabulary (multi-byte chars, Unicode spaces)."""
    rng = random.Random(seed)
    vocab = [
        "the", "of", "données", "naïve", "日本語", "テキスト", "😀ok", "x", "lorem", "ipsum",
        "straße", "e\u0301t\u0301e\u0301", "𝔘𝔫𝔦", "data", "dedup", "near", "duplicate", "minhash",
        "a", "b", "c", "中文", "한국어", "ё", "ο", "λ", "word", "token", "shingle", "band",
    ]
    spaces = [" "] * 12 + ["  ", "\n", "\t", "\u3000", "\u00a0", "\u2028"]
    parts, size = [], 0
    while size < target_bytes:
        w = rng.choice(vocab) + rng.choice(spaces)
        parts.append(w)
        size += len(w.encode("utf-8"))
    return "".join(parts)


@pytest.fixture(scope="module")
def big_doc():
    return big_document()


@pytest.mark.parametrize(("kind", "n"), [("char", 5), ("word", 3)])
def test_minhash_one_megabyte_document(cpu_backend, big_doc, kind, n):
    assert len(big_doc.encode("utf-8")) >= 1_000_000
    docs = ["short one", big_doc, "", big_doc[:1000]]
    check_minhash(cpu_backend, docs, kind, n, num_perm=8)


def test_shingle_sets_one_megabyte_document(cpu_backend, big_doc):
    check_shingle_sets(cpu_backend, [big_doc, "tail"], "word", 2)


# ------------------------------------------------------------------ shingle sets and Jaccard


@pytest.mark.parametrize("n", NGRAMS)
@pytest.mark.parametrize("kind", KINDS)
def test_shingle_sets_match_reference(cpu_backend, kind, n):
    check_shingle_sets(cpu_backend, TEXTS, kind, n)
    check_shingle_sets(cpu_backend, BAD_BYTES, kind, n)


def test_shingle_sets_docs_subset(cpu_backend):
    hp = hash_params(SEED, 4)
    buf = buffers(TEXTS)
    offsets, values = cpu_backend.shingle_sets(buf, hp, "char", 3)
    docs = [13, 0, 2, 13, 24]
    sub_off, sub_val = cpu_backend.shingle_sets(buf, hp, "char", 3, docs=np.array(docs))
    assert sub_off.shape == (len(docs) + 1,)
    for k, d in enumerate(docs):
        assert np.array_equal(sub_val[sub_off[k] : sub_off[k + 1]], values[offsets[d] : offsets[d + 1]])


def _sort_unique_cases():
    rng = np.random.default_rng(7)
    top = np.uint64(0xFFFFFFFFFFFFFFFF)
    for m in (0, 1, 2, 3, 23, 24, 25, 26, 64, 65, 200, 3000, 200_000):  # around SMALL_RUN, past 2**BUCKET_BITS buckets
        yield rng.integers(0, 2**63, m, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, m, dtype=np.uint64)
        yield rng.integers(0, 5, m, dtype=np.uint64)  # few values, one bucket: repeats
        yield np.arange(m, dtype=np.uint64)[::-1].copy()  # all in the lowest bucket: Numba's sort of a large bucket
        yield top - rng.integers(0, 3 * m + 1, m, dtype=np.uint64)  # the highest bucket
        yield np.full(m, 42, np.uint64)
        uniform = rng.integers(0, 2**63, m, dtype=np.uint64) << np.uint64(1)
        yield np.concatenate((uniform, uniform[: m // 3], np.sort(uniform)[: m // 4]))  # repeats among spread values


def test_sort_unique_kernel_equals_numpy_unique():
    from gpu_dedup.kernels import hash_cpu

    for case in _sort_unique_cases():
        pad = np.array([7, 9], np.uint64)  # values around the segment stay untouched
        values = np.concatenate((pad, case, pad))
        tmp = np.empty(case.shape[0], np.uint64)
        starts = np.empty((1 << hash_cpu.BUCKET_BITS) + 1, np.int64)
        u = hash_cpu._sort_unique(values, 2, 2 + case.shape[0], tmp, starts)
        want = np.unique(case)
        assert u == want.shape[0]
        assert np.array_equal(values[2 : 2 + u], want)
        assert np.array_equal(values[:2], pad) and np.array_equal(values[-2:], pad)


@pytest.mark.parametrize("kind", KINDS)
def test_shingle_sets_of_many_sizes_match_reference(cpu_backend, kind):
    """Documents of 0 to 80 words (shorter than n, one shingle, around the kernels' small-run cut), with and
    without repeated shingles, and a batch where no document repeats a shingle."""
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(60)]
    docs = [" ".join(rng.choice(vocab) for _ in range(k)) for k in range(81)]
    docs += [" ".join(vocab[:k]) for k in range(61)]  # distinct words: no repeated shingle
    check_shingle_sets(cpu_backend, docs, kind, 3)
    check_shingle_sets(cpu_backend, [" ".join(vocab[:k]) for k in (0, 1, 2, 3, 30, 60)], kind, 3)
    # as many shingles as the kernels' room for them: one-byte words and single spaces, one-byte code points
    tight = ["a b c d e f g", "x", "a  b", "ab", "abcdefgh" * 40, " ".join("abcdefghij" * 20)]
    check_shingle_sets(cpu_backend, tight, kind, 1)


def test_shingle_set_size_equals_reference_distinct_values(cpu_backend):
    prm = ref.params(SEED, 4)
    for kind in KINDS:
        for n in NGRAMS:
            offsets, _ = cpu_backend.shingle_sets(buffers(TEXTS), hash_params(SEED, 4), kind, n)
            sizes = np.diff(offsets).tolist()
            assert sizes == [len(set(ref.shingle_values(t, kind, n, prm))) for t in TEXTS]
            # hashed set sizes equal the string set sizes (no 64-bit collisions here)
            assert sizes == [len(ref.shingle_strings(t, kind, n)) for t in TEXTS]


@pytest.mark.parametrize("n", (1, 2, 3, 5, 24))
@pytest.mark.parametrize("kind", KINDS)
def test_jaccard_pairs_match_reference(cpu_backend, kind, n):
    docs = TEXTS + [ref.decode(b) for b in BAD_BYTES]
    offsets, values = cpu_backend.shingle_sets(buffers(docs), hash_params(SEED, 4), kind, n)
    m = len(docs)
    left = [i for i in range(m) for j in range(i, m)]
    right = [j for i in range(m) for j in range(i, m)]
    got = cpu_backend.jaccard_pairs(offsets, values, left, right)
    assert got.dtype == np.float64 and got.shape == (len(left),)
    want = [ref.jaccard(docs[i], docs[j], kind, n) for i, j in zip(left, right)]
    assert got.tolist() == want


def test_jaccard_pairs_known_values(cpu_backend):
    docs = ["a b c d", "a b c e", "", "", "x"]
    offsets, values = cpu_backend.shingle_sets(buffers(docs), hash_params(SEED, 4), "word", 1)
    got = cpu_backend.jaccard_pairs(offsets, values, [0, 0, 2, 2, 4], [1, 0, 3, 4, 4])
    assert got.tolist() == [3 / 5, 1.0, 0.0, 0.0, 1.0]
    assert cpu_backend.jaccard_pairs(offsets, values, [], []).shape == (0,)


def test_signature_similarity(cpu_backend):
    sig = check_minhash(cpu_backend, TEXTS, "word", 2)
    m = len(TEXTS)
    left = [i for i in range(m) for j in range(m)]
    right = [j for i in range(m) for j in range(m)]
    got = cpu_backend.signature_similarity(sig, left, right)
    rows = sig.tolist()
    want = [sum(x == y for x, y in zip(rows[i], rows[j])) / NUM_PERM for i, j in zip(left, right)]
    assert got.tolist() == want


# ------------------------------------------------------------------ band hashes

HYP_BANDS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize(("bands", "rows"), [(4, 4), (16, 1), (1, 16), (3, 5), (2, 3)])
def test_band_hashes_match_reference(cpu_backend, bands, rows):
    hp = hash_params(SEED, NUM_PERM)
    sig, _ = cpu_backend.minhash(buffers(TEXTS), hp, "char", 3)
    got = cpu_backend.band_hashes(sig, bands, rows, hp.band_base)
    assert got.dtype == np.uint64 and got.shape == (len(TEXTS), bands)
    for k, row in enumerate(sig.tolist()):
        assert got[k].tolist() == ref.band_hashes(row, bands, rows, hp.band_base)


@st.composite
def signature_matrices(draw):
    """(signatures, bands, rows, band_base): random 32-bit values, the sentinel and 0 among them,
    sometimes more columns than bands * rows (a band layout need not use them all)."""
    bands, rows = draw(st.integers(1, 12)), draw(st.integers(1, 16))
    cols = bands * rows + draw(st.integers(0, 3))
    value = st.one_of(st.integers(0, SENTINEL), st.sampled_from([0, 1, SENTINEL - 1, SENTINEL]))
    docs = draw(st.lists(st.lists(value, min_size=cols, max_size=cols), min_size=1, max_size=5))
    base = draw(st.one_of(st.integers(0, 2**64 - 1),  # any 64-bit value works as a base in the code
                          st.integers(0, 2**64 - 1).map(lambda seed: hash_params(seed, cols).band_base)))
    return np.array(docs, np.uint32), bands, rows, base


@HYP_BANDS
@given(case=signature_matrices())
def test_band_hashes_random_signatures_equal_reference(cpu_backend, case):
    sig, bands, rows, base = case
    got = cpu_backend.band_hashes(sig, bands, rows, base)
    assert got.dtype == np.uint64 and got.shape == (sig.shape[0], bands)
    assert got.tolist() == [ref.band_hashes(row, bands, rows, base) for row in sig.tolist()]


def test_band_hashes_sentinel_and_extremes(cpu_backend):
    hp = hash_params(SEED, 8)
    rng = random.Random(3)
    rows32 = [[SENTINEL] * 8, [0] * 8, [SENTINEL - 1] * 8] + [[rng.randrange(SENTINEL + 1) for _ in range(8)]
                                                            for _ in range(20)]
    sig32 = np.array(rows32, np.uint32)
    for bands, rows in ((2, 4), (4, 2)):
        got = cpu_backend.band_hashes(sig32, bands, rows, hp.band_base)
        assert got.tolist() == [ref.band_hashes(r, bands, rows, hp.band_base) for r in rows32]
    # bands are distinguished by their index even when their rows are equal
    assert len(set(cpu_backend.band_hashes(sig32[:1], 8, 1, hp.band_base)[0].tolist())) == 8
    # integer signatures of other dtypes are accepted when their values are 32-bit; larger ones are refused
    assert np.array_equal(cpu_backend.band_hashes(sig32.astype(np.int64), 2, 4, hp.band_base),
                          cpu_backend.band_hashes(sig32, 2, 4, hp.band_base))
    with pytest.raises(ValueError, match="32-bit"):
        cpu_backend.band_hashes(np.full((1, 8), 2**40, np.uint64), 2, 4, hp.band_base)


# ------------------------------------------------------------------ exact hashes


def test_exact_hashes_match_reference(cpu_backend):
    prm = ref.params(SEED, 4)
    hp = hash_params(SEED, 4)
    docs = [t.encode("utf-8") for t in TEXTS] + BAD_BYTES + [bytes(range(k)) for k in range(18)]
    docs += [b"\x00", b"\x00\x00", b"\x00" * 8, b"\xff" * 8, b"\xff" * 9]
    got = cpu_backend.exact_hashes(buffers(docs), hp.exact_seed1, hp.exact_seed2)
    assert got.dtype == np.uint64 and got.shape == (len(docs), 2)
    for k, d in enumerate(docs):
        assert (len(d), *got[k].tolist()) == ref.exact_key(d, prm), d
    # zero padding: trailing NULs within the last word change the length, not the hash
    assert ref.exact_key(b"a", prm)[1:] == ref.exact_key(b"a\x00", prm)[1:]
    # documents that differ in one 8-byte word never share a lane (each step is a bijection)
    one = [bytes([i]) + b"same tail of the document" for i in range(256)]
    lanes = cpu_backend.exact_hashes(buffers(one), hp.exact_seed1, hp.exact_seed2)
    assert len(set(lanes[:, 0].tolist())) == len(set(lanes[:, 1].tolist())) == 256


# ------------------------------------------------------------------ components


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(0, 30),
    raw=st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=40),
)
def test_components_match_reference(cpu_backend, n, raw):
    edges = [(u, v) for u, v in raw if u < n and v < n]
    src = np.array([u for u, _ in edges], np.int64)
    dst = np.array([v for _, v in edges], np.int64)
    got = cpu_backend.components(src, dst, n)
    assert got.tolist() == ref.connected_components(n, edges)


# ------------------------------------------------------------------ random text


SPACEY = st.text(
    alphabet=st.one_of(
        st.sampled_from(" \t\n\r\x0b\x0c\x1c\x85\u00a0\u1680\u2000\u2028\u2029\u202f\u205f\u3000\u180e\u200b"),
        st.sampled_from("abcé日😀\u0301"),
        st.characters(codec="utf-8"),
    ),
    max_size=60,
)

HYP = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


@HYP
@given(
    docs=st.lists(st.one_of(st.text(max_size=80), SPACEY), min_size=1, max_size=6),
    kind=st.sampled_from(KINDS),
    n=st.sampled_from((1, 2, 3, 5)),
)
def test_minhash_random_text(cpu_backend, docs, kind, n):
    check_minhash(cpu_backend, docs, kind, n, num_perm=8)


@HYP
@given(
    docs=st.lists(st.binary(max_size=60), min_size=1, max_size=6),
    kind=st.sampled_from(KINDS),
    n=st.sampled_from((1, 2, 4)),
)
def test_minhash_random_bytes(cpu_backend, docs, kind, n):
    check_minhash(cpu_backend, docs, kind, n, num_perm=4)
    check_shingle_sets(cpu_backend, docs, kind, n)


@HYP
@given(
    docs=st.lists(st.one_of(st.text(max_size=40), SPACEY), min_size=1, max_size=5),
    kind=st.sampled_from(KINDS),
    n=st.sampled_from((1, 2, 3)),
)
def test_shingle_sets_and_jaccard_random_text(cpu_backend, docs, kind, n):
    offsets, values = check_shingle_sets(cpu_backend, docs, kind, n)
    m = len(docs)
    left = [i for i in range(m) for j in range(m)]
    right = [j for i in range(m) for j in range(m)]
    got = cpu_backend.jaccard_pairs(offsets, values, left, right).tolist()
    want = [ref.jaccard(docs[i], docs[j], kind, n) for i, j in zip(left, right)]
    assert got == want


@HYP
@given(docs=st.lists(st.binary(max_size=40), min_size=1, max_size=8))
def test_exact_hashes_random_bytes(cpu_backend, docs):
    prm = ref.params(SEED, 1)
    hp = hash_params(SEED, 1)
    got = cpu_backend.exact_hashes(buffers(docs), hp.exact_seed1, hp.exact_seed2)
    assert [(len(d), *g) for d, g in zip(docs, got.tolist())] == [ref.exact_key(d, prm) for d in docs]


def test_only_kernel_arguments_are_borrowed():
    """``_borrow`` drops a view's memory owner: Numba frees an array after its last use, so a borrowed view of
    an array the kernel allocated would outlive its memory.  Only the kernels' own arguments (alive for the
    whole call) may be borrowed."""
    import ast
    import inspect

    from gpu_dedup.kernels import hash_cpu as cpu

    tree = ast.parse(inspect.getsource(cpu))
    borrowed = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        params = {a.arg for a in fn.args.args}
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            if isinstance(call.func, ast.Name) and call.func.id == "_borrow":
                arg = call.args[0]
                borrowed.append((fn.name, ast.unparse(arg), isinstance(arg, ast.Name) and arg.id in params))
    assert borrowed, "no _borrow call found: the check reads the wrong module"
    assert [b for b in borrowed if not b[2]] == []


@pytest.mark.parametrize("preset, expected", [({}, "PASSIVE"), ({"OMP_WAIT_POLICY": "ACTIVE"}, "ACTIVE"),
                                              ({"GOMP_SPINCOUNT": "1000"}, None)])
def test_openmp_wait_policy(preset, expected):
    """Importing the kernels makes libgomp's workers sleep between parallel loops (they spun, taking the core
    the read stage's reader threads needed), unless the user chose a wait policy or a spin count."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(preset)
    code = "import os, gpu_dedup.kernels; print(os.environ.get('OMP_WAIT_POLICY'))"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(expected)
