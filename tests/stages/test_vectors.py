"""Vectors from Arrow embedding columns and hashed term-weight vectors of text, against the reference."""

import math

import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.errors import InputError
from gpu_dedup.stages import projections as pj
from gpu_dedup.stages import vectors as vx
from gpu_dedup.stages.verify import text_cosine_similarity
from tests import reference_cosine as ref


def _fixed(m, dtype=pa.float32()):
    flat = pa.array(np.asarray(m).reshape(-1), dtype)
    return pa.FixedSizeListArray.from_arrays(flat, np.asarray(m).shape[1])


# ---------------------------------------------------------------- embedding columns


def test_fixed_size_list_float32_is_zero_copy():
    m = np.arange(12, dtype=np.float32).reshape(4, 3) + 1
    col = _fixed(m)
    v = vx.from_arrow(col)
    assert v.zero_copy and v.dim == 3 and np.array_equal(v.matrix, m)
    child = np.frombuffer(col.values.buffers()[1], np.float32)
    assert np.shares_memory(v.matrix, child)
    assert v.counts["ok"] == 4


def test_list_float32_back_to_back_is_zero_copy_and_slices_are_honoured():
    m = np.arange(20, dtype=np.float32).reshape(5, 4) + 1
    col = pa.ListArray.from_arrays(pa.array(np.arange(6, dtype=np.int32) * 4), pa.array(m.reshape(-1)))
    v = vx.from_arrow(col)
    assert v.zero_copy and np.array_equal(v.matrix, m)
    s = vx.from_arrow(col.slice(2, 2))
    assert np.array_equal(s.matrix, m[2:4])
    fs = vx.from_arrow(_fixed(m).slice(1, 3))
    assert np.array_equal(fs.matrix, m[1:4]) and fs.zero_copy


@pytest.mark.parametrize("typ", [pa.float16(), pa.float64()])
def test_float16_and_float64_values_become_float32(typ):
    m = np.array([[0.5, -1.25, 3.0], [1e-3, 2.0, -7.5]])
    v = vx.from_arrow(pa.array(m.tolist(), pa.list_(typ)))
    assert v.matrix.dtype == np.float32 and not v.zero_copy
    assert np.array_equal(v.matrix, m.astype(typ.to_pandas_dtype()).astype(np.float32))


def test_large_list_and_chunked_columns():
    a = pa.array([[1.0, 2.0], [3.0, 4.0]], pa.large_list(pa.float32()))
    b = pa.array([[5.0, 6.0]], pa.large_list(pa.float32()))
    v = vx.from_arrow(pa.chunked_array([a, b]))
    assert v.matrix.tolist() == [[1, 2], [3, 4], [5, 6]] and not v.zero_copy


def test_null_rows_and_zero_vectors_are_kept_and_counted():
    col = pa.array([[1.0, 0.0], None, [0.0, 0.0], [0.0, -2.0]], pa.list_(pa.float32()))
    v = vx.from_arrow(col)
    assert v.status.tolist() == [pj.OK, pj.NULL_ROW, pj.ZERO_VECTOR, pj.OK]
    assert v.counts == {"ok": 2, "zero_vector": 1, "non_finite": 0, "null": 1, "bad_length": 0, "empty_text": 0}
    sig = pj.signatures(v.matrix, 64, 1, status=v.status)
    assert sig.status.tolist() == v.status.tolist()
    h = pj.band_hashes(sig.bits, 4, 16)
    b = pj.bucket_rows(h, sig.status)
    assert not set(b.members.tolist()) & {1, 2}


def test_nan_and_inf_name_the_row_and_shard():
    col = pa.array([[1.0, 2.0], [3.0, float("nan")], [float("inf"), 1.0]], pa.list_(pa.float32()))
    with pytest.raises(InputError) as err:
        vx.from_arrow(col, shard="part-00003.parquet", row_offset=1000, name="vector column 'emb'")
    msg = str(err.value)
    assert "vector column 'emb': row 1001 of shard part-00003.parquet holds NaN" in msg
    assert "(2 such rows in all)" in msg and "cosine.bad_vectors: keep" in msg
    v = vx.from_arrow(col, bad_vectors="keep")
    assert v.status.tolist() == [pj.OK, pj.NON_FINITE, pj.NON_FINITE] and v.counts["non_finite"] == 2


def test_float64_beyond_float32_range_is_non_finite():
    col = pa.array([[1e300, 1.0], [1.0, 1.0]], pa.list_(pa.float64()))
    with pytest.raises(InputError, match="beyond the float32 range"):
        vx.from_arrow(col)


def test_null_value_inside_a_vector_is_non_finite():
    col = pa.array([[1.0, None], [1.0, 2.0]], pa.list_(pa.float32()))
    assert vx.from_arrow(col, bad_vectors="keep").status.tolist() == [pj.NON_FINITE, pj.OK]
    fcol = pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0, None, 4.0], pa.float32()), 2)
    assert vx.from_arrow(fcol, bad_vectors="keep").status.tolist() == [pj.OK, pj.NON_FINITE]


def test_rows_of_another_length():
    col = pa.array([None, [1.0, 2.0, 3.0], [1.0, 2.0], [4.0, 5.0, 6.0]], pa.list_(pa.float32()))
    with pytest.raises(InputError, match=r"row 12 of shard s.parquet has 2 values, expected 3 \(the dimension"):
        vx.from_arrow(col, shard="s.parquet", row_offset=10)
    v = vx.from_arrow(col, bad_vectors="keep")
    assert v.status.tolist() == [pj.NULL_ROW, pj.OK, pj.BAD_LENGTH, pj.OK]
    assert v.matrix.tolist() == [[0, 0, 0], [1, 2, 3], [0, 0, 0], [4, 5, 6]]
    with pytest.raises(InputError, match="row 1 has 3 values, expected 2"):
        vx.from_arrow(col, dim=2)
    fixed = _fixed(np.ones((2, 4), np.float32))
    with pytest.raises(InputError, match="has 4 values, expected 3"):
        vx.from_arrow(fixed, dim=3)


def test_all_null_and_empty_columns():
    v = vx.from_arrow(pa.array([None, None], pa.list_(pa.float32())))
    assert v.status.tolist() == [pj.NULL_ROW, pj.NULL_ROW]
    assert len(vx.from_arrow(pa.array([], pa.list_(pa.float32())))) == 0
    with pytest.raises(InputError, match="empty vector"):
        vx.from_arrow(pa.array([[], []], pa.list_(pa.float32())))


def test_wrong_types_are_named():
    with pytest.raises(InputError, match="expected float16, float32 or float64"):
        vx.from_arrow(pa.array([[1, 2]], pa.list_(pa.int32())))
    with pytest.raises(InputError, match=r"has Arrow type string in shard x; expected list<float>"):
        vx.from_arrow(pa.array(["a"]), shard="x")


def test_from_numpy():
    m = np.array([[1, 2], [0, 0], [np.nan, 1]], np.float64)
    with pytest.raises(InputError, match="row 2 holds NaN"):
        vx.from_numpy(m)
    assert vx.from_numpy(m, bad_vectors="keep").status.tolist() == [pj.OK, pj.ZERO_VECTOR, pj.NON_FINITE]
    with pytest.raises(InputError, match="2-d"):
        vx.from_numpy(np.ones(3))


# ---------------------------------------------------------------- text features and term-weight vectors

DOCS = [
    b"",
    b"a",
    b"hello world",
    b"the quick brown fox jumps over the lazy dog the quick brown fox",
    "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e  stra\u00dfe\u3000x".encode(),
    b"ab\xff cd \xe2\x82 ef",
    b"   ",
    b"one two three four five six one two three four five six",
]


def _buf():
    return string_buffers(pa.array(DOCS, pa.large_binary()))


@pytest.mark.parametrize("shingle,n", [("word", 1), ("word", 3), ("char", 1), ("char", 5)])
def test_feature_sets_equal_reference(shingle, n):
    offsets, feat, tf = vx.feature_sets(_buf(), shingle, n)
    for i, d in enumerate(DOCS):
        counts = {}
        for f in ref.features(d, shingle, n):
            counts[f] = counts.get(f, 0) + 1
        got = dict(zip(feat[offsets[i]:offsets[i + 1]].tolist(), tf[offsets[i]:offsets[i + 1]].tolist()))
        assert got == counts, (i, d)
        assert list(feat[offsets[i]:offsets[i + 1]]) == sorted(counts)


def test_feature_counts_and_exact_products_of_the_scalar_twins():
    """Two pieces of rules 6 and 8 that only the GPU kernels call, run on their CPU twins: the feature count the
    GPU sizes its buffers by, and the sparse products formed exactly in int64 (the correctly rounded float64
    product, so the sums do not depend on whether a compiler fuses a multiply with the add)."""
    from gpu_dedup.kernels.cosine_cpu import dev
    from gpu_dedup.kernels.cosine_scalar import EXACT_WEIGHT

    buf = _buf()
    for shingle, n in [("word", 1), ("word", 3), ("char", 1), ("char", 5)]:
        for i, d in enumerate(DOCS):
            got = dev.doc_feature_count(buf.data, buf.offsets[i], buf.offsets[i + 1], shingle == "word", n)
            assert got == len(ref.features(d, shingle, n)), (shingle, n, d)
    rng = np.random.default_rng(7)
    x = rng.integers(0, 2**31, 500).astype(np.float64)
    y = rng.integers(2**20, 2**31, 500).astype(np.float64)
    assert sum(a * b > 2**53 for a, b in zip(x, y)) > 100  # many products beyond 2**53 ...
    for a, b in zip(x, y):
        assert dev.exact_product(a, b) == a * b  # ... round as a float64 multiply rounds them
    big = float(EXACT_WEIGHT) * 3
    assert dev.exact_product(big, 7.0) == big * 7.0 and dev.exact_product(7.0, big) == 7.0 * big


def test_document_frequencies_idf_and_term_vectors_equal_reference():
    bits = 8
    df, n = vx.document_frequencies(_buf(), "word", 2, bits, chunk_bytes=20)  # several chunks
    assert n == len(DOCS) and df.tolist() == ref.document_frequencies(DOCS, "word", 2, bits)
    idf = vx.idf_table(df, n, bits)
    assert idf.weights.tolist() == ref.idf_weights(df.tolist(), n)
    tv = vx.term_vectors(_buf(), "word", 2, idf)
    for i, d in enumerate(DOCS):
        want = ref.term_vector(d, "word", 2, idf.weights.tolist(), bits)
        got = dict(zip(tv.features[tv.offsets[i]:tv.offsets[i + 1]].tolist(),
                       tv.weights[tv.offsets[i]:tv.offsets[i + 1]].tolist()))
        assert got == want
        assert tv.norms[i] == pytest.approx(math.sqrt(math.fsum(w * w for w in want.values())), rel=1e-15)
    df2, _ = vx.document_frequencies(_buf(), "word", 2, bits, df=df.copy())
    assert np.array_equal(df2, 2 * df)  # a running total over shards


@pytest.mark.parametrize("weighting", ["tf", "tfidf"])
def test_text_signatures_and_exact_cosine_equal_reference(weighting):
    buf = _buf()
    idf = None
    if weighting == "tfidf":
        df, n = vx.document_frequencies(buf, "char", 3, 10)
        idf = vx.idf_table(df, n, 10)
    sig = pj.text_signatures(buf, 128, 77, shingle="char", ngram=3, idf=idf)
    for i, d in enumerate(DOCS):
        vec = ref.term_vector(d, "char", 3, idf.weights.tolist() if idf else None, 10)
        if not vec:
            assert sig.status[i] == pj.EMPTY_TEXT and not sig.bits[i].any()
            continue
        assert sig.status[i] == pj.OK
        assert [int(w) for w in sig.bits[i]] == ref.pack(ref.simhash(vec, 128, 77))
    left = np.array([2, 3, 3, 4, 7, 0], np.int64)
    right = np.array([3, 7, 3, 5, 3, 2], np.int64)
    got = text_cosine_similarity(left, right, buf, "char", 3, idf, chunk_bytes=30)
    for k in range(left.shape[0]):
        a = ref.term_vector(DOCS[left[k]], "char", 3, idf.weights.tolist() if idf else None, 10)
        b = ref.term_vector(DOCS[right[k]], "char", 3, idf.weights.tolist() if idf else None, 10)
        assert got[k] == pytest.approx(ref.sparse_cosine(a, b), rel=1e-12, abs=1e-15)
    assert got[2] == pytest.approx(1.0)


def test_text_signatures_of_a_subset_and_status():
    buf = _buf()
    full = pj.text_signatures(buf, 64, 1, ngram=2)
    part = pj.text_signatures(buf, 64, 1, ngram=2, docs=[7, 2])
    assert np.array_equal(part.bits, full.bits[[7, 2]])
    st = vx.text_status(buf, "word", 2)
    assert st.tolist() == full.status.tolist()
    assert st[0] == st[6] == pj.EMPTY_TEXT and st[1] == pj.OK  # "a": one short feature


def test_near_duplicate_texts_share_more_bits_than_unrelated_ones():
    base = " ".join(f"w{i % 97}x{i % 13}" for i in range(400))
    near = base.replace("w5x5", "changed", 1)
    other = " ".join(f"z{i % 89}y{i % 7}" for i in range(400))
    sig = pj.text_signatures(pa.array([base, near, other]), 256, 3, ngram=3)
    from gpu_dedup.stages.verify import hamming_distance

    h = hamming_distance(np.array([0, 0]), np.array([1, 2]), sig.bits)
    assert h[0] < 40 < 90 < h[1]


from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(alphabet=st.sampled_from("ab c\u00e9\u3000\n\u65e5x"), max_size=30),
                          st.binary(max_size=12)), min_size=1, max_size=5),
       st.sampled_from([("word", 1), ("word", 2), ("char", 3)]))
def test_features_and_simhash_property(docs, mode):
    raw = [d.encode() if isinstance(d, str) else d for d in docs]
    buf = string_buffers(pa.array(raw, pa.large_binary()))
    shingle, n = mode
    offsets, feat, tf = vx.feature_sets(buf, shingle, n)
    sig = pj.text_signatures(buf, 64, 5, shingle=shingle, ngram=n)
    for i, d in enumerate(raw):
        counts = {}
        for f in ref.features(d, shingle, n):
            counts[f] = counts.get(f, 0) + 1
        assert dict(zip(feat[offsets[i]:offsets[i + 1]].tolist(), tf[offsets[i]:offsets[i + 1]].tolist())) == counts
        if counts:
            vec = {f: float(c) for f, c in counts.items()}
            assert [int(w) for w in sig.bits[i]] == ref.pack(ref.simhash(vec, 64, 5))
        else:
            assert sig.status[i] == pj.EMPTY_TEXT


def test_a_column_of_null_type_is_null_rows_and_lists_of_nulls_are_judged_by_their_values():
    """A column holding no vector at all (Arrow type null: a JSON field always null, an all-None pandas column)
    is null rows, as nulls in a list column are; lists whose values are all null (list<null>) follow the rules
    of null values and lengths, not a type error."""
    v = vx.from_arrow(pa.nulls(3), shard="s.jsonl")
    assert v.status.tolist() == [pj.NULL_ROW] * 3 and len(v) == 3
    assert vx.from_arrow(pa.chunked_array([pa.nulls(2), pa.nulls(1)])).status.tolist() == [pj.NULL_ROW] * 3
    assert vx.from_arrow(pa.nulls(2), dim=4).matrix.shape == (2, 4)
    nulls_inside = pa.array([None, [None, None], [None, None]], pa.list_(pa.null()))
    with pytest.raises(InputError, match="row 1 of shard s.jsonl holds NaN, infinity, a null value"):
        vx.from_arrow(nulls_inside, shard="s.jsonl")
    assert vx.from_arrow(nulls_inside, bad_vectors="keep").status.tolist() == [pj.NULL_ROW, pj.NON_FINITE,
                                                                                pj.NON_FINITE]
    assert vx.from_arrow(nulls_inside, bad_vectors="keep", dim=3).status.tolist() == [pj.NULL_ROW, pj.BAD_LENGTH,
                                                                                       pj.BAD_LENGTH]


def test_more_dimensions_than_supported_are_one_input_error():
    """Vectors longer than projections.MAX_DIM are refused where they are read, naming the shard, the length, the
    limit and the fix (was a ValueError from the signature stage: exit 1 with a traceback)."""
    d = pj.MAX_DIM + 1
    col = pa.FixedSizeListArray.from_arrays(pa.array(np.ones(d, np.float32)), d)
    for bad in ("error", "keep"):
        with pytest.raises(InputError, match=rf"shard s.parquet has {d:,} dimensions; at most {pj.MAX_DIM:,}.*reduce"):
            vx.from_arrow(col, shard="s.parquet", bad_vectors=bad)
    with pytest.raises(InputError, match=f"has {d:,} dimensions"):
        vx.from_numpy(np.ones((1, d), np.float32))
    assert vx.from_arrow(pa.FixedSizeListArray.from_arrays(pa.array(np.ones(pj.MAX_DIM, np.float32)),
                                                           pj.MAX_DIM)).dim == pj.MAX_DIM


def test_vectors_that_are_no_matrix_of_numbers_are_one_input_error():
    """In-memory vectors (Index.query(vectors=...), the DataFrame API's matrices) of rows of different lengths or
    of non-numbers: one InputError naming the problem and the fix (were NumPy's ValueErrors, "setting an array
    element with a sequence", "could not convert string to float")."""
    with pytest.raises(InputError, match=r"query vectors .*one length.*row 1 has 2"):
        vx.from_numpy([[1.0, 2.0, 3.0], [1.0, 2.0]], name="query vectors")
    with pytest.raises(InputError, match=r"query vectors .*numbers.*'a'"):
        vx.from_numpy([["a", "b"]], name="query vectors")
    assert vx.from_numpy([[1, 2], [3, 4]]).matrix.dtype == np.float32
