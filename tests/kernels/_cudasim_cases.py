"""CUDA kernels under Numba's CUDA simulator, bit for bit against the CPU kernels.

Run by ``tests/kernels/test_cuda_sim.py`` in a child process with
``NUMBA_ENABLE_CUDASIM=1`` (the simulator must be chosen before ``numba.cuda``
is imported, and the rest of the suite must keep real ``njit`` kernels).  The
file name does not match ``test_*.py`` so the main run does not collect it;
run it by hand with::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests/kernels/_cudasim_cases.py

The simulator runs every CUDA thread as a Python thread, so the inputs are
tiny and the launch geometry is shrunk (4 threads per block, 8-byte rounds,
24-byte segments, 3 blocks): documents longer than a block's threads, than a
round and than a segment all occur, which exercises the grid-stride loops,
the shared-memory rounds, the atomic merge of segments and the short-document
fix-up.  The warp signature kernel (the default) runs one warp per block here
(its warp primitives are emulated with block barriers, ``kernels/hash_cuda.py``),
on segments of at most ``seg_bytes`` (or ``warp_seg_bytes``); the block kernel
is selected by name where a test says so.  The GPU backend runs with NumPy
arrays here (``xp = numpy``).
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pytest
from gpu_dedup.kernels.params import hash_params
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numba import config as numba_config

from gpu_dedup.backends.cpu import CPUBackend
from gpu_dedup.backends.strings import string_buffers
from tests import reference as ref

# The simulator's block manager polls its threads in a busy loop that competes
# for the GIL; a short switch interval hands the GIL to the simulated threads
# sooner (5-10x faster here; this process runs nothing else).
sys.setswitchinterval(2e-4)

pytestmark = [
    pytest.mark.skipif(not numba_config.ENABLE_CUDASIM,
                       reason="run with NUMBA_ENABLE_CUDASIM=1 (tests/kernels/test_cuda_sim.py does)"),
    # the simulator runs the scalar source on NumPy scalars, which warn when a product wraps: hash family v2
    # is defined modulo 2**64 (kernels/hash_scalar.py), so wrapping is the specified result, not an error
    pytest.mark.filterwarnings("ignore:overflow encountered in scalar:RuntimeWarning"),
]

SEED = 4321
NUM_PERM = 6
LOREM = "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor. "

DOCS = [
    b"",
    b"a",
    "é".encode(),
    "😀".encode(),
    b" ",
    b"ab",  # shorter than n = 3 and 5 (char)
    b"x y",  # shorter than n = 3 and 5 (word)
    b"hello world",
    "日本語のテキストです。中文文本".encode(),
    "alpha\u3000beta\u00a0gamma\u2028delta eps\x85w".encode(),
    "  leading\tand\ntrailing  ".encode(),
    "emoji 👍🏽 e\u0301 naïve straße".encode(),
    ("ab" * 30).encode(),  # longer than a block's threads, a round and a segment
    (LOREM * 2).encode(),
    b"\xff\xfe",
    b"abc\x80def \xe2\x82 x",
    b"caf\xc3 \xed\xa0\x80 s \xf0\x9f\x98 t",
    b"\x80\x80 \x80",
    b"ok \xc0\xaf ok \xf4\x90\x80\x80 z",
]


def buffers(docs):
    return string_buffers(pa.array(docs, pa.large_binary()))


@pytest.fixture(scope="module")
def cpu():
    return CPUBackend()


@pytest.fixture(scope="module")
def gpu():
    from gpu_dedup.backends.gpu import GPUBackend

    be = GPUBackend(threads=4, span=8, seg_bytes=24, item_threads=4, max_blocks=3)
    assert be.xp is np and be.simulator and "CUDA simulator" in be.mode
    return be


def same(x, y):
    return x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


# ------------------------------------------------------------------ signatures


@pytest.mark.parametrize("n", (1, 3, 5))
@pytest.mark.parametrize("kind", ("char", "word"))
def test_minhash_equals_cpu(cpu, gpu, kind, n):
    hp = hash_params(SEED, NUM_PERM)
    buf = buffers(DOCS)
    gs, gc = gpu.minhash(buf, hp, kind, n)
    cs, cc = cpu.minhash(buf, hp, kind, n)
    assert same(gs, cs), (kind, n)
    assert gs.dtype == np.uint32
    assert same(gc, cc)
    # and the oracle, independently of the CPU kernels
    prm = ref.params(SEED, NUM_PERM)
    for k in (0, 1, 5, 6, 12, 15):
        assert gs[k].tolist() == ref.signature(ref.decode(DOCS[k]), kind, n, prm)


@pytest.mark.parametrize("kernel", ("warp", "block"))
def test_minhash_launch_geometries(cpu, gpu, kernel):
    """Odd block sizes, 1-byte rounds, segments cutting through multi-byte code points, one block; the
    warp kernel with the same segments (its block is one warp here)."""
    from gpu_dedup.backends.gpu import GPUBackend

    hp = hash_params(SEED, 5)
    buf = buffers([DOCS[k] for k in (1, 6, 8, 9, 11, 15, 16)])
    for kind, n in (("char", 3), ("word", 2)):
        want, wc = cpu.minhash(buf, hp, kind, n)
        for geo in (dict(threads=3, span=5, seg_bytes=7, max_blocks=1), dict(threads=1, span=2, seg_bytes=5, max_blocks=2),
                    dict(threads=8, span=64, seg_bytes=1 << 15, max_blocks=5)):
            be = GPUBackend(item_threads=3, signature_kernel=kernel, **geo)
            got, gc = be.minhash(buf, hp, kind, n)
            assert same(got, want), geo
            assert same(gc, wc), geo


def test_minhash_permutation_chunks_and_prefix(cpu, gpu):
    from gpu_dedup.backends.gpu import GPUBackend

    hp = hash_params(SEED, 9)
    buf = buffers(DOCS[:13])
    want, wc = cpu.minhash(buf, hp, "char", 2)
    be = GPUBackend(threads=4, span=8, seg_bytes=24, item_threads=4, max_blocks=3, perm_chunk=4,
                    signature_kernel="block")
    got, gc = be.minhash(buf, hp, "char", 2)  # 3 launches of 4 + 4 + 1 permutations
    assert same(got, want) and same(gc, wc)
    prefix, _ = gpu.minhash(buf, hp, "char", 2, num_perm=5)
    assert same(prefix, want[:, :5])


def test_minhash_docs_subset_empty_and_nulls(cpu, gpu):
    hp = hash_params(SEED, NUM_PERM)
    buf = buffers(DOCS)
    docs = np.array([13, 0, 5, 13, 8])
    assert same(gpu.minhash(buf, hp, "word", 2, docs=docs)[0], cpu.minhash(buf, hp, "word", 2, docs=docs)[0])
    empty = string_buffers(pa.array([], pa.large_string()))
    sig, counts = gpu.minhash(empty, hp, "word", 3)
    assert sig.shape == (0, NUM_PERM) and sig.dtype == np.uint32 and counts.shape == (0,)
    offsets, values = gpu.shingle_sets(empty, hp, "word", 3)
    assert offsets.tolist() == [0] and values.shape == (0,)
    nulls = string_buffers(pa.array([None, "", "ab cd", None], pa.string()))
    for kind in ("char", "word"):
        g, gc = gpu.minhash(nulls, hp, kind, 3)
        c, cc = cpu.minhash(nulls, hp, kind, 3)
        assert same(g, c) and same(gc, cc)
        assert (g[[0, 1, 3]] == (1 << 32) - 1).all()


def test_minhash_word_fast_path_and_long_ngrams(cpu, gpu):
    """Words of 15, 16 and more bytes (the two-load fast path and the general path), words cut by
    segment and round boundaries, non-ASCII words and spaces; char 24-grams and word 5-grams."""
    words = ["fifteen-bytes!!", "sixteen-bytes!!!", "a-word-of-twenty-bytes", "x", "naïveté", "日本語テキスト",
             "ok\u3000ok", "tab\tsep", "z" * 40]
    text = " ".join(words * 3).encode()
    docs = [text, text[:50], b" ".join(w.encode() for w in words[:4]), b"abcdefghijklmnopq"]
    buf = buffers(docs)
    prm = ref.params(SEED, 4)
    hp = hash_params(SEED, 4)
    for kind, n in (("char", 24), ("word", 5), ("word", 1)):
        g, gc = gpu.minhash(buf, hp, kind, n)
        c, cc = cpu.minhash(buf, hp, kind, n)
        assert same(g, c) and same(gc, cc), (kind, n)
        assert g.tolist() == [ref.signature(ref.decode(d), kind, n, prm) for d in docs]
        go, gv = gpu.shingle_sets(buf, hp, kind, n)
        for k, d in enumerate(docs):
            assert gv[go[k]:go[k + 1]].tolist() == sorted(set(ref.shingle_values(ref.decode(d), kind, n, prm)))


def test_short_documents_equal_reference(cpu, gpu):
    """Documents with fewer tokens than n: one shingle of all of them (the short_values fix-up)."""
    docs = [b"x y", b"ab", "日本".encode(), b"  lone  ", b"", b"a b c d"]
    buf = buffers(docs)
    prm = ref.params(SEED, NUM_PERM)
    hp = hash_params(SEED, NUM_PERM)
    for kind, n in (("char", 5), ("word", 5)):
        g, gc = gpu.minhash(buf, hp, kind, n)
        assert g.tolist() == [ref.signature(ref.decode(d), kind, n, prm) for d in docs]
        assert gc.tolist() == [len(ref.shingle_values(ref.decode(d), kind, n, prm)) for d in docs]


def test_minhash_long_document(cpu, gpu):
    """~1 KB of mixed-width text: dozens of segments and rounds in one document."""
    text = ("naïve 日本 😀 data, " * 40).encode()
    buf = buffers([b"tiny", text, b"", text[:100]])
    for kind, n in (("char", 5), ("word", 3)):
        hp = hash_params(SEED, 4)
        g, gc = gpu.minhash(buf, hp, kind, n)
        c, cc = cpu.minhash(buf, hp, kind, n)
        assert same(g, c) and same(gc, cc)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.one_of(st.binary(max_size=20), st.text(max_size=15).map(str.encode)), min_size=1, max_size=4),
       kind=st.sampled_from(("char", "word")), n=st.sampled_from((1, 2, 3)))
def test_minhash_random_bytes(cpu, gpu, docs, kind, n):
    hp = hash_params(SEED, 3)
    buf = buffers(docs)
    g, gc = gpu.minhash(buf, hp, kind, n)
    c, cc = cpu.minhash(buf, hp, kind, n)
    assert same(g, c) and same(gc, cc)


# ------------------------------------------------------------------ the warp signature kernel against the block kernel

SPLIT_DOCS = [
    b" " * 40 + b"alpha beta gamma",  # the first token lies past the first segments (word mode)
    b"x" * 45 + b" " + b"y" * 30,  # two words longer than a segment: a short document for word n >= 3
    ("é" * 12 + " 日本語 😀 ").encode() * 2,  # code points cut by segment boundaries
    LOREM.encode(),
    b"a",
    b"",
    b"ab \xff\xfe cd \xe2\x82 " * 3,
]


def _backend(**kw):
    from gpu_dedup.backends.gpu import GPUBackend

    return GPUBackend(item_threads=4, max_blocks=3, **kw)


def _lengths(docs):
    return np.array([len(d) for d in docs], np.int64)


@pytest.mark.parametrize(("kind", "n"), [("char", 1), ("char", 3), ("word", 2), ("word", 5)])
def test_warp_and_block_kernels_report_the_same_counts_and_first_tokens(cpu, kind, n):
    """What each kernel alone returns (``signature_pass``): the same first-token offsets, and the same
    signatures and full-shingle counts for every document of n tokens or more; a short document is signed
    by the warp kernel itself (count 1, the CPU's values) and left to the fix-up by the block kernel
    (count 0, SENTINEL)."""
    hp = hash_params(SEED, NUM_PERM)
    buf = buffers(DOCS)
    ws, wc, wf = _backend(seg_bytes=24).signature_pass(buf, hp, kind, n)
    bs, bc, bf = _backend(signature_kernel="block", threads=4, span=8, seg_bytes=24).signature_pass(buf, hp, kind, n)
    cs, cc = cpu.minhash(buf, hp, kind, n)
    assert same(ws, cs) and same(wc, cc)
    assert same(wf, bf) and wf.dtype == np.int64
    lengths = _lengths(DOCS)
    short = (bc == 0) & (bf < lengths)
    assert short.any() == (n > 1)
    assert same(bs[~short], cs[~short]) and (bs[short] == (1 << 32) - 1).all()
    assert same(wc[~short], bc[~short]) and (wc[short] == 1).all()
    # first tokens: none in an empty or all-space document, else the first code point (char) or word
    assert wf[0] == 0 and wf[4] == (1 if kind == "word" else 0) and wf[10] == (2 if kind == "word" else 0)


@pytest.mark.parametrize("seg", (7, 17))
def test_warp_kernel_splits_documents_across_warps(cpu, seg):
    """Documents cut into segments of ``seg`` bytes, one warp each: shingles spanning segments, a first
    segment without a token, words and code points cut by segment ends, a short document whose two words
    fill several segments; signatures, counts and first tokens equal the CPU's and the unsplit run's."""
    hp = hash_params(SEED, 5)
    buf = buffers(SPLIT_DOCS)
    split, whole = _backend(warp_seg_bytes=seg), _backend()
    for kind, n in (("char", 4), ("word", 1), ("word", 3)):
        g, gc = split.minhash(buf, hp, kind, n)
        c, cc = cpu.minhash(buf, hp, kind, n)
        assert same(g, c) and same(gc, cc), (seg, kind, n)
    first = split.signature_pass(buf, hp, "word", 3)[2]
    assert same(first, whole.signature_pass(buf, hp, "word", 3)[2]) and first[:2].tolist() == [40, 0]
    prm = ref.params(SEED, 5)
    assert split.minhash(buf, hp, "word", 3)[0][1].tolist() == ref.signature(ref.decode(SPLIT_DOCS[1]), "word", 3, prm)


def test_warp_kernel_permutation_counts(cpu):
    """One minimum per lane (1 and 32 permutations), a lane with a padded second (33), and 520 permutations:
    two launches (512 with 16 minima per lane, then 8)."""
    docs = [b"", b"ab", b"hello world", "日本語のテキスト".encode(), LOREM.encode()]
    buf = buffers(docs)
    be = _backend()
    for num_perm in (1, 32, 33, 520):
        hp = hash_params(SEED, num_perm)
        for kind, n in (("char", 3), ("word", 2)):
            g, gc = be.minhash(buf, hp, kind, n)
            c, cc = cpu.minhash(buf, hp, kind, n)
            assert same(g, c) and same(gc, cc), (num_perm, kind, n)


def test_warp_kernel_long_ngrams(cpu):
    """n-grams longer than a warp's chunk: char 40 and word 33 (a ring of 128 prefixes), char 1000 (2048
    prefixes, two warps a block on a device); documents shorter and longer than n tokens."""
    text = (LOREM * 14).encode()
    docs = [text[:1100], text[:30], (LOREM * 2).encode(), b"", " ".join(["w"] * 40).encode()]
    buf = buffers(docs)
    hp = hash_params(SEED, 3)
    prm = ref.params(SEED, 3)
    be = _backend(warp_seg_bytes=256)
    for kind, n in (("char", 40), ("word", 33), ("char", 1000)):
        g, gc = be.minhash(buf, hp, kind, n)
        c, cc = cpu.minhash(buf, hp, kind, n)
        assert same(g, c) and same(gc, cc), (kind, n)
        assert g[1].tolist() == ref.signature(ref.decode(docs[1]), kind, n, prm)


def test_block_kernel_by_environment_equals_cpu(cpu, monkeypatch):
    """GPU_DEDUP_SIGNATURE_KERNEL=block brings back the block kernel, still equal to the CPU."""
    monkeypatch.setenv("GPU_DEDUP_SIGNATURE_KERNEL", "block")
    be = _backend(threads=4, span=8, seg_bytes=24)
    assert be.signature_kernel == "block"
    hp = hash_params(SEED, NUM_PERM)
    buf = buffers(DOCS)
    for kind, n in (("char", 3), ("word", 2)):
        g, gc = be.minhash(buf, hp, kind, n)
        c, cc = cpu.minhash(buf, hp, kind, n)
        assert same(g, c) and same(gc, cc), (kind, n)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.function_scoped_fixture])
@given(docs=st.lists(st.one_of(st.binary(max_size=30), st.text(max_size=20).map(str.encode)), min_size=1, max_size=3),
       kind=st.sampled_from(("char", "word")), n=st.sampled_from((1, 2, 4)), seg=st.integers(1, 12))
def test_warp_kernel_random_bytes_and_segments(cpu, docs, kind, n, seg):
    hp = hash_params(SEED, 3)
    buf = buffers(docs)
    g, gc = _backend(warp_seg_bytes=seg).minhash(buf, hp, kind, n)
    c, cc = cpu.minhash(buf, hp, kind, n)
    assert same(g, c) and same(gc, cc)


# ------------------------------------------------------------------ shingle sets, Jaccard, similarity


@pytest.mark.parametrize(("kind", "n"), [("char", 1), ("char", 3), ("word", 1), ("word", 3)])
def test_shingle_sets_and_jaccard_equal_cpu(cpu, gpu, kind, n):
    hp = hash_params(SEED, 4)
    buf = buffers(DOCS)
    go, gv = gpu.shingle_sets(buf, hp, kind, n)
    co, cv = cpu.shingle_sets(buf, hp, kind, n)
    assert same(go, co) and same(gv, cv)
    m = len(DOCS)
    left = np.repeat(np.arange(m), m)
    right = np.tile(np.arange(m), m)
    assert same(gpu.jaccard_pairs(co, cv, left, right), cpu.jaccard_pairs(co, cv, left, right))


@pytest.mark.parametrize("cap", (4096, 8, 1))
def test_segments_sorted_in_shared_memory_or_together_give_the_same_csr(cap):
    """The GPU backend's per-segment sort: segments of at most ``cap`` values by the shared-memory kernel, longer ones
    by two sorts of their values; the CSR of the generic two-sort function, bit for bit, the largest uint64 (the
    kernel's padding) and repeats included, the values sorted in place."""
    from gpu_dedup.backends.gpu import GPUBackend, sorted_distinct_counts

    be = GPUBackend(threads=4, item_threads=4, max_blocks=3, sort_cap=cap)
    rng = np.random.default_rng(cap)
    lengths = np.array([0, 1, 2, 3, 5, 8, 9, 0, 16, 17, 1, 30, 0], np.int64)
    offsets = np.concatenate(([0], np.cumsum(lengths)))
    top = np.uint64(2**64 - 1)
    values = rng.choice(np.array([0, 1, 7, 2**63, 2**64 - 2, 2**64 - 1], np.uint64), offsets[-1])
    values[offsets[4]] = top  # a segment holding the padding's value
    want = sorted_distinct_counts(np, offsets, values.copy())
    got = be.sorted_distinct_counts(offsets, values)
    for w, g in zip(want, got):
        assert same(g, w)
    for k in range(lengths.shape[0]):
        seg = values[offsets[k]:offsets[k + 1]]
        assert np.all(seg[:-1] <= seg[1:])  # sorted in place
        u, c = np.unique(seg, return_counts=True)
        assert same(got[1][got[0][k]:got[0][k + 1]], u) and np.array_equal(got[2][got[0][k]:got[0][k + 1]], c)
    empty = be.sorted_distinct_counts(np.zeros(3, np.int64), np.zeros(0, np.uint64))
    assert empty[0].tolist() == [0, 0, 0] and empty[1].shape == empty[2].shape == (0,)


def test_shingle_sets_with_long_documents_sorted_together_equal_cpu(cpu):
    """Documents with more shingles than a block's shared sort holds (sort_cap 8 here) take the sorts of all their
    values; the sets equal the CPU's."""
    from gpu_dedup.backends.gpu import GPUBackend

    be = GPUBackend(threads=4, span=8, seg_bytes=24, item_threads=4, max_blocks=3, sort_cap=8)
    hp = hash_params(SEED, 4)
    buf = buffers(DOCS)
    for kind in ("char", "word"):
        go, gv = be.shingle_sets(buf, hp, kind, 2)
        co, cv = cpu.shingle_sets(buf, hp, kind, 2)
        assert same(go, co) and same(gv, cv)


def test_shingle_sets_docs_subset(cpu, gpu):
    hp = hash_params(SEED, 4)
    buf = buffers(DOCS)
    docs = np.array([12, 0, 3, 12, 16])
    for kind in ("char", "word"):
        go, gv = gpu.shingle_sets(buf, hp, kind, 2, docs=docs)
        co, cv = cpu.shingle_sets(buf, hp, kind, 2, docs=docs)
        assert same(go, co) and same(gv, cv)


def test_jaccard_known_values_and_empty(gpu):
    offsets = np.array([0, 2, 4, 4, 4, 5], np.int64)
    values = np.array([1, 5, 1, 7, 9], np.uint64)
    got = gpu.jaccard_pairs(offsets, values, np.array([0, 0, 2, 2, 4]), np.array([1, 0, 3, 4, 4]))
    assert got.tolist() == [1 / 3, 1.0, 0.0, 0.0, 1.0]
    assert gpu.jaccard_pairs(offsets, values, [], []).shape == (0,)


def test_signature_similarity_equals_cpu(cpu, gpu):
    hp = hash_params(SEED, 8)
    sig, _ = cpu.minhash(buffers(DOCS), hp, "char", 1)
    m = len(DOCS)
    left = np.repeat(np.arange(m), m)
    right = np.tile(np.arange(m), m)
    assert same(gpu.signature_similarity(sig, left, right), cpu.signature_similarity(sig, left, right))


# ------------------------------------------------------------------ band and exact hashes


def test_band_hashes_equal_cpu(cpu, gpu):
    hp = hash_params(SEED, 12)
    sig, _ = cpu.minhash(buffers(DOCS), hp, "char", 2)
    for bands, rows in ((3, 4), (12, 1), (1, 12), (2, 5)):
        assert same(gpu.band_hashes(sig, bands, rows, hp.band_base), cpu.band_hashes(sig, bands, rows, hp.band_base))
    sentinel = np.full((2, 12), (1 << 32) - 1, sig.dtype)
    assert same(gpu.band_hashes(sentinel, 3, 4, hp.band_base), cpu.band_hashes(sentinel, 3, 4, hp.band_base))


def test_exact_hashes_equal_cpu(cpu, gpu):
    hp = hash_params(SEED, 1)
    docs = DOCS + [bytes(range(k)) for k in range(18)] + [b"\x00", b"\x00" * 8, b"\xff" * 9]
    buf = buffers(docs)
    assert same(gpu.exact_hashes(buf, hp.exact_seed1, hp.exact_seed2), cpu.exact_hashes(buf, hp.exact_seed1, hp.exact_seed2))
    sliced = string_buffers(pa.array([d.decode("utf-8", "replace") for d in docs], pa.string()).slice(3, 9))
    assert same(gpu.exact_hashes(sliced, hp.exact_seed1, hp.exact_seed2),
                cpu.exact_hashes(sliced, hp.exact_seed1, hp.exact_seed2))


# ------------------------------------------------------------------ components (hooking kernel)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 25).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=2 * n))))
def test_components_hook_kernel(gpu, case):
    n, pairs = case
    src = np.array([a for a, _ in pairs], np.int64)
    dst = np.array([b for _, b in pairs], np.int64)
    assert gpu.components(src, dst, n).tolist() == ref.connected_components(n, pairs)


# ------------------------------------------------------------------ the pipeline end to end


def test_pipeline_gpu_equals_cpu(tmp_path):
    """A whole run with backend gpu (the simulated device) writes what backend cpu writes."""
    import pyarrow.parquet as pq

    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards
    from gpu_dedup.run.entry import run_dedup

    sample = planted_corpus(n_docs=40, n_clusters=6, cluster_size=(2, 4), words=(8, 25), edit_rate=(0.0, 0.1), seed=3)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    cfg = {"input": {"id_column": "id"}, "minhash": {"num_perm": 16, "ngram": 3}, "lsh": {"threshold": 0.6}}
    registry._CACHE["gpu"] = GPUBackend(threads=8, span=32, seg_bytes=64, item_threads=8, max_blocks=4)
    try:
        results = {}
        for name in ("cpu", "gpu"):
            results[name] = run_dedup(tmp_path / "in", tmp_path / name, Config.from_dict({**cfg, "backend": name}))
    finally:
        registry._CACHE.pop("gpu", None)
    c, g = results["cpu"], results["gpu"]
    assert g.report["backend"].startswith("gpu") and c.report["backend"].startswith("cpu")
    assert np.array_equal(c.kept, g.kept) and np.array_equal(c.cluster, g.cluster)
    assert np.array_equal(c.edges.src, g.edges.src) and np.array_equal(c.edges.similarity, g.edges.similarity)
    assert c.report["counts"] == g.report["counts"] and c.report["counts"]["removed"] > 0
    assert c.duplicates.equals(g.duplicates)
    for shard in c.shards:
        assert pq.read_table(tmp_path / "cpu" / shard.name).equals(pq.read_table(tmp_path / "gpu" / shard.name))
    assert os.path.exists(tmp_path / "gpu" / "report.json")


def test_pipeline_with_text_read_into_device_memory_equals_cpu(tmp_path, monkeypatch):
    """The GPU run whose text columns a device reader reads (cuDF's, here a stand-in giving
    pylibcudf-like columns): raw buffers concatenated, null flags and ``longest`` lengths from them,
    normalized by the simulated kernel; outputs equal the CPU run's."""
    import pyarrow.parquet as pq

    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.config import Config
    from gpu_dedup.evaluation.sample import planted_corpus
    from gpu_dedup.run.entry import run_dedup
    from tests.fake_columns import fake_plc_column

    sample = planted_corpus(n_docs=40, n_clusters=6, cluster_size=(2, 4), words=(8, 25), edit_rate=(0.0, 0.1), seed=5)
    texts = sample.table.column("text").to_pylist()
    texts[3], texts[17], texts[30] = None, "Ünïcödé  naïve " * 4, None
    table = sample.table.select(["id"]).append_column("text", pa.array(texts, pa.string()))
    (tmp_path / "in").mkdir()
    for k, (lo, hi) in enumerate([(0, 15), (15, 15), (15, 40)]):  # shards of 15, 0 and 25 rows
        pq.write_table(table.slice(lo, hi - lo), tmp_path / "in" / f"part-{k}.parquet")
    reads = []

    def read_text(shard, column):  # the read stage hands the reader its discovered shard
        reads.append(shard.path)
        return fake_plc_column(pq.read_table(shard.path, columns=[column]).column(column).combine_chunks())

    be = GPUBackend(threads=8, span=32, seg_bytes=64, item_threads=8, max_blocks=4)
    monkeypatch.setattr(be, "text_reader", lambda cfg: read_text)
    monkeypatch.setattr(be, "table_reader", lambda cfg: None)  # each shard's text column, not the whole-table read
    cfg = {"input": {"id_column": "id"}, "minhash": {"num_perm": 16, "ngram": 3}, "lsh": {"threshold": 0.6},
           "select": {"keep": "longest"}}
    registry._CACHE["gpu"] = be
    try:
        c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
        g = run_dedup(tmp_path / "in", tmp_path / "gpu", Config.from_dict({**cfg, "backend": "gpu"}))
    finally:
        registry._CACHE.pop("gpu", None)
    assert len(reads) == 3 and g.report["gpu"]["reader"] == "cudf"
    assert np.array_equal(c.kept, g.kept) and c.report["counts"] == g.report["counts"]
    assert c.report["counts"]["removed"] > 0 and c.duplicates.equals(g.duplicates)
    for shard in c.shards:
        assert pq.read_table(tmp_path / "cpu" / shard.name).equals(pq.read_table(tmp_path / "gpu" / shard.name))


def test_gpu_benchmark_path(monkeypatch):
    """The benchmark's GPU measurements (end to end and device-resident) run and match the CPU."""
    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.bench import gpu as bench_gpu

    monkeypatch.setitem(registry._CACHE, "gpu", GPUBackend(threads=8, span=32, seg_bytes=64, item_threads=8,
                                                             max_blocks=4))
    lines = []
    res = bench_gpu.run_benchmark(docs=(6,), perms=(4,), shingles=("char:5", "word:2"), backends=("cpu", "gpu"),
                                  log=lines.append, words=(4, 12))
    rows = res["rows"]
    assert {r["backend"] for r in rows} == {"cpu", "gpu", "gpu-kernel"} and len(rows) == 6
    assert all(r["identical_to_cpu"] for r in rows if r["backend"] != "cpu")
    assert res["device"] == "CUDA simulator"


def test_kernel_benchmark_rehearsal(monkeypatch, tmp_path):
    """The device step that times the warp kernel against the block kernel (and cuDF on a device), from the
    command line, on a tiny corpus: every GPU row identical to the CPU, the ratios written; no registers
    under the simulator."""
    import json

    from gpu_dedup import backends as registry
    from gpu_dedup.backends.gpu import GPUBackend
    from gpu_dedup.bench import gpu as bench_gpu

    monkeypatch.setitem(registry._CACHE, "gpu", GPUBackend(threads=8, span=32, seg_bytes=64, item_threads=8,
                                                             max_blocks=4))
    out = tmp_path / "kernels.json"
    assert bench_gpu.main(["--docs", "6", "--cases", "char:24x40", "word:5x16", "--backends", "cpu", "gpu", "gpu-block",
                           "--words", "4", "12", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert [(r["shingle"], r["num_perm"], r["backend"]) for r in rows] == [
        (sh, p, b) for sh, p in (("char:24", 40), ("word:5", 16)) for b in ("cpu", "gpu", "gpu-kernel", "gpu-block-kernel")]
    assert all(r["identical_to_cpu"] for r in rows if r["backend"] != "cpu")
    assert {r["kernel"] for r in rows if r["backend"].startswith("gpu")} == {"warp", "block"}
    assert [(r["shingle"], r["num_perm"]) for r in res["ratios"]] == [("char:24", 40), ("word:5", 16)]
    assert all(r["vs_block_kernel"] > 0 and "vs_cudf" not in r for r in res["ratios"])
    assert res["kernel_resources"] == [] and res["device"] == "CUDA simulator"


# ------------------------------------------------------------------ normalization


NORM_DOCS = DOCS + [
    "Hello,  World!\u00a0Ｆｕｌｌ\u3000width — dash".encode(),
    "ÉCOLE ﬁn \u0130stanbul \u212b".encode(),  # compatibility forms, special lowercase
    "\ufdfa".encode(),  # NFKC result longer than the document
    "x\u0301y e\u0323\u0301 \u1100\u1161\u11a8".encode(),  # combining marks, Hangul jamo
    b"a,,,,\xff bc",  # ill-formed but the repair fits
    "Ω  Ⱥ .. K".encode(),
]


@pytest.mark.parametrize("form", ("NFKC", "NFC", "NFD", "none"))
@pytest.mark.parametrize("lowercase", (True, False))
def test_normalize_equals_cpu(gpu, form, lowercase):
    from gpu_dedup.config import NormalizeConfig
    from gpu_dedup.stages.normalize import normalize_counted

    cfg = NormalizeConfig(form, lowercase, True, True)
    arr = pa.array(NORM_DOCS + [None], pa.large_binary())
    want, bad = normalize_counted(arr, cfg)
    offsets = np.frombuffer(arr.buffers()[1], np.int64)[: len(arr) + 1].copy()
    chars = np.frombuffer(arr.buffers()[2], np.uint8).copy()
    valid = np.asarray(arr.is_valid())
    got = gpu.normalize(offsets, chars, cfg, valid=valid)
    w = string_buffers(want)
    assert same(got.offsets, w.offsets) and bytes(got.chars) == bytes(w.data)
    assert got.invalid_utf8 == bad
    assert got.slow_docs > 0 and got.bytes_to_host > 0 and got.bytes_to_device > 0


@pytest.mark.parametrize("large", (False, True))
def test_cudf_column_buffers_feed_normalize_and_minhash(cpu, gpu, large):
    """The buffer handoff of a cuDF strings column (int32 or int64 offsets child, chars in data(), a
    row offset, a validity bitmap) into the normalization and signature kernels, bit for bit against
    the CPU path from Arrow."""
    from gpu_dedup.config import NormalizeConfig
    from gpu_dedup.stages.normalize import normalize_counted
    from tests.fake_columns import fake_plc_column

    cfg = NormalizeConfig()
    texts = ["skipped", None] + [d.decode("utf-8", "replace") for d in NORM_DOCS[:8]] + [None, "Hello,  World!"]
    arr = pa.array(texts, pa.large_string() if large else pa.string()).slice(1)
    strings, bad = gpu.normalize_column(fake_plc_column(arr), cfg)
    want, want_bad = normalize_counted(arr, cfg)
    w = string_buffers(want)
    assert same(strings.offsets, w.offsets) and bytes(strings.data[: int(strings.offsets[-1])]) == bytes(w.data)
    assert bad == want_bad
    params = hash_params(SEED, NUM_PERM)
    got_sig, got_n = gpu.minhash(strings, params, "char", 3)
    want_sig, want_n = cpu.minhash(w, params, "char", 3)
    assert same(got_sig, want_sig) and same(got_n, want_n)


def test_scattered_host_documents_are_gathered_before_upload(cpu):
    """Host text whose selected documents are spread out is gathered (only their bytes go to the
    device); results equal the CPU's."""
    from gpu_dedup.backends.gpu import GPUBackend

    be = GPUBackend(threads=4, span=8, seg_bytes=24, item_threads=4, max_blocks=3, compact_gap=0)
    buf = buffers([LOREM.encode() * 3, b"x", b"hello world again", LOREM.encode(), b"", "héllo wörld".encode()])
    docs = np.array([0, 2, 5], np.int64)
    params = hash_params(SEED, NUM_PERM)
    assert same(be.minhash(buf, params, "char", 3, docs=docs)[0], cpu.minhash(buf, params, "char", 3, docs=docs)[0])
    got = be.shingle_sets(buf, params, "word", 2, docs=docs)
    want = cpu.shingle_sets(buf, params, "word", 2, docs=docs)
    assert same(got[0], want[0]) and same(got[1], want[1])


def test_strings_taken_on_the_device_are_the_rows_arrow_takes(gpu, monkeypatch):
    """``take_strings`` gathers rows (any order, repeats, empty ones) of device texts on the device; a cluster
    block's payload of a few rows of its device texts (``BlockData.norm_rows``) is Arrow's take of those rows,
    and only their bytes (and offsets) cross to the host, not the block's other texts."""
    from gpu_dedup import backends as registry
    from gpu_dedup.backends import on_device, to_device
    from gpu_dedup.backends.strings import StringBuffers, arrow_strings
    from gpu_dedup.run.cluster.blocks import BlockData
    from tests.fake_cupy import fake_cupy

    buf = buffers(DOCS)
    want = arrow_strings(buf.offsets, buf.data)
    for rows in ([13, 0, 7, 13, 2], [0, 4], [], list(range(len(DOCS)))[::-1]):
        got = gpu.take_strings(buf, np.array(rows, np.int64))
        assert arrow_strings(got.offsets, got.data).equals(want.take(pa.array(rows, pa.int64())))
    xp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", xp)
    monkeypatch.setitem(registry._CACHE, "gpu", type(gpu)(xp=xp, threads=4, span=8, seg_bytes=24, item_threads=4,
                                                          max_blocks=3))
    dev = StringBuffers(to_device(buf.offsets, xp), to_device(buf.data, xp))
    data = BlockData(block=None, table=pa.table({}), strings=dev)
    rows = np.array([12, 7, 12], np.int64)
    before = dict(xp.moved)
    got = data.norm_rows(rows)
    assert on_device(dev.data) and got.equals(want.take(pa.array(rows)))
    picked = sum(len(DOCS[r]) for r in rows)
    assert xp.moved["device_to_host_bytes"] - before["device_to_host_bytes"] == picked + 8 * (len(rows) + 1)
    assert picked < buf.data.nbytes // 2
