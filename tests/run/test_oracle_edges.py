"""Whole runs against the pure-Python oracle (tests/reference.py) on a corpus at the edges.

The corpus: empty, whitespace- and punctuation-only documents, nulls, documents shorter than the n-gram, one
document many times, pairs at exactly Jaccard 0.7, 0.75, 0.8 and 0.9 (word 1-grams: 7/10, 3/4, 8/10, 9/10),
chains (a ~ b ~ c, a !~ c), equal-length near copies (ties of ``keep: longest``), and Unicode that the
normalization folds (full-width digits, combining marks, ligatures, sharp s, dotted I, no-break spaces).
Each run is checked stage by stage against the oracle: exact-copy representatives (best-ranked member of
each normalized text), the scored pairs against the oracle's LSH buckets (from its signatures and band
hashes) and its star centres, every similarity against exact Jaccard, the verified edges, the clusters
(connected components of verified edges and exact copies) and their survivors; with chain splitting, each
removed document's similarity to its kept survivor.  The same corpus cut into other shards and row groups
gives the same duplicates table.
"""

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.stages.normalize import normalize
from tests import reference as ref


def _words(prefix, k):
    return [f"{prefix}{i}q{(i * 7919) % 1000}" for i in range(k)]


def edge_corpus():
    docs = ["", " ", "   \t\n ", "!!!", "a", "a b", "a b c", "a b c d", "A B C D", "a  b\tc\nd", None, None, "", "."]
    docs += ["the same document repeated over and over again with many words"] * 6
    for k in range(4):
        v = _words(f"t{k}x", 10)
        docs += [" ".join(v[:8]), " ".join(v)]  # 8/10
    for name, cut, size in (("s7x", 7, 10), ("s9x", 9, 10), ("s75x", 3, 4)):
        v = _words(name, size)
        docs += [" ".join(v[:cut]), " ".join(v)]
    for k in range(3):
        v = _words(f"c{k}x", 40)
        docs += [" ".join(v[i:i + 30]) for i in (0, 3, 6, 9)]
    v = _words("tie", 30)
    docs += [" ".join(v), " ".join(v[:-1] + ["zz" + v[-1][2:]]), " ".join(v).upper()]
    docs += ["ｆｕｌｌ ｗｉｄｔｈ １２３ ｔｅｘｔ ｈｅｒｅ ｏｎｅ ｔｗｏ", "full width 123 text here one two",
             "cafe\u0301 na\u0308ive re\u0301sume\u0301 fiance\u0301 ok", "café naïve résumé fiancé ok",
             "STRASSE groß maß Fluß ΣΊΣΥΦΟΣ", "strasse groß maß fluß σίσυφος", "ﬁne ﬂow ﬃ oﬀ", "fine flow ffi off",
             "İstanbul ıi Iİ", "i̇stanbul ıi ii̇", "x\u00a0y\u2003z\u3000w", "x y z w", "a\u200bb zero\u200dwidth"]
    for k in range(6):
        v = _words(f"f{k}x", 60)
        base = v[:50]
        docs.append(" ".join(base))
        for j in range(1 + k % 4):
            w = list(base)
            for m in range(j + k % 3):
                w[(7 * m + 3 * j + k) % 50] = v[50 + (m + j) % 10]
            docs.append(" ".join(w))
    return docs


DOCS = edge_corpus()


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("edges")
    n = len(DOCS)
    table = pa.table({"id": pa.array(range(n), pa.int64()), "text": pa.array(DOCS, pa.string())})
    (d / "one").mkdir()
    pq.write_table(table, d / "one" / "a.parquet")
    (d / "three").mkdir()
    cuts = [0, 17, 18, n]  # a shard of one row
    for i in range(3):
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]), d / "three" / f"p{i}.parquet", row_group_size=2)
    return d


def _rank_key(keep):
    if keep == "longest":
        return lambda i: (-(len(DOCS[i]) if DOCS[i] is not None else -1), i)
    return lambda i: (i, i)  # first, lowest_id (ids are the rows)


def _canon(result):
    dup = result.duplicates
    cols = [c for c in dup.column_names if c not in ("shard", "shard_row")]
    return sorted(tuple(r[c] for c in cols) for r in dup.select(cols).to_pylist())


CONFIGS = [
    {"minhash": {"ngram": 1}},
    {"minhash": {"ngram": 1}, "lsh": {"threshold": 0.7}},
    {"minhash": {"ngram": 2}, "select": {"split_chains": False}},
    {"minhash": {"ngram": 2}, "select": {"keep": "longest"}},
    {"minhash": {"ngram": 2}, "select": {"split_chains": False, "keep": "longest"}},
    {"minhash": {"ngram": 3}, "select": {"split_chains": False, "keep": "lowest_id"}, "exact_dedup": False},
    {"minhash": {"shingle": "char", "ngram": 5}, "select": {"split_chains": False}},
    {"minhash": {"shingle": "char", "ngram": 24, "num_perm": 260}, "lsh": {"bands": 20, "rows": 13}},
    {"minhash": {"ngram": 2}, "verify": {"method": "signature"}, "select": {"split_chains": False}},
    {"minhash": {"ngram": 2}, "lsh": {"star_rounds": 1}, "select": {"split_chains": False}},
    {},
]


@pytest.mark.parametrize("extra", CONFIGS, ids=[str(i) for i in range(len(CONFIGS))])
def test_a_run_on_edge_documents_equals_the_oracle(shards, extra):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, **extra})
    r = run_dedup(shards / "one", None, cfg)
    m, keep = cfg.minhash, cfg.select.keep
    rank = _rank_key(keep)
    norm = normalize(pa.array(DOCS, pa.large_string()), cfg.normalize).to_pylist()
    n = len(DOCS)
    thr = cfg.verify.threshold if cfg.verify.threshold is not None else cfg.lsh.threshold
    bands, rows = r.report["lsh"]["bands"], r.report["lsh"]["rows"]
    prm = ref.params(m.seed, m.num_perm)
    # exact copies: the best-ranked document of each normalized text (nulls never)
    rep = list(range(n))
    if cfg.exact_dedup:
        groups = defaultdict(list)
        for i in range(n):
            if DOCS[i] is not None:
                groups[norm[i]].append(i)
        for g in groups.values():
            for i in g:
                rep[i] = min(g, key=rank)
    assert [int(x) for x in r.rep] == rep
    # candidates: pairs sharing one of the oracle's buckets; star centres: each bucket's smallest member
    buckets = defaultdict(list)
    for i in range(n):
        if DOCS[i] is not None and rep[i] == i:
            sig = ref.signature(norm[i], m.shingle, m.ngram, prm)
            for key in enumerate(ref.band_hashes(sig, bands, rows, prm["band_base"])):
                buckets[key].append(i)
    candidates, stars = set(), set()
    for members in buckets.values():
        candidates.update((a, b) for k, a in enumerate(members) for b in members[k + 1:])
        if norm[members[0]]:  # documents without shingles are never scored
            stars.update((members[0], b) for b in members[1:])
    scored = {(int(a), int(b)): float(s) for a, b, s in zip(r.scored.src, r.scored.dst, r.scored.similarity)}
    assert set(scored) <= candidates
    assert stars <= set(scored)
    if cfg.verify.method == "exact":
        assert scored == {(a, b): ref.jaccard(norm[a], norm[b], m.shingle, m.ngram) for a, b in scored}
    verified = {(int(a), int(b)) for a, b in zip(r.edges.src, r.edges.dst)}
    assert verified == {p for p, s in scored.items() if s >= thr}
    if m.ngram == 1 and thr == 0.8:  # pairs at exactly the threshold are kept as duplicates
        assert [p for p in verified if scored[p] == thr]
    dup = r.duplicates.to_pylist()
    if not cfg.select.split_chains:
        labels = ref.connected_components(n, list(verified) + [(i, rep[i]) for i in range(n) if rep[i] != i])
        members = defaultdict(list)
        for i in range(n):
            members[labels[i]].append(i)
        expected = [min(members[labels[i]], key=rank) for i in range(n)]
        assert [int(x) for x in r.cluster] == expected
    else:
        kept = {d["row"]: d["kept"] for d in dup}
        for d in dup:
            if d["kept"]:
                continue
            s = d["cluster_id"]
            assert kept[s]
            if d["match"] == "exact":
                assert norm[d["row"]] == norm[s]
            elif cfg.verify.method == "exact":
                j = ref.jaccard(norm[d["row"]], norm[s], m.shingle, m.ngram)
                assert j >= thr and np.float32(j) == np.float32(d["similarity"])
    clusters = defaultdict(list)
    for d in dup:
        clusters[d["cluster_id"]].append(d["row"])
    assert all(min(rows_, key=rank) == c for c, rows_ in clusters.items())
    assert all(DOCS[d["row"]] is not None for d in dup)  # nulls are never deduplicated
    # the same corpus in three shards (one of a single row) and row groups of two rows: the same table
    assert _canon(run_dedup(shards / "three", None, cfg)) == _canon(r)
