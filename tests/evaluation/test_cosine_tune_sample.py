"""Cosine additions of evaluation: the planted embedding generator and the cosine layout table."""

import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.config import Config
from gpu_dedup.curves import cosine_layout, cosine_s_curve
from gpu_dedup.evaluation.evaluate import cluster_pairs
from gpu_dedup.evaluation.sample import planted_embeddings
from gpu_dedup.evaluation.tune import (
    cosine_candidate_layouts,
    format_cosine_table,
    tune_cosine,
)
from gpu_dedup.stages.verify import cosine_similarity


def test_planted_embeddings_have_the_planted_cosines():
    pe = planted_embeddings(3000, 32, n_clusters=100, cluster_size=(2, 5), to_centre=(0.9, 0.99), seed=3)
    x = pe.vectors
    assert x.shape == (3000, 32) and x.dtype == np.float32
    assert np.allclose(np.linalg.norm(x, axis=1), 1, atol=1e-6)
    c = pe.cluster
    assert set(np.unique(c[c >= 0])) == set(range(100)) and (c == -1).sum() > 2000
    centres = np.full(100, -1)
    for i in np.flatnonzero((c >= 0) & (pe.to_centre == 1.0)):  # vectorized enough for a test
        centres[c[i]] = i
    members = np.flatnonzero((c >= 0) & (pe.to_centre < 1.0))
    got = cosine_similarity(members, centres[c[members]], x)
    assert np.allclose(got, pe.to_centre[members], atol=1e-5)
    left, right = cluster_pairs(c, ignore=-1)
    assert cosine_similarity(left, right, x).min() > 0.75
    again = planted_embeddings(3000, 32, n_clusters=100, cluster_size=(2, 5), to_centre=(0.9, 0.99), seed=3)
    assert np.array_equal(again.vectors, x)


def test_anisotropy_raises_the_background_cosine():
    iso = planted_embeddings(400, 64, n_clusters=0, seed=1).vectors
    ani = planted_embeddings(400, 64, n_clusters=0, anisotropy=0.4, seed=1).vectors
    a, b = np.arange(0, 200), np.arange(200, 400)
    assert abs(cosine_similarity(a, b, iso).mean()) < 0.05
    assert cosine_similarity(a, b, ani).mean() == pytest.approx(0.4, abs=0.05)
    with pytest.raises(ValueError, match="anisotropy"):
        planted_embeddings(10, 4, n_clusters=0, anisotropy=1.0)
    with pytest.raises(ValueError, match="too small"):
        planted_embeddings(10, 4, n_clusters=5, cluster_size=(3, 3))


@pytest.mark.parametrize("fixed", [True, False])
def test_planted_embeddings_as_an_arrow_table(fixed):
    from gpu_dedup.stages.vectors import from_arrow

    pe = planted_embeddings(50, 8, n_clusters=5, seed=2)
    t = pe.table("emb", fixed_size=fixed)
    assert t.column_names == ["id", "emb", "cluster"] and t.num_rows == 50
    assert pa.types.is_fixed_size_list(t.column("emb").type) == fixed
    v = from_arrow(t.column("emb"))
    assert np.array_equal(v.matrix, pe.vectors)


def test_cosine_layout_table():
    rows = cosine_candidate_layouts(0.9, 256, top=4)
    pick = [r for r in rows if r["pick"]]
    assert len(pick) == 1 and (pick[0]["bands"], pick[0]["rows"]) == cosine_layout(0.9, 256) == (19, 13)
    assert rows[0]["pick"] and rows[0]["rank"] == 1
    assert all(r["bits_used"] <= 256 and r["rows"] <= 64 for r in rows)
    assert rows[0]["p"]["0.92"] == round(float(cosine_s_curve(0.92, 19, 13)), 4)
    costs = [r["cost"] for r in rows if r["rank"] <= 4]
    assert costs == sorted(costs)
    text = format_cosine_table(rows, 0.9)
    assert "P(0.92)" in text and text.splitlines()[1].startswith("*")
    constrained = cosine_candidate_layouts(0.9, 1024, min_rows=21)
    assert all(r["rows"] >= 21 for r in constrained)


def test_tune_cosine_follows_the_config(tmp_path):
    cfg = Config.from_dict({"similarity": "cosine", "lsh": {"threshold": 0.85}, "cosine": {"bits": 512}})
    res = tune_cosine(cfg, rows_in_run=100_000, output_dir=tmp_path)
    assert res["min_rows"] == 21 and (res["pick"]["bands"], res["pick"]["rows"]) == cfg.cosine_layout_for(100_000)
    assert (tmp_path / "tune.json").is_file() and res["s_curve"][-1] == [1.0, 1.0]
    with pytest.raises(ValueError, match="must be in"):
        cosine_candidate_layouts(1.0, 64)
