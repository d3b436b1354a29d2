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
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.index.format import IndexMismatchError, index_fingerprint
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup


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


@pytest.mark.parametrize("method,split", [("exact", True), ("signature", True), ("exact", False),
                                          ("signature", False)])
def test_incremental_equals_full_dedup(batches, tmp_path, method, split):
    """Also with split chains (the default): a new document that resembles a removed indexed document
    joins that document's index cluster and is measured against its survivor, as in a full dedup."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "verify": {"method": method},
                            "select": {"split_chains": split}})
    idx = tmp_path / "index"
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=idx)
    b = run_dedup(batches / "b", tmp_path / "out_b", cfg, against=idx, update_index=True)
    c = run_dedup(batches / "c", tmp_path / "out_c", cfg, against=idx, update_index=True)
    full = run_dedup(batches / "all", tmp_path / "full", cfg)
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
        if split:  # no removed document below the threshold to the document kept in its place
            assert r.report["chaining"]["below_threshold_to_survivor"] == 0
            near = r.duplicates.filter(pa.compute.equal(r.duplicates.column("match"), "near"))
            assert near.num_rows > 0 and min(near.column("similarity").to_pylist()) >= 0.8 - 1e-6


def test_against_an_index_removes_what_a_full_dedup_removes_when_chains_cross_the_index(tmp_path):
    """Planted corpus split in halves: a new document close to an indexed document that a full dedup ejects
    from a larger cluster (the new half bridges two indexed documents below the threshold to each other) is
    removed as in the full dedup, with split_chains on (the default)."""
    sample = planted_corpus(n_docs=4000, n_clusters=800, seed=5)
    t = sample.table.select(["id", "text"])
    for name, part in (("a", t.slice(0, 2000)), ("b", t.slice(2000))):
        write_shards(part, tmp_path / name, shards=1, prefix=name)
        write_shards(part, tmp_path / "all", shards=1, prefix=name)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(tmp_path / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    b = run_dedup(tmp_path / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix")
    full = run_dedup(tmp_path / "all", tmp_path / "full", cfg)
    b_ids = set(t.slice(2000).column("id").to_pylist())
    assert _removed(b) == _removed(full) & b_ids
    assert full.report["counts"]["chain_split_ejected"] > 0


def test_indexed_documents_always_survive(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": "longest"}})
    first = run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    again = run_dedup(batches / "a", tmp_path / "again", cfg, against=tmp_path / "index")
    assert again.report["counts"]["kept"] == 0  # every document is already in the index
    dup = again.duplicates.to_pydict()
    assert all(dup["in_index"]) and len(dup["id"]) == 800
    # each document joins its first-run cluster; it is an exact copy of the survivor where its first-run
    # self was (kept, or an exact copy), else near, as similar to the survivor as that document was
    assert dup["cluster_id"] == first.cluster.tolist()
    assert [m == "exact" for m in dup["match"]] == (first.rep == first.cluster).tolist()
    assert 0 < dup["match"].count("near") < 800
    assert min(dup["similarity"]) >= 0.8 - 1e-6


def test_config_must_match_the_index(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    other = cfg.with_overrides({"minhash.ngram": 3})
    with pytest.raises(IndexMismatchError, match=r"minhash.ngram: index 5, this run 3"):
        run_dedup(batches / "b", tmp_path / "out_b", other, against=tmp_path / "index")
    with pytest.raises(InputError, match="not a gpu_dedup index"):
        Index.open(tmp_path / "out")
    with pytest.raises(InputError, match="an index already exists"):  # of other inputs
        run_dedup(batches / "b", tmp_path / "out2", cfg, index_out=tmp_path / "index")


def test_index_does_not_depend_on_the_backend_setting(batches, tmp_path):
    """One index format for both backends: the backend is not part of the fingerprint or the manifest."""
    base = Config.from_dict({"input": {"id_column": "id"}})
    configs = {b: base.with_overrides({"backend": b}) for b in ("cpu", "gpu", "auto")}
    assert len({index_fingerprint(c) for c in configs.values()}) == 1
    run_dedup(batches / "a", tmp_path / "out", configs["cpu"], index_out=tmp_path / "index")
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["fingerprint"] == index_fingerprint(configs["gpu"]) and "backend" not in json.dumps(manifest)
    for b in ("gpu", "auto"):  # opening checks the fingerprint: no mismatch
        assert Index.open(tmp_path / "index", configs[b]).documents == 800
    again = run_dedup(batches / "b", tmp_path / "out_b", configs["auto"], against=tmp_path / "index")  # GPU if any
    assert again.report["counts"]["removed_against_index"] > 0


def test_query_finds_near_and_exact_copies(batches, tmp_path):
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
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
    # the index's id column keeps its name; rows and clusters are document numbers
    assert index.id_column == "id" and q.column_names == ["query", "row", "id", "similarity", "exact", "kept",
                                                          "cluster_id", "survivor_id"]
    assert all(r["id"] == index.ids([r["row"]])[0].as_py() for r in rows)
    assert all(r["survivor_id"] == index.ids([r["cluster_id"]])[0].as_py() for r in rows)


def test_a_query_below_the_index_threshold_warns_with_the_chance_of_finding_a_pair(batches, tmp_path, caplog):
    """The index's LSH layout was chosen for its threshold: a pair at a lower similarity rarely shares a band
    hash with the query, so a lower --threshold returns only the few found.  The warning gives the S-curve's
    probability at the asked similarity; every match returned is still verified."""
    import logging

    from gpu_dedup.cli import main
    from gpu_dedup.curves import s_curve

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    index = Index.open(tmp_path / "index")
    bands, rows = cfg.layout
    texts = [t for t in pq.read_table(batches / "a").column("text").to_pylist() if len(t.split()) >= 120][:40]
    # every 16th word changed: word 5-gram Jaccard about 0.5 to the indexed text
    queries = [" ".join(w if i % 16 else f"zz{i}" for i, w in enumerate(t.split())) for t in texts]
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    found = index.query(pa.array(queries), threshold=0.45)
    said = [r.getMessage() for r in caplog.records if "below the index's" in r.getMessage()]
    assert len(said) == 1, caplog.text
    p = s_curve(0.45, bands, rows)
    assert f"query threshold 0.45 is below the index's 0.8: with its {bands} bands x {rows} rows" in said[0]
    assert f"found with probability {p:.2g} ({s_curve(0.8, bands, rows):.2f} at 0.8)" in said[0]
    assert "index at --threshold 0.45" in said[0] and all(len(line) <= 120 for line in said[0].splitlines())
    assert (found.column("similarity").to_numpy() >= 0.45).all()  # what is returned is verified
    assert len({r["query"] for r in found.to_pylist()}) < len(queries) / 2  # most pairs at J ~ 0.5 are missed
    caplog.clear()
    index.query(pa.array(queries), threshold=0.8)
    index.query(pa.array(queries), threshold=0.9)
    index.query(pa.array(queries))
    assert "below the index's" not in caplog.text  # at or above its threshold: nothing to say
    (tmp_path / "q.txt").write_text("\n".join(queries[:3]) + "\n")
    caplog.clear()
    assert main(["query", str(tmp_path / "index"), str(tmp_path / "q.txt"), "--threshold", "0.5", "-q"]) == 0
    assert "below the index's 0.8" in caplog.text  # the CLI says it too (on stderr), and still answers


def test_query_of_an_index_without_ids_names_documents_by_row(batches, tmp_path):
    """Issue: a generated id column called ``id`` looked like the user's: an index built without ids
    answers with ``row`` and ``cluster_id`` only."""
    cfg = Config.from_dict({"backend": "cpu"})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    index = Index.open(tmp_path / "index")
    assert index.id_column is None
    texts = pq.read_table(batches / "a").column("text").to_pylist()
    q = index.query(pa.array([texts[7]]))
    assert q.column_names == ["query", "row", "similarity", "exact", "kept", "cluster_id"]
    assert 7 in q.column("row").to_pylist() or q.column("exact").to_pylist() == [True]


def test_cli_build_info_query_and_half_written_segment(batches, tmp_path):
    py = [sys.executable, "-m", "gpu_dedup"]
    b = subprocess.run(py + ["index", "build", str(batches / "a"), "-o", str(tmp_path / "ix"), "--id-column", "id",
                             "--backend", "cpu", "-q"], capture_output=True, text=True)
    assert b.returncode == 0, b.stderr
    info = json.loads(subprocess.run(py + ["index", "info", str(tmp_path / "ix")], capture_output=True,
                                     text=True).stdout)
    assert info["documents"] == 800 and info["segments"] == 1 and info["id_column"] == "id"
    (tmp_path / "ix" / ".seg-00001.tmp").mkdir()  # a crashed append: never listed in the manifest
    text = pq.read_table(batches / "a").column("text")[3].as_py()
    q = subprocess.run(py + ["query", str(tmp_path / "ix")], input=text + "\n", capture_output=True, text=True)
    assert q.returncode == 0, q.stderr
    assert any(m["exact"] for line in q.stdout.splitlines() for m in json.loads(line)["matches"])
    # the README's line: a query without a match says so (an empty list; a count on stderr), exit 0
    q = subprocess.run(py + ["query", str(tmp_path / "ix")], input="some text\n", capture_output=True, text=True)
    assert q.returncode == 0 and json.loads(q.stdout) == {"query": 0, "matches": []}
    assert "0 of 1 queries matched" in q.stderr and "1 had no match" in q.stderr
    # a failure is told apart: no JSON on stdout, a non-zero exit, one line on stderr
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{oops\n', encoding="utf-8")
    q = subprocess.run(py + ["query", str(tmp_path / "ix"), "--jsonl", str(tmp_path / "bad.jsonl")],
                       capture_output=True, text=True)
    assert q.returncode != 0 and q.stdout == "" and "line 2" in q.stderr and "Traceback" not in q.stderr


def _segments(path):
    """Every segment's docs, bands and centres tables (the whole index content) and the manifest's counts."""
    from gpu_dedup.index.format import read_ipc as _read_ipc

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
        run_dedup(batches / "a", tmp_path / f"out_{route}", cfg, index_out=tmp_path / route)
    index = Index.open(tmp_path / "add")
    for batch in ("b", "c"):
        want = run_dedup(batches / batch, tmp_path / f"out_{batch}", cfg, against=tmp_path / "run", update_index=True)
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
    run_dedup(batches / "a", tmp_path / "want_a", cfg, index_out=tmp_path / "want_ix")
    want = run_dedup(batches / "b", tmp_path / "want_b", cfg, against=tmp_path / "want_ix", update_index=True)
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
    out = capsys.readouterr()
    answers = [json.loads(line) for line in out.out.splitlines()]
    assert [a["query"] for a in answers] == [0, 1, 2]  # one object per query, in input order
    first, second, third = (a["matches"] for a in answers)
    assert third == []  # no match: an empty list
    assert "2 of 3 queries matched" in out.err
    assert first[0]["exact"] and first[0]["similarity"] == 1.0  # best first
    assert any(not m["exact"] and 0.8 <= m["similarity"] < 1.0 for m in second)
    assert all(list(m) == ["row", "id", "similarity", "exact", "kept", "cluster_id", "survivor_id"]
               for m in first + second)
    index = Index.open(ix)  # the first indexed copy of texts[5]
    assert first[0]["row"] <= 5 and index.texts([first[0]["row"]]).to_pylist() == index.texts([5]).to_pylist()
    assert first[0]["id"] == index.ids([first[0]["row"]])[0].as_py() and ids[5] == index.ids([5])[0].as_py()
    # the same queries as JSON objects (another text column, blank lines skipped), options after the
    # positionals: the same answers
    lines = [json.dumps({"body": q, "n": i}) for i, q in enumerate(queries)]
    (tmp_path / "q.jsonl").write_text(lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n", encoding="utf-8")
    for argv in (["query", ix, str(tmp_path / "q.jsonl"), "--jsonl", "--text-column", "body"],
                 ["query", ix, "--jsonl", str(tmp_path / "q.jsonl"), "--text-column", "body"],
                 ["query", "--jsonl", "--text-column", "body", ix, str(tmp_path / "q.jsonl"), "-q"]):
        assert main(argv) == 0
        out = capsys.readouterr()
        assert [json.loads(line) for line in out.out.splitlines()] == answers, argv
    assert out.err == ""  # -q: no summary
    # --threshold: a stricter one drops the near copy, keeps the exact one
    assert main(["query", ix, str(tmp_path / "q.jsonl"), "--jsonl", "--text-column", "body", "--threshold",
                 "0.999"]) == 0
    strict = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [bool(a["matches"]) for a in strict] == [True, False, False]
    # a JSON line without the text field: one line naming it, nothing on stdout
    (tmp_path / "nofield.jsonl").write_text('{"text": "a b c"}\n', encoding="utf-8")
    rc = main(["query", ix, str(tmp_path / "nofield.jsonl"), "--jsonl", "--text-column", "body"])
    out = capsys.readouterr()
    assert rc != 0 and out.out == "" and "has no 'body' field" in out.err


def test_take_by_chunk_equals_arrow_take():
    import pyarrow as pa

    from gpu_dedup.index.store import _take

    t = pa.large_string()
    chunks = [pa.array(["a", "bb", None], t), pa.array(["ccc"], t), pa.array(["d", "ee"], t)]
    rows = np.array([5, 0, 3, 3, 2, 4, 1])
    want = pa.chunked_array(chunks).take(pa.array(rows)).to_pylist()
    assert _take(chunks, np.array([0, 3, 4]), rows).to_pylist() == want
    assert _take(chunks[:1], np.array([0]), np.array([2, 0])).to_pylist() == [None, "a"]


def test_index_of_another_hash_family_fails_naming_it_and_the_fix(batches, tmp_path):
    cfg = Config(backend="cpu")
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    manifest = json.loads((tmp_path / "index" / "manifest.json").read_text())
    assert manifest["hash_family"] == "v2-mix64-poly64-affine32" and manifest["format_version"] == 2
    old = dict(manifest, format_version=1)  # an index written before hash family v2 (no family recorded)
    del old["hash_family"]
    (tmp_path / "index" / "manifest.json").write_text(json.dumps(old))
    with pytest.raises(InputError, match=r"hash family v1 .*this gpu_dedup hashes with family "
                                         r"v2-mix64-poly64-affine32.*gpu-dedup index build"):
        Index.open(tmp_path / "index")
    with pytest.raises(InputError, match="rebuild the index"):
        run_dedup(batches / "b", tmp_path / "out_b", cfg, against=tmp_path / "index")


def _cli_run(*args, fault=None, quiet=True):
    import os

    env = {k: v for k, v in os.environ.items() if k != "GPU_DEDUP_FAULT"}
    if fault:
        env["GPU_DEDUP_FAULT"] = fault
    return subprocess.run([sys.executable, "-m", "gpu_dedup", *map(str, args), "--backend", "cpu",
                           *(["-q"] if quiet else [])], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("fault", ["report:before-success", "commit:before-success", "index:before-append",
                                   "index:before-manifest", "index:after-append"])
def test_an_update_index_run_killed_before_it_finishes_reruns_to_the_same_outputs_and_index(batches, tmp_path, fault):
    """The index is appended to after the outputs are published: a run killed before then leaves the index
    as it was, so the rerun the error message asks for neither appends the documents twice nor removes
    every document as a copy of its own earlier append."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "want_ix")
    want = run_dedup(batches / "b", tmp_path / "want", cfg, against=tmp_path / "want_ix", update_index=True)
    run_dedup(batches / "a", tmp_path / "out_a2", cfg, index_out=tmp_path / "ix")
    args = ("run", batches / "b", "-o", tmp_path / "out", "--id-column", "id", "--against", tmp_path / "ix",
            "--update-index")
    assert _cli_run(*args, fault=fault).returncode == -9
    done = _cli_run(*args, quiet=fault != "index:after-append")  # -q shows errors only: the warning needs without
    assert done.returncode == 0, done.stderr
    assert Index.open(tmp_path / "ix").documents == Index.open(tmp_path / "want_ix").documents == 1600
    for name in ["duplicates.parquet"] + sorted(p.name for p in (tmp_path / "want").glob("b-*")):
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "want" / name).read_bytes(), name
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["counts"]["removed"] == want.report["counts"]["removed"] < 800
    if fault == "index:after-append":  # the killed run had appended: the rerun matched the index as it was before
        assert "already appended" in done.stderr and report["index"]["updated"] is False
        assert _segments(tmp_path / "ix")[3].keys() == _segments(tmp_path / "want_ix")[3].keys()
    else:
        assert report["index"]["documents_after"] == 1600


def test_an_index_run_killed_before_it_finishes_reruns(batches, tmp_path):
    args = ("run", batches / "a", "-o", tmp_path / "out", "--id-column", "id", "--index-out", tmp_path / "ix")
    assert _cli_run(*args, fault="report:before-success").returncode == -9
    # no index: at most the directory with the lock file the killed build held (taken over by the rerun) and the
    # segment it wrote before the outputs' commit, unpublished (no manifest), which the rerun replaces
    assert not (tmp_path / "ix").exists() or \
        {p.name for p in (tmp_path / "ix").iterdir()} <= {".gpu_dedup_index.lock", ".seg-00000.tmp"}
    done = _cli_run(*args)
    assert done.returncode == 0, done.stderr
    assert Index.open(tmp_path / "ix").documents == 800


def test_building_an_index_never_overwrites_what_it_did_not_write(batches, tmp_path):
    from gpu_dedup.errors import OutputError

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    (tmp_path / "manifest").mkdir()
    (tmp_path / "manifest" / "manifest.json").write_text("mine\n")
    (tmp_path / "segment").mkdir()
    (tmp_path / "segment" / "seg-00000").write_text("mine\n")
    (tmp_path / "file").write_text("mine\n")
    for where, text in (("manifest", "is not a gpu_dedup index manifest"), ("segment", "seg-00000' exists"),
                        ("file", "exists and is not a directory")):
        with pytest.raises(OutputError, match=text):
            run_dedup(batches / "a", tmp_path / f"out-{where}", cfg, index_out=tmp_path / where)
    assert (tmp_path / "manifest" / "manifest.json").read_text() == "mine\n"
    assert (tmp_path / "segment" / "seg-00000").read_text() == "mine\n"
    assert sorted(p.name for p in (tmp_path / "segment").iterdir()) == ["seg-00000"]
    assert (tmp_path / "file").read_text() == "mine\n"
    with pytest.raises(OutputError, match="is inside the input directory"):
        run_dedup(batches / "a", tmp_path / "out-inside", cfg, index_out=batches / "a" / "ix")
    assert not (batches / "a" / "ix").exists()


def test_a_failing_index_build_leaves_no_index_behind(batches, tmp_path, monkeypatch):
    import gpu_dedup.index.store as store

    def full_disk(path, table):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store, "write_ipc", full_disk)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    from gpu_dedup.errors import ResourceError

    with pytest.raises(ResourceError, match="disk full writing the index .*nothing was published"):
        run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "ix")
    assert not (tmp_path / "ix").exists()  # no empty index that a rerun would call "already exists"
    assert not (tmp_path / "out" / "_SUCCESS").exists()  # the segment comes before the outputs' commit
    monkeypatch.undo()
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "ix")
    assert Index.open(tmp_path / "ix").documents == 800


def test_a_segment_left_unlisted_by_a_killed_append_is_replaced(batches, tmp_path):
    import shutil

    from gpu_dedup.errors import OutputError

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    shutil.copytree(tmp_path / "ix" / "seg-00000", tmp_path / "ix" / "seg-00001")  # renamed, manifest not written
    run_dedup(batches / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    index = Index.open(tmp_path / "ix")
    assert index.documents == 1600 and [s.name for s in index.segments] == ["seg-00000", "seg-00001"]
    (tmp_path / "ix" / "seg-00002").mkdir()
    (tmp_path / "ix" / "seg-00002" / "notes.txt").write_text("mine\n")
    with pytest.raises(OutputError, match="is not a segment it lists"):
        run_dedup(batches / "c", tmp_path / "out_c", cfg, against=tmp_path / "ix", update_index=True)
    assert (tmp_path / "ix" / "seg-00002" / "notes.txt").read_text() == "mine\n"
    assert Index.open(tmp_path / "ix").documents == 1600


def test_query_takes_one_string_as_one_query_and_refuses_other_types(batches, tmp_path):
    from gpu_dedup.errors import ConfigError

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "ix")
    index = Index.open(tmp_path / "ix")
    text = pq.read_table(batches / "a").column("text")[0].as_py()
    one = index.query(text)
    assert one.num_rows >= 1 and set(one.column("query").to_pylist()) == {0}
    with pytest.raises(InputError, match="queries must be strings; query 1 is a int"):
        index.query([text, 5])
    with pytest.raises(ConfigError, match="must be a number in"):
        index.query([text], threshold="0.8")
    with pytest.raises(ConfigError, match="members = -1"):
        index.query([text], members=-1)


# ---------------------------------------------------------------- one writer at a time; damage is detected


def _ids_in(path) -> set:
    index = Index.open(path)
    return set(index.ids(np.arange(index.documents)).to_pylist())


def test_a_second_writer_of_an_index_stops_with_exit_4_and_appends_nothing(batches, tmp_path):
    """While one run appends to an index (or builds it), another `--update-index` run or build of the same
    index stops at once with exit 4 naming the holder, and the index is left as it was."""
    from gpu_dedup.index.store import IndexBuilder

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    before = _segments(tmp_path / "ix")
    args = ("run", batches / "b", "-o", tmp_path / "out_b", "--id-column", "id", "--against", tmp_path / "ix",
            "--update-index")
    with Index.open(tmp_path / "ix").writing():
        second = _cli_run(*args)
    assert second.returncode == 4, second.stderr
    assert "is being written by another gpu-dedup run (pid" in second.stderr and "Traceback" not in second.stderr
    assert not (tmp_path / "out_b" / "_SUCCESS").exists()
    assert _segments(tmp_path / "ix")[1:3] == before[1:3]
    assert _cli_run(*args).returncode == 0 and Index.open(tmp_path / "ix").documents == 1600
    with IndexBuilder(tmp_path / "new", cfg):
        build = _cli_run("index", "build", batches / "c", "-o", tmp_path / "new", "--id-column", "id")
    assert build.returncode == 4 and "is in use by another gpu-dedup run" in build.stderr, build.stderr
    assert not (tmp_path / "new").exists()


def test_concurrent_appends_and_builds_never_lose_documents(batches, tmp_path):
    """Two `--update-index` runs started together, and two builds of one directory: every run that exits 0
    has its documents in the index, exactly once; the others exit 4 (or 3: the index was built meanwhile)."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    py = [sys.executable, "-m", "gpu_dedup"]

    def start(*args):
        return subprocess.Popen(py + [*map(str, args), "--backend", "cpu", "-q", "--id-column", "id"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    procs = {b: start("run", batches / b, "-o", tmp_path / f"out_{b}", "--against", tmp_path / "ix",
                      "--update-index") for b in ("b", "c")}
    codes = {b: p.wait(timeout=300) for b, p in procs.items()}
    assert set(codes.values()) <= {0, 4} and 0 in codes.values(), {b: p.stderr.read() for b, p in procs.items()}
    want = set(pq.read_table(batches / "a").column("id").to_pylist())
    for b, code in codes.items():
        if code == 0:
            want |= set(pq.read_table(batches / b).column("id").to_pylist())
    assert _ids_in(tmp_path / "ix") == want and Index.open(tmp_path / "ix").documents == len(want)
    builds = [start("index", "build", batches / b, "-o", tmp_path / "built") for b in ("b", "c")]
    codes = [p.wait(timeout=300) for p in builds]
    assert sorted(codes)[0] == 0 and sorted(codes)[1] in (3, 4), codes
    winner = ("b", "c")[codes.index(0)]
    assert _ids_in(tmp_path / "built") == set(pq.read_table(batches / winner).column("id").to_pylist())


def test_an_index_opened_before_another_process_appended_is_read_again_before_it_appends(batches, tmp_path):
    """Index.add on an index object opened before another writer appended: the other documents are matched
    and kept (the object reads the index again under the lock), never discarded as an unlisted segment."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    stale = Index.open(tmp_path / "ix")
    run_dedup(batches / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    got = stale.add(_frame(batches / "c", "arrow"), text="text", id="id", backend="cpu")
    assert got.first_doc == 1600 and stale.documents == 2400
    assert _ids_in(tmp_path / "ix") == set(pq.read_table(batches / "all").column("id").to_pylist())


def _damage_cases(ix, other):
    def overwrite(p):  # 4 KiB inside the texts, same size
        path = p / "seg-00000" / "docs.arrow"
        data = bytearray(path.read_bytes())
        data[len(data) // 2: len(data) // 2 + 4096] = b"\0" * 4096
        path.write_bytes(bytes(data))

    def edit(key, value):
        def hurt(p):
            m = json.loads((p / "manifest.json").read_text())
            m[key] = value
            (p / "manifest.json").write_text(json.dumps(m))
        return hurt

    import shutil

    return {
        "overwritten-texts": (overwrite, "seg-00000/docs.arrow changed after it was written"),
        "bands-of-another-index": (lambda p: shutil.copy(other / "seg-00000" / "bands.arrow",
                                                         p / "seg-00000" / "bands.arrow"), "seg-00000/bands.arrow"),
        "threshold-edited": (edit("threshold", 0.3), "checksum does not match"),
        "id-column-a-number": (edit("id_column", 5), "checksum does not match"),
        "config-edited": (edit("config", {**json.loads((ix / "manifest.json").read_text())["config"], "rows": 3}),
                          "checksum does not match"),
    }


def test_a_damaged_or_mixed_index_is_refused_not_queried(batches, tmp_path):
    """Segments carry a size and SHA-256 in the manifest, which carries its own checksum; opening the index
    verifies them: a damaged segment, a segment of another index or an edited manifest is exit 3 naming
    the index, for query, info and runs against it, never an answer."""
    import shutil

    from gpu_dedup.cli import main

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    run_dedup(batches / "b", tmp_path / "out_b", cfg, index_out=tmp_path / "other")
    queries = tmp_path / "q.txt"
    queries.write_text("\n".join(pq.read_table(batches / "a").column("text").to_pylist()[:50]) + "\n")
    for name, (hurt, said) in _damage_cases(tmp_path / "ix", tmp_path / "other").items():
        shutil.copytree(tmp_path / "ix", tmp_path / name)
        hurt(tmp_path / name)
        q = subprocess.run([sys.executable, "-m", "gpu_dedup", "query", str(tmp_path / name), str(queries)],
                           capture_output=True, text=True)
        assert q.returncode == 3 and q.stdout == "", (name, q.stdout[:200], q.stderr)
        assert f"the index in {str(tmp_path / name)!r} is damaged" in q.stderr and said in q.stderr, (name, q.stderr)
        assert "Traceback" not in q.stderr and len(q.stderr.strip().splitlines()) == 1, q.stderr
        assert main(["index", "info", str(tmp_path / name)]) == 3
        if name == "overwritten-texts":  # verify=False checks sizes only (the cost of a read of every file saved)
            assert Index.open(tmp_path / name, verify=False).documents == 800
        with pytest.raises(InputError, match="is damaged"):
            run_dedup(batches / "c", tmp_path / f"out_{name}", cfg, against=tmp_path / name)


def test_an_index_without_checksums_still_opens_with_a_warning_and_its_values_are_checked(batches, tmp_path,
                                                                                          caplog):
    from gpu_dedup.index.format import CHECKSUMS, MANIFEST_DIGEST

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    m = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    legacy = {k: v for k, v in m.items() if k not in (CHECKSUMS, MANIFEST_DIGEST)}
    (tmp_path / "ix" / "manifest.json").write_text(json.dumps(legacy))
    with caplog.at_level("WARNING", logger="gpu_dedup"):
        assert Index.open(tmp_path / "ix").documents == 800
    assert "without checksums" in caplog.text
    for key, value, said in (("id_column", 5, "id_column = 5 is not a column name"),
                             ("threshold", "high", "threshold = 'high'"),
                             ("split_chains", "yes", "split_chains = 'yes' is not true or false"),
                             ("segments", ["../../etc"], "seg-NNNNN"),
                             ("documents", -1, "documents = -1"),
                             ("fingerprint", "0" * 16, "does not match its fingerprint")):
        (tmp_path / "ix" / "manifest.json").write_text(json.dumps({**legacy, key: value}))
        with pytest.raises(InputError, match=f"is damaged .*{said}"):
            Index.open(tmp_path / "ix")
    from gpu_dedup.cli import main

    (tmp_path / "ix" / "manifest.json").write_text(json.dumps({**legacy, "id_column": 5}))
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", str(tmp_path / "ix"),
                 "-q"]) == 3  # not a TypeError, nor a config error about --id-column


def test_runs_against_an_index_refuse_ids_of_another_kind_and_outputs_inside_it(batches, tmp_path):
    """Integer ids against an index of string ids (or of row numbers) were a traceback when the duplicates
    table joined them; -o inside the index directory mixed a run's outputs with the index."""
    from gpu_dedup.cli import main
    from gpu_dedup.errors import OutputError

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    t = pq.read_table(batches / "b")
    pq.write_table(t.set_column(0, "id", pa.array(np.arange(t.num_rows))), tmp_path / "int_ids.parquet")
    for ix in ("ix", "rows"):
        if ix == "rows":
            assert main(["index", "build", str(batches / "a"), "-o", str(tmp_path / "rows"), "--no-id-column",
                         "-q"]) == 0
            args = [str(batches / "b")]
        else:
            args = [str(tmp_path / "int_ids.parquet")]
        with pytest.raises(InputError, match=r"holds (integer|string) ids, but the index in .* holds (string|integer) "
                                             r"ids.*--id-column"):
            run_dedup(args, tmp_path / f"out_{ix}", cfg, against=tmp_path / ix, update_index=True)
    assert Index.open(tmp_path / "ix").documents == 800
    for out, kw in ((tmp_path / "ix" / "out", {"against": tmp_path / "ix"}),
                    (tmp_path / "new_ix", {"index_out": tmp_path / "new_ix"})):
        with pytest.raises(OutputError, match="is inside the index directory"):
            run_dedup(batches / "b", out, cfg, **kw)
    assert sorted(p.name for p in (tmp_path / "ix").iterdir()) == ["manifest.json", "seg-00000"]


def test_a_segment_the_manifest_does_not_list_is_named_when_the_index_opens(batches, tmp_path, caplog):
    import shutil

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    shutil.copytree(tmp_path / "ix", tmp_path / "before")
    run_dedup(batches / "b", tmp_path / "out_b", cfg, against=tmp_path / "ix", update_index=True)
    shutil.copy(tmp_path / "before" / "manifest.json", tmp_path / "ix" / "manifest.json")  # restored from a copy
    with caplog.at_level("WARNING", logger="gpu_dedup"):
        assert Index.open(tmp_path / "ix").documents == 800
    assert "holds seg-00001, which its manifest does not list" in caplog.text
    (tmp_path / "ix" / ".gpu_dedup_index.lock").mkdir()  # something else where the lock file goes: exit 4
    from gpu_dedup.errors import OutputError

    with pytest.raises(OutputError, match="cannot open the lock file"):
        run_dedup(batches / "c", tmp_path / "out_c", cfg, against=tmp_path / "ix", update_index=True)


def test_a_full_disk_under_the_index_publishes_nothing_or_says_what_was_published(batches, tmp_path, monkeypatch,
                                                                                  capsys):
    """A disk full under the index said "nothing was published for this run" with exit 5 while the outputs and
    _SUCCESS were published (the index was written after the outputs' commit).  Its segment is now written before
    the commit: full there, nothing is published; only its manifest is written after, and full there the message
    says the outputs are published and the rerun adds the documents once."""
    import errno

    from gpu_dedup.cli import main
    from gpu_dedup.index import store

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    before = _segments(tmp_path / "ix")
    args = ["run", str(batches / "b"), "-o", str(tmp_path / "out"), "--against", str(tmp_path / "ix"),
            "--update-index", "--backend", "cpu", "-q"]
    real = store.write_ipc

    def full(path, table):
        real(path, table.slice(0, 1))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "write_ipc", full)
    assert main(args) == 5
    err = capsys.readouterr().err
    assert "disk full writing the index" in err and "nothing was published" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "out" / "_SUCCESS").exists() and not (tmp_path / "out" / "duplicates.parquet").exists()
    assert _segments(tmp_path / "ix") == before and not list((tmp_path / "ix").glob(".seg-*"))
    monkeypatch.setattr(store, "write_ipc", real)

    def manifest_full(p, manifest):
        raise OSError(errno.ENOSPC, "No space left on device", str(p / "manifest.json"))

    monkeypatch.setattr(Index, "_write_manifest", staticmethod(manifest_full))
    assert main(args) == 5
    err = capsys.readouterr().err
    assert "the outputs in" in err and "were published and verified (_SUCCESS is there)" in err, err
    assert "not added to the index" in err and "rerun the same command" in err and "nothing was published" not in err
    assert (tmp_path / "out" / "_SUCCESS").exists() and _segments(tmp_path / "ix") == before
    monkeypatch.undo()
    assert main(args) == 0  # the rerun the message asks for
    assert Index.open(tmp_path / "ix").documents == 1600


def test_an_index_and_a_runs_outputs_never_share_a_directory(batches, tmp_path):
    """Each in the other's directory made both unreadable (a run of the directory took the index's manifest.json
    for a shard): a run's -o that holds an index and an --index-out that holds a run's outputs are refused
    before anything is written."""
    from gpu_dedup.errors import OutputError

    cfg = Config.from_dict({"backend": "cpu"})
    run_dedup(batches / "a", tmp_path / "out", cfg)
    with pytest.raises(OutputError, match=r"holds a run's outputs \(its _SUCCESS\).*choose another --index-out"):
        run_dedup(batches / "a", tmp_path / "work", cfg, index_out=tmp_path / "out", write_shards=False)
    run_dedup(batches / "a", tmp_path / "work2", cfg, index_out=tmp_path / "index", write_shards=False)
    listed = sorted(p.name for p in (tmp_path / "index").iterdir())
    with pytest.raises(OutputError, match=r"output directory .* holds an index \(its manifest.json\).*another -o"):
        run_dedup(batches / "a", tmp_path / "index", cfg)
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == listed
    run_dedup(batches / "a", tmp_path / "out", cfg)  # a run again into its own outputs: as before


def test_a_build_killed_after_its_index_was_written_is_done_when_run_again(batches, tmp_path, caplog):
    """Killed between the index's manifest and its end, a build leaves a whole index (its lock too): the same
    command again (the documented fix for an interrupt) finds the index these inputs and config built and does
    not build it again; other inputs or another config are still refused."""
    import logging

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    manifest = (tmp_path / "index" / "manifest.json").read_bytes()
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        again = run_dedup(batches / "a", tmp_path / "out", cfg, index_out=tmp_path / "index")
    assert "was built from these inputs and config already" in caplog.text
    assert (tmp_path / "index" / "manifest.json").read_bytes() == manifest and again.report["counts"]["kept"] > 0
    with pytest.raises(InputError, match="an index already exists"):
        run_dedup(batches / "a", tmp_path / "out3", cfg.with_overrides({"lsh.threshold": 0.7}),
                  index_out=tmp_path / "index")


def test_a_run_at_another_threshold_is_refused_naming_the_threshold(batches, tmp_path, capsys):
    """--threshold 0.7 against an index built at 0.8: the refusal names lsh.threshold, the setting the user
    changed (it named only the lsh.bands / lsh.rows the run derived from it)."""
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    flags = ["--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix] + flags) == 0
    capsys.readouterr()
    rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--update-index",
               "--threshold", "0.7"] + flags)
    err = capsys.readouterr().err
    assert rc == 2 and "lsh.threshold: index 0.8, this run 0.7" in err and "Traceback" not in err
    assert Index.open(ix).documents == 800


def test_a_run_at_another_threshold_is_refused_whatever_the_layout(batches, tmp_path, capsys):
    """With lsh.bands and lsh.rows given (--bands 16 --rows 8), --threshold 0.6 against an index built at 0.8 was
    accepted with only a layout warning: the threshold is not in the fingerprint, and it was compared only where the
    run derived another layout from it (so --threshold 0.79, which derives the index's 16 x 8, and
    --set verify.threshold=0.6 passed too).  The run would remove at 0.6 what the index's documents were kept at
    0.8: refused on every path (CLI, run_dedup, Index.add), exit 2 before anything is written, naming both values
    and the fix.  Another lsh.threshold that changes nothing (the layout given, the verify threshold the index's)
    is accepted; a query with its own threshold (read-only) still is."""
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    layout = ["--bands", "16", "--rows", "8"]
    flags = ["--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix] + flags + layout) == 0
    assert json.loads((tmp_path / "ix" / "manifest.json").read_text())["verify_threshold"] == 0.8
    for extra, said in ((["--threshold", "0.6"] + layout, "lsh.threshold: index 0.8, this run 0.6"),
                        (["--threshold", "0.79"], "lsh.threshold: index 0.8, this run 0.79"),
                        (["--set", "verify.threshold=0.6"] + layout,
                         "verify threshold: index 0.8, this run 0.6 (verify.threshold)")):
        capsys.readouterr()
        rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--update-index"]
                  + flags + extra)
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, (extra, err)
        assert said in err and "(the index's value)" in err and "build a new index" in err, err
        assert not (tmp_path / "out_b").exists() and Index.open(ix).documents == 800
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "lsh": {"bands": 16, "rows": 8}})
    frame = pq.read_table(batches / "b")
    with pytest.raises(IndexMismatchError, match="lsh.threshold: index 0.8, this run 0.6"):
        run_dedup(batches / "b", tmp_path / "out_c", cfg.with_overrides({"lsh.threshold": 0.6}), against=ix)
    with pytest.raises(IndexMismatchError, match="lsh.threshold: index 0.8, this run 0.6"):
        Index.open(ix).add(frame, id="id", threshold=0.6, bands=16, rows=8)
    assert Index.open(ix).documents == 800 and not (tmp_path / "out_c").exists()
    # the same verify threshold: lsh.threshold alone moves nothing with the layout given (accepted)
    same = cfg.with_overrides({"lsh.threshold": 0.6, "verify.threshold": 0.8})
    assert run_dedup(batches / "b", None, same, against=ix).report["counts"]["removed_against_index"] > 0
    # a query is a read-only lookup: its own threshold stays allowed (below the index's: with a warning)
    assert main(["query", ix, str(_query_file(batches, tmp_path)), "--threshold", "0.6", "-q"]) == 0


def test_an_index_verified_at_its_own_threshold_is_run_against_at_it_and_old_indexes_by_their_threshold(
        batches, tmp_path):
    """An index built with verify.threshold 0.7 (lsh.threshold 0.8) records 0.7; Index.add without a config runs at
    it, a run at 0.8 is refused.  An index written before the verify threshold was recorded stands for it by its
    lsh.threshold (refused at another), and its first append records it."""
    from gpu_dedup.index.format import sealed

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "o7", cfg.with_overrides({"verify.threshold": 0.7}),
              index_out=tmp_path / "ix7")
    frame = pq.read_table(batches / "b")
    index = Index.open(tmp_path / "ix7")
    assert index.info()["verify_threshold"] == 0.7 and index.config().verify_threshold == 0.7
    with pytest.raises(IndexMismatchError, match=r"verify threshold: index 0.7, this run 0.8 \(lsh.threshold\)"):
        run_dedup(batches / "b", None, cfg, against=tmp_path / "ix7")
    assert index.add(frame, id="id").report["config"]["verify"]["threshold"] == 0.7
    run_dedup(batches / "a", tmp_path / "oa", cfg, index_out=tmp_path / "ix")
    path = tmp_path / "ix" / "manifest.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps(sealed({k: v for k, v in m.items() if k not in ("verify_threshold", "manifest_sha256")})))
    with pytest.raises(IndexMismatchError, match="lsh.threshold: index 0.8, this run 0.6"):
        run_dedup(batches / "b", None, cfg.with_overrides({"lsh.threshold": 0.6, "lsh.bands": 16, "lsh.rows": 8}),
                  against=tmp_path / "ix")
    run_dedup(batches / "b", tmp_path / "ob", cfg, against=tmp_path / "ix", update_index=True)
    assert json.loads(path.read_text())["verify_threshold"] == 0.8


def test_verify_none_against_an_index_without_signatures_is_refused_before_it_runs(batches, tmp_path, capsys):
    """--verify none scores candidate pairs by their MinHash signatures, which an index built with verify exact does
    not store: the run failed with a KeyError traceback (exit 1) once it reached the index; refused as --verify
    signature is (exit 2, before it runs)."""
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    flags = ["--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix] + flags) == 0
    capsys.readouterr()
    rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--verify", "none"]
              + flags)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "--verify none scores pairs by MinHash signatures" in err, err
    assert not (tmp_path / "out_b").exists()


def test_a_run_with_another_star_rounds_or_verify_method_is_refused_and_old_indexes_record_them(
        batches, tmp_path, capsys, caplog):
    """lsh.star_rounds and verify.method decide which documents are removed, and a change of either between runs
    against one index gave removals that neither value gives throughout (tools/index_settings_experiment.py): they
    were accepted silently.  An index records both; another value is refused (CLI, run_dedup, Index.add) naming
    both values and the fix; Index.add without a config uses the index's.  An index recording neither (written
    before) is run against with a warning, and its first append records the run's values."""
    import logging

    from gpu_dedup.cli import main
    from gpu_dedup.index.format import sealed

    ix = str(tmp_path / "ix")
    flags = ["--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix, "--verify",
                 "signature", "--set", "lsh.star_rounds=2"] + flags) == 0
    m = json.loads((tmp_path / "ix" / "manifest.json").read_text())
    assert (m["star_rounds"], m["verify_method"]) == (2, "signature")
    for extra, said in ((["--verify", "signature"], "lsh.star_rounds: index 2, this run 3"),
                        (["--set", "lsh.star_rounds=2"], "verify.method: index signature, this run exact")):
        capsys.readouterr()
        rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--update-index"]
                  + flags + extra)
        err = capsys.readouterr().err
        assert rc == 2 and "Traceback" not in err and err.count("\n") == 1 and said in err, err
        assert "(the index's value)" in err and not (tmp_path / "out_b").exists()
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "verify": {"method": "signature"}})
    with pytest.raises(IndexMismatchError, match="lsh.star_rounds: index 2, this run 3"):
        run_dedup(batches / "b", tmp_path / "out_c", cfg, against=ix)
    frame = pq.read_table(batches / "b")
    with pytest.raises(IndexMismatchError, match="lsh.star_rounds: index 2, this run 1"):
        Index.open(ix).add(frame, id="id", star_rounds=1)
    assert Index.open(ix).documents == 800
    assert Index.open(ix).add(frame, id="id").report["config"]["lsh"]["star_rounds"] == 2
    # an index written before they were recorded: a warning, and its first append records them
    path = tmp_path / "ix" / "manifest.json"
    m = json.loads(path.read_text())
    path.write_text(json.dumps(sealed({k: v for k, v in m.items()
                                       if k not in ("star_rounds", "verify_method", "manifest_sha256")})))
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        run_dedup(batches / "c", tmp_path / "out_d", cfg, against=ix, update_index=True)
    warned = [r.getMessage() for r in caplog.records if "does not record" in r.getMessage()]
    assert len(warned) == 1 and "lsh.star_rounds (3) or verify.method (signature)" in warned[0], warned
    m = json.loads(path.read_text())
    assert (m["star_rounds"], m["verify_method"]) == (3, "signature")


def _query_file(batches, tmp_path):
    q = tmp_path / "q.txt"
    q.write_text("\n".join(pq.read_table(batches / "b").column("text").to_pylist()[:5]) + "\n")
    return q


def test_a_run_with_another_split_chains_is_refused_before_it_runs(batches, tmp_path, capsys):
    """select.split_chains false against an index built with it true (and the other way round) was accepted:
    the run removed by components, the index's documents had been removed with chains split, and together they
    followed neither rule (tools/index_settings_experiment.py).  Refused like another threshold: exit 2 before
    anything is written, naming both values and the fixes; Index.add too, and with the threshold as well."""
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    flags = ["--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]
    assert main(["run", str(batches / "a"), "-o", str(tmp_path / "out_a"), "--index-out", ix] + flags) == 0
    assert json.loads((tmp_path / "ix" / "manifest.json").read_text())["split_chains"] is True
    capsys.readouterr()
    rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--update-index",
               "--set", "select.split_chains=false"] + flags)
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and err.count("\n") == 1, err
    assert "select.split_chains: index true, this run false" in err
    assert "--set select.split_chains=true (the index's value)" in err and "build a new index" in err
    assert not (tmp_path / "out_b").exists() and Index.open(ix).documents == 800
    rc = main(["run", str(batches / "b"), "-o", str(tmp_path / "out_b"), "--against", ix, "--threshold", "0.7",
               "--set", "select.split_chains=false"] + flags)  # one error naming both
    err = capsys.readouterr().err
    assert rc == 2 and "lsh.threshold: index 0.8, this run 0.7" in err
    assert "select.split_chains: index true, this run false" in err
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    frame = pq.read_table(batches / "b")
    with pytest.raises(IndexMismatchError, match="select.split_chains: index true, this run false"):
        Index.open(ix).add(frame, id="id", split_chains=False)
    with pytest.raises(IndexMismatchError, match="select.split_chains"):
        run_dedup(batches / "b", tmp_path / "out_c", cfg.with_overrides({"select.split_chains": False}), against=ix)
    assert Index.open(ix).documents == 800
    # an index built with split_chains false: Index.add without a config uses its value; true is refused
    run_dedup(batches / "a", tmp_path / "out_f", cfg.with_overrides(
        {"select.split_chains": False}), index_out=tmp_path / "ixf")
    assert Index.open(tmp_path / "ixf").add(frame, id="id").report["config"]["select"]["split_chains"] is False
    with pytest.raises(IndexMismatchError, match="select.split_chains: index false, this run true"):
        run_dedup(batches / "c", tmp_path / "out_g", cfg, against=tmp_path / "ixf")
    assert json.loads(subprocess.run([sys.executable, "-m", "gpu_dedup", "index", "info", str(tmp_path / "ixf")],
                                     capture_output=True, text=True, check=True).stdout)["split_chains"] is False


def test_a_run_with_another_keep_policy_is_accepted(batches, tmp_path):
    """select.keep is not part of an index's contract: a run with another policy ranks its new documents by it,
    indexed documents first, which is one ranking of all the documents (tools/index_settings_experiment.py: the
    result is exactly keep = score with such a score); so it is accepted, and the index's survivors stay."""
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    b = run_dedup(batches / "b", tmp_path / "out_b", cfg.with_overrides({"select.keep": "longest"}),
                  against=tmp_path / "ix", update_index=True)
    assert b.report["counts"]["removed_against_index"] > 0 and Index.open(tmp_path / "ix").documents == 1600


def test_an_index_recording_no_split_chains_is_accepted_with_a_warning_and_its_first_append_records_it(
        batches, tmp_path, caplog, capsys):
    """An index written before select.split_chains was recorded (its manifest without the key): a run with
    either value is accepted, warned that it cannot be checked; the first append records its value, which
    later runs must then match."""
    import logging

    from gpu_dedup.cli import main
    from gpu_dedup.index.format import sealed

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"split_chains": False}})
    run_dedup(batches / "a", tmp_path / "out_a", cfg, index_out=tmp_path / "ix")
    path = tmp_path / "ix" / "manifest.json"
    m = json.loads(path.read_text())
    old = sealed({k: v for k, v in m.items() if k not in ("split_chains", "manifest_sha256")})
    path.write_text(json.dumps(old))
    assert Index.open(tmp_path / "ix").info()["split_chains"] is None
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        r = run_dedup(batches / "b", tmp_path / "out_b", cfg.with_overrides({"select.split_chains": True}),
                      against=tmp_path / "ix")  # read only: nothing recorded
    assert "does not record select.split_chains (true)," in caplog.text
    assert r.report["counts"]["kept"] > 0 and "split_chains" not in json.loads(path.read_text())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        run_dedup(batches / "b", tmp_path / "out_b2", cfg, against=tmp_path / "ix", update_index=True)
    assert "does not record select.split_chains" in caplog.text
    assert json.loads(path.read_text())["split_chains"] is False and Index.open(tmp_path / "ix").documents == 1600
    capsys.readouterr()
    assert main(["run", str(batches / "c"), "-o", str(tmp_path / "out_c"), "--against", str(tmp_path / "ix"),
                 "--id-column", "id", "--backend", "cpu", "-q", "--no-shards"]) == 2
    assert "select.split_chains: index false, this run true" in capsys.readouterr().err


def test_no_id_column_against_an_index_of_string_ids_is_refused_before_it_runs(batches, tmp_path, capsys):
    """Integer ids against an index of string ids were told "or use --no-id-column", which then failed after
    the whole run with "ids of type int64 cannot join an index whose ids are large_string"."""
    from gpu_dedup.cli import main

    ix = str(tmp_path / "ix")
    flags = ["--backend", "cpu", "-q", "--no-shards"]
    assert main(["index", "build", str(batches / "a"), "-o", ix, "--id-column", "id", "-q"]) == 0
    t = pq.read_table(batches / "b")
    pq.write_table(t.set_column(0, "id", pa.array(np.arange(t.num_rows))), tmp_path / "int_ids.parquet")
    capsys.readouterr()
    assert main(["run", str(tmp_path / "int_ids.parquet"), "-o", str(tmp_path / "o1"), "--against", ix,
                 "--update-index", "--id-column", "id"] + flags) == 3
    assert "--no-id-column" not in capsys.readouterr().err  # not a fix for an index of string ids
    ints = str(tmp_path / "ints")
    assert main(["index", "build", str(tmp_path / "int_ids.parquet"), "-o", ints, "--id-column", "id", "-q"]) == 0
    capsys.readouterr()
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "o3"), "--against", ints, "--update-index",
                 "--id-column", "id"] + flags) == 3
    # row numbers would be mixed, unmarked, into the index's own integer ids
    assert "--no-id-column" not in capsys.readouterr().err
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "o2"), "--against", ix, "--update-index",
                 "--no-id-column"] + flags) == 3
    err = capsys.readouterr().err
    assert "names documents by row number (--no-id-column)" in err and "holds string ids in column 'id'" in err
    assert not (tmp_path / "o2").exists() and Index.open(ix).documents == 800
    before = Index.open(ints).documents  # row numbers appended among an index's integer ids: refused too
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "o4"), "--against", ints, "--update-index",
                 "--no-id-column"] + flags) == 3
    assert "holds integer ids in column 'id'" in capsys.readouterr().err
    assert not (tmp_path / "o4").exists() and Index.open(ints).documents == before
    assert main(["run", str(batches / "b"), "-o", str(tmp_path / "o5"), "--against", ints,  # read only: allowed
                 "--no-id-column"] + flags) == 0


def test_an_old_index_verified_at_its_own_threshold_is_run_against_at_it(batches, tmp_path, caplog):
    """An index built with verify.threshold 0.7 (lsh.threshold 0.8) by a gpu_dedup that did not record the verify
    threshold stands for it by its lsh.threshold 0.8, so a run with its real settings (lsh 0.8, verify 0.7) was
    refused ("verify threshold: index 0.8, this run 0.7"), and the fix it named (verify.threshold 0.8) would remove
    by another threshold than the index's documents were: no run could use the index as built.  A run whose
    lsh.threshold is the index's (the one value it records) is now accepted with the warning that the verify
    threshold cannot be checked; its first append records 0.7, which later runs must match.  With another
    lsh.threshold too, nothing vouches for the verify threshold: refused, naming lsh.threshold and its fix."""
    import logging

    from gpu_dedup.index.format import sealed

    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    real = cfg.with_overrides({"verify.threshold": 0.7})
    run_dedup(batches / "a", tmp_path / "oa", real, index_out=tmp_path / "ix")
    path = tmp_path / "ix" / "manifest.json"
    m = json.loads(path.read_text())
    assert m["threshold"] == 0.8 and m["verify_threshold"] == 0.7
    path.write_text(json.dumps(sealed({k: v for k, v in m.items() if k not in ("verify_threshold", "manifest_sha256")})))
    with pytest.raises(IndexMismatchError, match=r"lsh.threshold: index 0.8, this run 0.6.*--threshold 0.8"):
        run_dedup(batches / "b", None, real.with_overrides({"lsh.threshold": 0.6, "lsh.bands": 16, "lsh.rows": 8}),
                  against=tmp_path / "ix")
    full = run_dedup([batches / "a", batches / "b"], None, real)
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        res = run_dedup(batches / "b", tmp_path / "ob", real, against=tmp_path / "ix", update_index=True)
    assert "does not record verify.threshold (0.7)" in caplog.text
    assert json.loads(path.read_text())["verify_threshold"] == 0.7
    assert res.report["config"]["verify"]["threshold"] == 0.7
    assert res.report["counts"]["removed"] == int((~full.kept[800:]).sum())
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpu_dedup"):
        run_dedup(batches / "b", None, real, against=tmp_path / "ix")  # recorded now: checked, no warning
    assert "verify.threshold" not in caplog.text
    with pytest.raises(IndexMismatchError, match=r"verify threshold: index 0.7, this run 0.8 \(lsh.threshold\)"):
        run_dedup(batches / "b", None, cfg, against=tmp_path / "ix")
