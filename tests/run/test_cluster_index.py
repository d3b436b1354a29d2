"""Index runs on Dask workers (--index-out, --against, --update-index): the workers write one segment per block,
the client publishes them with one manifest write, and the index answers exactly as the one-process index."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.errors import ConfigError
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.index.format import SOURCES, read_ipc
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup as index_run
from tests.run.clusters import local_cluster

distributed = pytest.importorskip("distributed")

BASE = {"backend": "cpu", "input": {"id_column": "id"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three parts (a: two shards, b and c: one each) with near duplicates inside each and across them."""
    d = tmp_path_factory.mktemp("cix")
    sample = planted_corpus(n_docs=1600, n_clusters=120, words=(30, 120), edit_rate=(0, 0.05), seed=31)
    table = sample.table.select(["id", "text"])
    for part, (lo, hi) in {"a": (0, 800), "b": (800, 1200), "c": (1200, 1600)}.items():
        (d / part).mkdir()
        for i, start in enumerate(range(lo, hi, 400)):  # small row groups: several blocks per shard
            pq.write_table(table.slice(start, 400), d / part / f"{part}{i}.parquet", row_group_size=100)
    return d




@pytest.fixture(scope="module", params=[1, 2], ids=["1worker", "2workers"])
def cluster(request):
    with local_cluster(request.param) as c:
        yield c.scheduler_address


def _on(cfg: Config, scheduler, block_rows=150) -> Config:
    return cfg.with_overrides({"cluster.scheduler": scheduler, "cluster.block_rows": block_rows})


def _tables(path) -> dict:
    """An index's documents (in doc order) and its bands and centres (sorted), over all segments."""
    index = Index.open(path)  # verifies every checksum
    docs = pa.concat_tables([s.docs for s in index.segments]).combine_chunks()
    out = {"documents": index.documents, "docs": docs}
    for f, keys in (("bands.arrow", ["band", "hash", "doc"]), ("centers.arrow", ["band", "hash", "round", "doc"])):
        t = pa.concat_tables([read_ipc(index.path / s.name / f) for s in index.segments])
        out[f] = t.sort_by([(k, "ascending") for k in keys]).combine_chunks()
    return out


def _same_index(a, b):
    ta, tb = _tables(a), _tables(b)
    assert ta["documents"] == tb["documents"]
    for name in ("docs", "bands.arrow", "centers.arrow"):
        assert ta[name].schema == tb[name].schema, name
        assert ta[name].equals(tb[name]), name
    texts = ta["docs"].column("text").to_pylist()[::37] + ["an unrelated query text with nothing in common"]
    qa, qb = Index.open(a).query(texts), Index.open(b).query(texts)
    assert qa.equals(qb)


def _outputs_identical(a, b):
    names = sorted(p.name for p in a.iterdir() if p.suffix == ".parquet")
    assert names and names == sorted(p.name for p in b.iterdir() if p.suffix == ".parquet")
    for name in names:
        assert pq.read_table(a / name).equals(pq.read_table(b / name)), name


@pytest.mark.parametrize("extra", [{}, {"verify": {"method": "signature"}, "select": {"split_chains": True}}],
                         ids=["exact", "signature-split"])
def test_index_out_on_workers_equals_one_process(corpus, cluster, tmp_path, extra):
    cfg = Config.from_dict({**BASE, **extra})
    single = index_run(corpus / "a", tmp_path / "single", cfg, index_out=tmp_path / "ix1")
    dist = index_run(corpus / "a", tmp_path / "dist", _on(cfg, cluster), index_out=tmp_path / "ix2")
    assert dist.report["counts"] == single.report["counts"] and single.report["counts"]["removed"] > 0
    _outputs_identical(tmp_path / "single", tmp_path / "dist")
    _same_index(tmp_path / "ix1", tmp_path / "ix2")
    one, many = Index.open(tmp_path / "ix1"), Index.open(tmp_path / "ix2")
    assert len(one.segments) == 1 and len(many.segments) > 2  # one segment per block
    assert set(many.manifest[SOURCES].values()) == {one.manifest[SOURCES]["seg-00000"]}  # one source, every segment
    assert one.info()["kept"] == many.info()["kept"]
    assert not list(tmp_path.glob("ix2/.seg-*"))  # no temporary directory left behind

    # against the cluster-built index, one process and a cluster give what the one-process index gives
    ref = index_run(corpus / "b", tmp_path / "ref", cfg, against=tmp_path / "ix1")
    assert ref.report["counts"]["removed_against_index"] > 0
    for name, c in (("one", cfg), ("two", _on(cfg, cluster, 100))):
        got = index_run(corpus / "b", tmp_path / name, c, against=tmp_path / "ix2")
        assert got.report["counts"] == ref.report["counts"]
        _outputs_identical(tmp_path / "ref", tmp_path / name)


def test_update_index_on_workers_equals_one_process(corpus, cluster, tmp_path):
    cfg = Config.from_dict(BASE)
    index_run(corpus / "a", tmp_path / "base", cfg, index_out=tmp_path / "ix")
    shutil.copytree(tmp_path / "ix", tmp_path / "ix1")
    shutil.copytree(tmp_path / "ix", tmp_path / "ix2")
    single = index_run(corpus / "b", tmp_path / "single", cfg, against=tmp_path / "ix1", update_index=True)
    dist = index_run(corpus / "b", tmp_path / "dist", _on(cfg, cluster), against=tmp_path / "ix2", update_index=True)
    assert single.report["counts"]["removed_against_index"] > 0
    assert dist.report["counts"] == single.report["counts"]
    assert dist.report["index"] == {**single.report["index"], "path": str(tmp_path / "ix2")}
    _outputs_identical(tmp_path / "single", tmp_path / "dist")
    _same_index(tmp_path / "ix1", tmp_path / "ix2")

    # a later one-process append to the cluster-built index: the same as to the one-process one
    one = index_run(corpus / "c", tmp_path / "c1", cfg, against=tmp_path / "ix1", update_index=True)
    two = index_run(corpus / "c", tmp_path / "c2", cfg, against=tmp_path / "ix2", update_index=True)
    assert one.report["counts"] == two.report["counts"]
    _outputs_identical(tmp_path / "c1", tmp_path / "c2")
    _same_index(tmp_path / "ix1", tmp_path / "ix2")


def test_a_rerun_of_a_cluster_update_killed_after_its_append_does_not_append_twice(corpus, tmp_path):
    cfg = Config.from_dict(BASE)
    index_run(corpus / "a", tmp_path / "base", cfg, index_out=tmp_path / "ix")
    ref = index_run(corpus / "b", tmp_path / "ref", cfg, against=tmp_path / "ix")  # what the update must output
    before = Index.open(tmp_path / "ix").documents
    args = [sys.executable, "-m", "gpu_dedup", "run", str(corpus / "b"), "-o", str(tmp_path / "out"), "--against",
            str(tmp_path / "ix"), "--update-index", "--id-column", "id", "--backend", "cpu", "--workers", "2",
            "--set", "cluster.block_rows=150", "-q"]
    killed = subprocess.run(args, capture_output=True, text=True, timeout=600, start_new_session=True,
                            env={**os.environ, "GPU_DEDUP_FAULT": "index:after-append"})
    assert killed.returncode == -9, killed.stderr
    appended = Index.open(tmp_path / "ix")
    assert appended.documents == before + 400 and len(appended.segments) > 2
    again = subprocess.run(args[:-1], capture_output=True, text=True, timeout=600)  # not -q: its warnings shown
    assert again.returncode == 0, again.stderr
    assert "already appended" in again.stderr
    after = Index.open(tmp_path / "ix")
    assert after.manifest["segments"] == appended.manifest["segments"] and after.documents == before + 400
    _outputs_identical(tmp_path / "ref", tmp_path / "out")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["counts"] == ref.report["counts"]


def _build_killed_at(fault: str, corpus, tmp_path, between=lambda: None) -> None:
    """A --workers --index-out run of part a SIGKILLed at ``fault``, ``between()``, then the same command again."""
    args = [sys.executable, "-m", "gpu_dedup", "run", str(corpus / "a"), "-o", str(tmp_path / "out"), "--index-out",
            str(tmp_path / "ix"), "--id-column", "id", "--backend", "cpu", "--workers", "2",
            "--set", "cluster.block_rows=150", "-q"]
    killed = subprocess.run(args, capture_output=True, text=True, timeout=600, start_new_session=True,
                            env={**os.environ, "GPU_DEDUP_FAULT": fault})
    assert killed.returncode == -9, killed.stderr
    between()
    again = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr


def test_a_cluster_build_killed_before_its_manifest_leaves_no_index_and_reruns(corpus, tmp_path):
    def nothing_published():
        assert not (tmp_path / "ix" / "manifest.json").exists() and list((tmp_path / "ix").glob("seg-*"))

    _build_killed_at("index:before-manifest", corpus, tmp_path, nothing_published)
    index_run(corpus / "a", tmp_path / "single", Config.from_dict(BASE), index_out=tmp_path / "ix1")
    _same_index(tmp_path / "ix1", tmp_path / "ix")


def test_cosine_index_on_workers_equals_one_process(cluster, tmp_path):
    rng = np.random.default_rng(4)
    base = rng.normal(size=(50, 24)).astype(np.float32)
    vecs = base[rng.integers(0, 50, 600)] + rng.normal(scale=0.02, size=(600, 24)).astype(np.float32)
    vecs[7] = 0  # a vector without direction
    table = pa.table({"id": pa.array(np.arange(600)), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(vecs.ravel()), 24)})
    for part, (lo, hi) in {"a": (0, 400), "b": (400, 600)}.items():
        (tmp_path / part).mkdir()
        pq.write_table(table.slice(lo, hi - lo), tmp_path / part / f"{part}.parquet", row_group_size=50)
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "lsh": {"threshold": 0.9},
                            "input": {"id_column": "id", "vector_column": "emb"}})
    index_run(tmp_path / "a", tmp_path / "s", cfg, index_out=tmp_path / "ix1")
    index_run(tmp_path / "a", tmp_path / "d", _on(cfg, cluster, 100), index_out=tmp_path / "ix2")
    _outputs_identical(tmp_path / "s", tmp_path / "d")
    assert _tables(tmp_path / "ix1")["docs"].equals(_tables(tmp_path / "ix2")["docs"])
    one = index_run(tmp_path / "b", tmp_path / "s2", cfg, against=tmp_path / "ix1", update_index=True)
    two = index_run(tmp_path / "b", tmp_path / "d2", _on(cfg, cluster, 100), against=tmp_path / "ix2",
                    update_index=True)
    assert one.report["counts"] == two.report["counts"] and one.report["counts"]["removed_against_index"] > 0
    _outputs_identical(tmp_path / "s2", tmp_path / "d2")
    for name in ("docs", "bands.arrow", "centers.arrow"):
        assert _tables(tmp_path / "ix1")[name].equals(_tables(tmp_path / "ix2")[name]), name


def test_a_cluster_index_in_an_object_store_is_one_clear_error(corpus, tmp_path):
    cfg = _on(Config.from_dict(BASE), "tcp://127.0.0.1:1")
    with pytest.raises(ConfigError, match=r"--index-out 's3://bucket/ix'.*object store.*shared directory"):
        index_run(corpus / "a", tmp_path / "out", cfg, index_out="s3://bucket/ix")
    with pytest.raises(ConfigError, match=r"--update-index 's3://bucket/ix'.*drop --workers"):
        index_run(corpus / "a", tmp_path / "out", cfg, against="s3://bucket/ix", update_index=True)
    assert not (tmp_path / "out").exists()


def test_a_cluster_run_with_another_split_chains_is_refused_before_it_reaches_the_scheduler(corpus, tmp_path):
    """A cluster run against an index is held to the index's select.split_chains as a one-process run is
    (tests/index/test_store.py::test_a_run_with_another_split_chains_is_refused_before_it_runs): refused before
    it connects (the scheduler here does not exist), the index unchanged."""
    from gpu_dedup.index.format import IndexMismatchError

    index_run(corpus / "a", tmp_path / "out_a", Config.from_dict(BASE), index_out=tmp_path / "ix")
    cfg = _on(Config.from_dict({**BASE, "select": {"split_chains": False}}), "tcp://127.0.0.1:1")
    with pytest.raises(IndexMismatchError, match="select.split_chains: index true, this run false"):
        index_run(corpus / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    assert not (tmp_path / "out_b").exists() and Index.open(tmp_path / "ix").documents == 800


def test_a_cluster_run_at_another_threshold_is_refused_whatever_the_layout(corpus, tmp_path):
    """With lsh.bands and lsh.rows given, a cluster run at --threshold 0.6 against an index built at 0.8 reached the
    scheduler (the threshold was compared only where the run derived another layout from it); it is refused before
    it connects, as a one-process run is
    (tests/index/test_store.py::test_a_run_at_another_threshold_is_refused_whatever_the_layout)."""
    from gpu_dedup.index.format import IndexMismatchError

    fixed = {**BASE, "lsh": {"bands": 16, "rows": 8}}
    index_run(corpus / "a", tmp_path / "out_a", Config.from_dict(fixed), index_out=tmp_path / "ix")
    cfg = _on(Config.from_dict({**BASE, "lsh": {"bands": 16, "rows": 8, "threshold": 0.6}}), "tcp://127.0.0.1:1")
    with pytest.raises(IndexMismatchError, match="lsh.threshold: index 0.8, this run 0.6"):
        index_run(corpus / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    assert not (tmp_path / "out_b").exists() and Index.open(tmp_path / "ix").documents == 800


def test_a_cluster_run_with_another_star_rounds_is_refused_before_it_reaches_the_scheduler(corpus, tmp_path):
    """A cluster run with another lsh.star_rounds than its index's reached the scheduler; refused before it connects
    (tests/index/test_store.py::test_a_run_with_another_star_rounds_or_verify_method_is_refused_and_old_indexes_record_them)."""
    from gpu_dedup.index.format import IndexMismatchError

    index_run(corpus / "a", tmp_path / "out_a", Config.from_dict(BASE), index_out=tmp_path / "ix")
    cfg = _on(Config.from_dict({**BASE, "lsh": {"star_rounds": 1}}), "tcp://127.0.0.1:1")
    with pytest.raises(IndexMismatchError, match="lsh.star_rounds: index 3, this run 1"):
        index_run(corpus / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    assert not (tmp_path / "out_b").exists() and Index.open(tmp_path / "ix").documents == 800


def test_a_killed_cluster_index_build_resumes_from_its_checkpoints(corpus, tmp_path):
    """SIGKILL after the verify stage of a --workers --index-out run; the same command resumes from the workers'
    checkpoints and builds the index one process builds."""
    _build_killed_at("verify", corpus, tmp_path)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {"exact", "bands"} <= set(report["resumed_from_checkpoint"])
    index_run(corpus / "a", tmp_path / "single", Config.from_dict(BASE), index_out=tmp_path / "ix1")
    _same_index(tmp_path / "ix1", tmp_path / "ix")
