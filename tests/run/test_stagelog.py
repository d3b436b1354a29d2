"""Every second of a run is booked: its stages plus named fixed costs (and the little glue between them,
``unbooked_seconds``) add up to its wall time, in report.json."""

import json
import subprocess
import sys
import time

import pytest

from gpu_dedup.config import Config
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.stagelog import StageLog

NAMED = {"setup", "kernel_load", "checkpoints", "samples", "report", "commit"}


@pytest.fixture(scope="module")
def shards(planted_shards):
    return planted_shards("booked", n_docs=800, n_clusters=40, words=(20, 80), seed=4)


def _books_close(report: dict) -> None:
    stages = sum(v["seconds"] for v in report["stages"].values() if not v.get("resumed"))
    fixed = sum(report["fixed_seconds"].values())
    assert report["stage_seconds"] == pytest.approx(stages, abs=2e-3)
    assert stages + fixed + report["unbooked_seconds"] == pytest.approx(report["wall_seconds"], abs=5e-3)
    assert report["unbooked_seconds"] >= -5e-3
    # the glue between stages and costs is a small part of the run (milliseconds on an idle machine)
    assert report["unbooked_seconds"] <= 0.1 * report["wall_seconds"] + 0.05, report["unbooked_seconds"]


def test_a_runs_stages_and_fixed_costs_add_up_to_its_wall_time(shards, tmp_path):
    t0 = time.perf_counter()
    res = run_dedup(shards, tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    took = time.perf_counter() - t0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert NAMED <= set(rep["fixed_seconds"]) and "startup" not in rep["fixed_seconds"]  # not the CLI
    _books_close(rep)
    assert rep["wall_seconds"] <= took  # the books close before the files are published
    assert res.report["wall_seconds"] == rep["wall_seconds"]


def test_the_command_books_its_own_start_up(shards, tmp_path):
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(shards), "-o", str(tmp_path / "out"),
                    "--backend", "cpu", "-q"], check=True, timeout=300)
    took = time.perf_counter() - t0
    rep = json.loads((tmp_path / "out" / "report.json").read_text())
    assert rep["fixed_seconds"]["startup"] > 0.05  # the interpreter and the imports
    _books_close(rep)
    assert rep["wall_seconds"] <= took


def test_an_in_memory_run_books_its_seconds_too(shards):
    from gpu_dedup import storage

    res = run_dedup(storage.discover(shards), None, Config.from_dict({"backend": "cpu"}))
    assert {"setup", "kernel_load", "samples", "report"} <= set(res.report["fixed_seconds"])
    _books_close(res.report)


def test_a_fixed_cost_adds_up_over_its_calls():
    st = StageLog()
    for _ in range(3):
        with st.cost("checkpoints"):
            time.sleep(0.01)
    assert st.fixed["checkpoints"] >= 0.03
    acc = st.accounts()
    assert acc["fixed_seconds"] == st.fixed and acc["stage_seconds"] == 0


def test_the_write_stage_says_where_its_seconds_went(shards, tmp_path):
    """The shards and the duplicates table (written beside them, on a thread of its own), each within the stage;
    the seconds the write threads spent syncing and digesting the shards (every shard is both), which a single
    thread's share of the shards cannot exceed."""
    run_dedup(shards, tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    write = json.loads((tmp_path / "out" / "report.json").read_text())["stages"]["write"]
    assert 0 < write["shards_seconds"] <= write["seconds"] + 1e-3
    assert 0 < write["duplicates_table_seconds"] <= write["seconds"] + 1e-3
    assert 0 < write["host_shards_seconds"] <= write["shards_seconds"] + 1e-3
    assert write["sync_thread_seconds"] > 0 and write["digest_thread_seconds"] > 0
    assert "device_write_seconds" not in write  # the device wrote nothing
    # the stage's parts in sequence: its frames, the shards, then what it still waited for of the table's thread
    parts = write["frames_seconds"] + write["shards_seconds"] + write["table_wait_seconds"]
    assert 0 < write["frames_seconds"] and 0 <= write["table_wait_seconds"] and parts <= write["seconds"] + 1e-3
    assert write["seconds"] - parts < 0.05 + 0.1 * write["seconds"]  # the rest is glue
    steps = write["frames_parts_seconds"]  # the frames' steps, in order, add up to them
    assert list(steps) == ["outputs", "to_host"]  # the table's own frames are made on its thread, beside the shards
    assert all(v >= 0 for v in steps.values()) and abs(sum(steps.values()) - write["frames_seconds"]) < 2e-3
    _table_steps(write)
    removal_list = run_dedup(shards, tmp_path / "list", Config.from_dict({"backend": "cpu", "output": {"shards": False}}))
    listed = removal_list.report["stages"]["write"]
    assert "shards_seconds" not in listed and listed["duplicates_table_seconds"] > 0
    assert list(listed["frames_parts_seconds"]) == ["outputs", "to_host"]  # the table's thread makes them here too
    _table_steps(listed)


def _table_steps(write):
    """The table thread's steps: the frames' (on a thread of their own, a row group ahead) and the file's, which
    overlap each other, so each side, not their sum, fits within the thread's seconds."""
    table, seconds = write["table_parts_seconds"], write["duplicates_table_seconds"]
    assert list(table) == ["ids", "survivor_ids", "tables", "file"]
    frames = table["ids"] + table["survivor_ids"] + table["tables"]
    assert all(v >= 0 for v in table.values()) and 0 < table["file"] <= seconds + 2e-3 and frames <= seconds + 2e-3


def test_one_process_summarizes_the_similarities_beside_the_write_stage(shards, tmp_path, monkeypatch):
    """The removed near duplicates' similarities are summarized on a thread of their own while the write stage
    runs (a partial sort of every value: 0.6 s of 9 M values), not in the samples' booked wait before it; the
    summary is the one the values give at once."""
    import threading

    import gpu_dedup.run.sequence as sequence

    seen = []
    summarize = sequence.similarity_summary

    def watched(*args, **kw):
        seen.append(threading.current_thread().name)
        return summarize(*args, **kw)

    monkeypatch.setattr(sequence, "similarity_summary", watched)
    res = run_dedup(shards, tmp_path / "out", Config.from_dict({"backend": "cpu"}))
    assert seen == ["gpu_dedup-similarities"]
    monkeypatch.setattr(sequence, "similarity_summary", summarize)
    again = run_dedup(shards, tmp_path / "again", Config.from_dict({"backend": "cpu"}))
    near, other = res.report["chaining"], again.report["chaining"]
    assert near["near_duplicates_removed"] > 0 and near["similarity_to_survivor"]
    assert near["similarity_to_survivor"] == other["similarity_to_survivor"]
    assert near["similarity_to_survivor_histogram"] == other["similarity_to_survivor_histogram"]
