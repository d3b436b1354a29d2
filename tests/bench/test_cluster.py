"""The cluster benchmark (gpu_dedup/bench/cluster.py): how it compares outputs, judges its rows, sizes what
fits the deadline and writes its tables.  It runs whole in the tier-2 rehearsal
(tests/bench/test_first_contact.py) and on the GPU machine."""

import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.bench import cluster


def _out(d, rows, success):
    d.mkdir()
    pq.write_table(pa.table({"row": rows}), d / "duplicates.parquet")
    (d / "_SUCCESS").write_text(success)
    return d


def test_outputs_are_compared_without_the_success_marker(tmp_path):
    """_SUCCESS holds the manifest's fingerprint, which names the cluster: left out; every other file counts."""
    a = _out(tmp_path / "a", [1, 2], "fingerprint-one-process")
    b = _out(tmp_path / "b", [1, 2], "fingerprint-cluster")
    assert cluster.compared(a, b) == {"identical": True, "content_identical": True, "files_compared": 2,
                                      "differ": []}
    c = _out(tmp_path / "c", [1, 3], "fingerprint-one-process")
    got = cluster.compared(a, c)
    assert not got["identical"] and not got["content_identical"] and got["differ"] == ["duplicates.parquet"]


def test_problems_name_differing_outputs_failed_runs_and_an_unnamed_limit():
    rows = [{"config": "1 process", "docs": 10, "seconds": 1.0},
            {"config": "2 GPU workers on 1 GPU", "docs": 10, "shuffle": "device", "content_identical": False,
             "differ": ["part-00000.parquet"]},
            {"config": "4 GPU workers on 1 GPU", "docs": 10, "shuffle": "host", "error": "KilledWorker: boom"},
            {"config": "1 GPU worker on 1 GPU", "docs": 10, "memory": "spill_texts false", "error": "",
             "stopped_naming_the_setting": False},
            {"config": "1 GPU worker on 1 GPU", "docs": 10, "memory": "spill_texts false",
             "error": "ResourceError: ... cluster.device_memory_limit ...", "stopped_naming_the_setting": True}]
    got = cluster.problems(rows)
    assert len(got) == 3
    assert "2 GPU workers on 1 GPU 10 device: outputs differ" in got[0] and "KilledWorker: boom" in got[1]
    assert "did not stop with cluster.device_memory_limit named: it ran to the end" in got[2]


def test_a_larger_corpus_is_skipped_when_it_would_not_end_before_the_deadline():
    assert cluster._estimate({}, 10**7) == 0.0
    assert cluster._estimate({10**6: 4.0}, 10**7) == 60.0  # 1.5 x 4 s x 10
    assert cluster._estimate({10**6: ("out", 2.0)}, 10**6) == 3.0  # the one-process runs: (output, seconds)


def test_markdown_books_runs_fixed_costs_and_what_moved():
    rows = [{"config": "1 process", "docs": 1000, "seconds": 1.5},
            {"config": "2 CPU workers", "workers": 2, "docs": 1000, "shuffle": "host", "seconds": 3.0,
             "vs_one_process": 2.0, "identical": True, "content_identical": True, "shuffle_mb": 0.5,
             "device_routes": 0, "spilled_text_blocks": 0, "shuffled_rows": 1200,
             "shuffle_mb_by_stage": {"buckets": 0.4, "verify": 0.1}, "stage_seconds": {"write": 0.7},
             "write_threads": [1, 2]},
            {"config": "2 CPU workers", "workers": 2, "cluster": "fixed costs", "start_seconds": 2.0,
             "kernel_load_seconds": 1.0, "warmup_seconds": 3.0, "close_seconds": 0.5}]
    md = "\n".join(cluster.markdown(rows))
    assert "| 2 CPU workers | 1,000 | host | 3.0 | 2.0 | yes | yes | 0.5 | 0 | 0 | 0.7 | 1 2 |  |" in md
    assert "| 2 CPU workers | 2.0 | 1.0 | 3.0 | 0.5 |" in md
    assert "| 2 CPU workers | 1,000 | host | 0.4 | 0.1 | 1,200 |" in md
    assert "copied host->device" not in md  # CPU workers copy nothing
    rows[1].update(config="1 GPU worker", worker_transfer_mb_by_stage={
        "read": {"host_to_device": 400.0, "device_to_host": 1.5}, "verify": {"host_to_device": 2.0,
                                                                          "device_to_host": 3.25}})
    md = "\n".join(cluster.markdown(rows))
    assert "| 1 GPU worker | 1,000 | host | 400.0 / 1.5 | 2.0 / 3.25 |" in md


def test_every_cluster_runs_the_first_corpus_before_any_runs_the_larger_one(monkeypatch, tmp_path):
    """The 10^6 runs of the 1-, 2- and 4-worker clusters come first; the copies (10^7) after, each cluster
    started again, only those whose runs the earlier ones say would end before the deadline."""
    import time

    from gpu_dedup.bench import gpu

    calls = []
    monkeypatch.setattr(gpu, "planted_dir", lambda root, n, seed, words, shards=16, log=print: (tmp_path, 10 * n, n))
    monkeypatch.setattr(gpu, "replicated_dir", lambda src, copies, log=print: (tmp_path, 1, 10_000))
    monkeypatch.setattr(cluster, "_single_process", lambda *a, **k: calls.append(("single",)) or
                        {"seconds": 1.0, "warmup_seconds": 0.1, "stage_seconds": {}})

    def one(w, backend, corpora, single, shuffles, warm, tmp, rmm_async, probe, block_rows, add, late, took):
        calls.append((w, [c[0] for c in corpora], probe))
        for r in ("host", "device"):
            took.setdefault(r, {})[corpora[0][0]] = 2.0 if w < 4 else 30.0  # 4 workers: too slow for 10x the docs
        return 1.0

    monkeypatch.setattr(cluster, "_one_cluster", one)
    rows = cluster.cluster_bench(docs=(1000,), backend="cpu", workers=(1, 2, 4), copies=10, workdir=tmp_path,
                                 deadline=time.time() + 200, log=lambda *a: None)
    assert calls == [("single",), (1, [1000], True), (2, [1000], False), (4, [1000], False), ("single",),
                     (1, [10_000], False), (2, [10_000], False)]
    assert {"config": "4 CPU workers", "docs": 10_000, "skipped": "would not end before the deadline"} in rows


def test_a_joined_runs_row_carries_what_settles_where_its_seconds_went(monkeypatch, tmp_path):
    """A joined run's row: its stages' seconds and parts, its fixed costs, what the routes moved, each worker's Arrow pool, which writer
    wrote the shards, which read the blocks' texts and (GPU workers) the host<->device MiB of each stage."""
    import types

    report = {"stages": {"read": {"seconds": 1.5}, "write": {"seconds": 2.0, "shards_seconds": 1.2}},
              "fixed_seconds": {"setup": 0.1}, "cluster": {
        "blocks": 4, "routes": 52, "shuffle_mb_by_stage": {"buckets": 300.0}, "worker_peak_rss_mb": {"w": 900.0},
        "write_threads": {"w": 16}, "arrow_threads": {"w": 16}, "writers": {"cudf": 16}, "shards_from_held": 0,
        "text_readers": {"cudf": 4, "pyarrow": 0},
        "worker_transfer_mb_by_stage": {"read": {"host_to_device": 1500.0, "device_to_host": 2.0}}}}
    monkeypatch.setattr(cluster, "_run", lambda *a: (3.0, types.SimpleNamespace(report=report)))
    row = cluster._joined("in", tmp_path / "out", {}, None)
    assert row["stage_seconds"] == {"read": 1.5, "write": 2.0} and row["arrow_threads"] == [16]
    assert row["writers"] == {"cudf": 16} and row["fixed_seconds"] == {"setup": 0.1} and row["shards_from_held"] == 0
    assert row["stages"]["write"]["shards_seconds"] == 1.2  # each stage's parts
    assert row["text_readers"] == {"cudf": 4, "pyarrow": 0}
    assert row["worker_transfer_mb_by_stage"]["read"]["host_to_device"] == 1500.0 and row["write_threads"] == [16]
