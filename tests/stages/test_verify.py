"""The verify stage's exact Jaccard against the reference, whatever the chunks its pairs are cut into."""

import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import MinHashConfig
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.verify import exact_similarity, pair_rows
from tests import reference as ref

TEXTS = ["the quick brown fox jumps over the lazy dog", "the quick brown fox jumped over the lazy dog",
         "a completely different sentence about cats", "", "the quick brown fox", "jumps over the lazy dog today",
         "a completely different sentence about dogs", "x"]


@pytest.mark.parametrize("chunk_bytes", [1, 40, 120, 1 << 20])  # a chunk per pair, a few, one
@pytest.mark.parametrize("shingle,ngram", [("word", 2), ("char", 4)])
def test_exact_similarity_equals_the_reference_in_any_chunks(chunk_bytes, shingle, ngram):
    texts = normalize(pa.array(TEXTS, pa.large_string()))
    buf = string_buffers(texts)
    rng = np.random.default_rng(3)
    left = rng.integers(0, len(TEXTS), 60)
    right = rng.integers(0, len(TEXTS), 60)
    calls = []
    got = exact_similarity(left, right, buf, MinHashConfig(shingle=shingle, ngram=ngram), chunk_bytes=chunk_bytes,
                           progress=calls.append)
    norm = texts.to_pylist()
    want = [ref.jaccard(norm[a], norm[b], shingle, ngram) for a, b in zip(left, right)]
    assert got.tolist() == pytest.approx(want, abs=1e-12)
    assert sum(calls) == len(left)  # every pair once, a call per chunk
    if chunk_bytes == 1 << 20:
        assert len(calls) == 1
    if chunk_bytes == 1:
        assert len(calls) > 10


def test_no_pairs():
    buf = string_buffers(pa.array(["a b c"], pa.large_string()))
    none = np.zeros(0, np.int64)
    assert exact_similarity(none, none, buf, MinHashConfig()).shape == (0,)


def test_pair_rows_names_each_row_once():
    nodes, a, b = pair_rows(np.array([5, 2, 5]), np.array([2, 9, 9]))
    assert nodes.tolist() == [2, 5, 9]
    assert nodes[a].tolist() == [5, 2, 5] and nodes[b].tolist() == [2, 9, 9]


@pytest.mark.parametrize("clocked", [True, False])
def test_a_clock_is_given_each_chunks_sets_and_pairs_the_device_waited_for_after_each(clocked, monkeypatch):
    """With a clock, the backend is waited for after each chunk's sets and after its pairs, so that a device's
    kernels are counted in the step that launched them; without one it is never waited for (a run that does not
    ask pays nothing)."""
    from gpu_dedup.backends import get_backend

    be = get_backend("cpu")
    waits = []
    monkeypatch.setattr(type(be), "synchronize", lambda self: waits.append(1), raising=False)
    texts = normalize(pa.array(TEXTS, pa.large_string()))
    left, right = np.arange(7), np.arange(1, 8)
    clock: dict | None = {} if clocked else None
    progress: list = []
    got = exact_similarity(left, right, string_buffers(texts), MinHashConfig(shingle="word", ngram=2), be,
                           chunk_bytes=40, progress=progress.append, clock=clock)
    assert got.tolist() == exact_similarity(left, right, string_buffers(texts), MinHashConfig(shingle="word",
                                                                                              ngram=2)).tolist()
    if clocked:
        assert clock["chunks"] == len(progress) > 1 and len(waits) == 2 * clock["chunks"]
        assert clock["sets"] > 0 and clock["pairs"] > 0
    else:
        assert waits == []
