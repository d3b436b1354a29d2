"""bench workers: one process against Dask workers, rows for failed runs, the results table."""

import json

import pytest

from gpu_dedup.bench import workers

pytest.importorskip("distributed")


def test_tiny_run_writes_rows_with_identical_outputs_and_stage_volumes(tmp_path):
    payload = workers.bench_workers(documents=(1200,), workers=2, block_rows=400, results=tmp_path / "res",
                          workdir=tmp_path)
    one, dask, running = payload["rows"]
    assert one["config"] == "1 process" and dask["config"] == "2 workers"
    assert dask["identical_to_one_process"] is True and dask["removed"] == one["removed"] > 0
    assert dask["blocks"] == 3 and set(dask["shuffle_mb_by_stage"]) >= {"exact", "buckets"}
    # the same run joining a cluster the benchmark started before it (not timed): no scheduler of its own
    assert running["config"] == "2 workers, running" and running["identical_to_one_process"] is True
    assert running["blocks"] == 3 and running["worker_peak_rss_mb"] > 0 and dask["worker_peak_rss_mb"] > 0
    assert running["scheduler_peak_rss_mb"] is None and running["wall_vs_one_process"] > 0
    md = (tmp_path / "res" / "workers.md").read_text()
    assert "Shuffled MiB per stage" in md and "| 1,200 | planted |" in md
    assert md.split("Shuffled MiB per stage")[1].count("| 1,200 | planted |") == 1  # the running run moves the same
    assert json.loads((tmp_path / "res" / "workers.json").read_text())["rows"] == payload["rows"]


def test_a_failed_configuration_is_a_row_and_the_others_still_run(tmp_path, monkeypatch):
    real = workers.run_cli_job

    def job(inputs, out, extra):
        if "--workers" in extra:
            raise RuntimeError("benchmark job failed: gpu-dedup run ...\nTraceback\ngpu-dedup: error: Dask workers "
                               "died running a task; lower cluster.block_rows")
        return real(inputs, out, extra)

    monkeypatch.setattr(workers, "run_cli_job", job)
    payload = workers.bench_workers(documents=(300, 600), workers=2, block_rows=300, results=tmp_path / "res",
                          workdir=tmp_path)
    assert [r["config"] for r in payload["rows"]] == ["1 process", "2 workers", "2 workers, running"] * 2
    failed = [r for r in payload["rows"] if "failed" in r]
    assert [r["failed"] for r in failed] == ["Dask workers died running a task; lower cluster.block_rows"] * 2
    assert payload["client_growth_mb"] is None
    md = (tmp_path / "res" / "workers.md").read_text()
    assert md.count("failed after") == 2


def test_repeated_runs_take_turns_and_report_their_median(tmp_path, monkeypatch):
    """--repeat N: one run of each configuration in turn, N rounds; the row's wall time is the median, its
    peaks the largest, and every run's output is compared with the reference's."""
    calls = []
    walls = iter([5.0, 9.0, 7.0, 1.0, 11.0, 8.0, 3.0, 10.0, 6.0])  # 3 rounds of (1 process, 2 workers, running)

    def timed(inputs, out, extra, n_workers, memory_limit, running):
        name = "running" if running else "workers" if "--workers" in extra else "one"
        calls.append(name)
        out.mkdir(parents=True)
        (out / "duplicates.parquet").write_bytes(b"same" if len(calls) != 8 else b"other")  # round 3's 2 workers
        peak = {"one": 500.0, "workers": 200.0 + len(calls), "running": 210.0}[name]
        cluster = {} if name == "one" else {"worker_peak_rss_mb": {"w": 600.0 + len(calls)}, "blocks": 1}
        return {"wall_seconds": 1.0, "peak_rss_mb": peak, "counts": {"removed": 4}, "cluster": cluster}, next(walls), None

    monkeypatch.setattr(workers, "_timed", timed)
    payload = workers.bench_workers(documents=(300,), workers=2, block_rows=300, results=tmp_path / "res", workdir=tmp_path,
                          repeat=3)
    assert calls == ["one", "workers", "running"] * 3
    one, dask, running = payload["rows"]
    assert one["wall_seconds_runs"] == [5.0, 1.0, 3.0] and one["wall_seconds"] == 3.0
    assert one["identical_to_one_process"] is True  # its reruns against its first run
    assert dask["wall_seconds"] == 10.0 and dask["wall_vs_one_process"] == round(10.0 / 3.0, 2)
    assert running["wall_seconds"] == 7.0 and running["identical_to_one_process"] is True
    assert dask["identical_to_one_process"] is False  # one run of three differed: the row says so
    assert dask["client_peak_rss_mb"] == 208.0 and dask["worker_peak_rss_mb"] == 608.0  # the largest of the runs
    assert payload["repeat"] == 3
    md = (tmp_path / "res" / "workers.md").read_text()
    assert "ran 3 times" in md and "| 10.0 (9.0, 11.0, 10.0) |" in md
