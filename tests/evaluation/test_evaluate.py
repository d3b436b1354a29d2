import itertools

import numpy as np

from gpu_dedup.evaluation.evaluate import (
    cluster_pairs,
    pair_precision,
    pair_recall,
    sample_cluster_pairs,
)


def test_cluster_pairs_equal_brute_force():
    rng = np.random.default_rng(0)
    labels = rng.integers(-1, 15, 120)
    left, right = cluster_pairs(labels, ignore=-1)
    brute = {(i, j) for i, j in itertools.combinations(range(120), 2) if labels[i] == labels[j] != -1}
    assert set(zip(left.tolist(), right.tolist())) == brute and len(left) == len(brute)


def test_recall_and_precision():
    truth = np.array([0, 0, 0, 1, 1, -1])
    pred = np.array([0, 0, 2, 3, 3, 5])
    left, right = cluster_pairs(truth, ignore=-1)
    assert pair_recall(pred, left, right) == 2 / 4
    assert pair_precision(pred, truth, ignore=-1) == 1.0
    assert pair_precision(np.array([0, 0, 0, 0, 4, 4]), truth, ignore=-1) == 3 / 7


def _enumerated_precision(pred, truth, ignore):  # the definition: over every predicted same-cluster pair
    pairs = [(i, j) for i, j in itertools.combinations(range(len(pred)), 2) if pred[i] == pred[j]]
    if not pairs:
        return 1.0
    return sum(truth[i] == truth[j] and (ignore is None or truth[i] != ignore) for i, j in pairs) / len(pairs)


def test_pair_precision_from_counts_equals_enumerated_pairs():
    rng = np.random.default_rng(3)
    for trial in range(30):
        n = int(rng.integers(0, 60))
        pred, truth = rng.integers(0, 8, n), rng.integers(-1, 6, n)
        for ignore in (-1, None):
            assert pair_precision(pred, truth, ignore=ignore) == pytest.approx(
                _enumerated_precision(pred, truth, ignore), abs=1e-15)


def test_pair_precision_of_a_huge_cluster_is_counted_not_enumerated():
    pred = np.zeros(200_000, np.int64)  # 2 * 10^10 predicted pairs: enumerating them cannot fit
    truth = np.repeat(np.arange(2), 100_000)
    assert pair_precision(pred, truth) == pytest.approx(2 * (100_000 * 99_999 // 2) / (200_000 * 199_999 // 2))


def test_sample_cluster_pairs_is_every_pair_within_the_bound():
    labels = np.random.default_rng(0).integers(-1, 15, 120)
    every = cluster_pairs(labels, ignore=-1)
    got = sample_cluster_pairs(labels, max_pairs=len(every[0]), ignore=-1)
    assert all(np.array_equal(a, b) for a, b in zip(got, every))


def test_sample_cluster_pairs_bounds_a_large_cluster_and_keeps_the_small_ones():
    labels = np.concatenate([np.zeros(5000, np.int64), np.repeat(np.arange(1, 301), 3), -np.ones(50, np.int64)])
    assert len(cluster_pairs(labels, ignore=-1, max_pairs=10**8)[0]) == 5000 * 4999 // 2 + 900
    left, right = sample_cluster_pairs(labels, max_pairs=20_000, ignore=-1, seed=1)
    assert 15_000 < len(left) <= 20_000 and (left < right).all()
    assert (labels[left] == labels[right]).all() and (labels[left] != -1).all()
    assert len(set(zip(left.tolist(), right.tolist()))) == len(left)  # no pair twice
    small = labels[left] > 0
    assert small.sum() == 900  # every pair of every small cluster
    members = np.unique(np.concatenate([left[~small], right[~small]]))
    m = len(members)
    assert (~small).sum() == m * (m - 1) // 2 and m < 5000  # every pair of a random subset of the big one
    again = sample_cluster_pairs(labels, max_pairs=20_000, ignore=-1, seed=1)
    assert np.array_equal(again[0], left) and np.array_equal(again[1], right)  # deterministic per seed
    other = sample_cluster_pairs(labels, max_pairs=20_000, ignore=-1, seed=2)
    assert not np.array_equal(other[0], left)


def test_sample_cluster_pairs_with_more_clusters_than_pairs():
    labels = np.repeat(np.arange(1000), 2)
    left, right = sample_cluster_pairs(labels, max_pairs=100)
    assert len(left) == 100 and len(np.unique(labels[left])) == 100 and (labels[left] == labels[right]).all()


# ---------------------------------------------------------------- exact all-pairs, ARI, evaluate

import json  # noqa: E402
import unicodedata  # noqa: E402

import pyarrow as pa  # noqa: E402
import pytest  # noqa: E402
from gpu_dedup.kernels.params import hash_params  # noqa: E402

from gpu_dedup.backends import get_backend  # noqa: E402
from gpu_dedup.backends.strings import string_buffers  # noqa: E402
from gpu_dedup.config import Config  # noqa: E402
from gpu_dedup.evaluation.evaluate import (
    adjusted_rand_index,
    all_pairs_jaccard,
    evaluate,
    label_codes,
    summary,
)
from gpu_dedup.evaluation.sample import planted_corpus, write_shards  # noqa: E402
from gpu_dedup.stages.normalize import normalize  # noqa: E402
from tests import reference as ref  # noqa: E402


def ref_normalize(text):
    """Default normalization in plain Python (ASCII corpora)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(c for c in text if not unicodedata.category(c).startswith("P"))
    return " ".join(text.split())


def brute_force_jaccard(texts, kind="word", n=5):
    """{(i, j): J} for every pair i < j, from the oracle's shingle strings (a Python double loop)."""
    sets = [ref.shingle_strings(t, kind, n) for t in texts]
    out = {}
    for i, j in itertools.combinations(range(len(texts)), 2):
        union = len(sets[i] | sets[j])
        out[(i, j)] = len(sets[i] & sets[j]) / union if union else 0.0
    return out


@pytest.fixture(scope="module")
def small_planted():
    s = planted_corpus(n_docs=160, n_clusters=32, cluster_size=(2, 5), words=(40, 120), edit_rate=(0.0, 0.08), seed=4)
    texts = s.table.column("text").to_pylist()
    return s, [ref_normalize(t) for t in texts]


@pytest.mark.parametrize("chunk_entries", [20_000_000, 50])
def test_all_pairs_jaccard_equals_brute_force(small_planted, chunk_entries):
    s, norm = small_planted
    strings = string_buffers(normalize(s.table.column("text")))
    off, val = get_backend("cpu").shingle_sets(strings, hash_params(42, 128), "word", 5)
    left, right, jac = all_pairs_jaccard(off, val, floor=0.2, chunk_entries=chunk_entries)
    brute = {k: v for k, v in brute_force_jaccard(norm).items() if v >= 0.2}
    assert len(brute) > 60  # planted pairs spread over the similarity range
    assert list(zip(left.tolist(), right.tolist())) == sorted(brute)
    assert np.allclose(jac, [brute[k] for k in sorted(brute)], rtol=0, atol=1e-12)


def test_all_pairs_jaccard_empty_sets_and_floor():
    off = np.array([0, 0, 2, 4, 4])  # docs 0 and 3 empty; 1 and 2 share one of three shingles
    val = np.array([5, 7, 7, 9], np.uint64)
    l, r, j = all_pairs_jaccard(off, val, floor=0.3)
    assert l.tolist() == [1] and r.tolist() == [2] and j[0] == pytest.approx(1 / 3)
    assert all_pairs_jaccard(off, val, floor=0.4)[0].shape[0] == 0
    with pytest.raises(ValueError, match="floor = 0 must be in"):
        all_pairs_jaccard(off, val, floor=0)


def ari_pair_counting(x, y):
    """ARI from the 2x2 pair-counting table (Steinley 2004): a Python double loop."""
    a = b = c = d = 0
    for i, j in itertools.combinations(range(len(x)), 2):
        sx, sy = x[i] == x[j], y[i] == y[j]
        a += sx and sy
        b += sx and not sy
        c += sy and not sx
        d += not sx and not sy
    den = (a + b) * (b + d) + (a + c) * (c + d)
    return 1.0 if den == 0 else 2.0 * (a * d - b * c) / den


@pytest.mark.parametrize("seed", range(6))
def test_adjusted_rand_index_equals_pair_counting(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 90))
    x = rng.integers(0, int(rng.integers(1, 12)), n)
    y = np.where(rng.random(n) < 0.6, x, rng.integers(0, 12, n))
    assert adjusted_rand_index(x, y) == pytest.approx(ari_pair_counting(x.tolist(), y.tolist()), abs=1e-12)


def test_adjusted_rand_index_edge_cases():
    x = np.array([0, 0, 1, 1, 2])
    assert adjusted_rand_index(x, np.array([7, 7, 3, 3, 9])) == 1.0  # same partition, other names
    assert adjusted_rand_index(np.arange(5), np.arange(5)) == 1.0
    assert adjusted_rand_index(x, np.array(["a", "a", "b", "b", "c"])) == 1.0
    assert adjusted_rand_index(np.array([0, 0, 0, 1, 1, 1]), np.array([0, 1, 0, 1, 0, 1])) < 0.1
    with pytest.raises(ValueError, match="different lengths"):
        adjusted_rand_index(x, x[:3])


def test_label_codes_make_nulls_singletons():
    codes = label_codes(pa.array(["a", None, "a", "b", None]))
    assert codes[0] == codes[2] and len(set(codes.tolist())) == 4
    codes = label_codes(pa.array([1.0, float("nan"), 1.0, None]))
    assert codes[0] == codes[2] and len(set(codes.tolist())) == 3


def _oracle_misses(norm, t, bands, rows, num_perm, method, cluster):
    """Pure-Python account of the pipeline's misses: buckets, star edges, verification, components."""
    n = len(norm)
    brute = brute_force_jaccard(norm)
    prm = ref.params(42, num_perm)
    first = {}
    rep = [first.setdefault(x, i) for i, x in enumerate(norm)]
    sets = [ref.shingle_strings(x, "word", 5) for x in norm]
    sig = [ref.signature(x, "word", 5, prm) for x in norm]
    bh = [ref.band_hashes(s_, bands, rows, prm["band_base"]) for s_ in sig]
    table = {}
    for i in range(n):
        if rep[i] == i and sets[i]:
            for band, h in enumerate(bh[i]):
                table.setdefault((band, h), []).append(i)
    star = {(min(m), x) for m in table.values() if len(m) > 1 for x in m if x != min(m)}

    def sim(a, b):
        if method == "exact":
            return brute[(min(a, b), max(a, b))]
        return sum(p == q for p, q in zip(sig[a], sig[b])) / num_perm

    verified = [e for e in star if sim(*e) >= t]
    comp = ref.connected_components(n, verified + [(i, rep[i]) for i in range(n) if rep[i] != i])
    counts = {"pairs_missed": 0, "never_candidate": 0, "candidate_edge_rejected_by_verification": 0,
              "candidate_not_connected_through_bucket_centre": 0, "left_in_output": 0}
    bins = {}
    for (i, j), v in brute.items():
        if v < 0.3:
            continue
        cand = any(p == q for p, q in zip(bh[i], bh[j]))
        k = min(int(round((v - 0.3) / 0.05, 9)), 14) if v < 1 else 14
        bins.setdefault(k, [0, 0])
        bins[k][0] += 1
        bins[k][1] += cand
        if v < t or cluster[i] == cluster[j]:
            continue
        assert comp[i] != comp[j]  # the pipeline's clusters are the oracle's components
        counts["pairs_missed"] += 1
        counts["left_in_output"] += cluster[i] == i and cluster[j] == j
        if not cand:
            counts["never_candidate"] += 1
        elif (min(rep[i], rep[j]), max(rep[i], rep[j])) in star:
            counts["candidate_edge_rejected_by_verification"] += 1
        else:
            counts["candidate_not_connected_through_bucket_centre"] += 1
    return counts, bins


@pytest.mark.parametrize("method", ["exact", "signature"])
def test_miss_classification_and_bins_equal_a_pure_python_oracle(small_planted, tmp_path, method):
    s, norm = small_planted
    write_shards(s.table.select(["id", "text"]), tmp_path / "in", shards=2)
    # a coarse layout and plain star edges (the oracle's): misses of every kind occur on this corpus (the
    # layout is hash-dependent: chosen for hash family v2 so that each kind of miss is present)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "lsh": {"threshold": 0.7, "bands": 5,
                            "rows": 2, "star_rounds": 1}, "minhash": {"num_perm": 24}, "verify": {"method": method},
                            "select": {"split_chains": False}})
    report = evaluate(tmp_path / "in", cfg, sample=0, floor=0.3, plot=False, keep_runs=True, output_dir=tmp_path / "e")
    run = report["runs"]["components"]
    import pyarrow.parquet as pq

    dup = pq.read_table(tmp_path / "e" / "runs" / "components" / "duplicates.parquet").to_pandas()
    row = {i: k for k, i in enumerate(s.table.column("id").to_pylist())}
    cluster = np.arange(len(norm))
    cluster[[row[i] for i in dup.id]] = [row[i] for i in dup.survivor_id]
    counts, bins = _oracle_misses(norm, 0.7, 5, 2, 24, method, cluster)
    m = run["misses"]
    # a coarse layout misses pairs both ways: never a candidate, and lost around a dissimilar bucket centre
    assert counts["never_candidate"] > 0 and counts["candidate_not_connected_through_bucket_centre"] > 0
    if method == "signature":
        assert counts["candidate_edge_rejected_by_verification"] > 0  # estimates below t for pairs above it
    assert run["output"]["duplicate_pairs_left_in_output"] == counts.pop("left_in_output")
    for key, value in counts.items():
        assert m[key] == value, key
    assert m["connected_but_split_by_split_chains"] == 0 and m["verified_edge_not_coclustered"] == 0
    got = {k: [b["pairs"], round(b["candidate_rate"] * b["pairs"])] for k, b in enumerate(run["bins"]) if b["pairs"]}
    assert got == {k: v for k, v in bins.items()}


@pytest.fixture(scope="module")
def planted_eval(tmp_path_factory):
    d = tmp_path_factory.mktemp("eval")
    s = planted_corpus(n_docs=2000, n_clusters=160, cluster_size=(2, 6), words=(40, 250), edit_rate=(0.0, 0.06),
                       seed=11)
    cl = np.asarray(s.table.column("cluster"))
    table = s.table.set_column(2, "cluster", pa.array(np.where(cl < 0, None, cl), pa.int64()))
    write_shards(table.select(["id", "text", "cluster"]), d / "in", shards=2)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    report = evaluate(d / "in", cfg, output_dir=d / "out", sample=1500, seed=3, label_column="cluster",
                      compare_split_chains=True, lsh_seeds=4)
    return d, report


def test_targets_at_the_default_config_on_a_planted_corpus(planted_eval):
    d, report = planted_eval
    run = report["runs"]["components"]
    assert report["corpus"]["sample"] == 1500 and report["corpus"]["documents"] == 2000
    p, v = run["pairs"], run["verified_edges"]
    assert p["pairs_at_or_above_threshold_plus_0.05"] >= 150
    assert v["precision"] == 1.0 and v["edges"] > 50 and v["max_abs_difference_pipeline_vs_exact"] < 1e-12
    assert p["recall_at_threshold_plus_0.05"] >= 0.99
    assert all(t["met"] for t in run["targets"].values())
    # the default (split chains) meets them too, its recall measured on the output
    split = report["runs"]["split_chains"]
    assert split["run"]["split_chains"] is True and all(t["met"] for t in split["targets"].values())
    assert split["output"]["removal_recall_at_threshold_plus_0.05"] >= 0.99
    m = run["misses"]
    parts = ("never_candidate", "candidate_edge_rejected_by_verification",
             "candidate_not_connected_through_bucket_centre", "connected_but_split_by_split_chains")
    assert m["pairs_missed"] == sum(m[k] for k in parts)
    assert m["verified_edge_not_coclustered"] == 0 and m["candidate_edge_rejected_by_verification"] == 0
    assert p["pairs_at_or_above_threshold"] - m["pairs_missed"] == p["coclustered_pairs_at_or_above_threshold"]


def test_candidate_rate_follows_the_s_curve(planted_eval):
    _, report = planted_eval
    checked = 0
    for b in report["runs"]["components"]["bins"]:
        if b["distinct_text_pairs"] >= 40:
            e, m = b["distinct_s_curve_mean"], b["distinct_text_pairs"]
            assert abs(b["distinct_candidate_rate"] - e) <= 4 * np.sqrt(e * (1 - e) / m) + 0.02, b
            assert b["distinct_text_pairs"] <= b["pairs"]
            checked += 1
    assert checked >= 5


def test_candidate_rate_over_seeds(planted_eval):
    _, report = planted_eval
    over = report["candidate_rate_over_seeds"]
    bins = report["runs"]["components"]["bins"]
    assert over["seeds"] == [42, 43, 44, 45] and len(over["per_seed"]) == 4
    # the first seed is the run's own: the same rates as the run's bins
    assert over["per_seed"][0] == [b["distinct_candidate_rate"] for b in bins]
    assert over["distinct_text_pairs"] == [b["distinct_text_pairs"] for b in bins]
    assert len({tuple(x) for x in over["per_seed"]}) > 1  # other seeds, other outcomes
    for m, lo, hi, e, c in zip(over["mean"], over["min"], over["max"], over["s_curve_mean"],
                               over["distinct_text_pairs"]):
        if c >= 40:
            assert lo <= m <= hi and abs(m - e) <= 2 * np.sqrt(e * (1 - e) / c) + 0.02
    assert "MinHash seeds" in summary(report)


def test_cluster_quality_and_chaining_sections(planted_eval):
    d, report = planted_eval
    merged, split = report["runs"]["components"], report["runs"]["split_chains"]
    c = merged["clusters"]
    assert 0.9 <= c["ari_vs_ideal_components"] <= 1.0
    assert 0.0 < c["ari_vs_labels"] <= 1.0 and c["labelled_clusters"] > 100
    # planted variants with heavy edits fall below the threshold: the labels are a looser truth
    assert c["ari_ideal_components_vs_labels"] < 1.0
    assert merged["chaining"]["below_threshold_to_survivor"] > 0
    assert split["chaining"]["below_threshold_to_survivor"] == 0
    assert split["run"]["split_chains"] is True and split["run"]["counts"]["chain_split_ejected"] > 0
    assert split["misses"]["connected_but_split_by_split_chains"] > 0
    assert split["pairs"]["cluster_pair_precision"] >= merged["pairs"]["cluster_pair_precision"]
    target = split["targets"]["recall_at_threshold_plus_0.05_at_least_0.99"]
    assert target["measure"] == "pairs not both kept"
    assert target["value"] == split["output"]["removal_recall_at_threshold_plus_0.05"]
    # pairs in one cluster are never both kept: the output's recall is at least the clusters'
    for run in (merged, split):
        o, p = run["output"], run["pairs"]
        assert o["removal_recall_at_threshold"] >= p["recall_at_threshold"]
    # the output: documents both kept although similar, counted from the run's clusters
    for run in (merged, split):
        o = run["output"]
        assert o["kept"] == run["run"]["counts"]["kept"] and o["kept"] + o["removed"] == 1500
        assert 0 <= o["duplicate_pairs_left_in_output"] <= run["misses"]["pairs_missed"]
    assert split["output"]["removed_below_threshold_to_survivor"] == 0
    h = merged["chaining"]["similarity_to_survivor_histogram"]
    assert sum(h["counts"]) == merged["chaining"]["near_duplicates_removed"] and len(h["edges"]) == 21
    # written outputs
    saved = json.loads((d / "out" / "evaluation.json").read_text())
    assert saved["runs"]["components"]["pairs"] == merged["pairs"]
    assert "recall" in summary(report) and "ARI vs ideal components" in summary(report)


def test_evaluate_rejects_bad_arguments(planted_eval, tmp_path):
    d, _ = planted_eval
    cfg = Config(backend="cpu")
    with pytest.raises(ValueError, match="floor = 0.9 must be in"):
        evaluate(d / "in", cfg, sample=100, floor=0.9, plot=False)
    with pytest.raises(ValueError, match="sample = -1 must be >= 0"):
        evaluate(d / "in", cfg, sample=-1, plot=False)
    with pytest.raises(ValueError, match="lsh_seeds = 0 must be >= 1"):
        evaluate(d / "in", cfg, sample=50, plot=False, lsh_seeds=0)


def test_miss_classification_on_a_constructed_case():
    from gpu_dedup.evaluation.evaluate import exact_truth, score_run
    from gpu_dedup.stages.edges import Edges

    words = [f"w{k}" for k in range(100)]
    a = " ".join(words)
    b = " ".join(words[:50] + ["changed"] + words[51:])  # 5 of 96 word 5-grams differ: J = 91 / 101
    c = " ".join(f"x{k}" for k in range(100))
    cfg = Config.from_dict({"backend": "cpu", "select": {"split_chains": False}})
    truth = exact_truth(pa.array([a, b, c]), cfg, floor=0.3)
    assert truth.left.tolist() == [0] and truth.right.tolist() == [1] and truth.jaccard[0] == pytest.approx(91 / 101)
    none = Edges(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
    star = Edges(np.array([0]), np.array([1]), np.array([91 / 101]))  # the pair the run scored
    apart = np.array([0, 1, 2])
    # a candidate whose own star edge (bucket centre 0 -> 1) was scored and not verified
    m = score_run(truth, apart, none, cfg, scored=star)["misses"]
    assert m["pairs_missed"] == 1 and m["candidate_edge_rejected_by_verification"] == 1
    assert m["never_candidate"] == 0
    # a verified edge whose ends are not in one cluster: a broken pipeline, reported
    m = score_run(truth, apart, star, cfg, scored=star)["misses"]
    assert m["verified_edge_not_coclustered"] == 1
    # one band of 128 rows: P(candidate) = J^128 ~ 1e-6: never a candidate
    narrow = cfg.with_overrides({"lsh.bands": 1, "lsh.rows": 128})
    run = score_run(truth, apart, none, narrow, scored=none)
    assert run["misses"]["never_candidate"] == 1 and run["pairs"]["candidate_pairs_at_or_above_floor"] == 0
    assert run["output"]["duplicate_pairs_left_in_output"] == 1
    # found: nothing missed, precision 1
    ok = score_run(truth, np.array([0, 0, 2]), star, cfg, scored=star)
    assert ok["misses"]["pairs_missed"] == 0 and ok["pairs"]["recall_at_threshold"] == 1.0
    assert ok["verified_edges"]["precision"] == 1.0 and ok["pairs"]["cluster_pair_precision"] == 1.0
    assert ok["chaining"]["near_duplicates_removed"] == 1 and ok["output"]["removed"] == 1


def test_blank_texts_are_exact_copies_not_false_pairs(tmp_path):
    import pyarrow.parquet as pq

    texts = [None, "", "   ", "!!!", "hi there", "hi there", None, "one two three four five six seven eight"]
    pq.write_table(pa.table({"text": pa.array(texts, pa.string())}), tmp_path / "x.parquet")
    for exact in (True, False):  # "", "   ", "!!!" are one empty text (3 pairs); "hi there" twice (1 pair)
        cfg = Config.from_dict({"backend": "cpu", "exact_dedup": exact, "minhash": {"ngram": 3},
                                "select": {"split_chains": False}})
        run = evaluate(tmp_path / "x.parquet", cfg, sample=0, plot=False)["runs"]["components"]
        p = run["pairs"]
        # without the exact stage blank texts have no shingle and stay alone; "hi there" still pairs by LSH
        assert p["coclustered_pairs"] == (4 if exact else 1) and p["cluster_pair_precision"] == 1.0
        ideal = [0, 1, 1, 1, 4, 4, 6, 7]
        pred = ideal if exact else [0, 1, 2, 3, 4, 4, 6, 7]
        assert run["clusters"]["ari_vs_ideal_components"] == pytest.approx(adjusted_rand_index(pred, ideal))


def test_evaluate_never_overwrites_files_it_did_not_write_nor_writes_into_its_inputs(planted_eval, tmp_path):
    from gpu_dedup.errors import OutputError

    d, _ = planted_eval
    cfg = Config(backend="cpu")
    (tmp_path / "json").mkdir()
    (tmp_path / "json" / "evaluation.json").write_text('{"mine": 1}\n')
    (tmp_path / "png").mkdir()
    (tmp_path / "png" / "evaluation.png").write_bytes(b"mine")
    with pytest.raises(OutputError, match="evaluation.json' exists and was not written by gpu_dedup"):
        evaluate(d / "in", cfg, output_dir=tmp_path / "json", sample=50, plot=False)
    with pytest.raises(OutputError, match="evaluation.png' exists and was not written by gpu_dedup"):
        evaluate(d / "in", cfg, output_dir=tmp_path / "png", sample=50, plot=False)
    assert (tmp_path / "json" / "evaluation.json").read_text() == '{"mine": 1}\n'
    assert (tmp_path / "png" / "evaluation.png").read_bytes() == b"mine"
    with pytest.raises(OutputError, match="is inside the input directory"):  # its .json would be read as a shard
        evaluate(d / "in", cfg, output_dir=d / "in", sample=50, plot=False)
    assert not (d / "in" / "evaluation.json").exists()
    evaluate(d / "in", cfg, output_dir=tmp_path / "ours", sample=50, plot=False)
    evaluate(d / "in", cfg, output_dir=tmp_path / "ours", sample=50, plot=False)  # its own file: rewritten


def test_a_missing_label_column_names_the_option(planted_eval, tmp_path):
    from gpu_dedup.errors import InputError

    d, _ = planted_eval
    with pytest.raises(InputError) as exc:
        evaluate(d / "in", Config(backend="cpu"), sample=50, plot=False, label_column="nope")
    assert "label column 'nope' is not in shard" in str(exc.value) and "--label-column" in str(exc.value)
    assert "id_column" not in str(exc.value)


def test_bad_evaluate_arguments_are_configuration_errors(planted_eval, capsys):
    from gpu_dedup.cli import main

    d, _ = planted_eval
    for extra in (["--sample", "-1"], ["--floor", "2"], ["--lsh-seeds", "0"]):
        assert main(["evaluate", str(d / "in"), "-o", str(d / "bad"), "--backend", "cpu", "-q", *extra]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_the_summary_of_seeds_without_a_bin_of_100_pairs_claims_no_gap():
    """On a small sample no similarity bin holds 100 pairs: the summary said "the mean is within 0.0000 of the
    S-curve in every bin with >= 100 pairs (largest gap in the bin from 0.00)", a gap of no bin; it says there
    is none to compare instead."""
    corpus = {"sample": 3000, "documents": 3000, "seed": 0, "exact_pairs_at_or_above_floor": 1045, "floor": 0.3,
              "seconds": {"all_pairs": 0.1}}
    over = {"seeds": [42, 43], "bin_lo": [0.5, 0.8], "distinct_text_pairs": [36, 68], "mean": [0.3, 0.9],
            "s_curve_mean": [0.09, 0.97]}
    text = " ".join(summary({"corpus": corpus, "candidate_rate_over_seeds": over, "runs": {}}).split())
    assert "within 0.0000" not in text and "every bin with >= 100 pairs" not in text
    assert "candidate rate over 2 MinHash seeds: no similarity bin has >= 100 pairs" in text
    over["distinct_text_pairs"] = [136, 168]
    text = " ".join(summary({"corpus": corpus, "candidate_rate_over_seeds": over, "runs": {}}).split())
    assert "the mean is within 0.2100 of the S-curve in every bin with >= 100 pairs (largest gap in the bin from 0.50)" \
        in text


@pytest.mark.parametrize("shards", [
    [{"label": [[1], [2], None]}],  # nested labels
    [{"label": [1, 2, 3]}, {"label": ["a", "b", "c"]}],  # two types across shards
])
def test_a_wrong_label_column_names_label_column_not_the_id_options(tmp_path, capsys, shards):
    """The label column is read as the id column; its errors were translated in part: a nested or mixed-type
    label column said "choose another --id-column, or --no-id-column to name documents by row" or "make the id
    column one type ... or pass --no-id-column", options that do not apply to evaluate --label-column."""
    import pyarrow.parquet as pq

    from gpu_dedup.cli import main

    words = " ".join(f"w{i}" for i in range(40))
    for i, cols in enumerate(shards):
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(pa.table({"text": [words, words + " x", f"other {i}"], **cols}), tmp_path / "in" / f"{i}.parquet")
    code = main(["evaluate", str(tmp_path / "in"), "-o", str(tmp_path / "ev"), "--no-plot", "--backend", "cpu",
                 "--label-column", "label"])
    err = capsys.readouterr().err
    assert code == 3 and "label column 'label'" in err and "Traceback" not in err, err
    assert "--id-column" not in err and "--no-id-column" not in err and "id column" not in err, err
