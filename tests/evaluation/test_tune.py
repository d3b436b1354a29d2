import json

import numpy as np
import pytest

from gpu_dedup.cli import main
from gpu_dedup.config import Config
from gpu_dedup.curves import error_areas, optimal_layout, s_curve
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.evaluation.tune import candidate_layouts, format_table, tune


@pytest.mark.parametrize("t, num_perm, wfp, wfn", [(0.8, 128, 0.05, 0.95), (0.7, 256, 0.5, 0.5), (0.9, 64, 0.2, 0.8),
                                                   (0.5, 20, 0.05, 0.95)])
def test_pick_is_optimal_layout_and_rows_are_ranked(t, num_perm, wfp, wfn):
    rows = candidate_layouts(t, num_perm, wfp, wfn, top=5)
    picks = [r for r in rows if r["pick"]]
    assert len(picks) == 1 and (picks[0]["bands"], picks[0]["rows"]) == optimal_layout(t, num_perm, wfp, wfn)
    assert picks[0]["rank"] == 1 and rows[0] is picks[0]
    costs = [r["cost"] for r in rows]
    assert costs == sorted(costs) and len(rows) >= 5
    for r in rows:
        fp, fn = error_areas(t, [r["bands"]], [r["rows"]])
        assert r["cost"] == pytest.approx(wfp * fp[0] + wfn * fn[0], abs=1e-6)
        assert r["bands"] * r["rows"] <= num_perm
        for s, p in r["p"].items():
            assert p == pytest.approx(float(s_curve(float(s), r["bands"], r["rows"])), abs=1e-4)
    b, r = picks[0]["bands"], picks[0]["rows"]
    shown = {(x["bands"], x["rows"]) for x in rows}
    for nb, nr in [(b - 1, r), (b, r - 1)]:  # neighbours are listed
        if nb >= 1 and nr >= 1:
            assert (nb, nr) in shown


def test_table_marks_the_pick():
    rows = candidate_layouts(0.8, 128)
    text = format_table(rows, 0.8)
    star = [line for line in text.splitlines() if line.startswith("*")]
    assert len(star) == 1 and star[0].split()[1:3] == ["16", "8"]
    assert "P(0.8)" in text and "P(0.85)" in text


def test_cli_tune_prints_table_and_writes_json_and_png(tmp_path, capsys):
    rc = main(["tune", "--threshold", "0.7", "--num-perm", "96", "--fp-weight", "0.3", "--fn-weight", "0.7",
               "-o", str(tmp_path / "t")])
    out = capsys.readouterr().out
    b, r = optimal_layout(0.7, 96, 0.3, 0.7)
    assert rc == 0 and f"pick: lsh.bands={b} lsh.rows={r}" in out and "FP area" in out
    saved = json.loads((tmp_path / "t" / "tune.json").read_text())
    assert saved["pick"] == {"bands": b, "rows": r} and saved["fp_weight"] == 0.3
    pytest.importorskip("matplotlib")
    assert (tmp_path / "t" / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tune_confirms_layouts_on_a_sample(tmp_path):
    s = planted_corpus(n_docs=600, n_clusters=60, cluster_size=(2, 4), words=(40, 150), edit_rate=(0.0, 0.08), seed=9)
    write_shards(s.table.select(["id", "text"]), tmp_path / "in", shards=1)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "minhash": {"num_perm": 64}})
    result = tune(cfg, top=4, sample_inputs=tmp_path / "in", sample=500, confirm=3, plot=False)
    emp = result["empirical"]
    assert emp["corpus"]["sample"] == 500 and len(emp["layouts"]) == 3
    assert emp["layouts"][0]["pick"] and [m["bands"] for m in emp["layouts"]] == [r["bands"] for r in
                                                                                   result["layouts"][:3]]
    for m in emp["layouts"]:
        assert 0.5 < m["recall_at_threshold"] <= 1.0 and m["verified_edge_precision"] == 1.0


def test_cli_tune_with_sample(tmp_path, capsys):
    s = planted_corpus(n_docs=300, n_clusters=30, cluster_size=(2, 4), words=(40, 150), seed=2)
    write_shards(s.table.select(["id", "text"]), tmp_path / "in", shards=1)
    rc = main(["tune", "--backend", "cpu", "--sample", str(tmp_path / "in"), "--sample-size", "200", "--confirm", "2",
               "-o", str(tmp_path / "t"), "--no-plot", "-q"])
    out = capsys.readouterr().out
    assert rc == 0 and "measured on 200 of 300 documents" in out
    assert not (tmp_path / "t" / "tune.png").exists()


def test_bad_threshold():
    with pytest.raises(ValueError, match="threshold = 1.5 must be in"):
        candidate_layouts(1.5, 128)
    assert np.isfinite(candidate_layouts(1.0, 8)[0]["cost"])


def test_tune_never_overwrites_a_file_it_did_not_write(tmp_path, capsys):
    from gpu_dedup.errors import OutputError

    (tmp_path / "tune.json").write_text('{"mine": 1}\n')
    with pytest.raises(OutputError, match="tune.json' exists and was not written by gpu_dedup"):
        tune(Config(backend="cpu"), output_dir=tmp_path, plot=False)
    assert main(["tune", "-o", str(tmp_path), "-q"]) == 4
    assert (tmp_path / "tune.json").read_text() == '{"mine": 1}\n'
    tune(Config(backend="cpu"), output_dir=tmp_path / "ours", plot=False)
    tune(Config(backend="cpu"), output_dir=tmp_path / "ours", plot=False)  # its own file: rewritten


@pytest.mark.parametrize("argv, said", [
    (["--top", "-5"], "argument --top: -5 must be >= 0"),
    (["--confirm", "0", "--sample-corpus", "CORPUS"], "argument --confirm: 0 must be >= 1"),
    (["--confirm", "-1", "--sample-corpus", "CORPUS"], "argument --confirm: -1 must be >= 1"),
    (["--similarity", "cosine", "--documents", "-5"], "argument --documents: -5 must be >= 1"),
    (["--similarity", "cosine", "--documents", "0"], "argument --documents: 0 must be >= 1"),
    (["--documents", "1000"], "applies with --similarity cosine only"),
    (["--floor", "2"], "give the corpus with --sample-corpus"),
    (["--sample-size", "100"], "--sample-size 100 applies to the sample that confirms the layouts, and no "
                               "--sample-corpus is given; give the corpus with --sample-corpus CORPUS, or drop "
                               "--sample-size"),
    (["--seed", "0", "--confirm", "2"], "--confirm 2 and --seed 0 apply to the sample"),
    (["--similarity", "cosine", "--seed", "3"], "drop --seed"),
])
def test_tune_options_that_would_be_ignored_or_are_out_of_range_are_one_line_exit_2(tmp_path, capsys, argv, said):
    """``tune --top -5``, ``--confirm -1`` (ran one layout), ``--documents -5`` (min_rows 1) were accepted, and
    ``--documents`` without cosine and ``--floor``, ``--sample-size``, ``--confirm`` or ``--seed`` without a sample
    did nothing, silently; each is exit 2 naming the option, nothing written."""
    argv = [str(tmp_path / "corpus.jsonl") if a == "CORPUS" else a for a in argv]
    (tmp_path / "corpus.jsonl").write_text('{"text": "a b c d e f"}\n')
    with pytest.raises(SystemExit) as exit_:
        code = main(["tune", "-o", str(tmp_path / "t"), "--no-plot", "-q", *argv])
        raise SystemExit(code)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and said in err and "Traceback" not in err, err
    assert not (tmp_path / "t").exists()
