"""similarity: cosine through the one stage sequence: signatures, buckets and clusters against the
slow reference, CLI runs (one process, Dask workers, resume), the report, evaluate, index and query."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpu_dedup
from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.evaluation.evaluate import evaluate
from gpu_dedup.evaluation.sample import planted_embeddings
from gpu_dedup.index.format import IndexMismatchError
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.entry import run_dedup as index_run
from gpu_dedup.stages.families import RowData, family_for
from gpu_dedup.stages.vectors import from_numpy
from tests import reference_cosine as ref
from tests.accounting import assert_accounted

BASE = {"backend": "cpu", "similarity": "cosine", "input": {"id_column": "id", "vector_column": "emb"},
        "lsh": {"threshold": 0.9}}


def _cfg(**over) -> Config:
    cfg = Config.from_dict(BASE)
    return cfg.with_overrides(over) if over else cfg


def _write(table: pa.Table, d, shards: int = 3, row_group_size: int = 100):
    d.mkdir(parents=True, exist_ok=True)
    n = table.num_rows
    cuts = np.linspace(0, n, shards + 1).astype(int)
    for i in range(shards):
        pq.write_table(table.slice(cuts[i], cuts[i + 1] - cuts[i]), d / f"part-{i}.parquet",
                       row_group_size=row_group_size)
    return d


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """1,200 planted embeddings in 48 dimensions across 3 Parquet shards (small row groups: several
    Dask blocks per shard), a text column beside them; 4 exact copies."""
    d = tmp_path_factory.mktemp("cosine")
    pe = planted_embeddings(1200, 48, n_clusters=80, seed=5)
    t = pe.table("emb")
    emb = pe.vectors.astype(np.float32, copy=True)
    emb[[10, 20, 30, 40]] = emb[[11, 21, 31, 41]]  # exact copies
    t = t.set_column(t.column_names.index("emb"), "emb",
                     pa.FixedSizeListArray.from_arrays(pa.array(emb.ravel()), 48))
    t = t.append_column("text", pa.array([f"document {i}" for i in range(1200)]))
    _write(t, d / "in")
    return d, emb


def _cli(*args, env=None, timeout=600):
    e = dict(os.environ)
    e.pop("GPU_DEDUP_FAULT", None)
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "gpu_dedup", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=e)


def _identical(a, b):
    names = sorted(p.name for p in a.iterdir() if p.suffix == ".parquet")
    assert names == sorted(p.name for p in b.iterdir() if p.suffix == ".parquet")
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


# ---------------------------------------------------------------- against the slow reference


def test_signatures_buckets_and_clusters_match_the_reference(tmp_path):
    """A small corpus of tight clusters (every member >= 0.97 to its centre): the pipeline's
    signatures and buckets equal the reference's, and its clusters equal the components of the pairs
    that share a reference bucket and reach the threshold by the reference's exact cosine."""
    pe = planted_embeddings(150, 12, n_clusters=12, to_centre=(0.97, 1.0), seed=3)
    x = pe.vectors.astype(np.float32)
    x[7] = 0.0  # a zero vector: kept, counted, never bucketed
    cfg = _cfg(**{"cosine.bits": 128, "cosine.bands": 8, "cosine.rows": 12, "select.split_chains": False})
    fam = family_for(cfg, 150)
    rows = RowData(vectors=from_numpy(x))
    sig = fam.signatures(rows, np.arange(150))
    planes = ref.hyperplanes(12, 128, cfg.cosine.seed)
    for i in range(150):  # the reference is slow: every row, one at a time
        bits, status = ref.signature_bits([float(v) for v in x[i]], 128, cfg.cosine.seed, planes)
        assert list(map(int, sig.values[i])) == ref.pack(bits), i
        assert bool(sig.usable[i]) == (status == 0)
    hashes = fam.band_hashes(sig.values)
    ref_hashes = [ref.band_hashes(list(map(int, sig.values[i])), 8, 12) for i in range(150)]
    assert [list(map(int, h)) for h in hashes] == ref_hashes
    buckets = ref.groups(ref_hashes, valid=[bool(u) for u in sig.usable])

    table = pa.table({"id": pa.array([f"v{i:03d}" for i in range(150)]),
                      "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 12)})
    pq.write_table(table, tmp_path / "in.parquet")
    res = run_dedup(tmp_path / "in.parquet", tmp_path / "out", cfg)
    assert res.report["counts"]["unsigned_zero_vector"] == 1 and res.kept[7]

    parent = list(range(150))

    def find(a):
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for _band, members in buckets:
        m = sorted(members)
        for a in m:
            for b in m:
                if a < b and ref.cosine([float(v) for v in x[a]], [float(v) for v in x[b]]) >= 0.9:
                    parent[find(b)] = find(a)
    expect = {}
    for i in range(150):
        expect.setdefault(find(i), []).append(i)
    want = sorted(sorted(g) for g in expect.values())
    got = {}
    for i, c in enumerate(res.cluster):
        got.setdefault(int(c), []).append(i)
    assert sorted(sorted(g) for g in got.values()) == want
    assert any(len(g) > 2 for g in want)


def test_duplicates_similarity_is_the_exact_cosine_to_the_survivor(corpus, tmp_path):
    d, emb = corpus
    res = run_dedup(d / "in", tmp_path / "out", _cfg())
    dup = pq.read_table(tmp_path / "out" / "duplicates.parquet").to_pandas()
    removed = dup[~dup["kept"]]
    assert len(removed) > 50
    ids = {f"vec-{i:08d}": i for i in range(emb.shape[0])}
    for _, r in removed.head(60).iterrows():  # the reference, pair by pair
        a, b = ids[r["id"]], ids[r["survivor_id"]]
        want = ref.cosine([float(v) for v in emb[a]], [float(v) for v in emb[b]])
        assert r["similarity"] == pytest.approx(want, abs=1e-7)  # duplicates.parquet stores float32
        assert r["similarity"] >= 0.9 - 1e-12  # split_chains: nobody below the threshold to its survivor
    assert res.report["counts"]["exact_duplicates"] == 4  # identical vectors collapse before LSH
    assert_accounted(res, [pq.read_table(p, columns=["id"]) for p in sorted((d / "in").glob("*.parquet"))])


# ---------------------------------------------------------------- the command line


def test_cli_run_report_dask_and_resume(corpus, tmp_path):
    pytest.importorskip("distributed")  # its Dask part: a machine without Dask (the GPU image) skips
    d, _ = corpus
    args = ["run", d / "in", "--similarity", "cosine", "--vector-column", "emb", "--threshold", "0.9",
            "--id-column", "id", "--backend", "cpu", "-q"]
    one = _cli(*args, "-o", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    rep = json.loads((tmp_path / "one" / "report.json").read_text())
    lsh = rep["lsh"]
    assert lsh["similarity"] == "cosine" and lsh["bits"] == 1024
    assert lsh["s_curve_formula"] == f"1-(1-(1-arccos(s)/pi)^{lsh['rows']})^{lsh['bands']}"
    s, p = zip(*lsh["s_curve"])
    assert p[list(s).index(0.9)] == pytest.approx(ref.cosine_s_curve(0.9, lsh["bands"], lsh["rows"]), abs=1e-9)
    html = (tmp_path / "one" / "report.html").read_text()
    assert "cosine similarity s of a pair" in html or "S-curve" in html

    two = _cli(*args, "-o", tmp_path / "two", "--workers", "2", "--set", "cluster.block_rows=200")
    assert two.returncode == 0, two.stderr
    _identical(tmp_path / "one", tmp_path / "two")

    killed = _cli(*args, "-o", tmp_path / "resumed", env={"GPU_DEDUP_FAULT": "verify"})
    assert killed.returncode != 0
    again = _cli(*args, "-o", tmp_path / "resumed")
    assert again.returncode == 0, again.stderr
    rep2 = json.loads((tmp_path / "resumed" / "report.json").read_text())
    assert rep2["resumed_from_checkpoint"]
    assert rep2["stages"]["bands"].get("resumed") and rep2["stages"]["buckets"].get("resumed")
    _identical(tmp_path / "one", tmp_path / "resumed")


def test_bad_vectors_error_names_row_and_shard_or_are_kept_and_counted(tmp_path):
    pytest.importorskip("distributed")  # its Dask part: a machine without Dask (the GPU image) skips
    x = planted_embeddings(60, 8, n_clusters=5, seed=1).vectors.copy()
    x[33, 2] = np.nan
    t = pa.table({"id": pa.array(np.arange(60)), "emb": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), 8)})
    _write(t, tmp_path / "in", shards=2, row_group_size=30)
    args = ["run", tmp_path / "in", "--similarity", "cosine", "--vector-column", "emb", "--backend", "cpu", "-q"]
    bad = _cli(*args, "-o", tmp_path / "o1")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr
    assert "row 3 of shard" in bad.stderr and "part-1.parquet" in bad.stderr and "cosine.bad_vectors" in bad.stderr
    bad2 = _cli(*args, "-o", tmp_path / "o2", "--workers", "2", "--set", "cluster.block_rows=10")
    last = bad2.stderr.strip().splitlines()[-1]  # (Dask's worker log names the failed task above it)
    assert bad2.returncode != 0 and last.startswith("gpu-dedup: error:") and "row 3 of shard" in last
    ok = _cli(*args, "-o", tmp_path / "o3", "--set", "cosine.bad_vectors=keep")
    assert ok.returncode == 0, ok.stderr
    c = json.loads((tmp_path / "o3" / "report.json").read_text())["counts"]
    assert c["unsigned_non_finite"] == 1 and c["kept"] + c["removed"] == 60
    missing = _cli(*args[:-1], "--vector-column", "nope", "-o", tmp_path / "o4")
    assert missing.returncode != 0 and "'nope'" in missing.stderr and "--vector-column" in missing.stderr


def test_text_vectors_without_a_vector_column_one_process_and_dask(tmp_path):
    """Cosine of tf-idf vectors of the text: near copies (a word changed) are found; Dask equals one process."""
    pytest.importorskip("distributed")  # its Dask part: a machine without Dask (the GPU image) skips
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(400)]
    base = [" ".join(rng.choice(words, 60)) for _ in range(60)]
    texts, ids = [], []
    for i in range(300):
        t = base[i % 60].split()
        if i >= 60:
            t[int(rng.integers(60))] = "changed"
        texts.append(" ".join(t))
        ids.append(i)
    _write(pa.table({"id": pa.array(ids), "text": pa.array(texts)}), tmp_path / "in", shards=2, row_group_size=50)
    args = ["run", tmp_path / "in", "--similarity", "cosine", "--threshold", "0.8", "--id-column", "id",
            "--backend", "cpu", "-q"]
    one = _cli(*args, "-o", tmp_path / "one")
    assert one.returncode == 0, one.stderr
    rep = json.loads((tmp_path / "one" / "report.json").read_text())
    assert rep["lsh"]["source"] == "text" and rep["lsh"]["text_vectors"]["weighting"] == "tfidf"
    assert rep["counts"]["removed"] >= 200
    two = _cli(*args, "-o", tmp_path / "two", "--workers", "2", "--set", "cluster.block_rows=50")
    assert two.returncode == 0, two.stderr
    _identical(tmp_path / "one", tmp_path / "two")


# ---------------------------------------------------------------- API, evaluate


def test_dedup_api_with_an_embedding_column():
    pe = planted_embeddings(500, 16, n_clusters=40, seed=2)
    import pandas as pd

    df = pd.DataFrame({"emb": list(pe.vectors), "other": np.arange(500)})
    res = gpu_dedup.dedup(df, similarity="cosine", vector_column="emb", threshold=0.9)
    assert res.report["lsh"]["similarity"] == "cosine"
    assert len(res.deduplicated) == int(res.kept.sum()) < 500
    assert list(res.deduplicated.columns) == ["emb", "other"]
    removed = res.duplicates[~res.duplicates["kept"]]
    x = pe.vectors
    for _, r in removed.head(20).iterrows():
        a, b = int(r["row"]), int(res.clusters[int(r["row"])])
        assert r["similarity"] == pytest.approx(ref.cosine([float(v) for v in x[a]], [float(v) for v in x[b]]),
                                                abs=1e-7)


def test_evaluate_scores_against_exact_all_pairs_cosine(corpus, tmp_path):
    d, _ = corpus
    rep = evaluate(d / "in", _cfg(), output_dir=tmp_path / "ev", sample=0, plot=False)
    assert rep["lsh"]["similarity"] == "cosine"
    run_ = next(iter(rep["runs"].values()))
    p = run_["pairs"]
    assert p["pairs_at_or_above_threshold"] > 100
    assert run_["output"]["removal_recall_at_threshold_plus_0.05"] >= 0.99  # split_chains: pairs not both kept
    assert run_["pairs"]["candidate_recall_at_threshold"] >= 0.9
    assert run_["verified_edges"]["precision"] == 1.0
    assert run_["verified_edges"]["max_abs_difference_pipeline_vs_exact"] < 1e-9
    bins = [b for b in run_["bins"] if b["pairs"] >= 50]
    assert bins and all(abs(b["candidate_rate"] - b["s_curve_mean_over_pairs"]) < 0.1 for b in bins)
    assert (tmp_path / "ev" / "evaluation.json").is_file()


# ---------------------------------------------------------------- index and query


def test_index_incremental_equals_full_and_query(corpus, tmp_path):
    d, emb = corpus
    cfg = _cfg(**{"select.split_chains": False})
    files = sorted((d / "in").glob("*.parquet"))
    index_run(files[:2], tmp_path / "o1", cfg, index_out=tmp_path / "idx")
    inc = index_run(files[2:], tmp_path / "o2", cfg, against=tmp_path / "idx")
    index = Index.open(tmp_path / "idx")
    layout = (index.manifest["config"]["bands"], index.manifest["config"]["rows"])
    full = run_dedup(files, tmp_path / "full", cfg.with_overrides({"cosine.bands": layout[0], "cosine.rows": layout[1]}))
    n = inc.kept.shape[0]
    assert (inc.kept == full.kept[-n:]).all()
    assert inc.report["counts"]["removed_against_index"] > 0
    assert index.manifest["similarity"] == "cosine"

    q = emb[:5] + np.float32(1e-3)
    hits = index.query(vectors=q).to_pandas()
    assert set(hits["query"]) == set(range(5))
    assert (hits["similarity"] >= 0.9).all()
    top = hits.sort_values("similarity", ascending=False).drop_duplicates("query").sort_values("query")
    assert list(top["row"]) == [0, 1, 2, 3, 4]
    exact = index.query(vectors=emb[:3]).to_pandas()
    assert exact.groupby("query")["exact"].any().all()

    qf = tmp_path / "q.jsonl"
    qf.write_text("".join(json.dumps({"emb": v.tolist()}) + "\n" for v in q))
    out = _cli("query", tmp_path / "idx", qf, "--jsonl", "-q")
    assert out.returncode == 0, out.stderr
    recs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["matches"][0]["row"] for r in recs] == [0, 1, 2, 3, 4]

    with pytest.raises(InputError, match="holds vectors"):
        index.query(pa.array(["a text"]))
    with pytest.raises(InputError, match="dimensions"):
        index.query(vectors=np.ones((1, 5), np.float32))


def test_a_jaccard_index_is_not_used_as_a_cosine_one(corpus, tmp_path):
    d, _ = corpus
    jac = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    index_run(d / "in", tmp_path / "o", jac, index_out=tmp_path / "jidx")
    with pytest.raises(IndexMismatchError, match="similarity 'jaccard'.*--similarity jaccard"):
        index_run(d / "in", tmp_path / "o2", _cfg(), against=tmp_path / "jidx")
    with pytest.raises(InputError, match="indexes texts"):
        Index.open(tmp_path / "jidx").query(vectors=np.ones((1, 48), np.float32))
    out = _cli("run", d / "in", "-o", tmp_path / "o3", "--against", tmp_path / "jidx", "--similarity", "cosine",
               "--vector-column", "emb", "--backend", "cpu", "-q")
    assert out.returncode != 0 and "similarity 'jaccard'" in out.stderr and "Traceback" not in out.stderr
    with pytest.raises(ConfigError, match="weighting: tf"):
        index_run(d / "in", tmp_path / "o4", _cfg(**{"input.vector_column": None}), index_out=tmp_path / "tidx")


def test_a_run_against_an_index_takes_the_indexed_vector_dimension(tmp_path):
    """The index fixes the vectors' dimension: a run whose first vector has another length (kept as bad_length)
    still finds its copies of indexed vectors, as the full run does; vectors of another dimension than the
    index's are one clear error (or kept as bad_length), never silently unmatched."""
    x = np.random.default_rng(7).normal(size=(20, 8)).astype(np.float32)

    def shard(name, rows):
        pq.write_table(pa.table({"id": pa.array([f"{name}{i}" for i in range(len(rows))]),
                                 "emb": pa.array(rows, pa.list_(pa.float32()))}), tmp_path / f"{name}.parquet")
        return tmp_path / f"{name}.parquet"

    a = shard("a", x.tolist())
    b = shard("b", [[1.0] * 7] + x[:10].tolist())  # a first row of another length, then copies of indexed rows
    c = shard("c", np.ones((3, 16), np.float32).tolist())
    keep = _cfg(**{"cosine.bad_vectors": "keep"})
    index_run([a], tmp_path / "o1", keep, index_out=tmp_path / "idx")
    inc = index_run([b], tmp_path / "o2", keep, against=tmp_path / "idx")
    assert inc.report["counts"]["unsigned_bad_length"] == 1
    assert not inc.kept[1:].any() and inc.kept[0]  # every copy removed against the index
    with pytest.raises(InputError, match=r"row 0 of shard .*c\.parquet has 16 values, expected 8 .*index"):
        index_run([c], tmp_path / "o3", _cfg(), against=tmp_path / "idx")
    kept = index_run([c], tmp_path / "o4", keep, against=tmp_path / "idx")
    assert kept.report["counts"]["unsigned_bad_length"] == 3 and kept.kept.all()


def test_a_shard_without_any_vector_is_null_rows(tmp_path):
    """A JSON Lines shard whose vector field is always null (Arrow type null) and a Parquet shard of an
    all-None column: their rows are null vectors (kept, counted as null_text) beside the other shards'."""
    x = np.random.default_rng(3).normal(size=(6, 32)).astype(np.float32)
    d = tmp_path / "in"
    d.mkdir()
    pq.write_table(pa.table({"id": pa.array([f"a{i}" for i in range(12)]),
                             "emb": pa.array(np.concatenate([x, x]).tolist(), pa.list_(pa.float32()))}),
                   d / "a.parquet")
    (d / "b.jsonl").write_text("".join(json.dumps({"id": f"b{i}", "emb": None}) + "\n" for i in range(3)))
    pq.write_table(pa.table({"id": pa.array(["c0", "c1"]), "emb": pa.nulls(2)}), d / "c.parquet")
    res = run_dedup(d, tmp_path / "out", _cfg())
    c = res.report["counts"]
    assert c["null_text"] == 5 and c["removed"] == 6 and res.kept[12:].all()


def test_a_cluster_run_against_an_index_takes_the_indexed_vector_dimension(tmp_path):
    """As one process: Dask workers take the index's dimension, not the first block's first vector's."""
    pytest.importorskip("distributed")  # its Dask part: a machine without Dask (the GPU image) skips
    x = np.random.default_rng(7).normal(size=(20, 8)).astype(np.float32)
    for name, rows in (("a", x.tolist()), ("b", [[1.0] * 7] + x[:10].tolist())):
        pq.write_table(pa.table({"id": pa.array([f"{name}{i}" for i in range(len(rows))]),
                                 "emb": pa.array(rows, pa.list_(pa.float32()))}), tmp_path / f"{name}.parquet")
    keep = _cfg(**{"cosine.bad_vectors": "keep"})
    index_run([tmp_path / "a.parquet"], tmp_path / "o1", keep, index_out=tmp_path / "idx")
    out = _cli("run", tmp_path / "b.parquet", "-o", tmp_path / "o2", "--against", tmp_path / "idx", "--similarity",
               "cosine", "--vector-column", "emb", "--threshold", "0.9", "--id-column", "id", "--backend", "cpu",
               "--set", "cosine.bad_vectors=keep", "--workers", "2", "-q")
    assert out.returncode == 0, out.stderr
    counts = json.loads((tmp_path / "o2" / "report.json").read_text())["counts"]
    assert counts["unsigned_bad_length"] == 1 and counts["removed_against_index"] == 10


def test_an_index_of_null_vectors_fixes_no_dimension(tmp_path):
    """An index whose documents have no vector with a direction (null vectors only: stored as zeros one wide)
    leaves the dimension to the run's vectors, and to queries'."""
    x = np.random.default_rng(0).normal(size=(6, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": pa.array(["n0", "n1"]), "emb": pa.array([None, None], pa.list_(pa.float32()))}),
                   tmp_path / "a.parquet")
    pq.write_table(pa.table({"id": pa.array([f"b{i}" for i in range(12)]),
                             "emb": pa.array(np.concatenate([x, x]).tolist(), pa.list_(pa.float32()))}),
                   tmp_path / "b.parquet")
    index_run([tmp_path / "a.parquet"], tmp_path / "o1", _cfg(), index_out=tmp_path / "idx")
    res = index_run([tmp_path / "b.parquet"], tmp_path / "o2", _cfg(), against=tmp_path / "idx")
    assert res.report["counts"]["removed"] == 6 and res.report["counts"]["unsigned_bad_length"] == 0
    assert len(Index.open(tmp_path / "idx").query(vectors=x[:1])) == 0


def test_real_vectors_appended_to_an_index_of_null_vectors(tmp_path):
    """An index built from null vectors only, then appended real vectors (``--update-index``): the index takes
    the appended vectors' dimension, and later runs, appends and queries read its vectors as a full run of
    everything would (no segment of another width in the way)."""
    x = np.random.default_rng(1).normal(size=(6, 8)).astype(np.float32)

    def shard(name, rows, typ=pa.list_(pa.float32())):
        pq.write_table(pa.table({"id": pa.array([f"{name}{i}" for i in range(len(rows))]),
                                 "emb": pa.array(rows, typ)}), tmp_path / f"{name}.parquet")
        return tmp_path / f"{name}.parquet"

    a = shard("a", [None, None])
    b = shard("b", x.tolist())
    c = shard("c", (x * 2).tolist() + [[0.5] * 8])  # copies (same directions) of b's, and a new vector
    index_run([a], tmp_path / "o1", _cfg(), index_out=tmp_path / "idx")
    assert Index.open(tmp_path / "idx").vectors([]).matrix.shape == (0, 1)  # no document asked: no vector (was an error)
    index_run([b], tmp_path / "o2", _cfg(), against=tmp_path / "idx", update_index=True)
    index = Index.open(tmp_path / "idx")
    assert index.documents == 8 and index._vector_dim() == 8
    assert {s.docs.schema.field("vector").type.list_size for s in index.segments} == {1, 8}  # as stored
    assert index.vectors(np.arange(8)).matrix.shape == (8, 8) and not index.vectors([0, 1]).matrix.any()
    assert np.array_equal(index.vectors([5, 2, 0]).matrix, np.concatenate([x[[3, 0]], np.zeros((1, 8))]))
    assert index.vectors([]).matrix.shape == (0, 8)
    hits = index.query(vectors=x[:2]).to_pandas()
    assert sorted(hits["query"].unique().tolist()) == [0, 1]
    res = index_run([c], tmp_path / "o3", _cfg(), against=tmp_path / "idx", update_index=True)
    assert res.report["counts"]["removed_against_index"] == 6 and res.kept[6] and not res.kept[:6].any()
    index = Index.open(tmp_path / "idx")
    assert index.documents == 15 and index.vectors(np.arange(15)).matrix.shape == (15, 8)
    full = index_run([a, b, c], tmp_path / "o4", _cfg())
    assert full.report["counts"]["removed"] == 6
