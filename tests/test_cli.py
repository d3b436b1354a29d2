import json
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.cli import main


def test_run_with_overrides(tmp_path, capsys):
    texts = ["the cat sat on the mat today", "the cat sat on the mat today!", "something else entirely here"]
    pq.write_table(pa.table({"uid": [1, 2, 3], "text": texts}), tmp_path / "a.parquet")
    rc = main(["run", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "out"), "--id-column", "uid",
               "--ngram", "3", "--threshold", "0.9", "--backend", "cpu", "--set", "select.keep=lowest_id"])
    assert rc == 0
    assert "kept 2, removed 1" in capsys.readouterr().out
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["config"]["minhash"]["ngram"] == 3 and report["config"]["select"]["keep"] == "lowest_id"


def test_user_errors_exit_2_with_one_line(tmp_path, capsys):
    rc = main(["run", str(tmp_path / "missing"), "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "does not exist" in err and "Traceback" not in err
    rc = main(["config", "--set", "lsh.treshold=0.5"])
    assert rc == 2 and "valid keys: threshold" in capsys.readouterr().err
    rc = main(["config", "--set", "noequals"])
    assert rc == 2 and "KEY=VALUE" in capsys.readouterr().err


def test_config_prints_derived_values(capsys):
    assert main(["config", "-c", "fineweb"]) == 0
    out = capsys.readouterr().out
    assert "num_perm: 112" in out and "bands=14 rows=8" in out


def test_demo_reports_recall(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "demo", "-o", str(tmp_path / "demo"), "--docs", "1200",
                           "--backend", "cpu", "-q"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "(recall)" in proc.stdout and "precision" in proc.stdout
    line = [x for x in proc.stdout.splitlines() if "Jaccard >= 0.90" in x][0]
    assert float(line.split(":")[-1].split()[0]) >= 0.99
    assert (tmp_path / "demo" / "output" / "report.json").exists()
    assert (tmp_path / "demo" / "output" / "report.html").exists() and "report.html" in proc.stdout


def _planted_dir(tmp_path, n=400):
    from gpu_dedup.sample import planted_corpus, write_shards

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
    assert rc == 1 and "recall_at_threshold_plus_0.05_at_least_0.99" in capsys.readouterr().err


def test_evaluate_missing_label_column_is_a_user_error(tmp_path, capsys):
    inp = _planted_dir(tmp_path, 200)
    rc = main(["evaluate", str(inp), "-o", str(tmp_path / "ev"), "--backend", "cpu", "--label-column", "nope"])
    err = capsys.readouterr().err
    assert rc == 2 and "'nope' is not in shard" in err and "'cluster'" in err


STAGES = ("read", "normalize", "exact", "signatures", "bands", "buckets", "verify", "components", "select", "write")


def test_run_logs_every_stage_with_counts_and_rate_and_is_silent_with_quiet(tmp_path):
    """stderr not a terminal: plain log lines, one per stage end with its counts and rate; -q: nothing."""
    import re

    inp = _planted_dir(tmp_path, 200)
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(inp), "--id-column", "id", "--backend", "cpu"]
    proc = subprocess.run(cmd + ["-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "\r" not in proc.stderr  # no terminal redraws in a log
    for stage in STAGES:
        assert f"INFO stage {stage} ..." in proc.stderr, stage
        done = re.search(rf"INFO stage {stage} done in [0-9.]+s: ([0-9,]+)/([0-9,]+) [a-z ]+, [0-9,]+ [a-z ]+/s",
                         proc.stderr)
        assert done and done.group(1) == done.group(2), (stage, proc.stderr)
    assert "stage read done in" in proc.stderr and "2/2 shards" in proc.stderr
    assert "stage select done in" in proc.stderr and "200/200 docs" in proc.stderr
    quiet = subprocess.run(cmd + ["-o", str(tmp_path / "quiet"), "-q"], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stderr == "" and quiet.stdout == ""
    assert (tmp_path / "quiet" / "_SUCCESS").exists()
