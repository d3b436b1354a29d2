"""``gpu-dedup bench stages|signatures|cosine|gpu``: the CLI hands the rest of the command line to each
benchmark's own parser, and each runs on tiny inputs."""

import importlib.util
import json

import pytest

from gpu_dedup import cli


def test_stages_runs_and_writes_results(tmp_path, capsys):
    out = tmp_path / "res"
    work = tmp_path / "not" / "yet"  # --workdir is made when it does not exist, and left empty
    assert cli.main(["bench", "stages", "--docs", "200", "--no-man", "--repeat", "1", "--results", str(out),
                     "--workdir", str(work)]) == 0
    assert work.is_dir() and not any(work.iterdir())
    res = json.loads((out / "stages.json").read_text())
    assert {r["stage"] for r in res["rows"]} >= {"read parquet", "read jsonl", "normalize", "write parquet"}
    assert all(r["corpus"] == "planted-0k" and r["ours_mb_s"] > 0 for r in res["rows"])
    assert "read jsonl" in capsys.readouterr().out


def test_signatures_runs_and_writes_results(tmp_path):
    pytest.importorskip("rensa")
    assert cli.main(["bench", "signatures", "--docs", "200", "--repeats", "1", "--results", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "signatures.json").read_text())
    assert res["benchmark"] == "signatures" and res["signatures"]["documents"] == 200


def test_cosine_runs_and_writes_results(tmp_path):
    args = ["bench", "cosine", "--rows", "1000", "--dims", "16", "--bits", "256", "--no-fidelity",
            "-o", str(tmp_path / "out"), "--workdir", str(tmp_path)]
    if importlib.util.find_spec("faiss") is None:
        args.append("--no-faiss")
    assert cli.main(args) == 0
    res = json.loads((tmp_path / "out" / "cosine.json").read_text())
    assert res["planted"][0]["runs"][0]["tool"] == "gpu_dedup"


def test_gpu_runs_its_cpu_part(tmp_path):
    out = tmp_path / "gpu.json"
    assert cli.main(["bench", "gpu", "--docs", "50", "--perms", "8", "--shingles", "word:2", "--backends", "cpu",
                     "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["backend"], r["docs"], r["num_perm"]) for r in rows] == [("cpu", 50, 8)]


def test_own_parser_rejects_unknown_options_and_other_commands_still_do(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "stages", "--no-such-option"])
    assert exc.value.code == 2 and "--no-such-option" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["bench", "skew", "--no-such-option"])
    assert exc.value.code == 2 and "unrecognized arguments: --no-such-option" in capsys.readouterr().err


@pytest.mark.parametrize("argv, said", [
    (["skew", "--sizes", "0"], "argument --sizes: 0 must be >= 1"),
    (["skew", "--sizes", "100", "-5"], "argument --sizes: -5 must be >= 1"),
    (["index", "--documents", "0"], "argument --documents: 0 must be >= 1"),
    (["index", "--documents", "10", "--queries", "-1"], "argument --queries: -1 must be >= 1"),
    (["index", "--single", "0"], "argument --single: 0 must be >= 1"),
    (["workers", "--workers", "0"], "argument --workers: 0 must be >= 1"),
    (["workers", "--documents", "1"], "argument --documents: 1 must be >= 6"),
    (["workers", "--block-rows", "0"], "argument --block-rows: 0 must be >= 1"),
    (["peers", "--sizes", "0"], "argument --sizes: 0 must be >= 6"),
    (["peers", "--quality-sample", "-3"], "argument --quality-sample: -3 must be >= 1"),
    (["signatures", "--docs", "-1"], "argument --docs: -1 must be >= 6"),
    (["signatures", "--repeats", "0"], "argument --repeats: 0 must be >= 1"),
    (["stages", "--docs", "0"], "argument --docs: 0 must be >= 1"),
    (["cosine", "--rows", "0"], "argument --rows: 0 must be >= 1"),
    (["gpu", "--docs", "5"], "argument --docs: 5 must be >= 6"),
    (["gpu", "--dask-workers", "0"], "argument --dask-workers: 0 must be >= 1"),
    (["index", "--documents", "1e6"], "argument --documents: '1e6' is not a whole number"),
])
def test_bench_sizes_and_counts_out_of_range_are_one_usage_error(tmp_path, capsys, argv, said):
    """``bench skew --sizes 0``, ``index --documents -1``, ``workers --workers 0`` (ZeroDivisionError),
    ``peers --sizes 0``, ``signatures --docs -1``, ``index --single 0`` ... ended in tracebacks from numpy or the
    planted-corpus generator (exit 1); each is exit 2 from the parser, naming the option, nothing written."""
    with pytest.raises(SystemExit) as exit_:
        cli.main(["bench", *argv, "--results", str(tmp_path / "res")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "res").exists()
