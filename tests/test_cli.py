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
