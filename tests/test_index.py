"""Persisted index: incremental dedup equals a full dedup; online queries; format checks."""

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.errors import InputError
from gpu_dedup.index import Index, IndexMismatchError, index_fingerprint
from gpu_dedup.pipeline import run
from gpu_dedup.sample import planted_corpus, write_shards


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    """Three batches with near duplicates inside each and across them (clusters span batches)."""
    d = tmp_path_factory.mktemp("index")
    sample = planted_corpus(n_docs=2400, n_clusters=200, cluster_size=(2, 6), words=(30, 150),
                            edit_rate=(0.0, 0.06), seed=17)
    t = sample.table.select(["id", "text"])
    for name, lo in (("a", 0), ("b", 800), ("c", 1600)):
        write_shards(t.slice(lo, 800), d / name, shards=2, prefix=name)
        write_shards(t.slice(lo, 800), d / "all", shards=2, prefix=name)  # a-*, b-*, c-*: input order
    return d


def _removed(result):
    dup = result.duplicates
    return set(dup.filter(pa.compute.invert(dup.column("kept"))).column("id").to_pylist())


@pytest.mark.parametrize("method", ["exact", "signature"])
def test_incremental_equals_full_dedup(batches, tmp_path, method):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "verify": {"method": method}})
    idx = tmp_path / "index"
    run(batches / "a", tmp_path / "out_a", cfg, index_out=idx)
    b = run(batches / "b", tmp_path / "out_b", cfg, against=idx, update_index=True)
    c = run(batches / "c", tmp_path / "out_c", cfg, against=idx, update_index=True)
    full = run(batches / "all", tmp_path / "full", cfg)
    full_removed = _removed(full)
    b_ids = set(pq.read_table(batches / "b").column("id").to_pylist())
    c_ids = set(pq.read_table(batches / "c").column("id").to_pylist())
    assert _removed(b) == full_removed & b_ids
    assert _removed(c) == full_removed & c_ids
    assert b.report["counts"]["removed_against_index"] > 20 and c.report["counts"]["removed_against_index"] > 20
    index = Index.open(idx)
    assert index.documents == 2400
    # re-starred rounds happened and are replayed: centre records beyond round 0 in every segment
    assert all((s.centre_round >= 1).sum() > 0 for s in index.segments)
    for r in (b, c):  # every row accounted for
        assert r.report["counts"]["kept"] + r.report["counts"]["removed"] == 800


def test_indexed_documents_always_survive(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": "longest"}})
    run(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    again = run(batches / "a", tmp_path / "again", cfg, against=tmp_path / "index")
    assert again.report["counts"]["kept"] == 0  # every document is already in the index
    dup = again.duplicates.to_pydict()
    assert all(dup["in_index"]) and set(dup["match"]) == {"exact"}


def test_config_must_match_the_index(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    other = cfg.with_overrides({"minhash.ngram": 3})
    with pytest.raises(IndexMismatchError, match=r"minhash.ngram: index 5, this run 3"):
        run(batches / "b", tmp_path / "out_b", other, against=tmp_path / "index")
    with pytest.raises(InputError, match="not a gpu_dedup index"):
        Index.open(tmp_path / "out")
    with pytest.raises(InputError, match="an index already exists"):
        run(batches / "a", tmp_path / "out2", cfg, index_out=tmp_path / "index")


def test_index_does_not_depend_on_the_backend_setting(batches, tmp_path):
    """One index format for both backends: the backend is not part of the fingerprint or the manifest."""
    base = Config.from_dict({"input": {"id_column": "id"}})
    configs = {b: base.with_overrides({"backend": b}) for b in ("cpu", "gpu", "auto")}
    assert len({index_fingerprint(c) for c in configs.values()}) == 1
    run(batches / "a", tmp_path / "out", configs["cpu"], index_out=tmp_path / "index")
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["fingerprint"] == index_fingerprint(configs["gpu"]) and "backend" not in json.dumps(manifest)
    for b in ("gpu", "auto"):  # opening checks the fingerprint: no mismatch
        assert Index.open(tmp_path / "index", configs[b]).documents == 800
    again = run(batches / "b", tmp_path / "out_b", configs["auto"], against=tmp_path / "index")  # GPU if any
    assert again.report["counts"]["removed_against_index"] > 0


def test_query_finds_near_and_exact_copies(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    index = Index.open(tmp_path / "index")
    texts = pq.read_table(batches / "a").column("text").to_pylist()
    words = texts[0].split()
    near = " ".join(words[:-1] + ["different"]) if len(words) > 40 else texts[0] + " extra"
    q = index.query(pa.array([texts[0].upper(), near, "nothing like anything in the corpus at all today"]))
    rows = q.to_pylist()
    assert any(r["query"] == 0 and r["exact"] and r["similarity"] == 1.0 for r in rows)
    assert any(r["query"] == 1 and 0.8 <= r["similarity"] < 1.0 for r in rows)
    assert not any(r["query"] == 2 for r in rows)
    assert {r["survivor_id"] for r in rows if r["query"] == 0} <= set(index.ids(np.arange(len(index))).to_pylist())


def test_cli_build_info_query_and_half_written_segment(batches, tmp_path):
    py = [sys.executable, "-m", "gpu_dedup"]
    b = subprocess.run(py + ["index", "build", str(batches / "a"), "-o", str(tmp_path / "ix"), "--id-column", "id",
                             "--backend", "cpu", "-q"], capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    info = json.loads(subprocess.run(py + ["index", "info", str(tmp_path / "ix")], capture_output=True,
                                     text=True).stdout)
    assert info["documents"] == 800 and info["segments"] == 1
    (tmp_path / "ix" / ".seg-00001.tmp").mkdir()  # a crashed append: never listed in the manifest
    text = pq.read_table(batches / "a").column("text")[3].as_py()
    q = subprocess.run(py + ["query", str(tmp_path / "ix")], input=text + "\n", capture_output=True, text=True)
    assert q.returncode == 0, q.stderr
    assert any(json.loads(line)["exact"] for line in q.stdout.splitlines())


def _segments(path):
    """Every segment's docs, bands and centres tables (the whole index content) and the manifest's counts."""
    from gpu_dedup.index import _read_ipc

    manifest = json.loads((path / "manifest.json").read_text())
    tables = {(seg, part): _read_ipc(path / seg / f"{part}.arrow")
              for seg in manifest["segments"] for part in ("docs", "bands", "centers")}
    return manifest["fingerprint"], manifest["documents"], manifest["segments"], tables


def _frame(directory, kind):
    """The shards of a batch in the pipeline's order (sorted by path), plus a column the index ignores."""
    t = pa.concat_tables([pq.read_table(p) for p in sorted(directory.glob("*.parquet"))])
    t = t.append_column("extra", pa.array(np.arange(t.num_rows)))
    return t.to_pandas() if kind == "pandas" else t


@pytest.mark.parametrize("kind", ["pandas", "arrow"])
def test_add_equals_against_update_index(batches, tmp_path, kind):
    """Index.add(frame) removes the same rows and leaves the same index as `run --against --update-index`."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "minhash": {"ngram": 4}})
    for route in ("run", "add"):
        run(batches / "a", tmp_path / f"out_{route}", cfg, index_out=tmp_path / route)
    index = Index.open(tmp_path / "add")
    for batch in ("b", "c"):
        want = run(batches / batch, tmp_path / f"out_{batch}", cfg, against=tmp_path / "run", update_index=True)
        before = index.documents
        got = index.add(_frame(batches / batch, kind), text="text", id="id", backend="cpu")  # the index's settings
        assert got.first_doc == before and index.documents == before + 800  # updated in place
        assert np.array_equal(got.kept, want.kept) and np.array_equal(got.clusters, want.cluster)
        assert _removed(want) and got.report["counts"]["removed_against_index"] > 0
        dup = pa.Table.from_pandas(got.duplicates) if kind == "pandas" else got.duplicates
        assert set(dup.filter(pa.compute.invert(dup.column("kept"))).column("id").to_pylist()) == _removed(want)
        assert dup.column_names == ["id", "row", "cluster_id", "kept", "similarity", "match", "survivor_id",
                                    "in_index"]
        assert len(got.deduplicated) == int(got.kept.sum()) and "extra" in list(got.deduplicated.columns
                                                                                 if kind == "pandas"
                                                                                 else got.deduplicated.column_names)
        assert got.report["counts"] == {**want.report["counts"]}
    assert _segments(tmp_path / "add") == _segments(tmp_path / "run")
    with pytest.raises(IndexMismatchError, match=r"minhash.ngram: index 4, this run 5"):
        index.add(_frame(batches / "a", kind), id="id", config=Config.from_dict({"backend": "cpu"}))
    assert Index.open(tmp_path / "add").documents == 2400  # nothing appended


def test_cli_run_against_update_index_equals_the_pipeline(batches, tmp_path, capsys):
    from gpu_dedup.cli import main

    flags = ["--id-column", "id", "--backend", "cpu"]
    ix = str(tmp_path / "ix")
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix, "-q"] + flags) == 0
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--update-index"]
                + flags) == 0
    assert "removed" in capsys.readouterr().out
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run(batches / "a", tmp_path / "want_a", cfg, index_out=tmp_path / "want_ix")
    want = run(batches / "b", tmp_path / "want_b", cfg, against=tmp_path / "want_ix", update_index=True)
    got = pq.read_table(tmp_path / "out_b" / "duplicates.parquet")
    assert got.equals(pq.read_table(tmp_path / "want_b" / "duplicates.parquet"))
    assert set(got.filter(pa.compute.invert(got.column("kept"))).column("id").to_pylist()) == _removed(want) != set()
    report = json.loads((tmp_path / "out_b" / "report.json").read_text())
    assert report["counts"] == want.report["counts"] and report["counts"]["removed_against_index"] > 0
    assert report["index"]["updated"] and report["index"]["documents_after"] == 1600
    assert Index.open(ix).documents == 1600 and (tmp_path / "out_b" / "_SUCCESS").exists()
    kept_rows = sum(pq.read_table(p).num_rows for p in (tmp_path / "out_b").glob("b-*.parquet"))
    assert kept_rows == report["counts"]["kept"]
    # a config that does not match the index: exit 2, one line naming the difference, index untouched
    rc = main(["run", str(batches / "c"), "-o", str(tmp_path / "out_c"), "--against", ix, "--update-index",
               "--ngram", "3"] + flags)
    err = capsys.readouterr().err
    assert rc == 2 and "minhash.ngram: index 5, this run 3" in err and "Traceback" not in err
    assert Index.open(ix).documents == 1600


def test_cli_query_reads_a_text_file_and_jsonl(batches, tmp_path, capsys):
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    assert main(["index", "build", str(batches / "a"), "-o", ix, "--id-column", "id", "--backend", "cpu", "-q"]) == 0
    capsys.readouterr()
    a = pq.read_table(batches / "a")
    texts, ids = a.column("text").to_pylist(), a.column("id").to_pylist()
    assert "\n" not in texts[5] + texts[9]
    words = texts[9].split()
    near = " ".join(words[:-1] + ["different"])
    queries = [texts[5].upper(), near, "nothing like anything in the corpus at all today"]
    (tmp_path / "q.txt").write_text("\n".join(queries) + "\n", encoding="utf-8")
    assert main(["query", ix, str(tmp_path / "q.txt")]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert any(r["query"] == 0 and r["exact"] and r["similarity"] == 1.0 for r in rows)
    assert any(r["query"] == 1 and not r["exact"] and 0.8 <= r["similarity"] < 1.0 for r in rows)
    assert not any(r["query"] == 2 for r in rows)
    exact = [r for r in rows if r["query"] == 0 and r["exact"]]  # the first indexed copy of texts[5]
    index = Index.open(ix)
    assert exact[0]["doc"] <= 5 and index.texts([exact[0]["doc"]]).to_pylist() == index.texts([5]).to_pylist()
    assert exact[0]["id"] == index.ids([exact[0]["doc"]])[0].as_py() and ids[5] == index.ids([5])[0].as_py()
    # the same queries as JSON objects (another text column, blank lines skipped): the same matches
    lines = [json.dumps({"body": q, "n": i}) for i, q in enumerate(queries)]
    (tmp_path / "q.jsonl").write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")
    assert main(["query", ix, str(tmp_path / "q.jsonl"), "--jsonl", "--text-column", "body"]) == 0
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == rows
    # --threshold: a stricter one drops the near copy, keeps the exact one
    assert main(["query", ix, str(tmp_path / "q.jsonl"), "--jsonl", "--text-column", "body", "--threshold",
                 "0.999"]) == 0
    strict = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {r["query"] for r in strict} == {0}


def test_take_by_chunk_equals_arrow_take():
    import pyarrow as pa

    from gpu_dedup.index import _take

    t = pa.large_string()
    chunks = [pa.array(["a", "bb", None], t), pa.array(["ccc"], t), pa.array(["d", "ee"], t)]
    rows = np.array([5, 0, 3, 3, 2, 4, 1])
    want = pa.chunked_array(chunks).take(pa.array(rows)).to_pylist()
    assert _take(chunks, np.array([0, 3, 4]), rows).to_pylist() == want
    assert _take(chunks[:1], np.array([0]), np.array([2, 0])).to_pylist() == [None, "a"]
