"""CPU workers' blocks keep their Parquet pieces' input batches for the write stage (``output.hold_inputs``), as
one process keeps its shards': the shards are written from them on the worker holding them, byte for byte the
files one process writes, and without reading the shards again."""

import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.run.cluster import blocks as B
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.storage.discovery import discover
from tests.run.clusters import scheduler_of

distributed = pytest.importorskip("distributed")

BASE = {"backend": "cpu", "input": {"id_column": "id"}}
SHARDS = 3


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Three Parquet shards of 800 rows in row groups of 150 (a block of 300 rows splits each over blocks), with
    a column the run does not read (every column is held and written)."""
    d = tmp_path_factory.mktemp("held") / "in"
    d.mkdir()
    sample = planted_corpus(n_docs=2400, n_clusters=120, words=(30, 150), edit_rate=(0, 0.05), seed=23)
    table = sample.table.select(["id", "text"])
    table = table.append_column("extra", pa.array(np.arange(table.num_rows, dtype=np.int64) * 7))
    for i, lo in enumerate(range(0, 2400, 800)):
        pq.write_table(table.slice(lo, 800), d / f"part-{i}.parquet", row_group_size=150,
                       compression="zstd" if i == 1 else "snappy")
    return d


@pytest.fixture(scope="module")
def cluster2():
    with scheduler_of(2) as address:
        yield address


@pytest.fixture(scope="module")
def in_process():
    """One worker in this process: what its tasks call can be counted here."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        yield cluster.scheduler_address


def _outputs(d):
    """The data files of an output directory (the report, the manifest of the files' times and its _SUCCESS
    digest differ from run to run)."""
    return sorted(p.name for p in d.iterdir() if p.suffix == ".parquet")


def _identical(a, b):
    assert _outputs(a) == _outputs(b)
    for name in _outputs(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), f"{name} differs"


def _held_on_one_worker(corpus, block_rows: int) -> int:
    """The shards whose blocks the executor reads on one worker of two (blocks.spread_blocks): those it writes
    from held batches."""
    cfg = Config.from_dict(BASE)
    blocks = B.plan_blocks([B.inspect_shard(s, cfg) for s in discover(str(corpus), "auto")], block_rows)
    homes = B.spread_blocks([b.rows for b in blocks], ["a", "b"])
    workers: dict = {}
    for b, home in zip(blocks, homes):
        for i in b.shard_indices:
            workers.setdefault(i, set()).add(home)
    return sum(len(w) == 1 for w in workers.values())


@pytest.mark.parametrize("keep, block_rows, hold", [
    ("first", 10_000, True),  # one block: every shard whole in it
    ("longest", 10_000, "auto"),
    ("first", 600, True),  # 4 blocks, every shard split over two: the first and last on one worker, the middle
    ("longest", 600, "auto"),  # one on both (read again)
    ("first", 600, False),
])
def test_two_workers_write_held_shards_as_one_process(corpus, cluster2, tmp_path, keep, block_rows, hold):
    cfg = Config.from_dict({**BASE, "select": {"keep": keep}, "output": {"hold_inputs": hold}})
    single = run_dedup(corpus, tmp_path / "single", cfg)
    assert single.report["counts"]["removed"] > 0
    dist = run_dedup(corpus, tmp_path / "two", cfg.with_overrides({
        "cluster.scheduler": cluster2, "cluster.whole_on_one_worker": False, "cluster.block_rows": block_rows}))
    _identical(tmp_path / "single", tmp_path / "two")
    expected = 0 if hold is False else _held_on_one_worker(corpus, block_rows)
    assert expected == (0 if hold is False else SHARDS if block_rows > 2400 else 2)
    assert dist.report["cluster"]["shards_from_held"] == expected


class _Reads:
    """Counts the shards the write stage reads (storage.filter's reader), calling the real one."""

    def __init__(self, real):
        self.real, self.paths = real, []

    def __call__(self, shard, *args, **kw):
        self.paths.append(shard.path)
        return self.real(shard, *args, **kw)


@pytest.mark.parametrize("hold", [True, False])
def test_held_shards_are_not_read_again(corpus, in_process, tmp_path, monkeypatch, hold):
    from gpu_dedup.storage import filter as storage_filter

    single = run_dedup(corpus, tmp_path / "single", Config.from_dict(BASE))
    reads = _Reads(storage_filter.iter_parquet)
    monkeypatch.setattr(storage_filter, "iter_parquet", reads)
    dist = run_dedup(corpus, tmp_path / "one", Config.from_dict({**BASE, "output": {"hold_inputs": hold}}).with_overrides(
        {"cluster.scheduler": in_process, "cluster.whole_on_one_worker": False, "cluster.block_rows": 300}))
    _identical(tmp_path / "single", tmp_path / "one")
    if hold:  # one worker holds every block: every shard, split over blocks, written from their batches
        assert reads.paths == []
        assert dist.report["cluster"]["shards_from_held"] == SHARDS
    else:
        assert len(reads.paths) == SHARDS
        assert dist.report["cluster"]["shards_from_held"] == 0


def test_a_block_weighs_its_held_batches_and_frees_them(corpus, monkeypatch):
    cfg = Config.from_dict({**BASE, "cluster": {"spill_texts": False}})  # the texts in memory, whatever its size
    shards = [s.with_rows(800) for s in discover(str(corpus), "auto")]
    infos = [B.inspect_shard(s, cfg) for s in shards]
    block = B.plan_blocks(infos, 1200)[0]  # 2 shards' pieces (the first whole, the second in part)
    mine = [shards[i] for i in block.shard_indices]
    assert len(block.pieces) == 2
    plain = B.read_block(block, mine, cfg, run="sizes")
    held = B.read_block(block, mine, cfg, run="sizes", hold=True)
    assert plain.held is None and B.block_held(held) == list(range(len(block.pieces)))
    batches = B.held_bytes(held)
    whole = sum(pq.read_table(s.path).slice(p.shard_row0, p.rows).nbytes for p, s in zip(block.pieces, mine))
    assert batches >= 0.9 * whole  # every column of the pieces' rows
    assert sys.getsizeof(held) - sys.getsizeof(plain) == batches  # Dask weighs (and spills) the block by them
    got = B.take_held(held, 0)
    assert got and B.block_held(held) == list(range(1, len(block.pieces)))
    assert sys.getsizeof(held) == sys.getsizeof(plain) + batches - sum(t.nbytes for t in got)
    assert B.drop_held(held) > 0 and sys.getsizeof(held) == sys.getsizeof(plain)
    # auto: held while this run's blocks on the worker take at most HOLD_SHARE of its memory
    monkeypatch.setattr(B, "_worker_memory", lambda: batches / B.HOLD_SHARE * 1.5)
    assert B.read_block(block, mine, cfg, run="auto", hold="auto").held is not None
    assert B.read_block(block, mine, cfg, run="auto", hold="auto").held is None  # the second is over the share
    B.drop_texts("auto", _Worker(str(corpus)))  # the run's end releases the worker's account
    assert B.read_block(block, mine, cfg, run="auto", hold="auto").held is not None
    B.drop_texts("auto", _Worker(str(corpus)))
    B.drop_texts("sizes", _Worker(str(corpus)))


class _Worker:
    def __init__(self, local_directory):
        self.local_directory = local_directory


class _Stop(Exception):
    pass


def test_a_resumed_write_takes_the_held_shards_left_and_reads_the_rest(corpus, in_process, tmp_path, monkeypatch):
    """A run stopped after its first shard was written resumes with its blocks read (and held) again: the shard
    written is kept, the others are written from the held batches; a block whose batches are gone by the write
    (computed again without them) has its shards read again.  The same files as one process's every time."""
    from gpu_dedup.run.cluster import executor
    from gpu_dedup.storage import filter as storage_filter

    cfg = Config.from_dict({**BASE, "output": {"hold_inputs": True}})
    single = run_dedup(corpus, tmp_path / "single", cfg)
    on = cfg.with_overrides({"cluster.scheduler": in_process, "cluster.whole_on_one_worker": False,
                             "cluster.block_rows": 600})

    def stop(point):
        if point == "write:first-shard":
            raise _Stop(point)

    monkeypatch.setattr(executor, "maybe_crash", stop)
    with pytest.raises(_Stop):
        run_dedup(corpus, tmp_path / "one", on)
    monkeypatch.undo()
    resumed = run_dedup(corpus, tmp_path / "one", on)
    _identical(tmp_path / "single", tmp_path / "one")
    assert resumed.report["cluster"]["shards_from_held"] == SHARDS - 1

    real = B.take_held

    def lost(data, k):  # the first block's batches gone: its shard (the first) is read again
        got = real(data, k)
        return None if data.block.index == 0 else got

    reads = _Reads(storage_filter.iter_parquet)
    monkeypatch.setattr(B, "take_held", lost)
    monkeypatch.setattr(storage_filter, "iter_parquet", reads)
    again = run_dedup(corpus, tmp_path / "lost", on)
    _identical(tmp_path / "single", tmp_path / "lost")
    assert [p.rsplit("/", 1)[1] for p in reads.paths] == ["part-0.parquet"]
    assert again.report["cluster"]["shards_from_held"] == SHARDS - 1
