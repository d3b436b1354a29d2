"""The peers benchmark: its exact-truth sampling and scores against brute force, and a tiny run."""

import json

import numpy as np
import pytest

from gpu_dedup.bench import peers
from gpu_dedup.config import Config
from gpu_dedup.evaluation.evaluate import exact_truth
from gpu_dedup.evaluation.sample import planted_corpus


@pytest.fixture(scope="module")
def corpus():
    return planted_corpus(n_docs=400, n_clusters=40, words=(20, 60), edit_rate=(0.0, 0.15), seed=5)


def test_sample_truth_equals_all_pairs_restricted_to_the_sample(corpus):
    cfg = Config(backend="cpu")
    texts = corpus.table.column("text")
    rows = np.sort(np.random.default_rng(1).choice(len(texts), 120, replace=False))
    left, right, jac, size = peers.sample_truth(texts, cfg, rows, 0.5)
    full = exact_truth(texts, cfg, floor=0.5)
    want = set()
    for a, b, j in zip(full.left, full.right, full.jaccard):
        if a in rows:
            want.add((int(a), int(b), round(float(j), 12)))
        if b in rows:
            want.add((int(b), int(a), round(float(j), 12)))
    got = {(int(a), int(b), round(float(j), 12)) for a, b, j in zip(left, right, jac)}
    assert got == want and len(got) > 20
    assert np.array_equal(size, full.set_sizes)


def _brute_quality(removed, pairs, rows, size, t):
    """Per-pair and per-document loops: the definitions, written plainly."""
    sel = [(a, b) for a, b, j in pairs if j >= t]
    recall = np.mean([removed[a] or removed[b] for a, b in sel])
    scored = [r for r in rows if removed[r] and size[r] > 0]
    ok = [any(a == r and not removed[b] and j >= t for a, b, j in pairs) for r in scored]
    return recall, np.mean(ok)


def test_quality_matches_its_definition():
    rng = np.random.default_rng(3)
    n = 60
    size = rng.integers(0, 5, n)
    rows = np.arange(0, n, 2)
    pairs = [(int(a), int(b), float(rng.uniform(0.6, 1.0))) for a in rows for b in range(n)
             if a != b and rng.random() < 0.08]
    removed = rng.random(n) < 0.4
    truth = (np.array([p[0] for p in pairs]), np.array([p[1] for p in pairs]), np.array([p[2] for p in pairs]), size)
    q = peers.quality(removed, truth, rows, 0.8)
    recall, precision = _brute_quality(removed, pairs, rows, size, 0.8)
    assert q["recall"] == pytest.approx(recall)
    assert q["precision"] == pytest.approx(precision)
    assert q["pairs_recall"] == sum(j >= 0.8 for *_, j in pairs)


def test_peer_shingles_normalize_like_the_pipeline():
    got = peers.peer_shingles(["The  quick, brown FOX jumps!", "", None, "ab"], "word", 3)
    assert got[0] == ["the quick brown", "quick brown fox", "brown fox jumps"]
    assert got[1] == [] and got[2] == []
    assert got[3] == ["ab"]  # shorter than the n-gram: one shingle of the whole text
    assert peers.peer_shingles(["abcd"], "char", 3) == [["abc", "bcd"]]


def test_markdown_and_ratios_from_a_payload():
    e2e = [{"corpus": "c", "tool": "gpu_dedup", "documents": 10, "seconds": 2.0, "docs_per_s": 5, "mb_per_s": 1.0,
            "peak_rss_mb": 100, "removed": 1, "recall": 1.0, "precision": 1.0},
           {"corpus": "c", "tool": "rensa", "documents": 10, "seconds": 5.0, "docs_per_s": 2, "mb_per_s": 0.4,
            "peak_rss_mb": 90, "removed": 1}]
    sig = [{"tool": "gpu_dedup", "threads": 1, "documents": 10, "shingles": 100, "seconds": 1.0, "cpu_seconds": 1.0,
            "docs_per_s": 10, "shingles_per_s_per_thread": 100, "shingles_per_cpu_s": 100},
           {"tool": "rensa", "threads": 1, "documents": 10, "shingles": 100, "seconds": 0.4, "cpu_seconds": 0.5,
            "docs_per_s": 25, "shingles_per_s_per_thread": 250, "shingles_per_cpu_s": 200}]
    r = peers._ratios(e2e, sig)
    assert r["end_to_end"]["c"] == {"rensa": 2.5}
    assert r["signatures_per_core"] == {"rensa": 0.5}  # per CPU second: a helper thread's time counts


def test_tiny_run_writes_tables_figure_and_scores(tmp_path):
    pytest.importorskip("rensa")
    pytest.importorskip("datasketch")
    res = tmp_path / "res"
    payload = peers.bench_peers(sizes=(600,), real=None, quality_sample=300, sig_docs=600, datasketch_sig_docs=200,
                        results=res, workdir=tmp_path)
    assert {r["tool"] for r in payload["end_to_end"]} == {"gpu_dedup", peers.SHARDS, peers.PLAIN, "rensa",
                                                          "datasketch"}
    by = {r["tool"]: r for r in payload["end_to_end"]}
    assert by["gpu_dedup"]["removed"] == by[peers.SHARDS]["removed"]  # the same run, with or without its shards
    kept = 600 - by[peers.SHARDS]["removed"]
    assert by[peers.SHARDS]["rows_written"] == kept  # it wrote the deduplicated shards ...
    assert by["gpu_dedup"]["rows_written"] == by[peers.PLAIN]["rows_written"] == 0  # ... the peers' workload none
    for r in payload["end_to_end"]:
        assert r["documents"] == 600 and r["removed"] > 0
        assert 0.0 <= r["recall"] <= 1.0 and 0.0 <= r["precision"] <= 1.0
    plain = next(r for r in payload["end_to_end"] if r["tool"] == peers.PLAIN)
    assert plain["recall"] >= 0.9 and plain["precision"] >= 0.8
    ours = next(r for r in payload["end_to_end"] if r["tool"] == "gpu_dedup")  # split_chains: true, the default
    assert ours["recall"] >= 0.9
    assert ours["precision"] == 1.0  # every removed document is >= threshold to its kept survivor
    assert {(r["tool"], r["threads"]) for r in payload["signatures"]} >= {("gpu_dedup", 1), ("rensa", 1),
                                                                           ("rensa_hashes", 1), ("datasketch", 1)}
    assert json.loads((res / "peers.json").read_text())["parameters"]["num_perm"] == 128
    assert "| planted-600 | gpu_dedup |" in (res / "peers.md").read_text()
    for r in (r for r in payload["end_to_end"] if "stages" in r):  # every second of gpu_dedup's wall booked
        assert sum(r["stages"].values()) + sum(r["fixed"].values()) == pytest.approx(r["report_seconds"], abs=0.01)
        assert {"startup", "kernel_load", "samples", "commit", "unbooked"} <= set(r["fixed"])
        outside = r["seconds"] - r["report_seconds"]  # the process's creation and exit (10 ms ticks)
        assert -0.02 < outside < 0.5 * r["seconds"]
    assert next(r for r in payload["end_to_end"] if r["tool"] == "datasketch")["candidates"] > 0
    assert (res / "peers.png").stat().st_size > 10_000


@pytest.mark.parametrize("layout,files,groups", [("files", 2, [1, 1]), ("one-row-group", 1, [1]),
                                                  ("many-row-groups", 1, [3])])
def test_corpus_layouts_hold_the_same_documents(tmp_path, monkeypatch, layout, files, groups):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from gpu_dedup.bench.workers import make_corpus

    monkeypatch.setattr(peers, "MANY_ROW_GROUP_ROWS", 900)
    make_corpus(tmp_path / "files", 2000, chunk=1000, words=(5, 20))
    make_corpus(tmp_path / layout, 2000, chunk=1000, words=(5, 20))
    peers.lay_out(tmp_path / layout, layout)
    paths = sorted((tmp_path / layout).glob("*.parquet"))
    assert len(paths) == files
    assert [pq.ParquetFile(p).metadata.num_row_groups for p in paths] == groups
    whole = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "files").glob("*.parquet"))])
    assert pa.concat_tables([pq.read_table(p) for p in paths]).equals(whole)


def test_datatrove_runs_its_minhash_steps_beside_gpu_dedup(tmp_path):
    """datatrove's four MinhashDedup steps on the planted corpus (in shards), scored like every peer."""
    for module in ("datatrove", "spacy", "xxhash", "tokenizers"):
        pytest.importorskip(module)
    res = tmp_path / "res"
    payload = peers.bench_peers(sizes=(600,), real=None, tools=["gpu_dedup", "datatrove"], quality_sample=300, sig_docs=600,
                        results=res, workdir=tmp_path)
    by = {r["tool"]: r for r in payload["end_to_end"]}
    dt = by["datatrove"]
    assert dt["documents"] == 600 and dt["shards"] == peers.DATATROVE_SHARDS and dt["texts_with_digits"] == 0
    assert dt["removed"] > 0 and dt["recall"] >= 0.8 and 0.0 < dt["precision"] <= 1.0
    assert by["gpu_dedup"]["recall"] >= 0.9
    md = (res / "peers.md").read_text()
    assert "| planted-600 | datatrove |" in md and "letters only (0 texts with a digit" in md
    assert payload["versions"]["datatrove"]
