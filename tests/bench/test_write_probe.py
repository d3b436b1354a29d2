"""The GPU write probe's plumbing, with a stand-in device writer (pyarrow writes what libcudf would)."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpu_dedup.backends as backends
from gpu_dedup.bench import write_probe


class _Writer:
    """The GPU backend's read_table / write_table, on the host."""

    info = {"frames": "cudf"}

    def __init__(self, paths):
        self.paths, self.streams = paths, []

    def read_table(self, shards):
        return pa.concat_tables([pq.read_table(p) for p in self.paths])

    def write_table(self, held, starts, keep, targets, codec, streams=1, after=None):
        self.streams.append(streams)
        rows = []
        for k, t in enumerate(targets):
            part = held.slice(int(starts[k]), int(starts[k + 1] - starts[k])).filter(pa.array(keep[starts[k]:starts[k + 1]]))
            pq.write_table(part, t, compression=codec)
            rows.append(part.num_rows)
            if after is not None:
                after(k, part.num_rows)
        return rows


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    for k in range(3):
        pq.write_table(pa.table({"id": pa.array([f"{k}-{i}" for i in range(200)]),
                                 "text": pa.array([f"text {k} {i} " * 5 for i in range(200)])}),
                       d / f"part-{k}.parquet", compression="snappy")
    return d


@pytest.mark.parametrize("variant", ["default", "uncompressed", "streams"])
def test_one_variant_times_every_part_and_checks_the_files(corpus, monkeypatch, variant):
    writer = _Writer(sorted(corpus.glob("*.parquet")))
    monkeypatch.setattr(backends, "get_backend", lambda name: writer)
    row = write_probe.probe_once(corpus, variant)
    assert "error" not in row and row["rows_ok"] is True and row["shards"] == 3 and row["rows"] == 600
    assert set(row["seconds"]) == {"read_table", "write_first", "write", "check", "digests", "stage"}
    assert row["codec"] == ("none" if variant == "uncompressed" else "snappy") and row["bytes_written"] > 0
    assert row["stage_published"] == 3  # the write stage's own call: every file checked, digested and published
    assert writer.streams == [write_probe.STREAMS if variant == "streams" else 1] * 3 == [row["streams"]] * 3
    assert not list(corpus.parent.glob("write-probe-*"))  # its files go with it


def test_without_cudf_a_variant_says_so(corpus, monkeypatch):
    class NoCudf(_Writer):
        info = {"frames": "pyarrow"}

    monkeypatch.setattr(backends, "get_backend", lambda name: NoCudf([]))
    assert "cuDF is not installed" in write_probe.probe_once(corpus, "default")["error"]


def test_every_variant_runs_in_a_process_of_its_own(corpus, monkeypatch):
    seen = []

    class Done:
        returncode, stderr = 0, ""

        def __init__(self, argv, env):
            seen.append((argv[-1], env.get("KVIKIO_NTHREADS")))
            self.stdout = '{"variant": "%s", "seconds": {"write": 0.5}}\n' % argv[-1]

    monkeypatch.setattr(write_probe.subprocess, "run", lambda argv, env, **kw: Done(argv, env))
    monkeypatch.delenv("KVIKIO_NTHREADS", raising=False)
    rows = write_probe.probe(corpus, ["default", "kvikio1"], log=lambda *a: None)
    assert seen == [("default", None), ("kvikio1", "1")] and [r["seconds"]["write"] for r in rows] == [0.5, 0.5]
    assert np.all([r["process_seconds"] >= 0 for r in rows])


def test_the_host_sink_variant_digests_from_memory_the_files_it_writes(corpus, monkeypatch):
    """libcudf into host buffers, each file's SHA-256 taken from them: the files on disk are those bytes (their
    digests match), with each shard's kept rows."""
    writer = _Writer(sorted(corpus.glob("*.parquet")))
    monkeypatch.setattr(backends, "get_backend", lambda name: writer)
    row = write_probe.probe_once(corpus, "host-sink")
    assert "error" not in row and row["rows_ok"] is True and row["digests_match"] is True
    assert row["stage_published"] == 3 and row["bytes_written"] > 0
    assert set(row["seconds"]) == {"read_table", "write_first", "write", "files", "stage"}
    assert not list(corpus.parent.glob("write-probe-*"))


def test_the_buffered_variant_turns_off_kvikio_direct_writes():
    assert write_probe.VARIANTS["buffered"] == {"KVIKIO_AUTO_DIRECT_IO_WRITE": "0"}
