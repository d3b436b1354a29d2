"""The write stage of the stage sequence (gpu_dedup/run/sequence.py): the duplicates table is written on a thread
of its own while the shards are written, and the stage ends with both done or with the first error."""

import threading
import time

import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.errors import OutputError
from gpu_dedup.run import local
from gpu_dedup.run.entry import run_dedup


@pytest.fixture(scope="module")
def shards(planted_shards):
    return planted_shards("beside", n_docs=600, n_clusters=30, words=(20, 60), seed=5)


def _cfg():
    return Config.from_dict({"backend": "cpu"})


def _table_threads():
    return [t for t in threading.enumerate() if t.name.startswith("gpu-dedup-table")]  # and its frames' thread


def test_the_duplicates_table_is_written_while_the_shards_are(shards, tmp_path, monkeypatch):
    started = threading.Event()
    seen = {}
    write_table, write_shards_ = local.LocalExecutor.write_table, local.LocalExecutor.write_shards

    def table(self, parts, path):
        started.set()
        return write_table(self, parts, path)

    def shards_(self, *args, **kw):
        seen["table started before the shards ended"] = started.wait(timeout=30)
        return write_shards_(self, *args, **kw)

    monkeypatch.setattr(local.LocalExecutor, "write_table", table)
    monkeypatch.setattr(local.LocalExecutor, "write_shards", shards_)
    res = run_dedup(shards, tmp_path / "out", _cfg())
    assert seen == {"table started before the shards ended": True}
    assert pq.read_table(tmp_path / "out" / "duplicates.parquet").equals(res.duplicates)
    write = res.report["stages"]["write"]
    assert 0 < write["duplicates_table_seconds"] <= write["seconds"] and not _table_threads()


def test_a_failed_table_write_fails_the_run_after_the_shards(shards, tmp_path, monkeypatch):
    def table(self, parts, path):
        raise OutputError(f"cannot write {path}: no space left on device")

    monkeypatch.setattr(local.LocalExecutor, "write_table", table)
    with pytest.raises(OutputError, match="no space left"):
        run_dedup(shards, tmp_path / "out", _cfg())
    assert not (tmp_path / "out" / "_SUCCESS").exists() and not _table_threads()


def test_a_failed_shard_write_waits_for_the_table_and_raises_its_own_error(shards, tmp_path, monkeypatch):
    done = []

    def table(self, parts, path):
        time.sleep(0.3)
        done.append(path)
        raise OutputError("the table failed too")

    def shards_(self, *args, **kw):
        raise RuntimeError("a shard failed")

    monkeypatch.setattr(local.LocalExecutor, "write_table", table)
    monkeypatch.setattr(local.LocalExecutor, "write_shards", shards_)
    with pytest.raises(RuntimeError, match="a shard failed"):
        run_dedup(shards, tmp_path / "out", _cfg())
    assert len(done) == 1 and not _table_threads()  # joined before the error went on


def test_one_process_makes_the_tables_frames_beside_the_shards(shards, tmp_path, monkeypatch):
    """The members' ids are gathered on the table's thread: here they can be gathered only once the shards'
    write has begun, so a stage that made the table's frames before the shards would fail this test."""
    shards_began = threading.Event()
    seen = {}
    ids, write_shards_ = local.LocalExecutor.ids, local.LocalExecutor.write_shards

    def ids_(self, parts, column="row"):
        if threading.current_thread().name.startswith("gpu-dedup-table"):
            seen["ids waited for the shards"] = shards_began.wait(timeout=30)
        return ids(self, parts, column)

    def shards_(self, *args, **kw):
        shards_began.set()
        return write_shards_(self, *args, **kw)

    monkeypatch.setattr(local.LocalExecutor, "ids", ids_)
    monkeypatch.setattr(local.LocalExecutor, "write_shards", shards_)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    res = run_dedup(shards, tmp_path / "out", cfg)
    assert seen == {"ids waited for the shards": True}
    assert pq.read_table(tmp_path / "out" / "duplicates.parquet").equals(res.duplicates)
    assert not _table_threads()


def test_a_failed_table_frame_fails_the_run_after_the_shards(shards, tmp_path, monkeypatch):
    def ids_(self, parts, column="row"):
        raise OutputError("cannot gather the ids: a stand-in failure")

    monkeypatch.setattr(local.LocalExecutor, "ids", ids_)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    with pytest.raises(OutputError, match="stand-in failure"):
        run_dedup(shards, tmp_path / "out", cfg)
    assert not (tmp_path / "out" / "_SUCCESS").exists() and not _table_threads()


@pytest.fixture(scope="module")
def few_shards(planted_shards):
    return planted_shards("few", n_docs=40, n_clusters=4, words=(8, 16), seed=3)


def test_the_tables_thread_is_handed_host_arrays(few_shards, tmp_path, monkeypatch):
    """The table's thread copies nothing from a device: the run's thread copied the blocks' columns first.  This
    has teeth under ``--backend gpu`` with stand-in device arrays (tests/backends/test_backend_gpu_simulated.py);
    on the CPU it checks that the thread does make the frames."""
    from gpu_dedup.backends import on_device
    from gpu_dedup.stages import write as write_stage

    seen = []

    def spy(real):
        def to_host_(a):
            if threading.current_thread().name.startswith("gpu-dedup-table"):
                seen.append(on_device(a))
            return real(a)
        return to_host_

    monkeypatch.setattr(write_stage, "to_host", spy(write_stage.to_host))
    monkeypatch.setattr(local, "to_host", spy(local.to_host))
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    res = run_dedup(few_shards, tmp_path / "out", cfg)
    assert res.report["counts"]["removed"] > 0
    assert seen and not any(seen)


def _small_row_groups(monkeypatch, rows):
    from gpu_dedup.run import sequence
    monkeypatch.setattr(sequence, "DUPLICATES_ROW_GROUP", rows)
    monkeypatch.setattr(local, "DUPLICATES_ROW_GROUP", rows)


@pytest.mark.parametrize("shards_out", [True, False], ids=["shards", "removal-list"])
def test_the_table_is_made_and_written_a_row_group_at_a_time_as_one_write_makes_it(shards, tmp_path, monkeypatch,
                                                                                   shards_out):
    """One process makes the table's frames a row group at a time, the next one while this one is written: the
    writer's first row group is held until the second row group's frames have begun (a thread that made every
    frame first, or made and wrote each row group in turn, would fail here).  The file is the one
    ``pq.write_table`` of the whole table makes with those row groups, byte for byte."""
    import pyarrow as pa

    from gpu_dedup.stages.write import duplicates_parquet_options

    _small_row_groups(monkeypatch, 16)
    next_began = threading.Event()
    calls, seen = [], {}
    ids, write_group = local.LocalExecutor.ids, pq.ParquetWriter.write_table

    def ids_(self, parts, column="row"):
        if threading.current_thread().name.startswith("gpu-dedup-table"):
            calls.append(column)
            if len(calls) == 3:  # the second row group's member ids (each group gathers ids, then survivor ids)
                next_began.set()
        return ids(self, parts, column)

    def write_group_(self, table, *args, **kw):
        if not seen and threading.current_thread().name == "gpu-dedup-table":  # the table's writer, not a shard's
            seen["the next row group's frames began while the first was written"] = next_began.wait(timeout=10)
        return write_group(self, table, *args, **kw)

    monkeypatch.setattr(local.LocalExecutor, "ids", ids_)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", write_group_)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "output": {"shards": shards_out}})
    res = run_dedup(shards, tmp_path / "out", cfg)
    assert seen == {"the next row group's frames began while the first was written": True}
    got = tmp_path / "out" / "duplicates.parquet"
    table = pq.read_table(got)
    assert table.equals(res.duplicates) and table.num_rows > 2 * 16
    assert pq.ParquetFile(got).metadata.num_row_groups == -(-table.num_rows // 16)
    sink = pa.BufferOutputStream()
    pq.write_table(res.duplicates, sink, row_group_size=16, compression="zstd",
                   **duplicates_parquet_options(res.duplicates.schema))
    assert got.read_bytes() == sink.getvalue().to_pybytes()
    write = res.report["stages"]["write"]
    assert write["table_parts_seconds"]["file"] > 0 and not _table_threads()


def test_a_table_without_rows_is_the_file_one_write_makes(planted_shards, tmp_path, monkeypatch):
    import pyarrow as pa

    from gpu_dedup.stages.write import duplicates_parquet_options

    _small_row_groups(monkeypatch, 64)
    lone = planted_shards("lone", n_docs=30, n_clusters=0, words=(20, 40), seed=9)
    res = run_dedup(lone, tmp_path / "out", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}))
    assert res.duplicates.num_rows == 0
    sink = pa.BufferOutputStream()
    pq.write_table(res.duplicates, sink, compression="zstd", **duplicates_parquet_options(res.duplicates.schema))
    assert (tmp_path / "out" / "duplicates.parquet").read_bytes() == sink.getvalue().to_pybytes()
