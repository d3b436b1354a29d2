"""End-to-end runs on planted-cluster corpora, checked against the reference oracle."""

import json
import os
import unicodedata

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.errors import InputError, OutputError
from gpu_dedup.evaluation.evaluate import cluster_pairs
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.entry import run_dedup
from tests import reference as ref
from tests.accounting import assert_accounted


def ref_normalize(text):
    """Default normalization in plain Python (ASCII-safe corpora: str.lower == utf8proc lower)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
    return " ".join(text.split())


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    d = tmp_path_factory.mktemp("planted")
    sample = planted_corpus(n_docs=1500, n_clusters=80, cluster_size=(2, 5), words=(40, 200),
                            edit_rate=(0.0, 0.06), seed=11)
    write_shards(sample.table.select(["id", "text"]), d / "in", shards=3)
    return d, sample


@pytest.fixture(scope="module")
def planted_run(planted):
    d, sample = planted
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    return run_dedup(d / "in", d / "out", cfg), cfg


def test_recall_and_precision_against_exact_jaccard(planted, planted_run):
    d, sample = planted
    result, cfg = planted_run
    t = cfg.lsh.threshold
    texts = [ref_normalize(x) for x in sample.table.column("text").to_pylist()]
    left, right = cluster_pairs(sample.clusters, ignore=-1)
    jac = np.array([ref.jaccard(texts[a], texts[b], "word", 5) for a, b in zip(left, right)])
    high = jac >= t + 0.1
    assert high.sum() > 100
    same = result.cluster[left] == result.cluster[right]
    assert same[high].mean() >= 0.99
    # exact verification: every kept edge really is above the threshold (none below t - 0.1)
    e = result.edges
    assert len(e) > 0
    edge_j = np.array([ref.jaccard(texts[a], texts[b], "word", 5) for a, b in zip(e.src, e.dst)])
    assert np.all(edge_j >= t - 1e-9)
    assert np.allclose(edge_j, e.similarity)
    # chaining is reported: members whose similarity to the survivor is below the threshold
    ch = result.report["chaining"]
    assert ch["near_duplicates_removed"] == result.report["counts"]["near_duplicates"]
    near = result.duplicates.filter(pa.compute.equal(result.duplicates.column("match"), "near"))
    assert ch["below_threshold_to_survivor"] == int((np.asarray(near.column("similarity")) < t).sum())


def test_every_row_accounted_and_outputs_complete(planted, planted_run):
    d, sample = planted
    result, _ = planted_run
    inputs = [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))]
    assert_accounted(result, inputs)
    out_names = sorted(p.name for p in (d / "out").iterdir() if p.name != ".gpu_dedup_manifest.json")
    assert out_names == ["_SUCCESS", "duplicates.parquet", "part-00000.parquet", "part-00001.parquet",
                         "part-00002.parquet", "report.html", "report.json"]  # no checkpoint directory left behind
    for p in (d / "in").glob("*.parquet"):
        assert pq.read_schema(d / "out" / p.name).equals(pq.read_schema(p))
    rep = json.loads((d / "out" / "report.json").read_text())
    assert rep["lsh"]["bands"] == 16 and rep["lsh"]["rows"] == 8
    assert rep["lsh"]["permutations_not_computed"] == 0
    assert set(rep["stages"]) == {"read", "normalize", "exact", "signatures", "bands", "buckets",
                                  "verify", "components", "select", "write"}
    assert all(v["seconds"] >= 0 for v in rep["stages"].values())
    dup = pq.read_table(d / "out" / "duplicates.parquet")
    assert dup.column_names == ["id", "row", "cluster_id", "kept", "similarity", "match", "survivor_id", "shard",
                                "shard_row"]
    # one survivor per cluster, and it is the cluster id: the row of the survivor
    frame = dup.to_pandas()
    assert (frame.groupby("cluster_id")["kept"].sum() == 1).all()
    assert (frame[frame["kept"]]["row"] == frame[frame["kept"]]["cluster_id"]).all()
    starts = np.cumsum([0] + [t.num_rows for t in inputs])
    shard_index = frame["shard"].map({f"part-{i:05d}.parquet": i for i in range(len(inputs))})
    assert (frame["row"] == starts[shard_index] + frame["shard_row"]).all()


def test_accounting_check_reads_the_written_outputs(planted, planted_run, tmp_path):
    """assert_accounted on an output directory fails when a written shard lost a row."""
    import shutil

    d, _ = planted
    inputs = [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))]
    out = tmp_path / "out"
    shutil.copytree(d / "out", out)
    assert_accounted(out, inputs)
    shard = pq.read_table(out / "part-00001.parquet")
    pq.write_table(shard.slice(1), out / "part-00001.parquet")
    with pytest.raises(AssertionError):
        assert_accounted(out, inputs)


def test_readme_stage_seconds_name_real_stages(planted_run):
    """README's "Seconds per stage" sentence names only stages a run reports (report.json "stages")."""
    import re
    from pathlib import Path

    result, _ = planted_run
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    sentence = readme[readme.index("Seconds per stage"):].split(".\n")[0]
    named = re.findall(r"\b([a-z_]+) [0-9]+\.[0-9]+\b", sentence.split(":", 1)[1])
    assert len(named) >= 5 and set(named) <= set(result.report["stages"]), named


def test_survivor_is_first_in_input_order(planted_run):
    result, _ = planted_run
    frame = result.duplicates.to_pandas()
    row = {i: r for r, i in enumerate(f"doc-{k:07d}" for k in range(1500))}  # ids are in input order
    for cid, g in frame.groupby("cluster_id"):
        kept = g[g.kept].id.iloc[0]
        assert row[kept] == min(row[i] for i in g.id)


def test_rerun_is_byte_identical(planted, planted_run, tmp_path):
    d, _ = planted
    result, cfg = planted_run
    again = run_dedup(d / "in", tmp_path / "out2", cfg)
    for name in ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]:
        assert (d / "out" / name).read_bytes() == (tmp_path / "out2" / name).read_bytes()
    assert again.report["counts"] == result.report["counts"]
    assert_accounted(again, [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))])


def test_shards_are_written_at_once_only_as_far_as_memory_allows(planted, planted_run, tmp_path, monkeypatch):
    import gpu_dedup.run.local as local

    d, _ = planted
    result, cfg = planted_run
    pools = []
    real = local.ThreadPoolExecutor

    def pool(workers, *a, **kw):
        if kw.get("thread_name_prefix") == "gpu-dedup-write":  # the write stage's
            pools.append(workers)
        return real(workers, *a, **kw)

    monkeypatch.setattr(local, "ThreadPoolExecutor", pool)
    monkeypatch.setattr(local, "available_memory", lambda: 1 << 20)  # room for none: one shard at a time
    run_dedup(d / "in", tmp_path / "one", cfg)
    assert pools == [1]
    for name in ["part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]:
        assert (d / "out" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    monkeypatch.setattr(local, "available_memory", lambda: 1 << 40)
    run_dedup(d / "in", tmp_path / "all", cfg)
    assert pools == [1, min(3, os.cpu_count() or 1)]


@pytest.mark.parametrize("method", ["signature", "none"])
def test_other_verify_methods(planted, planted_run, method, tmp_path):
    d, sample = planted
    exact, _ = planted_run
    # none: plain components, so every candidate edge joins (split_chains would eject by the estimate);
    # they remove at least what exact verification with split chains (the default) removes
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "verify": {"method": method},
                            "select": {"split_chains": method == "signature"}})
    result = run_dedup(d / "in", tmp_path / "out", cfg)
    inputs = [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))]
    assert_accounted(result, inputs)
    removed, removed_exact = result.report["counts"]["removed"], exact.report["counts"]["removed"]
    if method == "signature":  # estimates scatter around the threshold: close to the exact answer
        assert np.all(result.edges.similarity >= 0.8)
        assert abs(removed - removed_exact) <= 0.1 * removed_exact
    else:  # every candidate counts: at least what exact verification removes
        assert removed >= removed_exact


def test_keep_longest_policy(tmp_path):
    texts = ["alpha beta gamma delta epsilon zeta eta theta iota kappa",
             "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda",
             "Alpha beta, gamma delta epsilon zeta eta theta iota kappa!"]
    pq.write_table(pa.table({"id": ["s", "l", "p"], "text": texts}), tmp_path / "x.parquet")
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": "longest"},
                            "minhash": {"ngram": 2}, "lsh": {"threshold": 0.7}})
    result = run_dedup(tmp_path / "x.parquet", tmp_path / "out", cfg)
    assert_accounted(result, [pq.read_table(tmp_path / "x.parquet")])
    assert pq.read_table(tmp_path / "out" / "x.parquet").column("id").to_pylist() == ["l"]
    frame = result.duplicates.to_pandas().set_index("id")
    assert frame.loc["p", "match"] == "near"  # 'p' equals 's' after normalization, but 'l' survives
    assert frame.loc["s", "similarity"] == pytest.approx(9 / 10)


def test_null_empty_and_short_documents(tmp_path):
    texts = [None, "", "   ", "hi", "hi", None, "one two three four five six", "!!!"]
    table = pa.table({"id": list(range(8)), "text": pa.array(texts, pa.string())})
    pq.write_table(table, tmp_path / "x.parquet")
    result = run_dedup(tmp_path / "x.parquet", tmp_path / "out", Config.from_dict({"input": {"id_column": "id"}}))
    kept = result.kept.tolist()
    # nulls are kept and never deduplicated; "", "   " and "!!!" normalize to the same empty text
    # (exact copies: one kept); "hi" twice is an exact copy; short texts are one shingle
    assert kept == [True, True, False, True, False, True, True, False]
    assert result.report["counts"]["null_text"] == 2
    assert_accounted(result, [table])


def test_zero_documents(tmp_path):
    table = pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string())})
    pq.write_table(table, tmp_path / "empty.parquet")
    result = run_dedup(tmp_path / "empty.parquet", tmp_path / "out", Config.from_dict({"input": {"id_column": "id"}}))
    assert_accounted(result, [table])
    assert result.report["counts"]["documents_read"] == 0
    assert pq.read_table(tmp_path / "out" / "empty.parquet").num_rows == 0
    assert (tmp_path / "out" / "report.json").exists()


def test_output_must_not_overwrite_inputs(tmp_path):
    pq.write_table(pa.table({"text": ["a"]}), tmp_path / "x.parquet")
    with pytest.raises(OutputError, match="inside the input directory"):
        run_dedup(tmp_path, tmp_path, Config(backend="cpu"))
    with pytest.raises(OutputError, match="would overwrite input shard"):
        run_dedup(tmp_path / "x.parquet", tmp_path, Config(backend="cpu"))


def test_failed_run_publishes_nothing_and_foreign_markers_are_refused(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.parquet").write_bytes(b"garbage")
    with pytest.raises(InputError):
        run_dedup(tmp_path / "in", tmp_path / "out", Config(backend="cpu"))
    out = tmp_path / "out"
    assert not [p for p in out.rglob("*") if not p.relative_to(out).parts[0].startswith(".")]
    out = tmp_path / "out2"
    out.mkdir()
    (out / "report.json").write_text("{}")  # markers gpu_dedup did not write
    (out / "_SUCCESS").write_text("another tool\n")
    with pytest.raises(OutputError, match="was not written by gpu_dedup"):
        run_dedup(tmp_path / "in", out, Config(backend="cpu"))
    assert (out / "_SUCCESS").read_text() == "another tool\n" and (out / "report.json").read_text() == "{}"


def test_jsonl_end_to_end_keeps_lines_verbatim(tmp_path):
    sample = planted_corpus(n_docs=300, n_clusters=20, words=(30, 80), edit_rate=(0, 0.02), seed=3)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2, fmt="jsonl")
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    result = run_dedup(tmp_path / "in", tmp_path / "out", cfg)
    for shard in result.shards:
        src = (tmp_path / "in" / shard.name).read_text().splitlines()
        out = (tmp_path / "out" / shard.name).read_text().splitlines()
        assert set(out) <= set(src) and len(out) < len(src)
        assert out == [line for line in src if line in set(out)]  # order and bytes preserved
    assert result.report["counts"]["removed"] > 0
    sample_ids = sample.table.select(["id"])
    assert_accounted(result, [sample_ids])


def test_boilerplate_skew_costs_linear_edges(tmp_path):
    """20% of the corpus is one boilerplate text with a varying number: one giant bucket."""
    sample = planted_corpus(n_docs=20000, n_clusters=100, words=(30, 60), boilerplate_fraction=0.2, seed=5)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "exact_dedup": False})
    result = run_dedup(tmp_path / "in", tmp_path / "out", cfg)
    c = result.report["counts"]
    assert_accounted(result, [sample.table.select(["id"])])
    assert c["candidate_edges"] <= 16 * 20000  # at most one edge per membership, never pairs
    boiler = np.flatnonzero(sample.clusters == 100)
    assert len(set(result.cluster[boiler])) <= 5  # nearly all boilerplate copies in one cluster


def test_outputs_do_not_depend_on_thread_count(planted, planted_run, tmp_path):
    import os
    import subprocess
    import sys

    d, _ = planted
    env = {**os.environ, "NUMBA_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(d / "in"), "-o", str(tmp_path / "one"),
                           "--id-column", "id", "--backend", "cpu", "-q"], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "on 1 threads" in (tmp_path / "one" / "report.json").read_text()
    for name in ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]:
        assert (d / "out" / name).read_bytes() == (tmp_path / "one" / name).read_bytes()
    assert_accounted(tmp_path / "one", [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))])


@pytest.mark.parametrize("exact_dedup", [True, False])
def test_skew_one_boilerplate_text_and_empty_documents(tmp_path, exact_dedup):
    """10% one identical boilerplate text, 10% empty: linear edges, everything accounted for."""
    n = 20000
    sample = planted_corpus(n_docs=n, n_clusters=200, words=(30, 80), boilerplate_fraction=0.1,
                            boilerplate_identical=True, empty_fraction=0.1, seed=8)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=2)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "exact_dedup": exact_dedup})
    result = run_dedup(tmp_path / "in", tmp_path / "out", cfg)
    c = result.report["counts"]
    assert c["candidate_edges"] <= n  # star edges, deduplicated across bands: at most one per document here
    boiler = np.flatnonzero(sample.clusters == 200)
    empty = np.flatnonzero(sample.clusters == 201)
    assert len(set(result.cluster[boiler])) == 1 and result.kept[boiler].sum() == 1
    if exact_dedup:  # empty texts are exact copies of each other: one kept
        assert result.kept[empty].sum() == 1
    else:  # no shingles: never candidates
        assert result.kept[empty].all() and c["no_shingles"] == 2000
    inputs = [pq.read_table(p) for p in sorted((tmp_path / "in").glob("*.parquet"))]
    assert_accounted(result, inputs)


def test_split_chains_mode_accounts_for_every_row_and_keeps_members_close(planted, planted_run, tmp_path):
    d, sample = planted
    result, cfg = planted_run  # split chains: the default
    assert cfg.select.split_chains is True
    merged = run_dedup(d / "in", tmp_path / "components", cfg.with_overrides({"select.split_chains": False}))
    inputs = [pq.read_table(p) for p in sorted((d / "in").glob("*.parquet"))]
    assert_accounted(result, inputs)
    c, ch = result.report["counts"], result.report["chaining"]
    assert merged.report["chaining"]["below_threshold_to_survivor"] > 0  # the corpus chains ...
    assert c["chain_split_ejected"] > 0 and ch["below_threshold_to_survivor"] == 0  # ... and the mode splits
    assert c["removed"] <= merged.report["counts"]["removed"]
    texts = [ref_normalize(x) for x in sample.table.column("text").to_pylist()]
    removed = np.flatnonzero(~result.kept)
    surv = result.cluster[removed]
    jac = np.array([ref.jaccard(texts[a], texts[b], "word", 5) for a, b in zip(removed, surv)])
    assert np.all(jac >= 0.8 - 1e-12)  # every removed document resembles its own survivor
    # clusters only split: each final cluster lies inside one connected component of the components run
    assert np.all(merged.cluster[result.cluster] == merged.cluster)
    frame = result.duplicates.to_pandas()
    assert (frame.groupby("cluster_id")["kept"].sum() == 1).all()
    again = run_dedup(d / "in", tmp_path / "out2", cfg)
    assert np.array_equal(again.cluster, result.cluster)


def test_write_stage_streams_without_the_normalized_texts(planted, tmp_path, monkeypatch):
    """The normalized texts (as large as the text) are freed before the shards are written, unless an index
    reads them afterwards; reading them after that is an error, not a second normalization."""
    from gpu_dedup.index import IndexBuilder
    from gpu_dedup.run.local import LocalExecutor, run_local

    d, _ = planted
    seen = []
    write = LocalExecutor.write_shards

    def spy(self, *args, **kw):
        seen.append(self._strings is None)
        if self._strings is None:
            with pytest.raises(RuntimeError, match="released"):
                self.strings  # noqa: B018
        return write(self, *args, **kw)

    monkeypatch.setattr(LocalExecutor, "write_shards", spy)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    plain = run_dedup(d / "in", tmp_path / "plain", cfg)
    with IndexBuilder(tmp_path / "index", cfg) as builder:
        indexed = run_local(d / "in", tmp_path / "indexed", cfg, sink=builder)
    assert seen == [True, False]
    assert plain.report["counts"] == indexed.report["counts"]


def test_the_report_samples_are_started_before_the_write_stage(planted, tmp_path, monkeypatch):
    """The sequence asks for the report's samples (sample texts, similarity summary) before it writes, so a
    cluster's workers read them beside the write stage; one process takes them at once, and the report is the
    same."""
    from gpu_dedup.run.local import LocalExecutor

    d, _ = planted
    events = []
    soon, write_table = LocalExecutor.soon, LocalExecutor.write_table

    def spy_soon(self, fn, *args, **kw):
        events.append("soon")
        return soon(self, fn, *args, **kw)

    def spy_write_table(self, *args, **kw):
        events.append("write_table")
        return write_table(self, *args, **kw)

    monkeypatch.setattr(LocalExecutor, "soon", spy_soon)
    monkeypatch.setattr(LocalExecutor, "write_table", spy_write_table)
    res = run_dedup(d / "in", tmp_path / "out", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}))
    assert events == ["soon", "write_table"]
    assert res.report["largest_clusters"] and res.report["chaining"]["near_duplicates_removed"] > 0


@pytest.mark.parametrize("writer", ["cudf", "pyarrow"])
def test_a_device_writer_writes_several_shards_at_once_unless_gpu_writer_is_pyarrow(planted, planted_run, tmp_path,
                                                                                    monkeypatch, writer):
    """The write stage hands shards to the backend's device writer (cuDF on a GPU) from as many threads as the
    host writer uses: one at a time it took 17 s for 10^6 documents on an H100, against 2.2 s for pyarrow on
    16 cores.  ``gpu.writer: pyarrow`` keeps it on the host."""
    import threading

    from gpu_dedup.backends import get_backend

    d, _ = planted
    base, _ = planted_run
    at_once = threading.Barrier(2, timeout=20)  # broken (an error) unless two shards are in the writer together
    calls = []

    def device_writer(src, keep, dst, codec):
        calls.append(src)
        if len(calls) <= 2:  # the first two shards (of 3)
            at_once.wait()
        # no rows written (None): pyarrow writes the shard, as after the real writer's fallback

    # on the class: the GPU backend's writer is a read-only property (the CPU backend's a plain None)
    monkeypatch.setattr(type(get_backend("cpu")), "write_parquet", property(lambda self: device_writer))
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "gpu": {"writer": writer}})
    got = run_dedup(d / "in", tmp_path / "out", cfg)
    assert len(calls) == (3 if writer == "cudf" else 0)
    assert np.array_equal(got.kept, base.kept)
    for shard in sorted((d / "out").glob("*.parquet")):
        assert (tmp_path / "out" / shard.name).read_bytes() == shard.read_bytes()


def test_texts_kept_in_a_mapped_file_give_the_same_outputs(planted, planted_run, tmp_path):
    """``cluster.spill_texts: true`` in one process: the normalized texts in a mapped file of the output
    directory (what ``auto`` does past half the memory available), every output file byte for byte the
    in-memory run's, and no file of theirs left."""
    d, _ = planted
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "cluster": {"spill_texts": True}})
    result = run_dedup(d / "in", tmp_path / "out", cfg)
    assert result.report["stages"]["normalize"]["texts_in_file"] is True
    assert "texts_in_file" not in planted_run[0].report["stages"]["normalize"]
    names = sorted(p.name for p in (d / "out").iterdir() if p.suffix == ".parquet")
    assert names and names == sorted(p.name for p in (tmp_path / "out").iterdir() if p.suffix == ".parquet")
    assert all((tmp_path / "out" / n).read_bytes() == (d / "out" / n).read_bytes() for n in names)
    assert not [p for p in (tmp_path / "out").rglob("*") if "texts" in p.name]


def test_a_saved_units_device_arrays_are_copied_while_the_next_stage_runs_and_counted_in_none(tmp_path, monkeypatch):
    """``LocalExecutor.save`` copies no device array on the run's thread (its ``checkpoints`` cost is the queueing);
    the writer's thread copies them while the next stage runs, and that stage's numbers leave them out: they are
    counted as checkpoint copies.  A resumed run loads what the host arrays would have saved."""
    import sys
    import threading

    from gpu_dedup.backends import CHECKPOINT_COPIES, transfer_totals
    from gpu_dedup.run import checkpoint
    from gpu_dedup.run.local import LocalExecutor
    from gpu_dedup.run.stagelog import StageLog
    from tests.fake_cupy import fake_cupy

    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    release = threading.Event()
    real = checkpoint.Checkpoints._save

    def held(self, unit, arrays, meta):  # the writer's thread, slower than the run
        assert release.wait(30)
        real(self, unit, arrays, meta)

    monkeypatch.setattr(checkpoint.Checkpoints, "_save", held)
    ex = LocalExecutor([], Config.from_dict({"backend": "cpu"}))
    ck = checkpoint.Checkpoints(tmp_path, "fp")
    rows, hashes = np.arange(5, dtype=np.int64), np.arange(15, dtype=np.uint64).reshape(5, 3)
    parts = {"bands": [{"lsh_row": cp.asarray(rows), "band_hashes": cp.asarray(hashes)}], "extra": [None]}
    st = StageLog()
    before = transfer_totals()
    with st.cost("checkpoints"):
        assert ex.save(ck, "bands", parts, {"stages": {}, "counts": {"lsh_rows": 5}}) is parts
    assert not any(what == "get" for what, _, _ in cp.calls) and transfer_totals() == before
    with st.stage("buckets"):
        release.set()
        ck.wait()  # the copies and the file, made by the writer's thread during this stage
    assert {thread for what, thread, _ in cp.calls if what == "get"} == {"gpu-dedup-checkpoints"}
    assert not any(k.endswith("_bytes") for k in st.stages["buckets"])
    assert transfer_totals()[CHECKPOINT_COPIES] - before[CHECKPOINT_COPIES] == rows.nbytes + hashes.nbytes
    loaded, meta = ex.load(ck, "bands")
    assert meta["counts"] == {"lsh_rows": 5} and loaded["extra"] == [None]
    assert np.array_equal(loaded["bands"][0]["lsh_row"], rows) and np.array_equal(loaded["bands"][0]["band_hashes"],
                                                                                  hashes)


def test_the_verify_stage_says_where_its_seconds_went_round_by_round(planted_run):
    """``stages.verify.round_seconds``: each star round's pairs (those scored for the first time: together the
    candidate edges) and its seconds making them, scoring them and taking their answers in, within the stage's."""
    result, _ = planted_run
    verify = result.report["stages"]["verify"]
    rounds = verify["round_seconds"]
    assert 1 <= len(rounds) <= verify["star_rounds"]
    assert sum(r["pairs"] for r in rounds) == verify["candidate_edges"] > 0
    assert all(r[k] >= 0 for r in rounds for k in ("propose", "score", "accept"))
    assert sum(r["propose"] + r["score"] + r["accept"] for r in rounds) <= verify["seconds"]
    for r in rounds:  # the exact scoring's chunks: their sets made and their pairs scored, within the round's score
        if not r["pairs"]:
            assert "score_parts" not in r  # nothing scored
            continue
        parts = r["score_parts"]
        assert sorted(parts) == ["chunks", "pairs", "sets"] and parts["chunks"] >= 1
        assert 0 < parts["sets"] and 0 <= parts["pairs"] and parts["sets"] + parts["pairs"] <= r["score"] + 1e-3
