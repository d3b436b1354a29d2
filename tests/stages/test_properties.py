"""Property-based tests: pipeline invariants over random Unicode corpora."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpu_dedup.backends.strings import string_buffers
from gpu_dedup.config import Config, MinHashConfig
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.exact import exact_keys
from gpu_dedup.stages.minhash import signatures
from gpu_dedup.stages.normalize import normalize
from gpu_dedup.stages.verify import exact_similarity, signature_similarity
from tests import reference as ref

WORDS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=6).filter(lambda w: w.strip())


@st.composite
def corpora(draw):
    """Random Unicode documents, some of them edited copies of others."""
    bases = draw(st.lists(st.lists(WORDS, min_size=0, max_size=30), min_size=1, max_size=6))
    docs = []
    for words in bases:
        docs.append(" ".join(words))
        for _ in range(draw(st.integers(0, 3))):
            w = list(words)
            for _ in range(draw(st.integers(0, 1))):
                if w and draw(st.booleans()):
                    w[draw(st.integers(0, len(w) - 1))] = draw(WORDS)
                else:
                    w.insert(draw(st.integers(0, len(w))), draw(WORDS))
            docs.append(" ".join(w))
    nulls = draw(st.lists(st.integers(0, len(docs) - 1), max_size=2))
    return [None if i in nulls else d for i, d in enumerate(docs)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(docs=corpora(), ngram=st.integers(1, 3), threshold=st.sampled_from([0.5, 0.7, 0.9]))
def test_pipeline_invariants(tmp_path_factory, docs, ngram, threshold):
    d = tmp_path_factory.mktemp("prop")
    n = len(docs)
    pq.write_table(pa.table({"id": list(range(n)), "text": pa.array(docs, pa.string())}), d / "c.parquet")
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "minhash": {"ngram": ngram},
                            "lsh": {"threshold": threshold}, "select": {"split_chains": False}})
    # chain splitting (the default): no removed document is below the threshold to its survivor
    split = run_dedup(d / "c.parquet", d / "split", cfg.with_overrides({"select.split_chains": True}))
    near = split.duplicates.filter(pc.equal(split.duplicates.column("match"), "near"))
    assert all(s >= threshold - 1e-6 for s in near.column("similarity").to_pylist())
    # connected components: the clusters are exactly the unions of verified edges and exact copies
    result = run_dedup(d / "c.parquet", d / "out", cfg)
    kept, cluster = result.kept, result.cluster
    # accounting: every row once, kept in the shard or removed in the duplicates table
    out_ids = pq.read_table(d / "out" / "c.parquet").column("id").to_pylist()
    removed = [r["id"] for r in result.duplicates.to_pylist() if not r["kept"]]
    assert sorted(out_ids + removed) == list(range(n))
    # one survivor per cluster: the first row of the cluster (policy "first")
    for c in np.unique(cluster):
        members = np.flatnonzero(cluster == c)
        assert kept[members].sum() == 1 and kept[members.min()] and c == members.min()
    # verified edges: similarity >= threshold, equal to the oracle, endpoints in one cluster
    norm = normalize(pa.array(docs, pa.large_string()))
    texts = norm.to_pylist()
    e = result.edges
    for a, b, s in zip(e.src, e.dst, e.similarity):
        assert s >= threshold and cluster[a] == cluster[b]
        assert s == ref.jaccard(texts[a], texts[b], "word", ngram)
    # clusters are exactly the unions of verified edges and exact-copy links
    keys = exact_keys(norm)
    valid = np.array([t is not None for t in docs])
    src, dst = list(e.src), list(e.dst)
    for i in range(n):
        for j in range(i + 1, n):
            if valid[i] and valid[j] and (keys[i] == keys[j]).all():
                src.append(i)
                dst.append(j)
    assert list(cluster) == ref.connected_components(n, list(zip(src, dst)))
    # nulls are never deduplicated
    assert all(kept[i] for i in range(n) if docs[i] is None)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(max_size=60), min_size=2, max_size=8), st.integers(1, 5))
def test_similarity_is_symmetric(texts, ngram):
    cfg = MinHashConfig(num_perm=32, ngram=ngram)
    buf = string_buffers(pa.array(texts, pa.large_string()))
    k = len(texts)
    left = np.repeat(np.arange(k), k)
    right = np.tile(np.arange(k), k)
    s = exact_similarity(left, right, buf, cfg).reshape(k, k)
    assert np.array_equal(s, s.T)
    sig = signatures(buf, cfg).values
    e = signature_similarity(left, right, sig).reshape(k, k)
    assert np.array_equal(e, e.T)
