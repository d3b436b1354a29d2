"""The cosine benchmark on tiny inputs: the pipelines run, the scoring is right, the results are written."""

import importlib.util
import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_dedup.bench import cosine as bc
from gpu_dedup.evaluation.sample import planted_corpus, planted_embeddings

HAS_FAISS = importlib.util.find_spec("faiss") is not None


@pytest.fixture(scope="module")
def planted():
    pe = planted_embeddings(3000, 32, n_clusters=150, to_centre=(0.93, 1.0), seed=5)
    truth = bc.truth_pairs(pe.vectors, 0.85)
    return pe, truth


def test_truth_pairs_equal_brute_force(planted):
    pe, (left, right, cos) = planted
    x = pe.vectors[:600].astype(np.float64)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    s = xn @ xn.T
    i, j = np.nonzero(np.triu(s >= 0.85, 1))
    got = {(a, b) for a, b in zip(left.tolist(), right.tolist()) if b < 600}
    assert got == set(zip(i.tolist(), j.tolist()))
    assert cos.min() >= 0.85 and np.all((left < right))


def test_ours_finds_the_planted_pairs_and_scores_them(planted):
    pe, truth = planted
    r = bc.run_ours(pe.vectors, 512, 24, 21, 0.9)
    sc = bc.score(r, truth, pe.vectors, 0.9)
    assert sc["recall_at_threshold_plus_0.02"] > 0.95
    assert sc["verified_edges_below_threshold_minus_0.05"] == 0 and r["cos"].min() >= 0.9
    assert set(r["seconds"]) >= {"signatures", "band_hashes", "buckets", "edges_verified", "components", "total"}
    split = bc.score(r, truth, pe.vectors, 0.9, "split_labels")
    assert split["removed_below_threshold_to_survivor"] == 0


def test_score_counts_what_it_claims():
    x = np.eye(4, dtype=np.float32)
    truth = (np.array([0, 0]), np.array([1, 2]), np.array([0.95, 0.91]))
    result = {"labels": np.array([0, 0, 2, 3]), "left": np.array([0]), "right": np.array([1]),
              "cos": np.array([0.95])}
    sc = bc.score(result, truth, x, 0.9)
    assert sc["pairs_at_threshold_plus_0.02"] == 1 and sc["recall_at_threshold_plus_0.02"] == 1.0
    assert sc["pairs_at_threshold"] == 2 and sc["recall_at_threshold"] == 0.5
    assert sc["edge_recall_at_threshold"] == 0.5 and sc["output_recall_at_threshold"] == 0.5
    assert sc["removed"] == 1 and sc["removed_below_threshold_minus_0.05_to_survivor"] == 1  # e0, e1 orthogonal


@pytest.mark.skipif(not HAS_FAISS, reason="faiss-cpu is not installed (the bench extra)")
def test_faiss_pipeline_and_children(planted, tmp_path):
    pe, truth = planted
    r = bc.run_faiss(pe.vectors, 512, 24, 21, 0.9)
    assert bc.score(r, truth, pe.vectors, 0.9)["recall_at_threshold_plus_0.02"] > 0.95
    path = tmp_path / "x.npy"
    np.save(path, pe.vectors)
    child = bc.run_child("faiss", path, 512, 24, 21, 0.9, 42, tmp_path)
    assert child["peak_rss_mb"] > 0 and child["labels"].shape == (3000,)


def test_collision_fidelity_tracks_theory():
    rows = bc.collision_fidelity(16, bits=128, pairs=300, cosines=(0.0, 0.9))
    for r in rows:
        assert abs(r["ours_minus_theory"]) < 0.02 and abs(r["float_minus_theory"]) < 0.02


def test_main_writes_results_with_text(tmp_path):
    corpus = planted_corpus(400, 30, seed=1)
    path = tmp_path / "c.parquet"
    pq.write_table(corpus.table, path)
    args = ["--rows", "2000", "--dims", "16", "--bits", "256", "-o", str(tmp_path / "out"), "--text", str(path),
            "--text-bits", "256", "--text-threshold", "0.7", "--no-fidelity"]
    if not HAS_FAISS:
        args.append("--no-faiss")
    assert bc.main(args) == 0
    res = json.loads((tmp_path / "out" / "cosine.json").read_text())
    assert res["planted"][0]["runs"][0]["tool"] == "gpu_dedup" and res["text"]["documents"] == 400
    assert res["text"]["recall_at_threshold_plus_0.05"] is not None
    assert "## Real text" in (tmp_path / "out" / "cosine.md").read_text()
