"""The CPU's replacement of rule 7's inner loop (``cosine_cpu.simhash_add``) against the scalar source.

The scalar ``cosine_scalar.simhash_add`` is the specification (the CUDA twin
compiles it); the CPU computes the same sums in two passes over a scratch
buffer.  Both are run here on the same accumulator, feature keys, weights and
hyperplane offsets, and must leave identical sums; a whole kernel run at the
default 1,024 bits is checked against the pure-Python reference.
"""

import numpy as np
import pytest
from gpu_dedup.kernels import cosine_cpu as ck
from gpu_dedup.kernels import cosine_scalar as cs
from gpu_dedup.kernels.cosine_scalar import GAUSS8
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import reference_cosine as ref

U64 = np.uint64


def scalar_sums(acc, z, weight, w0):
    with np.errstate(over="ignore"):  # uint64 arithmetic wraps by definition (rule 1)
        cs.simhash_add(acc, U64(z), np.int64(weight), GAUSS8, w0, None)
    return acc


def cpu_sums(acc, z, weight, w0):
    scratch = np.full(ck.simhash_scratch(acc.shape[0]), 0xDEAD, np.uint64)  # garbage in: all overwritten
    _add(acc, U64(z), np.int64(weight), GAUSS8, np.int64(w0), scratch)
    return acc


_add = None


def setup_module():
    import numba

    global _add

    @numba.njit
    def add(acc, z, weight, gauss, w0, scratch):  # the replacement as the kernels call it (inlined)
        ck.simhash_add(acc, z, weight, gauss, w0, scratch)

    _add = add


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**64 - 1), st.integers(0, 2**40), st.sampled_from([8, 32, 64, 1024]),
       st.integers(0, 200), st.lists(st.integers(-(2**50), 2**50), min_size=0, max_size=4))
def test_replacement_leaves_the_scalar_sums(z, weight, bits, w0, start):
    acc = np.zeros(bits, np.int64)
    if start:  # a partly filled accumulator, as after earlier features
        acc[: len(start)] = start
    assert np.array_equal(cpu_sums(acc.copy(), z, weight, w0), scalar_sums(acc.copy(), z, weight, w0))


def test_every_byte_value_at_every_position_of_a_word():
    """Keys until the hyperplane words of a 1,024-bit signature have shown all 256 byte values at each of the
    8 byte positions (the replacement reads bytes through a view: each position must map to its hyperplane)."""
    seen = np.zeros((8, 256), bool)
    z = 0
    while not seen.all():
        with np.errstate(over="ignore"):
            key = int(cs.key_mix(U64(z), U64(12345)))  # as the kernels key features (rule 3's first step)
        weight = 1 + z % 7
        assert np.array_equal(cpu_sums(np.zeros(1024, np.int64), key, weight, 0),
                              scalar_sums(np.zeros(1024, np.int64), key, weight, 0))
        with np.errstate(over="ignore"):
            words = [int(cs.hyperplane_word(U64(key), w)) for w in range(128)]
        for w in words:
            for b in range(8):
                seen[b, (w >> (8 * b)) & 255] = True
        z += 1
    assert z < 100


@pytest.mark.parametrize("shingle,n,idf", [("word", 3, True), ("char", 5, False)])
def test_kernel_at_1024_bits_equals_reference(shingle, n, idf):
    texts = ["the quick brown fox jumps over the lazy dog " * 3, "a b c", "", "x",
             "naïve café, déjà vu: the quick brown fox again and again"]
    from gpu_dedup.backends.strings import string_buffers
    from gpu_dedup.stages import projections as pj
    from gpu_dedup.stages import vectors as vx

    buf = string_buffers(texts)
    table = None
    if idf:
        df, docs = vx.document_frequencies(buf, shingle, n, 10)
        table = vx.idf_table(df, docs, 10)
    sig = pj.text_signatures(buf, 1024, 11, shingle, n, table)
    for i, text in enumerate(texts):
        vec = ref.term_vector(text.encode(), shingle, n, None if table is None else table.weights.tolist(), 10)
        if not vec:
            assert sig.status[i] == pj.EMPTY_TEXT
            continue
        assert [int(w) for w in sig.bits[i]] == ref.pack(ref.simhash(vec, 1024, 11))


@pytest.mark.parametrize("texts", [
    ["one two three four five six", "seven eight nine ten eleven twelve"],  # every feature distinct: no gaps
    ["a b a b a b a b a b a b a b", "x y z", "c d c d c d c d c d c d"],  # most repeated: compacted and copied
    ["a b c d e f g h i j k l a b c", "", "p q r s t u v w x y z a b c d", "m"],  # a few repeated: compacted views
], ids=["distinct", "repeated", "some-repeated"])
@pytest.mark.parametrize("order", ["all", "subset"])
@pytest.mark.parametrize("group", [None, 1, 5], ids=["one-group", "group-1", "group-5"])
def test_feature_sets_in_one_pass_equal_reference(texts, order, group, monkeypatch):
    from gpu_dedup.backends import cpu
    from gpu_dedup.backends.cpu import CPUBackend
    from gpu_dedup.backends.strings import string_buffers

    if group is not None:  # documents hashed and reduced a few occurrences at a time
        monkeypatch.setattr(cpu, "FEATURE_GROUP", group)

    buf = string_buffers(texts)
    docs = np.arange(len(texts), dtype=np.int64) if order == "all" else np.arange(len(texts), dtype=np.int64)[::-2]
    offsets, feat, tf = CPUBackend.text_features(buf, docs, True, 2)
    assert offsets[0] == 0 and offsets.shape[0] == docs.shape[0] + 1 and feat.shape[0] == tf.shape[0] == offsets[-1]
    for k, d in enumerate(docs):
        want = ref.term_vector(texts[d].encode(), "word", 2)
        got = dict(zip(feat[offsets[k]:offsets[k + 1]].tolist(), tf[offsets[k]:offsets[k + 1]].tolist()))
        assert got == {f: int(c) for f, c in want.items()}
        assert list(got) == sorted(got)


@settings(max_examples=200, deadline=None)
@given(st.binary(min_size=1, max_size=24))
def test_code_point_decodes_as_decode_utf8(data):
    """``code_point`` (one-byte case first, inlined on the CPU) against the decoder, at every position."""
    buf = np.frombuffer(data, np.uint8)
    for pos in range(len(data)):
        for impl in (cs, ck.dev):
            assert tuple(int(v) for v in impl.code_point(buf, pos, len(data))) == \
                tuple(int(v) for v in ck.dev.decode_utf8(buf, pos, len(data)))
