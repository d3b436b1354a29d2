"""The report's sample clusters (largest, most near duplicates, closest to the threshold) equal a plain
reference that sorts every row and cluster, whatever the partitions, ties, row numbers and array module."""

import sys

import numpy as np
import pyarrow as pa
import pytest

from gpu_dedup.report import build
from tests.fake_cupy import fake_cupy

THRESHOLD = 0.75  # gaps to it tie exactly: similarities are multiples of 1/8


class InProcess:
    """The executor methods examples_from_parts uses, over a list of parts in this process."""

    def collect(self, fn, parts, **kw):
        return [fn(p, **kw) for p in parts]

    def take(self, rows, column):
        return pa.array([f"text of {r}" for r in np.asarray(rows).tolist()])


class Corpus:
    def __init__(self, rows):
        self.shards = [type("Shard", (), {"rows": rows, "name": "s"})()]
        self.id_generated = True


def select_rows(seed: int, clusters: int, spread: int):
    """Rows as the select stage leaves them (``node``, ``survivor``, ``kept``, ``exact``, ``similarity``), in
    no order: clusters of few sizes (many tied), a survivor each, removed members exact or near with
    similarities of few values (tied gaps to THRESHOLD); row ``r`` is node ``first_doc + r * spread``."""
    rng = np.random.default_rng(seed)
    sizes = rng.choice([1, 2, 3, 5, 5, 8, 8, 13], clusters)
    n = int(sizes.sum())
    rows = rng.permutation(n)
    label = np.repeat(np.arange(clusters), sizes)
    start = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    surv_row = rows[start][label]
    kept = rows == surv_row
    exact = kept | (rng.random(n) < 0.3)
    sim = np.where(exact, 1.0, rng.choice([0.5, 0.625, 0.75, 0.875, 1.0], n))
    first_doc = 1000
    return {"node": first_doc + rows * spread, "survivor": first_doc + surv_row * spread, "kept": kept,
            "exact": exact, "similarity": sim, "cluster": label}, first_doc, n * spread


def reference(rows: dict, first_doc: int, k=8, near_k=4, closest=6, members=3) -> dict:
    """What the samples hold, by sorting every cluster and row in Python."""
    row = (rows["node"] - first_doc).tolist()
    surv = (rows["survivor"] - first_doc).tolist()
    kept, exact, sim = rows["kept"].tolist(), rows["exact"].tolist(), rows["similarity"].tolist()
    of: dict = {}
    for i, s in enumerate(surv):
        of.setdefault(s, []).append(i)
    size = {s: len(m) for s, m in of.items()}
    copies = {s: sum(not kept[i] and exact[i] for i in m) for s, m in of.items()}
    nears = {s: sum(not kept[i] and not exact[i] for i in m) for s, m in of.items()}
    top = sorted((s for s in of if size[s] > 1), key=lambda s: (-size[s], s))[:k]
    near_top = sorted((s for s in of if nears[s] and s not in top), key=lambda s: (-nears[s], -size[s], s))[:near_k]

    def shown(s, near_only):
        m = [i for i in of[s] if not kept[i] and not (near_only and exact[i])]
        return [row[i] for i in sorted(m, key=lambda i: (exact[i], sim[i], row[i]))[:members]]

    near = [i for i in range(len(row)) if not kept[i] and not exact[i]]
    close = sorted(near, key=lambda i: (abs(sim[i] - THRESHOLD), row[i]))[:closest]
    return {"largest": [(s, size[s], copies[s], nears[s], shown(s, False)) for s in top],
            "near": [(s, size[s], copies[s], nears[s], shown(s, True)) for s in near_top],
            "close": [(row[i], surv[i], sim[i]) for i in close]}


def summary(got: dict) -> dict:
    def cluster(c):
        assert c["survivor"]["row"] == c["cluster_id"] and c["survivor"]["match"] == "kept"
        return c["cluster_id"], c["size"], c["exact_copies"], c["near_duplicates"], [m["row"] for m in c["members"]]

    return {"largest": [cluster(c) for c in got["largest_clusters"]],
            "near": [cluster(c) for c in got["largest_near_duplicate_clusters"]],
            "close": [(p["member"]["row"], p["survivor"]["row"], p["member"]["similarity"])
                      for p in got["closest_to_threshold"]]}


def partitions(rows: dict, count: int, seed: int) -> list:
    """Whole clusters per partition, each in its own row order."""
    rng = np.random.default_rng(seed)
    owner = rng.integers(0, count, int(rows["cluster"].max()) + 1)[rows["cluster"]]
    out = []
    for p in range(count):
        at = rng.permutation(np.flatnonzero(owner == p))
        out.append({k: v[at] for k, v in rows.items() if k != "cluster"})
    return out


@pytest.mark.parametrize("spread", [1, 10**9])  # row numbers dense (a flag each) or far apart (sorted)
@pytest.mark.parametrize("count", [1, 4])
@pytest.mark.parametrize("clusters", [3, 400])
@pytest.mark.parametrize("sample", [1 << 16, 7])  # 7: the closest calls' bound from a sample of the rows
def test_samples_equal_the_reference(monkeypatch, spread, count, clusters, sample):
    monkeypatch.setattr(build, "SAMPLE", sample, raising=False)
    rows, first_doc, n = select_rows(clusters + spread % 7, clusters, spread)
    got = build.examples_from_parts(InProcess(), partitions(rows, count, clusters), first_doc, Corpus(n), THRESHOLD)
    assert summary(got) == reference(rows, first_doc)
    if clusters > 100:  # ties at every step, and every view filled
        assert len(got["largest_clusters"]) == 8 and len(got["largest_near_duplicate_clusters"]) == 4
        assert len(got["closest_to_threshold"]) == 6


def test_device_parts_give_the_same(monkeypatch):
    """The GPU's parts (device arrays): computed where they are, only the picked rows brought over."""
    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    rows, first_doc, n = select_rows(3, 300, 1)
    parts = partitions(rows, 2, 0)
    want = build.examples_from_parts(InProcess(), parts, first_doc, Corpus(n), THRESHOLD)
    device = [{k: cp.asarray(v) for k, v in p.items()} for p in parts]
    cp.moved["device_to_host_bytes"] = 0
    got = build.examples_from_parts(InProcess(), device, first_doc, Corpus(n), THRESHOLD)
    assert got == want
    assert cp.moved["device_to_host_bytes"] < sum(v.nbytes for p in parts for v in p.values()) / 4


def test_no_rows_no_samples():
    rows, first_doc, n = select_rows(1, 5, 1)
    empty = [{k: v[:0] for k, v in rows.items() if k != "cluster"}]
    got = build.examples_from_parts(InProcess(), empty, first_doc, Corpus(n), THRESHOLD)
    assert got == {"largest_clusters": [], "largest_near_duplicate_clusters": [], "closest_to_threshold": []}


def test_float_ids_that_are_not_numbers_keep_report_json_strict(tmp_path):
    """A float64 id column holding NaN or infinity (a missing value written as NaN) wrote ``"id": NaN`` and
    ``Infinity`` into report.json's sample clusters: not JSON (``JSON.parse``, ``jq`` and strict parsers
    refuse the file).  Such ids are shown as the words ``nan`` / ``inf``; the outputs keep the values."""
    import json

    import pyarrow.parquet as pq

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    words = " ".join(f"w{i}" for i in range(60))
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"text": [words, words + " more", words + " more2"],
                             "id": pa.array([float("nan"), float("inf"), -float("inf")], pa.float64())}),
                   tmp_path / "in" / "a.parquet")
    run_dedup(tmp_path / "in", tmp_path / "out", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}))

    def refuse(constant):
        raise ValueError(f"report.json holds {constant}, which is not JSON")

    report = json.loads((tmp_path / "out" / "report.json").read_text(), parse_constant=refuse)
    cluster = report["largest_clusters"][0]
    assert [cluster["survivor"]["id"]] + [m["id"] for m in cluster["members"]] == ["nan", "inf", "-inf"]
    assert pq.read_table(tmp_path / "out" / "duplicates.parquet").column("id").to_pylist()[1:] == [
        float("inf"), -float("inf")]
