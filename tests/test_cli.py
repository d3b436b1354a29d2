import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from tests.signals import interruptible


def test_run_with_overrides(tmp_path, capsys):
    texts = ["the cat sat on the mat today", "the cat sat on the mat today!", "something else entirely here"]
    pq.write_table(pa.table({"uid": [1, 2, 3], "text": texts}), tmp_path / "a.parquet")
    rc = main(["run", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "out"), "--id-column", "uid",
               "--ngram", "3", "--threshold", "0.9", "--backend", "cpu", "--set", "select.keep=lowest_id"])
    assert rc == 0
    assert "kept 2, removed 1" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["minhash"]["ngram"] == 3 and report["config"]["select"]["keep"] == "lowest_id"


def test_user_errors_exit_with_their_code_and_one_line(tmp_path, capsys):
    rc = main(["run", str(tmp_path / "missing"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 3 and "does not exist" in err and "Traceback" not in err
    rc = main(["config", "--set", "lsh.treshold=0.5"])
    assert rc == 2 and "valid keys: threshold" in capsys.readouterr().err
    rc = main(["config", "--set", "noequals"])
    assert rc == 2 and "KEY=VALUE" in capsys.readouterr().err


def test_config_prints_derived_values(capsys):
    assert main(["config", "-c", "fineweb"]) == 0
    out = capsys.readouterr().out
    assert "num_perm: 112" in out and "bands=14 rows=8" in out


def test_run_help_names_every_input_the_readme_lists(capsys):
    """README: a directory of .parquet / .jsonl[.gz|.bz2|.zst] / .arrow, a dataset saved with save_to_disk, an
    hf:// repository. ``gpu-dedup --help`` said "deduplicate Parquet / JSONL shards" and run's inputs named none
    of the rest."""
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "deduplicate Parquet / JSONL / Arrow shards" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for named in (".parquet", ".jsonl[.gz|.bz2|.zst]", ".arrow", "save_to_disk", "hf://datasets/"):
        assert named in text, named

def test_config_prints_the_cosine_layout_under_similarity_cosine(capsys):
    """``config --similarity cosine`` printed MinHash's derived bands, rows and permutations (9 x 14 of 126 at
    0.9), which a cosine run never uses; it prints the cosine layout, or where it comes from."""
    assert main(["config", "--similarity", "cosine", "--threshold", "0.9"]) == 0
    derived = capsys.readouterr().out.splitlines()[-1]
    assert derived.startswith("# derived: cosine bands and rows from the run's number of rows")
    assert "permutations_computed" not in derived and "verify_threshold=0.9" in derived
    assert main(["config", "--similarity", "cosine", "--threshold", "0.9", "--set", "cosine.min_rows=25"]) == 0
    derived = capsys.readouterr().out.splitlines()[-1]
    assert derived.startswith("# derived: bands=40 rows=25 of 1024 cosine bits")  # as tune --documents 1000000
    assert main(["config", "--similarity", "cosine", "--set", "cosine.rows=16"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("# derived: bands=64 rows=16 of 1024 cosine bits")


def test_demo_reports_recall(tmp_path):
    cmd = [sys.executable, "-m", "gpu_dedup", "demo", "--docs", "1200", "--backend", "cpu"]
    quiet = subprocess.run(cmd + ["-o", str(tmp_path / "quiet"), "-q"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stdout == "" and quiet.stderr == ""  # -q: silent
    proc = subprocess.run(cmd + ["-o", str(tmp_path / "demo")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "below the threshold: none of the" in proc.stdout  # split chains, the default
    assert "(recall;" in proc.stdout and "precision" in proc.stdout
    line = [x for x in proc.stdout.splitlines() if "Jaccard >= 0.90" in x][0]
    assert float(line.split("not both kept:")[1].split()[0]) >= 0.99
    assert (tmp_path / "demo" / "output" / "report.json").exists()
    assert (tmp_path / "demo" / "output" / "report.html").exists() and "report.html" in proc.stdout


def _planted_dir(tmp_path, n=400):
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    s = planted_corpus(n_docs=n, n_clusters=n // 10, cluster_size=(2, 4), words=(40, 150), edit_rate=(0, 0.05),
                       seed=5)
    write_shards(s.table.select(["id", "text", "cluster"]), tmp_path / "in", shards=2)
    return tmp_path / "in"


def test_evaluate_writes_json_and_png(tmp_path, capsys):
    import pytest

    inp = _planted_dir(tmp_path)
    rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--sample", "300", "--backend", "cpu",
               "--id-column", "id", "--label-column", "cluster", "--compare-split-chains", "-q"])
    out = capsys.readouterr().out
    assert rc == 0 and "recall:" in out and "ARI vs ideal components" in out and "vs labels" in out
    report = json.loads((tmp_path / "ev" / "evaluation.json").read_text())
    assert set(report["runs"]) == {"components", "split_chains"} and report["corpus"]["sample"] == 300
    assert report["config"]["input"]["id_column"] == "id"
    pytest.importorskip("matplotlib")
    assert (tmp_path / "ev" / "evaluation.png").read_bytes()[:4] == b"\x89PNG"


def test_evaluate_without_matplotlib_writes_json_and_says_why(tmp_path, capsys, monkeypatch, caplog):
    inp = _planted_dir(tmp_path, 200)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--sample", "0", "--backend", "cpu"])
    assert rc == 0
    assert (tmp_path / "ev" / "evaluation.json").exists() and not (tmp_path / "ev" / "evaluation.png").exists()
    assert "matplotlib is not installed" in caplog.text and '.[eval]' in caplog.text


def test_evaluate_require_targets_fails_on_a_poor_layout(tmp_path, capsys):
    inp = _planted_dir(tmp_path)
    rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--sample", "0", "--backend", "cpu", "--bands", "1",
               "--rows", "40", "--no-plot", "--require-targets", "-q"])
    assert rc == 6 and "recall_at_threshold_plus_0.05_at_least_0.99" in capsys.readouterr().err


def test_evaluate_missing_label_column_is_a_user_error(tmp_path, capsys):
    inp = _planted_dir(tmp_path, 200)
    rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--backend", "cpu", "--label-column", "nope"])
    err = capsys.readouterr().err
    assert rc == 3 and "'nope' is not in shard" in err and "'cluster'" in err


STAGES = ("read", "normalize", "exact", "signatures", "bands", "buckets", "verify", "components", "select", "write")


def test_run_off_a_terminal_says_it_once_in_short_lines_and_nothing_with_quiet(tmp_path):
    """stderr not a terminal (CI, a batch log): the summary on stdout is the one account of the run (a short
    run's stages log nothing at INFO: no stage lines, no ``done:`` line repeating its numbers), every line
    at most 120 characters; -v adds each stage's end with its counts and rate; -q: nothing."""
    import re

    inp = _planted_dir(tmp_path, 200)
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(inp), "--backend", "cpu"]  # the input's id column: said
    proc = subprocess.run(cmd + ["-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr  # no terminal redraws in a log
    assert "stage " not in proc.stderr and "done:" not in proc.stderr and "read 200" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("read 200 documents from 2 shard(s)") and "seconds: read" in proc.stdout
    long = [line for line in (proc.stdout + proc.stderr).splitlines() if len(line) > 120]
    assert not long, long
    verbose = subprocess.run(cmd + ["-o", str(tmp_path / "verbose"), "-v"], capture_output=True, text=True,
                             timeout=600)
    assert verbose.returncode == 0, verbose.stderr
    for stage in STAGES:
        done = re.search(rf"DEBUG stage {stage} done in [0-9.]+s: ([0-9,]+)/([0-9,]+) [a-z ]+, [0-9,]+ [a-z ]+/s",
                         verbose.stderr)
        assert done and done.group(1) == done.group(2), (stage, verbose.stderr)
    assert "2/2 shards" in verbose.stderr and "200/200 docs" in verbose.stderr
    quiet = subprocess.run(cmd + ["-o", str(tmp_path / "quiet"), "-q"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    assert (tmp_path / "quiet" / "_SUCCESS").exists()


def test_the_command_takes_jemalloc_for_arrow_unless_the_user_chose_a_pool(tmp_path):
    """The gpu-dedup process is gpu_dedup's own: its Arrow memory pool is jemalloc where pyarrow has it (see
    storage.pool); ARROW_DEFAULT_MEMORY_POOL, where set, is the user's choice and is kept."""
    try:
        pa.jemalloc_memory_pool()
    except NotImplementedError:
        pytest.skip("this pyarrow has no jemalloc")
    inp = _planted_dir(tmp_path, 200)
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    for chosen, expected in ((None, "jemalloc"), ("system", "system")):
        out = tmp_path / f"out-{expected}"
        e = env if chosen is None else {**env, "ARROW_DEFAULT_MEMORY_POOL": chosen}
        proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(inp), "--backend", "cpu", "-q", "-o",
                               str(out)], capture_output=True, text=True, timeout=600, env=e)
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        assert json.loads((out / "report.json").read_text())["machine"]["arrow_memory_pool"] == expected


def test_evaluate_does_not_relay_other_libraries_info_lines(tmp_path):
    """A fresh matplotlib font cache (as on the first evaluate after install) logs INFO lines of its own; the
    CLI shows other libraries' lines from WARNING up (-v: INFO)."""
    inp = _planted_dir(tmp_path, 200)
    env = {**os.environ, "MPLCONFIGDIR": str(tmp_path / "mpl")}  # no font cache yet: matplotlib builds one
    cmd = [sys.executable, "-m", "gpu_dedup", "evaluate", str(inp), "--backend", "cpu", "--sample", "200"]
    proc = subprocess.run(cmd + ["-o", str(tmp_path / "ev")], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert " INFO " not in proc.stderr.replace(" INFO document ids", ""), proc.stderr
    assert list((tmp_path / "mpl").glob("fontlist-*.json"))  # the cache was built during this run
    long = [line for line in (proc.stdout + proc.stderr).splitlines() if len(line) > 120]
    assert not long, long


# ---------------------------------------------------------------- what a new user meets


def test_quiet_hides_warnings_and_a_cpu_install_hears_nothing_of_cupy(tmp_path):
    """-q shows nothing, a warning about the data included; a CPU install is not told about CuPy at every run."""
    import importlib.util

    import pyarrow as pa
    import pyarrow.parquet as pq

    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(pa.table({"id": [1, 1, 2], "text": ["a b c d e f", "g h i j k l", "m n o p q r"]}), inp / "a.parquet")
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(inp), "--id-column", "id"]  # backend auto
    loud = subprocess.run(cmd + ["-o", str(tmp_path / "loud")], capture_output=True, text=True, timeout=600)
    assert loud.returncode == 0, loud.stderr
    assert "WARNING 1 rows repeat an id" in loud.stderr
    if importlib.util.find_spec("cupy") is None:  # a CPU install: the fallback reason only at -v
        assert "CuPy" not in loud.stderr and "backend auto" not in loud.stderr
        verbose = subprocess.run(cmd + ["-o", str(tmp_path / "verbose"), "-v"], capture_output=True, text=True,
                                 timeout=600)
        assert "DEBUG backend auto: using the CPU" in verbose.stderr
    quiet = subprocess.run(cmd + ["-o", str(tmp_path / "quiet"), "-q"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""


def _with_ids(tmp_path, ids, name="in"):
    """Two shards with a user column ``id`` (strings that look nothing like row numbers) and near copies."""
    base = "the quick brown fox jumps over the lazy dog near the river bank today and tomorrow again"
    texts = [base, base + " extra", "unrelated words entirely here for once in a while today", base.upper()]
    d = tmp_path / name
    d.mkdir()
    pq.write_table(pa.table({"id": ids[:2], "text": texts[:2]}), d / "a.parquet")
    pq.write_table(pa.table({"id": ids[2:], "text": texts[2:]}), d / "b.parquet")
    return d


def test_generated_ids_are_rows_and_an_input_id_column_is_used_verbatim(tmp_path, capsys, caplog):
    """Issue: without --id-column, duplicates.parquet called its row numbers ``id`` even when the input had
    its own ``id`` column; a join on ``id`` silently matched the wrong rows."""
    import logging

    caplog.set_level(logging.INFO, logger="gpu_dedup")
    inp = _with_ids(tmp_path, ["u-9", "u-7", "u-5", "u-3"])
    assert main(["run", str(inp), "-o", str(tmp_path / "auto"), "--backend", "cpu", "--ngram", "3"]) == 0
    said = [r.getMessage() for r in caplog.records if "document ids" in r.getMessage()]
    assert len(said) == 1 and "'id'" in said[0] and "--no-id-column" in said[0]  # said once
    dup = pq.read_table(tmp_path / "auto" / "duplicates.parquet")
    assert dup.column_names == ["id", "row", "cluster_id", "kept", "similarity", "match", "survivor_id", "shard",
                                "shard_row"]
    assert dup.column("id").to_pylist() == ["u-9", "u-7", "u-3"] and dup.column("row").to_pylist() == [0, 1, 3]
    assert set(dup.column("survivor_id").to_pylist()) == {"u-9"} and set(dup.column("cluster_id").to_pylist()) == {0}
    # --no-id-column: rows only; no column can be mistaken for the user's ids
    assert main(["run", str(inp), "-o", str(tmp_path / "rows"), "--backend", "cpu", "--ngram", "3",
                 "--no-id-column"]) == 0
    dup = pq.read_table(tmp_path / "rows" / "duplicates.parquet")
    assert dup.column_names == ["row", "cluster_id", "kept", "similarity", "match", "shard", "shard_row"]
    assert dup.column("row").to_pylist() == [0, 1, 3]
    # another column named explicitly: verbatim, under its own name
    t = pq.read_table(inp / "a.parquet")
    pq.write_table(t.append_column("url", pa.array(["x://a", "x://b"])), inp / "a.parquet")
    t = pq.read_table(inp / "b.parquet")
    pq.write_table(t.append_column("url", pa.array(["x://c", "x://d"])), inp / "b.parquet")
    assert main(["run", str(inp), "-o", str(tmp_path / "url"), "--backend", "cpu", "--ngram", "3",
                 "--id-column", "url"]) == 0
    dup = pq.read_table(tmp_path / "url" / "duplicates.parquet")
    assert dup.column_names[:2] == ["url", "row"] and dup.column("url").to_pylist() == ["x://a", "x://b", "x://d"]
    report = json.loads((tmp_path / "url" / "report.json").read_text())
    assert report["largest_clusters"][0]["survivor"]["id"] == "x://a"
    report = json.loads((tmp_path / "rows" / "report.json").read_text())
    assert "id" not in report["largest_clusters"][0]["survivor"]  # generated: row only


def test_an_id_column_of_mixed_types_is_refused_and_a_reserved_name_is_refused(tmp_path, capsys):
    """An ``id`` column found by itself that is int64 in one shard and a string in the other cannot keep every
    id as it is: exit 3 naming both shards and --no-id-column (it was a silent fall-back to row numbers)."""
    inp = _with_ids(tmp_path, [1, 2, 3, 4])
    pq.write_table(pa.table({"id": ["x", "y"], "text": pq.read_table(inp / "b.parquet").column("text")}),
                   inp / "b.parquet")  # int64 in one shard, string in the other
    assert main(["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "-q"]) == 3
    err = capsys.readouterr().err
    assert "a.parquet" in err and "b.parquet" in err and "int64" in err and "--no-id-column" in err
    assert not (tmp_path / "out").exists()
    assert main(["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "-q", "--no-id-column"]) == 0
    assert pq.read_table(tmp_path / "out" / "duplicates.parquet").column_names[0] == "row"
    t = pq.read_table(inp / "a.parquet")
    pq.write_table(t.append_column("cluster_id", pa.array([5, 6])), tmp_path / "c.parquet")
    rc = main(["run", str(tmp_path / "c.parquet"), "-o", str(tmp_path / "out2"), "--backend", "cpu",
               "--id-column", "cluster_id"])
    err = capsys.readouterr().err
    assert rc == 2 and "id column 'cluster_id' has the name of a column gpu_dedup writes" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_id_column_found_by_itself_is_kept_for_every_shard_or_refused(tmp_path, capsys):
    """``id`` found by itself across Parquet and JSON Lines shards, behind a first JSON line without it or with
    bytes that are not UTF-8, of float64, decimal128 or timestamp type: every id kept as it is; in some shards
    only, or nested: exit 3 naming the shard and --no-id-column.  (Each case was a run with row numbers only,
    exit 0, at most an INFO line.)"""
    import datetime
    import decimal

    base = "the quick brown fox jumps over the lazy dog near the river bank today and tomorrow"

    def jsonl(path, records):
        path.write_bytes(b"".join(r if isinstance(r, bytes) else json.dumps(r).encode() + b"\n" for r in records))

    def ids_of(inp, name):
        assert main(["run", str(inp), "-o", str(tmp_path / name), "--backend", "cpu", "-q"]) == 0, \
            capsys.readouterr().err
        return pq.read_table(tmp_path / name / "duplicates.parquet").column("id").to_pylist()

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": [base, base]}), mixed / "a.parquet")
    jsonl(mixed / "b.jsonl", [{"id": 3, "text": base}, {"id": 4, "text": base}])
    assert ids_of(mixed, "o1") == [1, 2, 3, 4]
    first = tmp_path / "first"
    first.mkdir()
    jsonl(first / "a.jsonl", [{"text": base}, {"id": "s1", "text": base}, {"id": "s2", "text": base}])
    assert ids_of(first, "o2") == [None, "s1", "s2"]  # the line without one: a null id, as when named
    latin = tmp_path / "latin"
    latin.mkdir()
    jsonl(latin / "a.jsonl", [b'{"id": "a0", "text": "caf\xe9 ' + base.encode() + b'"}\n', {"id": "a1", "text": base},
                              {"id": "a2", "text": base}])
    assert ids_of(latin, "o3") == ["a0", "a1", "a2"]
    for name, values in (("f", [1.5, 2.0]), ("d", [decimal.Decimal("1.10"), decimal.Decimal("2.20")]),
                         ("t", [datetime.datetime(2020, 1, 1), datetime.datetime(2020, 1, 2)])):
        (tmp_path / name).mkdir()
        pq.write_table(pa.table({"id": pa.array(values), "text": [base, base]}), tmp_path / name / "a.parquet")
        assert ids_of(tmp_path / name, "o" + name) == values
    some = tmp_path / "some"
    some.mkdir()
    pq.write_table(pa.table({"id": [1, 2], "text": [base, base]}), some / "a.parquet")
    pq.write_table(pa.table({"text": [base, base]}), some / "b.parquet")
    nested = tmp_path / "nested"
    nested.mkdir()
    jsonl(nested / "a.jsonl", [{"id": {"$oid": "x"}, "text": base}, {"id": {"$oid": "y"}, "text": base}])
    for inp, said in ((some, "has no such column"), (nested, "type struct")):
        out = tmp_path / ("refused-" + inp.name)
        assert main(["run", str(inp), "-o", str(out), "--backend", "cpu", "-q"]) == 3
        err = capsys.readouterr().err
        assert said in err and "--no-id-column" in err and "Traceback" not in err and len(err.splitlines()) == 1
        assert not out.exists()
        assert main(["run", str(inp), "-o", str(out), "--backend", "cpu", "-q", "--no-id-column"]) == 0


def test_a_run_against_an_index_uses_the_index_id_column(tmp_path, capsys):
    inp = _with_ids(tmp_path, ["u-9", "u-7", "u-5", "u-3"])
    ix = str(tmp_path / "ix")
    assert main(["index", "build", str(inp / "a.parquet"), "-o", ix, "--backend", "cpu", "--ngram", "3", "-q"]) == 0
    assert capsys.readouterr().out == ""  # -q: silent
    assert json.loads((tmp_path / "ix" / "manifest.json").read_text())["id_column"] == "id"
    assert main(["run", str(inp / "b.parquet"), "-o", str(tmp_path / "b"), "--against", ix, "--backend", "cpu",
                 "--ngram", "3", "-q"]) == 0
    dup = pq.read_table(tmp_path / "b" / "duplicates.parquet").to_pylist()
    assert [(r["id"], r["row"], r["survivor_id"], r["in_index"]) for r in dup] == [("u-3", 3, "u-9", True)]


def test_auto_backend_says_once_how_to_install_the_gpu_packages(tmp_path):
    """Issue: the fallback line named a distribution no registry has, and evaluate printed it twice."""
    inp = _planted_dir(tmp_path, 200)
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "evaluate", str(inp), "-o", str(tmp_path / "ev/"),
                           "--sample", "0", "--compare-split-chains", "--no-plot"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "backend auto: using the CPU" in line]
    assert len(said) <= 1  # none on a machine with a usable GPU
    if said:
        assert "pip install -e '.[cuda12]'" in said[0] and "gpu_dedup[cuda12]" not in said[0]
    assert f"in {tmp_path / 'ev'}/\n" in proc.stdout and "//" not in proc.stdout.splitlines()[-1]


def test_dask_chatter_is_silenced_unless_verbose(tmp_path):
    """Issue: --workers 2 printed ~60 Dask INFO lines and 18 shuffle warnings."""
    pytest.importorskip("distributed")
    inp = _planted_dir(tmp_path, 300)
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(inp), "-o", str(tmp_path / "out"),
                           "--backend", "cpu", "--workers", "2", "--set", "cluster.block_rows=100"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    for chatter in ("Shuffle", "Nanny", "Scheduler", "Start worker", "Remove worker", "Lost all workers"):
        assert chatter not in proc.stderr, chatter
    assert proc.stderr.count("Dask dashboard") == 1 and "Dask dashboard" not in proc.stdout  # once
    # -q: nothing but errors, the P2P shuffle's lines in the local scheduler's own process included
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(inp), "-o", str(tmp_path / "p2p"),
                           "--backend", "cpu", "--workers", "2", "-q", "--set", "cluster.block_rows=100",
                           "--set", "cluster.shuffle=p2p"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr


def test_shuffle_chatter_filter_drops_only_the_routine_lines():
    import logging

    from gpu_dedup.run.quiet import ShuffleChatter

    f = ShuffleChatter()

    def rec(msg, *args):
        return logging.LogRecord("distributed.shuffle._scheduler_plugin", logging.WARNING, "x", 1, msg, args, None)

    assert not f.filter(rec("Shuffle %s initialized by task %r executed on worker %s", "a", "k", "w"))
    assert not f.filter(rec("Shuffle %s deactivated due to stimulus '%s'", "a", "s"))
    assert f.filter(rec("Shuffle %s failed: %s", "a", "boom"))


def test_tune_announces_its_default_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["tune", "--no-plot"]) == 0
    out = capsys.readouterr().out
    first, last = out.splitlines()[0], out.splitlines()[-1]
    assert first.startswith(f"writing tune.json and tune.png to {tmp_path / 'gpu-dedup-tune'}/")
    assert last.endswith("in gpu-dedup-tune/") and (tmp_path / "gpu-dedup-tune" / "tune.json").exists()
    assert main(["tune", "--no-plot", "-o", str(tmp_path / "t")]) == 0
    assert "writing tune.json" not in capsys.readouterr().out  # asked for: no announcement


def test_run_summary_says_how_many_removed_documents_are_below_the_threshold(tmp_path, capsys):
    inp = _planted_dir(tmp_path, 400)
    for split, words in (("true", "below the threshold: none of the"), ("false", "are less similar than 0.8")):
        rc = main(["run", str(inp), "-o", str(tmp_path / split), "--backend", "cpu", "--set",
                   f"select.split_chains={split}"])
        out = capsys.readouterr().out
        assert rc == 0 and words in out, out
        report = json.loads((tmp_path / split / "report.json").read_text())
        below = report["chaining"]["below_threshold_to_survivor"]
        assert (below == 0) == (split == "true")
        if split == "false":
            assert f"{below:,} of {report['chaining']['near_duplicates_removed']:,} removed" in out
            assert "select.split_chains: true keeps them" in out


# ---------------------------------------------------------------------- exit codes and one-line errors


def _small_corpus(d):
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    sample = planted_corpus(n_docs=300, n_clusters=20, words=(30, 80), edit_rate=(0, 0.04), seed=5)
    write_shards(sample.table.select(["id", "text"]), d, shards=2)
    return d


def test_help_epilog_documents_the_exit_codes(capsys):
    from gpu_dedup.errors import EXIT_CODES

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "exit status:" in out
    for code, text in EXIT_CODES.items():
        assert f"{code:>3}  {text[:30]}" in out


def test_malformed_set_yaml_is_a_config_error(capsys):
    assert main(["config", "--set", "input.text_column=[unclosed"]) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML" in err and "--set" in err and "Traceback" not in err


def test_a_yaml_file_that_is_not_utf8_is_a_config_error(tmp_path, capsys):
    (tmp_path / "c.yaml").write_bytes(b"input:\n  text_column: caf\xe9\n")
    assert main(["config", "-c", str(tmp_path / "c.yaml")]) == 2
    assert "is not UTF-8 text" in capsys.readouterr().err


def test_exponent_floats_in_yaml_are_floats(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("lsh:\n  threshold: 1e-1\nverify:\n  threshold: 5E-1\n")
    assert main(["config", "-c", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert "threshold: 0.1" in out and "threshold: 0.5" in out
    assert main(["config", "--set", "lsh.threshold=1e-3"]) == 0
    assert "threshold: 0.001" in capsys.readouterr().out
    assert main(["config", "--set", "lsh.threshold=abc"]) == 2


def test_parameters_are_bounded_before_any_allocation(capsys):
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert main(["config", "--num-perm", "100000"]) == 2
    err = capsys.readouterr().err
    assert "minhash.num_perm = 100000 must be in [1, 1024]" in err
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000  # KiB: nothing large allocated
    assert main(["config", "--set", "lsh.star_rounds=1000000"]) == 2
    assert main(["config", "--set", "minhash.ngram=100000000"]) == 2


def test_workers_without_dask_installed_is_one_message(tmp_path, capsys, monkeypatch):
    _small_corpus(tmp_path / "in")
    monkeypatch.setitem(sys.modules, "distributed", None)
    monkeypatch.setitem(sys.modules, "dask", None)
    rc = main(["run", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--workers", "2", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "need Dask" in err and "pip install" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize("how", ["interrupt", "terminate"])
def test_ctrl_c_is_one_line_exit_130_and_the_rerun_resumes(tmp_path, how):
    """Ctrl-C (SIGINT) and SIGTERM: one line, exit 130, checkpoints consistent (the rerun resumes)."""
    import os

    _small_corpus(tmp_path / "in")
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
           "--backend", "cpu", "--id-column", "id", "-q"]
    env = {**os.environ, "GPU_DEDUP_FAULT": f"verify:{how}"}

    stopped = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, preexec_fn=interruptible)
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.strip().splitlines() == [stopped.stderr.strip()] and "interrupted" in stopped.stderr
    env.pop("GPU_DEDUP_FAULT")
    again = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["resumed_from_checkpoint"] == ["bands", "buckets", "exact"]


def test_an_internal_error_exits_1(tmp_path, caplog, monkeypatch):
    from gpu_dedup.run import sequence

    _small_corpus(tmp_path / "in")

    def bug(self):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(sequence.Sequence, "components", bug)
    assert main(["run", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "--backend", "cpu", "-q"]) == 1
    assert "internal error" in caplog.text and "ZeroDivisionError: a bug" in caplog.text


def test_run_no_shards_writes_only_the_duplicates_table_and_the_report(tmp_path, capsys):
    inp = _planted_dir(tmp_path)
    assert main(["run", str(inp), "-o", str(tmp_path / "full"), "--backend", "cpu", "-q"]) == 0
    assert main(["run", str(inp), "-o", str(tmp_path / "ids"), "--backend", "cpu", "--no-shards"]) == 0
    out = capsys.readouterr().out
    assert "(duplicates.parquet, report.json, report.html)" in out and "deduplicated shards" not in out
    names = sorted(p.name for p in (tmp_path / "ids").iterdir() if not p.name.startswith("."))
    assert names == ["_SUCCESS", "duplicates.parquet", "report.html", "report.json"]
    assert (tmp_path / "ids" / "duplicates.parquet").read_bytes() == (tmp_path / "full" / "duplicates.parquet").read_bytes()
    full, ids = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("full", "ids"))
    assert full["stages"]["write"]["rows_written"] == full["counts"]["kept"] > 0
    assert ids["stages"]["write"]["rows_written"] == 0 and ids["counts"]["kept"] == full["counts"]["kept"]
    # the same directory again with shards, then without: the earlier run's shards go at the commit
    assert main(["run", str(inp), "-o", str(tmp_path / "ids"), "--backend", "cpu", "-q"]) == 0
    assert sorted(p.name for p in (tmp_path / "ids").glob("*.parquet")) == sorted(
        p.name for p in (tmp_path / "full").glob("*.parquet"))
    assert main(["run", str(inp), "-o", str(tmp_path / "ids"), "--backend", "cpu", "-q", "--no-shards"]) == 0
    assert sorted(p.name for p in (tmp_path / "ids").glob("*.parquet")) == ["duplicates.parquet"]


def test_no_shards_and_no_duplicates_table_is_a_config_error(tmp_path, capsys):
    inp = _planted_dir(tmp_path, 40)
    rc = main(["run", str(inp), "-o", str(tmp_path / "o"), "--no-shards", "--set", "output.duplicates_table=false"])
    assert rc == 2 and "output.shards and output.duplicates_table are both false" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_scheduler_address_that_is_not_one_is_a_usage_error(tmp_path, capsys):
    pytest.importorskip("distributed")
    inp = _small_corpus(tmp_path / "in")
    import socket
    import time

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        closed = f"tcp://127.0.0.1:{s.getsockname()[1]}"
    for address in ("nonsense", "tcp://:", "foo://host:1", closed):
        t0 = time.perf_counter()
        rc = main(["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "-q", "--scheduler", address])
        err = capsys.readouterr().err
        assert rc == 2, err
        assert f"cannot connect to the Dask scheduler {address!r}" in err and "tcp://HOST:PORT" in err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
        assert address != closed or ("connection refused" in err and time.perf_counter() - t0 < 10)  # not 30 s
    assert not (tmp_path / "out").exists()


def test_an_empty_output_path_is_refused_instead_of_writing_into_the_current_directory(tmp_path, capsys,
                                                                                      monkeypatch):
    inp = _small_corpus(tmp_path / "in")
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    for argv in (["run", str(inp), "-o", "", "--backend", "cpu"], ["index", "build", str(inp), "-o", ""],
                 ["evaluate", str(inp), "-o", "", "--backend", "cpu", "--no-plot"],
                 ["run", str(inp), "-o", "out", "--against", ""], ["query", ""]):
        assert main(argv) == 2, argv
        assert "is given the empty path ''" in capsys.readouterr().err
    assert list(cwd.iterdir()) == []


def test_an_empty_id_column_is_refused_instead_of_naming_a_column_of_row_numbers_with_no_name(tmp_path, capsys):
    """``--id-column "$ID"`` with ID unset ran, and duplicates.parquet's id column was named '' and held row
    numbers; an empty text column was already refused."""
    inp = _small_corpus(tmp_path / "in")
    for argv in (["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "--id-column", ""],
                 ["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "--set", "input.id_column=''"]):
        assert main(argv) == 2, argv
        assert "input.id_column is empty" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_yaml_syntax_error_is_one_line_and_a_directory_is_not_called_missing(tmp_path, capsys):
    (tmp_path / "c.yaml").write_text("lsh: {threshold: 0.7\n")
    assert main(["config", "-c", str(tmp_path / "c.yaml")]) == 2
    err = capsys.readouterr().err
    assert "is not valid YAML" in err and "line 2, column 1" in err and len(err.strip().splitlines()) == 1
    (tmp_path / "d.yaml").mkdir()
    assert main(["config", "-c", str(tmp_path / "d.yaml")]) == 2
    err = capsys.readouterr().err
    assert "is a directory, not a file" in err and "does not exist" not in err


def test_query_options_and_non_string_jsonl_texts_are_user_errors(tmp_path, capsys, monkeypatch):
    import io

    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    for extra, code, text in ((["--threshold", "2"], 2, "query threshold = 2.0 must be a number in (0, 1]"),
                              (["--members", "-1"], 2, "query members = -1 must be an integer >= 0"),
                              (["--jsonl"], 3, "query 1 of '-' has a int in 'text' (5), not a string")):
        monkeypatch.setattr(sys, "stdin", io.StringIO('{"text": 5}\n'))
        assert main(["query", str(tmp_path / "ix"), *extra]) == code, extra
        err = capsys.readouterr().err
        assert text in err and "Traceback" not in err
    deep = '{"text": "q", "m": ' + "[" * 5000 + "]" * 5000 + "}"  # deeper than Python's json takes
    monkeypatch.setattr(sys, "stdin", io.StringIO("{\"text\": \"fine\"}\n" + deep + "\n"))
    assert main(["query", str(tmp_path / "ix"), "--jsonl"]) == 3
    err = capsys.readouterr().err
    assert "line 2 of '-' nests arrays/objects deeper than" in err and "Traceback" not in err


def test_a_damaged_index_is_one_error_naming_it(tmp_path, capsys, monkeypatch):
    import io
    import shutil

    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    damage = {
        "list-manifest": lambda p: (p / "manifest.json").write_text("[1, 2]"),
        "no-segments": lambda p: (p / "manifest.json").write_text(json.dumps(
            {k: v for k, v in json.loads((p / "manifest.json").read_text()).items() if k != "segments"})),
        "truncated-segment": lambda p: (p / "seg-00000" / "docs.arrow").write_bytes(
            (p / "seg-00000" / "docs.arrow").read_bytes()[:100]),
        "missing-segment-file": lambda p: (p / "seg-00000" / "bands.arrow").unlink(),
    }
    for name, hurt in damage.items():
        shutil.copytree(tmp_path / "ix", tmp_path / name)
        hurt(tmp_path / name)
        monkeypatch.setattr(sys, "stdin", io.StringIO("some text\n"))
        assert main(["query", str(tmp_path / name)]) == 3, name
        err = capsys.readouterr().err
        assert str(tmp_path / name) in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------- signals, hangs, one-line errors


def _gpu_dedup(*args, env=None, stdin=None, timeout=300):
    import os

    env = {**{k: v for k, v in os.environ.items() if k != "GPU_DEDUP_FAULT"}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "gpu_dedup", *map(str, args)], env=env, input=stdin,
                          capture_output=True, timeout=timeout)


SWALLOWED = """
import gc, os, signal, sys, threading, time
import gpu_dedup.cli.parser as parser
from gpu_dedup import cli

def busy_callback(phase, info):  # Python work in a gc callback (as Dask's GCDiagnosis), where the signal lands
    if phase == "start":
        t = time.time()
        while time.time() - t < 0.5:
            pass

def command(args):
    gc.callbacks.append(busy_callback)
    threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM)).start()
    gc.collect()
    gc.callbacks.remove(busy_callback)
    time.sleep(3)
    print("finished")
    return 0

parser.cmd_config = command
sys.argv = ["gpu-dedup", "config"]
sys.exit(cli.main())
"""


def test_a_sigterm_that_lands_in_a_garbage_collector_callback_still_stops_the_run():
    """Python only prints an exception raised in a gc callback ("Exception ignored in ..."): a SIGTERM whose
    KeyboardInterrupt landed there was lost and the run finished with exit 0.  It is delivered again."""
    done = subprocess.run([sys.executable, "-c", SWALLOWED], capture_output=True, text=True, timeout=60)
    assert done.returncode == 130 and "finished" not in done.stdout, (done.stdout, done.stderr)
    assert done.stderr.strip().splitlines() == [done.stderr.strip()] and "interrupted" in done.stderr


def test_an_interrupted_dask_run_is_one_line_without_tracebacks(tmp_path):
    """SIGTERM while the workers work (the exact stage's checkpoint written, the next stages under way): exit 130
    and the one line, no "Task exception was never retrieved ... AllExit" traceback per block the client stopped
    waiting for."""
    import os
    import signal
    import time

    pytest.importorskip("distributed")
    from gpu_dedup.evaluation.sample import planted_corpus, write_shards

    sample = planted_corpus(n_docs=20000, n_clusters=500, seed=3)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=4)
    p = subprocess.Popen([sys.executable, "-m", "gpu_dedup", "run", str(tmp_path / "in"), "-o", str(tmp_path / "out"),
                          "--workers", "2", "--backend", "cpu", "--set", "cluster.block_rows=2000"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    exact = tmp_path / "out" / ".gpu_dedup_checkpoint" / "exact.arrays"  # a batch log says nothing of short stages
    try:
        deadline = time.time() + 300
        while not exact.exists() and p.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        os.kill(p.pid, signal.SIGTERM)  # the client waits on the workers' signatures, bands, ...
        err = p.stderr.read()
        assert p.wait(timeout=120) == 130, err
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert "Traceback" not in err and "Task exception was never retrieved" not in err, err
    assert err.strip().splitlines()[-1].startswith("gpu-dedup: error: interrupted"), err
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_query_refuses_binary_files_replaces_bad_bytes_and_stops_quietly_at_a_closed_pipe(tmp_path):
    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    shard = sorted(inp.glob("*.parquet"))[0]
    q = _gpu_dedup("query", tmp_path / "ix", shard)
    assert q.returncode == 3 and q.stdout == b"", q.stderr
    assert b"are a Parquet file, not text" in q.stderr and b"gpu-dedup run SHARD --against" in q.stderr
    import gzip

    (tmp_path / "q.txt.gz").write_bytes(gzip.compress(b"some text\n"))
    q = _gpu_dedup("query", tmp_path / "ix", tmp_path / "q.txt.gz")
    assert q.returncode == 3 and b"gzip-compressed" in q.stderr and b"zcat" in q.stderr
    q = _gpu_dedup("query", tmp_path / "ix", stdin=b"ok\n\xff\xfe bad\n")
    assert q.returncode == 0 and b"Traceback" not in q.stderr, q.stderr
    assert [json.loads(line)["query"] for line in q.stdout.splitlines()] == [0, 1]
    assert b"2 byte sequence(s) that are not UTF-8" in q.stderr
    texts = pq.read_table(shard).column("text").to_pylist()
    (tmp_path / "many.txt").write_text("\n".join(texts * 40) + "\n")
    piped = subprocess.run(f"{sys.executable} -m gpu_dedup query {tmp_path / 'ix'} {tmp_path / 'many.txt'} | head -2",
                           shell=True, capture_output=True, text=True, timeout=300, executable="/bin/bash")
    assert len(piped.stdout.splitlines()) == 2 and piped.stderr == "", piped.stderr


def test_against_an_index_without_signatures_with_verify_signature_is_one_error(tmp_path, capsys):
    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    rc = main(["run", str(inp), "-o", str(tmp_path / "out"), "--against", str(tmp_path / "ix"), "--verify",
               "signature", "-q"])
    err = capsys.readouterr().err
    assert rc == 2 and "stores none for seg-00000" in err and "--verify exact" in err and "Traceback" not in err


def test_cluster_settings_that_would_hang_are_refused_at_once(tmp_path, capsys):
    import threading
    import time
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    inp = _small_corpus(tmp_path / "in")
    for value, said in (("1KiB", "is below 512 MiB"), ("lots", "is not a size")):
        rc = main(["run", str(inp), "-o", str(tmp_path / "out"), "--workers", "2", "--set",
                   f"cluster.memory_limit={value}"])
        err = capsys.readouterr().err
        assert rc == 2 and f"cluster.memory_limit = '{value}' {said}" in err, err
    pytest.importorskip("distributed")
    server = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)  # a port that speaks HTTP, not Dask
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        t0 = time.perf_counter()
        r = _gpu_dedup("run", inp, "-o", tmp_path / "out", "--scheduler", f"tcp://127.0.0.1:{server.server_port}",
                       env={"DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}, timeout=120)
        took = time.perf_counter() - t0
    finally:
        server.shutdown()
    assert r.returncode == 2 and b"no Dask scheduler answered" in r.stderr and b"Traceback" not in r.stderr, r.stderr
    assert took < 60


def test_output_paths_through_broken_or_looping_links_are_output_errors(tmp_path, capsys):
    import os

    inp = _small_corpus(tmp_path / "in")
    os.symlink(tmp_path / "loop_b", tmp_path / "loop_a")
    os.symlink(tmp_path / "loop_a", tmp_path / "loop_b")
    os.symlink(tmp_path / "missing" / "target", tmp_path / "dangling")
    for out, said in (("loop_a", "looping symbolic link"), ("dangling", "which does not exist"),
                      ("dangling/sub", "which does not exist")):
        rc = main(["run", str(inp), "-o", str(tmp_path / out), "-q"])
        err = capsys.readouterr().err
        assert rc == 4 and said in err and "Traceback" not in err, (out, err)
    assert not (tmp_path / "missing").exists()


def test_bad_environment_and_config_files_are_one_line(tmp_path, capsys):
    inp = _small_corpus(tmp_path / "in")
    r = _gpu_dedup("run", inp, "-o", tmp_path / "out", "-q", env={"NUMBA_NUM_THREADS": "0"})
    assert r.returncode == 2 and b"NUMBA_NUM_THREADS = '0' is not a positive number" in r.stderr, r.stderr
    assert main(["config", "-c", "/dev/null"]) == 0  # an empty config: the defaults
    assert "threshold: 0.8" in capsys.readouterr().out
    (tmp_path / "twice.yaml").write_text("lsh:\n  threshold: 0.7\nminhash:\n  ngram: 3\nlsh:\n  threshold: 0.9\n")
    assert main(["config", "-c", str(tmp_path / "twice.yaml")]) == 2
    assert "sets 'lsh' twice (lines 1 and 5); keep one of them" in capsys.readouterr().err
    assert main(["config", "-c", str(tmp_path)]) == 2 and "is a directory" in capsys.readouterr().err


def test_report_rewrites_a_runs_page_only_as_the_run_owns_it(tmp_path, capsys):
    inp = _small_corpus(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["run", str(inp), "-o", str(out), "-q", "--backend", "cpu"]) == 0
    assert main(["report", str(out)]) == 0
    # the manifest records the page it rewrote: the next run (even --restart) still owns every output
    assert main(["run", str(inp), "-o", str(out), "-q", "--backend", "cpu", "--restart"]) == 0
    capsys.readouterr()
    (out / "report.html").write_text("my notes\n")  # the user's edit is not overwritten
    assert main(["report", str(out)]) == 4 and "is not the unchanged output" in capsys.readouterr().err
    assert (out / "report.html").read_text() == "my notes\n"
    (tmp_path / "page.html").write_text("someone else's page\n")
    assert main(["report", str(out / "report.json"), "-o", str(tmp_path / "page.html")]) == 4
    assert (tmp_path / "page.html").read_text() == "someone else's page\n"
    assert main(["report", str(out / "report.json"), "-o", str(tmp_path / "new.html")]) == 0
    assert main(["report", str(out / "report.json"), "-o", str(tmp_path / "new.html")]) == 0  # ours: rewritten


def test_report_to_dash_writes_the_page_to_stdout(tmp_path, capsysbinary, monkeypatch):
    """``report -o -`` wrote a file named ``-``; it is standard output, the page alone (no "wrote" line)."""
    inp = _small_corpus(tmp_path / "in")
    out = tmp_path / "out"
    assert main(["run", str(inp), "-o", str(out), "-q", "--backend", "cpu"]) == 0
    capsysbinary.readouterr()
    for where in (tmp_path, out):  # in a run's output directory too: not a page of the run named '-'
        monkeypatch.chdir(where)
        assert main(["report", str(out / "report.json"), "-o", "-"]) == 0
        got = capsysbinary.readouterr()
        assert got.out == (out / "report.html").read_bytes() and got.err == b""
        assert not (where / "-").exists()


def test_quiet_and_verbose_together_are_a_usage_error(tmp_path, capsys, monkeypatch):
    """``-q -v``: -q won, silently; argparse refuses the pair (exit 2) before anything runs."""
    monkeypatch.chdir(tmp_path)
    for argv in (["run", "in/", "-o", "out/", "-q", "-v"], ["evaluate", "in/", "-o", "out/", "-vv", "-q"],
                 ["tune", "--no-plot", "-v", "--quiet"]):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "not allowed with argument" in err, (argv, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fault,said,success", [
    ("commit:renamed:terminate", "interrupted while publishing the outputs in", False),
    ("index:before-append:terminate", "previous complete output (if any) is untouched", True),  # segments first
    ("index:before-manifest:terminate", "before this run's documents were added to the index", True)])
def test_an_interrupt_during_or_after_the_commit_says_what_the_directory_holds(tmp_path, fault, said, success):
    inp = _small_corpus(tmp_path / "in")
    extra = ["--index-out", str(tmp_path / "ix")] if fault.startswith("index") else []
    args = ["run", inp, "-o", tmp_path / "out", "--backend", "cpu", "--id-column", "id", "-q", *extra]
    assert _gpu_dedup(*args).returncode == 0
    (tmp_path / "out" / "part-00000.parquet").unlink()  # the rerun has something to publish
    if extra:
        import shutil

        shutil.rmtree(tmp_path / "ix")
    stopped = _gpu_dedup(*args, "--restart", env={"GPU_DEDUP_FAULT": fault})
    err = stopped.stderr.decode()
    assert stopped.returncode == 130 and said in err and ("untouched" in said) == ("untouched" in err), err
    assert err.strip().splitlines() == [err.strip()]
    assert (tmp_path / "out" / "_SUCCESS").exists() == success  # the new or the earlier run's, or none (a mix)
    if extra:  # the index is as it was (none): its segments were staged, its manifest never written
        assert not (tmp_path / "ix" / "manifest.json").exists()
    again = _gpu_dedup(*args)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "out" / "_SUCCESS").exists()
    if extra:
        assert main(["index", "info", str(tmp_path / "ix")]) == 0


def test_an_interrupted_index_build_leaves_no_index_and_says_so(tmp_path):
    inp = _small_corpus(tmp_path / "in")
    args = ("index", "build", inp, "-o", tmp_path / "ix", "--backend", "cpu", "-q")
    stopped = _gpu_dedup(*args, env={"GPU_DEDUP_FAULT": "index:before-manifest:terminate"})
    err = stopped.stderr.decode()
    assert stopped.returncode == 130 and f"no index was left in {str(tmp_path / 'ix')!r}" in err, err
    assert not (tmp_path / "ix" / "manifest.json").exists() and not (tmp_path / "ix" / "seg-00000").exists()
    assert _gpu_dedup(*args).returncode == 0


def test_a_misspelled_flag_names_the_close_one_on_the_subcommands_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "in/", "-o", "out/", "--treshold", "0.7"])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert err.startswith("usage: gpu-dedup run ") and "gpu-dedup run: error: unrecognized arguments" in err
    assert "--treshold: did you mean --threshold?" in err
    with pytest.raises(SystemExit):
        main(["bench", "peers", "--quality-smaple", "10"])
    err = capsys.readouterr().err
    assert "usage: gpu-dedup bench peers" in err and "did you mean --quality-sample?" in err


@pytest.mark.parametrize("argv, usage, hint", [
    (["rnu", "in/", "-o", "out/"], "usage: gpu-dedup ", "invalid choice: 'rnu'; did you mean 'run'?"),
    (["evalute", "in/", "-o", "out/"], "usage: gpu-dedup ", "invalid choice: 'evalute'; did you mean 'evaluate'?"),
    (["index", "bulid", "in/", "-o", "ix/"], "usage: gpu-dedup index ", "'bulid'; did you mean 'build'?"),
    (["--verison"], "usage: gpu-dedup ", "--verison: did you mean --version?"),
])
def test_a_misspelt_subcommand_gets_the_one_it_likely_meant(argv, usage, hint, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith(usage) and hint in err, err


def test_a_misspelt_flag_is_named_not_the_option_it_leaves_missing(capsys):
    """``--ouput out/``: argparse alone takes out/ as one more input and reports -o missing."""
    with pytest.raises(SystemExit) as exc:
        main(["run", "in/", "--ouput", "out/"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "--ouput: did you mean --output (-o)?" in err and "required" not in err, err
    with pytest.raises(SystemExit):
        main(["index", "build", "in/", "--ouptut=ix/", "--treshold", "0.7"])
    err = capsys.readouterr().err
    assert "unrecognized options --ouptut --treshold" in err and "--ouptut: did you mean --output (-o)?" in err
    assert "--treshold: did you mean --threshold?" in err
    with pytest.raises(SystemExit):
        main(["run", "in/", "--zzz", "-o", "out/", "-vv", "--threshold", "-0.5"])  # -vv and -0.5 are no typos
    err = capsys.readouterr().err
    assert "unrecognized arguments: --zzz" in err and "-vv" not in err.splitlines()[-1]


def test_tune_sample_corpus_and_its_old_spelling(tmp_path, capsys):
    """--sample is a count in evaluate; tune's corpus is --sample-corpus (the old --sample still works, saying so)."""
    inp = _planted_dir(tmp_path, 200)
    args = ["tune", "--backend", "cpu", "--sample-size", "100", "--confirm", "1", "--no-plot", "--id-column", "id"]
    assert main(args + ["--sample-corpus", str(inp), "-o", str(tmp_path / "new"), "-q"]) == 0
    assert capsys.readouterr().err == ""
    assert main(args + ["--sample", str(inp), "-o", str(tmp_path / "old"), "-q"]) == 0
    assert "--sample is deprecated; use --sample-corpus" in capsys.readouterr().err
    new = json.loads((tmp_path / "new" / "tune.json").read_text())
    old = json.loads((tmp_path / "old" / "tune.json").read_text())
    assert new["empirical"]["corpus"]["sample"] == old["empirical"]["corpus"]["sample"] == 100
    assert [x["recall_at_threshold"] for x in new["empirical"]["layouts"]] == \
        [x["recall_at_threshold"] for x in old["empirical"]["layouts"]]


def test_query_help_says_plain_text_is_one_query_per_line(capsys):
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    out = capsys.readouterr().out
    assert "one query per line" in out and "--jsonl" in out


def test_the_command_runs_exit_handlers_flushes_and_exits_with_the_status():
    """``gpu-dedup`` ends with os._exit after main (no interpreter teardown): exit handlers still run,
    everything printed arrives, and the exit status is main's."""
    script = ("import atexit, sys\n"
              "from gpu_dedup.cli import console\n"
              "atexit.register(lambda: print('exit handler ran', flush=True))\n"
              "sys.stdout.write('buffered, not flushed\\n')\n"
              "sys.argv = ['gpu-dedup'] + sys.argv[1:]\n"
              "console()\n"
              "print('never printed')\n")
    ok = subprocess.run([sys.executable, "-c", script, "config"], capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    assert "buffered, not flushed" in ok.stdout and "exit handler ran" in ok.stdout
    assert "bands" in ok.stdout and "never printed" not in ok.stdout
    bad = subprocess.run([sys.executable, "-c", script, "run", "/nonexistent/shards", "-o", "/nonexistent/out"],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 3 and "does not exist" in bad.stderr and "exit handler ran" in bad.stdout


def test_the_command_exits_as_usual_while_another_thread_runs(monkeypatch):
    """A non-daemon thread still alive: no shortcut (Python joins it as usual)."""
    import threading

    from gpu_dedup import cli

    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    ended = []
    monkeypatch.setattr(cli, "main", lambda: 0)
    monkeypatch.setattr("os._exit", lambda code: ended.append(code))
    try:
        with pytest.raises(SystemExit) as exc:
            cli.console()
    finally:
        stop.set()
        worker.join()
    assert exc.value.code == 0 and ended == []


def test_misleading_messages_say_what_happened_to_what_with_the_fix(tmp_path, capsys):
    """Each of these said something else than what happened: query > /dev/full spoke of -o and publishing; a
    garbling server as --scheduler gave "Unable to allocate 3.07 EiB"; a 300-character -o was exit 3 "check the
    path"; --id-column with --no-id-column and --workers with --scheduler were taken silently."""
    import os
    import socket
    import threading

    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    if os.path.exists("/dev/full"):
        with open("/dev/full", "wb") as full:
            q = subprocess.run([sys.executable, "-m", "gpu_dedup", "query", str(tmp_path / "ix")], input=b"some text\n",
                               stdout=full, stderr=subprocess.PIPE, timeout=300, check=False)
        err = q.stderr.decode()
        assert q.returncode == 5 and "cannot write the query results to standard output" in err, err
        assert "another -o" not in err and "published" not in err and "Traceback" not in err
    name = "x" * 300
    assert main(["run", str(inp), "-o", str(tmp_path / name), "-q"]) == 4
    err = capsys.readouterr().err
    assert "300 bytes long" in err and "choose a shorter -o" in err and not (tmp_path / name[:255]).exists()
    assert main(["run", str(inp), "-o", str(tmp_path / "o1"), "--id-column", "text", "--no-id-column", "-q"]) == 2
    assert "give one of them" in capsys.readouterr().err and not (tmp_path / "o1").exists()
    assert main(["run", str(inp), "-o", str(tmp_path / "o2"), "--workers", "2", "--scheduler", "tcp://127.0.0.1:9",
                 "-q"]) == 2
    assert "starts a local cluster" in capsys.readouterr().err and not (tmp_path / "o2").exists()
    # a server that answers at once in another protocol (an HTTP error), read by Dask as a length of exabytes
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def answer():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    pytest.importorskip("distributed")
    try:
        rc = main(["run", str(inp), "-o", str(tmp_path / "o3"), "--scheduler",
                   f"tcp://127.0.0.1:{server.getsockname()[1]}", "-q"])
    finally:
        server.close()
    err = capsys.readouterr().err
    assert rc == 2 and "answered, but not as a Dask scheduler does" in err and "allocate" not in err, err


def test_an_interrupted_query_says_it_only_reads(tmp_path):
    """query interrupted while it waits for its queries: SIGINT spoke of checkpoints and resuming; now SIGINT and
    SIGTERM both say the query only reads, exit 130."""
    import signal
    import time

    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        p = subprocess.Popen([sys.executable, "-m", "gpu_dedup", "query", str(tmp_path / "ix")], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                             preexec_fn=interruptible)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # the index is open (mapped): next, query reads stdin
                with open(f"/proc/{p.pid}/maps") as maps:
                    if "docs.arrow" in maps.read():
                        break
                time.sleep(0.1)
            time.sleep(0.5)
            p.send_signal(sig)
            _, err = p.communicate(timeout=60)
        finally:
            if p.poll() is None:
                p.kill()
        err = err.decode()
        assert p.returncode == 130 and "it only reads" in err and "checkpoint" not in err, (sig, err)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


SET_KEYS = ["lsh.threshold", "lsh.bands", "lsh.rows", "lsh.fp_weight", "lsh.fn_weight", "lsh.star_rounds",
            "minhash.num_perm", "minhash.ngram", "minhash.shingle", "minhash.seed", "verify.method", "verify.threshold",
            "select.keep", "select.split_chains", "exact_dedup", "normalize.unicode", "normalize.lowercase",
            "similarity", "cosine.bits", "cosine.bands", "input.vector_column", "gpu.memory_limit",
            "cluster.memory_limit", "output.compression", "lsh", "lsh.threshold.x", "lsj.threshold", ""]
SET_VALUES = ["null", "true", "0", "-1", "1", "2", "4", "8", "64", "1e400", ".nan", ".inf", "0.5", "0.9", "1.0", "abc",
              "[1]", "{a: 1}", "infGiB", "12GiB", "exact", "none", "char", "lowest_id", "cosine", "emb", "zstd"]


def test_any_set_is_a_run_or_one_line_exit_2(tmp_path):
    """Hypothesis: ``gpu-dedup run --set KEY=VALUE`` (one to three, odd keys and values) on a tiny corpus exits 0
    with every row accounted for and the pairs at the threshold found as the oracle finds them, or exits 2 with one
    line and no traceback (``infGiB`` / ``1e400`` sizes were exit 1 with a traceback, ``.nan`` weights exit 0 with a
    1 x 1 layout, ``--vector-column`` under jaccard exit 1)."""
    import contextlib
    import io

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from tests import reference as ref

    words = " ".join(f"w{i}" for i in range(40))
    texts = [words, words + " tail", "something else entirely here", words.upper(), "x y"]
    pq.write_table(pa.table({"id": list("abcde"), "text": texts, "emb": [[1.0, 0.0]] * 5}), tmp_path / "c.parquet")
    runs = iter(range(10**6))

    @settings(max_examples=60, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.lists(st.tuples(st.sampled_from(SET_KEYS), st.sampled_from(SET_VALUES)), min_size=1, max_size=3))
    def check(pairs):
        out = tmp_path / f"o{next(runs)}"
        args = ["run", str(tmp_path / "c.parquet"), "-o", str(out), "--backend", "cpu", "-q"]
        for key, value in pairs:
            args += ["--set", f"{key}={value}"]
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            rc = main(args)
        lines = err.getvalue().strip().splitlines()
        assert rc in (0, 2), (pairs, rc, err.getvalue())
        if rc == 2:
            assert len(lines) == 1 and lines[0].startswith("gpu-dedup: error: ") and not out.exists(), pairs
            return
        report = json.loads((out / "report.json").read_text())
        kept = pq.read_table(out / "c.parquet").column("id").to_pylist()
        dup = pq.read_table(out / "duplicates.parquet")
        removed = [i for i, k in zip(dup.column("id").to_pylist(), dup.column("kept").to_pylist()) if not k]
        assert sorted(kept + removed) == list("abcde")
        cfg = report["config"]
        if cfg["similarity"] == "jaccard" and cfg["verify"]["method"] == "exact" and cfg["minhash"]["num_perm"] >= 64:
            # the oracle: documents 0 and 1 (lower case already) at the oracle's Jaccard j; a derived layout finds a
            # pair at its threshold, and exact verification keeps it when j reaches the verify threshold
            j = ref.jaccard(texts[0], texts[1], cfg["minhash"]["shingle"], cfg["minhash"]["ngram"])
            at = cfg["verify"]["threshold"] or cfg["lsh"]["threshold"]
            if cfg["lsh"]["threshold"] <= j and at <= j and cfg["lsh"]["bands"] is None and cfg["lsh"]["rows"] is None:
                assert "b" in removed, (pairs, j)
            if at > j:
                assert "b" not in removed, (pairs, j)

    check()


def test_report_of_a_json_nested_too_deeply_is_one_error(tmp_path, capsys):
    """``gpu-dedup report`` of a file holding arrays nested 200,000 deep (a garbled or hostile report.json) was
    a RecursionError: exit 1 "internal error" with a traceback.  It is exit 3 naming the file, nothing written."""
    src = tmp_path / "report.json"
    src.write_text("[" * 200_000 + "]" * 200_000)
    assert main(["report", str(src), "-o", str(tmp_path / "page.html")]) == 3
    err = capsys.readouterr().err
    assert "nested too deeply" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "page.html").exists()


def test_evaluate_and_tune_with_workers_score_the_sample_in_one_process(tmp_path, capsys, caplog):
    """``evaluate --workers 2`` (or a config with cluster.workers) ended in an AttributeError and a traceback, exit 1:
    a cluster run keeps no scored edges to score; the sample is run in one process, and the log says so."""
    import logging

    inp = _planted_dir(tmp_path, 200)
    with caplog.at_level(logging.INFO, logger="gpu_dedup"):
        rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--sample", "0", "--backend", "cpu",
                   "--workers", "2", "--no-plot", "-q"])
    assert rc == 0, capsys.readouterr().err
    assert "recall:" in capsys.readouterr().out and "runs the sample in one process" in caplog.text
    assert (tmp_path / "ev" / "evaluation.json").exists()
    rc = main(["tune", "-o", str(tmp_path / "tune"), "--sample-corpus", str(inp), "--confirm", "1",
               "--backend", "cpu", "--set", "cluster.workers=2", "--no-plot", "-q"])
    assert rc == 0 and "measured on 200 of 200 documents" in capsys.readouterr().out


@pytest.mark.parametrize("docs", ["0", "-5", "1", "19"])
def test_demo_with_too_few_documents_is_one_line_exit_2(tmp_path, capsys, docs):
    """``demo --docs 0`` (or -5, 1) ended in a ValueError from the sample generator and a traceback, exit 1."""
    rc = main(["demo", "--docs", docs, "-o", str(tmp_path / "demo"), "--backend", "cpu"])
    err = capsys.readouterr().err
    assert rc == 2 and f"--docs {docs} is too few" in err and "--docs 20 or more" in err
    assert not (tmp_path / "demo").exists()


def test_demo_owns_only_what_it_writes(tmp_path, capsys):
    """An existing ``gpu-dedup-demo/`` holding other files: the demo overwrote the user's ``input/part-00000.parquet``
    and ``planted_truth.parquet`` and read their ``input/mine.parquet`` as part of the sample (then an IndexError
    scoring it, exit 1). ``-o`` naming a file was exit 3 "Not a directory". Both are exit 4 before anything is
    written; the demo's own files are rewritten by the next demo."""
    demo = tmp_path / "demo"
    assert main(["demo", "--docs", "60", "-o", str(demo), "--backend", "cpu", "-q"]) == 0
    assert main(["demo", "--docs", "80", "-o", str(demo), "--backend", "cpu", "-q"]) == 0  # its own: rewritten
    assert pq.read_table(demo / "planted_truth.parquet").num_rows == 80
    user = pa.table({"id": ["u1"], "text": ["a text of the user's"]})
    for name in ("input/mine.parquet", "input/part-00000.parquet", "planted_truth.parquet"):
        d = tmp_path / name.replace("/", "_")
        assert main(["demo", "--docs", "60", "-o", str(d), "--backend", "cpu", "-q"]) == 0
        pq.write_table(user, d / name)
        before = {p: p.read_bytes() for p in d.rglob("*") if p.is_file()}
        capsys.readouterr()
        rc = main(["demo", "--docs", "60", "-o", str(d), "--backend", "cpu", "-q"])
        err = capsys.readouterr().err
        assert rc == 4 and "was not written by the demo" in err and name.split("/")[-1] in err, err
        assert {p: p.read_bytes() for p in d.rglob("*") if p.is_file()} == before
    (tmp_path / "afile").write_text("mine")
    rc = main(["demo", "--docs", "60", "-o", str(tmp_path / "afile"), "--backend", "cpu", "-q"])
    assert rc == 4 and "exists and is not a directory" in capsys.readouterr().err
    assert (tmp_path / "afile").read_text() == "mine"


def test_an_index_build_interrupted_before_its_run_says_no_index_was_left(tmp_path, capsys, monkeypatch):
    """Ctrl-C in the first half second of ``index build`` (while the inputs are looked at for an id column) said a
    run's "completed stages are checkpointed ... rerun the same command to resume": a build keeps no checkpoints."""
    import gpu_dedup.cli.commands as commands

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    inp = _small_corpus(tmp_path / "in")
    monkeypatch.setattr(commands, "_with_id_column", interrupted)
    rc = main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "--backend", "cpu", "-q"])
    err = capsys.readouterr().err
    assert rc == 130 and f"no index was left in {str(tmp_path / 'ix')!r}" in err and "checkpointed" not in err, err
    assert not (tmp_path / "ix").exists()
    from gpu_dedup.cli import INTERRUPTED

    assert "checkpointed" not in INTERRUPTED["cmd_index_build"]  # an interrupt before the command's own try


def test_query_options_that_would_do_nothing_are_refused(tmp_path, capsys, monkeypatch):
    """``query INDEX q.jsonl --text-column body`` without ``--jsonl`` read every JSON line as a plain-text query
    (the option ignored: matches computed on the JSON text), and ``--vector-column`` on a text index was ignored;
    both are exit 2 naming the option and the fix, before any query is read.  ``--text-column`` had no help."""
    import io

    inp = _small_corpus(tmp_path / "in")
    assert main(["index", "build", str(inp), "-o", str(tmp_path / "ix"), "-q"]) == 0
    capsys.readouterr()
    for extra, said in ((["--text-column", "body"], "add --jsonl"),
                        (["--jsonl", "--vector-column", "emb"], "applies to a cosine index of vectors")):
        monkeypatch.setattr(sys, "stdin", io.StringIO('{"body": "the cat sat on the mat"}\n'))
        assert main(["query", str(tmp_path / "ix"), *extra]) == 2, extra
        captured = capsys.readouterr()
        assert said in captured.err and captured.out == "" and len(captured.err.strip().splitlines()) == 1
    monkeypatch.setattr(sys, "stdin", io.StringIO('{"body": "the cat sat on the mat"}\n'))
    assert main(["query", str(tmp_path / "ix"), "--jsonl", "--text-column", "body", "-q"]) == 0
    assert json.loads(capsys.readouterr().out)["query"] == 0
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    assert "the key holding each query's text" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("option", ["--text-column", "--id-column", "--vector-column"])
def test_demo_does_not_offer_options_naming_input_columns(tmp_path, capsys, option):
    """``demo --help`` listed --text-column, --id-column and --vector-column, but the demo writes its own sample
    (columns id and text): ``demo --text-column body`` wrote the sample, then failed with exit 3 "text column
    'body' is not in shard .../input/part-00000.parquet ... Set --text-column to one of them". They are not the
    demo's options: exit 2 from the parser, nothing written; the help names none of them."""
    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--docs", "100", "-o", str(tmp_path / "demo"), option, "body"])
    assert exit_.value.code == 2 and f"unrecognized arguments: {option}" in capsys.readouterr().err
    assert not (tmp_path / "demo").exists()
    with pytest.raises(SystemExit):
        main(["demo", "--help"])
    text = capsys.readouterr().out
    assert option not in text and "(default:gpu-dedup-demo)" in "".join(text.split())  # argparse wraps at "-"
