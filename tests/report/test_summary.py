"""Report numbers made without bringing per-document values together: the similarity quantiles found by
narrowing histograms equal numpy's, whatever the partitions."""

import numpy as np
import pytest

from gpu_dedup.report import build


class InProcess:
    """The one executor method similarity_summary uses, over a list of parts in this process."""

    def collect(self, fn, parts, **kw):
        return [fn(p, **kw) for p in parts]


def values(part):
    return part


@pytest.mark.parametrize("split", [6, 1])
@pytest.mark.parametrize("gather", [4096, 7])
@pytest.mark.parametrize("kind", ["uniform", "ties", "one", "cosine", "fractions"])
def test_quantiles_over_parts_equal_numpy(monkeypatch, gather, kind, split):
    """Values in 0..1 (the first narrowing pass counted with the first statistics) or not (cosine); in several
    parts (narrowed) or one (its own order statistics)."""
    monkeypatch.setattr(build, "GATHER_AT_MOST", gather)  # 7: every quantile found by narrowing
    rng = np.random.default_rng(len(kind) * 31 + gather)
    fractions = np.array([a / b for b in range(70, 90) for a in range(56, b + 1)])  # Jaccard-like, many ties
    v = {"uniform": rng.random(20_000), "ties": np.round(rng.random(20_000), 2),
         "one": np.array([0.83]), "cosine": rng.uniform(-1, 1, 5_000),
         "fractions": np.concatenate((rng.choice(fractions, 20_000), np.ones(15_000), np.zeros(3)))}[kind]
    parts = np.array_split(v, split)
    got = build.similarity_summary(InProcess(), parts, values, 0.8)
    want = {f"p{int(q * 100)}": round(float(x), 4) for q, x in zip(build.QUANTILES, np.quantile(v, build.QUANTILES))}
    assert got["quantiles"] == want
    assert got["n"] == v.shape[0] and got["below"] == int((v < 0.8).sum())
    assert got["hist"] == np.histogram(v, bins=got["edges"])[0].tolist() and sum(got["hist"]) == v.shape[0]
    assert got["edges"] == (build.WIDE_BINS if kind == "cosine" else build.SIMILARITY_BINS).tolist()


def test_the_similarity_histogram_counts_every_removed_document():
    """Cosine similarity to a survivor reached through a chain can be below 0: the histogram had bins over
    0..1 only and dropped those documents, so the report's chaining figure showed 14 of 32 removed near
    duplicates (a cosine run with verify.method none).  Every value is counted: where some are below 0 the
    bins cover -1..1, else 0..1 as before (values a rounding past 1 go in the last bin)."""
    v = np.array([-0.0766, -0.0766, -0.3, -1.0, 0.0, 0.48, 0.87, 1.0, 1.0000001])
    got = build.similarity_summary(InProcess(), np.array_split(v, 3), values, 0.5)
    assert sum(got["hist"]) == got["n"] == 9 and got["edges"][0] == -1.0 and len(got["hist"]) == 40
    assert got["hist"][0] == 1 and got["hist"][18] == 2 and got["hist"][-1] == 2
    jaccard = build.similarity_summary(InProcess(), [v[v >= 0]], values, 0.5)
    assert jaccard["edges"] == build.SIMILARITY_BINS.tolist() and sum(jaccard["hist"]) == 5


def test_every_quantile_is_narrowed_in_the_same_passes(monkeypatch):
    """One pass over the parts serves every rank: a cluster's report waits on a few rounds of tasks, not on
    two or more per quantile."""
    monkeypatch.setattr(build, "GATHER_AT_MOST", 7)
    v = np.random.default_rng(5).random(50_000)
    calls = []

    class Counting(InProcess):
        def collect(self, fn, parts, **kw):
            calls.append(fn.__name__)
            return super().collect(fn, parts, **kw)

    got = build.similarity_summary(Counting(), np.array_split(v, 4), values, 0.8)
    assert got["quantiles"]["p50"] == round(float(np.quantile(v, 0.5)), 4)
    assert calls[0] == "_value_stats" and 1 < len(calls) <= 5, calls


def test_one_part_gives_its_values_once():
    """A one-process run's removed near duplicates are one part: their values are taken once (on a GPU, one
    copy to the host) and the part answers the quantiles itself, with no narrowing passes."""
    v = np.random.default_rng(9).random(30_000)
    calls, taken = [], []

    class Counting(InProcess):
        def collect(self, fn, parts, **kw):
            calls.append(fn.__name__)
            return super().collect(fn, parts, **kw)

    def once(part):
        taken.append(1)
        return part

    got = build.similarity_summary(Counting(), [v], once, 0.8)
    assert calls == ["_value_stats"] and len(taken) == 1
    assert got["quantiles"]["p25"] == round(float(np.quantile(v, 0.25)), 4)


def test_histogram_is_numpys():
    """The 20 similarity bins by a binary search each: the edges, 1.0 (in the last bin), values outside and NaN
    (in none) as ``np.histogram`` counts them."""
    rng = np.random.default_rng(3)
    edges = build.SIMILARITY_BINS
    v = np.concatenate((rng.random(5_000), edges, np.nextafter(edges, 2.0), np.nextafter(edges, -1.0),
                        [-0.5, 1.5, np.nan, 1.0, 1.0, 0.0]))
    assert build._histogram(v, edges).tolist() == np.histogram(v, bins=edges)[0].tolist()
    assert build._histogram(v[:0], edges).tolist() == [0] * 20


def test_no_values_no_quantiles():
    got = build.similarity_summary(InProcess(), [np.zeros(0), np.zeros(0)], values, 0.8)
    assert got == {"n": 0, "below": 0, "hist": [0] * 20, "edges": build.SIMILARITY_BINS.tolist(), "quantiles": {}}


def test_size_histograms_from_counts():
    sizes = np.array([2, 2, 3, 4, 5, 9, 17, 2])
    counts = dict(zip(*np.unique(sizes, return_counts=True)))
    assert build.log2_histogram(counts) == {"2": 3, "3-4": 2, "5-8": 1, "9-16": 1, "17-32": 1}
    assert build.size_counts({"3": 1, 2: 3}) == {"sizes": [2, 3], "counts": [3, 1]}  # JSON keys read back


def test_a_resumed_runs_seconds_add_up_in_the_summary_and_the_page():
    """A resumed run's report keeps the earlier run's seconds of the stages it resumed (``resumed: true``), which
    are not in its wall time: the summary listed them as this run's ("verify 0.18, ...; total 0.10s") and the page
    gave them a share of a total that mixed both runs (verify 50.8%).  The summary says ``resumed`` for them, the
    page leaves their share empty, and the shares of this run's stages add up to 100%."""
    import re

    from gpu_dedup.report.page import render

    report = {"counts": {"documents_read": 4, "kept": 3, "removed": 1, "exact_duplicates": 0, "near_duplicates": 1,
                         "clusters": 1, "candidate_edges": 1, "verified_edges": 1},
              "lsh": {"bands": 2, "rows": 2, "threshold": 0.5, "false_positive_area": 0.1, "false_negative_area": 0.1},
              "inputs": [], "config": {"verify": {"method": "exact"}}, "backend": "cpu", "peak_rss_mb": 1.0,
              "stages": {"read": {"seconds": 0.25}, "verify": {"seconds": 9.0, "resumed": True},
                         "write": {"seconds": 0.75}},
              "fixed_seconds": {"setup": 0.5}, "unbooked_seconds": 0.0, "wall_seconds": 1.5}
    text = build.summary(report)
    assert "read 0.25, verify resumed, write 0.75" in text and "9.00" not in text
    page = render(report, figs=None)
    shares = re.findall(r'<td>(\w+)</td><td class="n">[\d.]+</td><td class="n">([\d.]*)%?</td>', page)
    assert shares == [("read", "25.0"), ("verify", ""), ("write", "75.0")], shares
