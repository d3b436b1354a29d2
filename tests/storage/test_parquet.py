"""Parquet footers (gpu_dedup/storage/parquet.py): each input shard's footer is read once per process, a
rewritten shard is never served its old footer, and the cache keeps to its bound."""

import os
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.storage import columns, discover, parquet
from gpu_dedup.storage.discovery import Shard
from tests.footers import FooterReads, fresh_footers


@pytest.fixture
def footers(monkeypatch):
    return fresh_footers(monkeypatch)


def _shard(path, rows: int, **kwargs) -> Shard:
    pq.write_table(pa.table({"id": list(range(rows)), "text": [f"text {i}" for i in range(rows)]}), path, **kwargs)
    return discover(path)[0]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Four shards of a planted corpus (near duplicates across shards), each of several row groups."""
    d = tmp_path_factory.mktemp("footer-corpus")
    s = planted_corpus(n_docs=800, n_clusters=80, cluster_size=(2, 4), words=(30, 80), edit_rate=(0, 0.05), seed=7)
    write_shards(s.table.select(["id", "text"]), d / "in", shards=4, row_group_rows=64)
    return d / "in"


@pytest.mark.parametrize("flags", [[], ["--no-shards"], ["--set", "output.hold_inputs=false"]],
                         ids=["shards", "removal-list", "shards-read-again"])
def test_a_run_reads_each_input_footer_once(corpus, tmp_path, monkeypatch, footers, flags):
    reads = FooterReads(monkeypatch, corpus)
    assert main(["run", str(corpus), "-o", str(tmp_path / "out"), "-q", "--backend", "cpu", *flags]) == 0
    shards = sorted(os.path.realpath(p) for p in corpus.glob("*.parquet"))
    assert dict(reads.by_path) == dict.fromkeys(shards, 1)  # sizes, read, samples, write: one footer read
    report = (tmp_path / "out" / "report.json").read_text()
    assert '"removed": 0' not in report  # duplicates were found: the samples and the write read the shards


def test_the_outputs_are_those_of_reads_without_the_cache(corpus, tmp_path, monkeypatch, footers):
    assert main(["run", str(corpus), "-o", str(tmp_path / "cached"), "-q", "--backend", "cpu"]) == 0
    monkeypatch.setattr(parquet, "FOOTERS", parquet.FooterCache(max_entries=0))  # keeps nothing: reads every time
    assert main(["run", str(corpus), "-o", str(tmp_path / "uncached"), "-q", "--backend", "cpu"]) == 0
    names = sorted(p.name for p in (tmp_path / "cached").glob("*.parquet"))
    assert "duplicates.parquet" in names and len(names) == 5
    for name in names:
        assert (tmp_path / "cached" / name).read_bytes() == (tmp_path / "uncached" / name).read_bytes(), name


def test_a_rewritten_shard_is_read_with_its_new_footer(tmp_path, monkeypatch, footers):
    p = tmp_path / "a.parquet"
    before = _shard(p, 2)
    reads = FooterReads(monkeypatch, tmp_path)
    assert parquet.parquet_metadata(before).num_rows == 2
    assert parquet.parquet_metadata(before).num_rows == 2  # kept
    after = _shard(p, 3)  # another size
    assert after.identity != before.identity
    assert parquet.parquet_metadata(after).num_rows == 3
    assert columns.read_columns(after, InputConfig()).num_rows == 3
    assert reads.total == 2
    size, mtime = p.stat().st_size, p.stat().st_mtime_ns
    pq.write_table(pa.table({"id": [0, 1, 2], "text": ["text 7", "text 8", "text 9"]}), p)
    os.utime(p, ns=(mtime, mtime))  # the same size and modification time: the footer bytes tell it apart
    again = discover(p)[0]
    assert p.stat().st_size == size and again.identity != after.identity
    assert columns.read_columns(again, InputConfig()).column("text").to_pylist() == ["text 7", "text 8", "text 9"]
    assert reads.total == 3


def test_a_shard_changed_after_its_footer_was_kept_is_named_as_changed(tmp_path, footers):
    p = tmp_path / "a.parquet"
    shard = _shard(p, 1000, row_group_size=100)
    assert parquet.parquet_metadata(shard).num_row_groups == 10
    pq.write_table(pa.table({"x": [1]}), p)  # far smaller: the kept footer's column chunks are past its end
    with pytest.raises(InputError, match="changed during the run"):
        columns.read_columns(shard, InputConfig())


def test_shards_without_an_identity_are_not_kept(tmp_path, monkeypatch, footers):
    p = tmp_path / "a.parquet"
    _shard(p, 2)
    bare = Shard(str(p), "a.parquet", "parquet")  # not found by discovery: nothing tells a rewrite
    reads = FooterReads(monkeypatch, tmp_path)
    for _ in range(3):
        assert parquet.parquet_metadata(bare).num_rows == 2
    assert reads.total == 3 and len(footers) == 0


def test_threads_opening_one_shard_read_its_footer_once(tmp_path, monkeypatch, footers):
    shard = _shard(tmp_path / "a.parquet", 10)
    reads = FooterReads(monkeypatch, tmp_path)
    start = threading.Barrier(8)
    got = []

    def read():
        start.wait()
        got.append(parquet.read_parquet(shard, ["id"]).num_rows)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == [10] * 8 and reads.total == 1


def test_the_cache_keeps_to_its_bounds(tmp_path):
    metas = [pq.read_metadata(_shard(tmp_path / f"{k}.parquet", 1 + k).path) for k in range(5)]
    footers = [parquet.Footer(m, m.schema.to_arrow_schema()) for m in metas]
    cache = parquet.FooterCache(max_entries=3)
    for k, f in enumerate(footers):
        cache.put(k, f)
        if k == 2:
            assert cache.get(0) is footers[0]  # used: the least recently used is now 1
    assert len(cache) == 3 and [k for k in range(5) if cache.get(k)] == [0, 3, 4]
    assert cache.nbytes == sum(footers[k].size for k in (0, 3, 4))

    size = max(f.size for f in footers)
    cache = parquet.FooterCache(max_bytes=2 * size)
    for k, f in enumerate(footers):
        cache.put(k, f)
        assert cache.nbytes <= 2 * size
    assert len(cache) == 2 and cache.get(4) is footers[4]
    cache.put(4, footers[4])  # put again: counted once
    assert cache.nbytes == sum(footers[k].size for k in (3, 4))
    small = parquet.FooterCache(max_bytes=size - 1)
    small.put("big", max(footers, key=lambda f: f.size))
    assert len(small) == 0 and small.nbytes == 0  # larger than the whole bound: not kept
    cache.clear()
    assert len(cache) == 0 and cache.nbytes == 0


def test_the_schema_is_the_one_read_schema_gives(tmp_path, footers):
    p = tmp_path / "a.parquet"
    table = pa.table({"id": pa.array([1, 2], pa.int32()), "text": pa.array(["a", "b"]).dictionary_encode(),
                      "t": pa.array([1, 2], pa.timestamp("s", tz="UTC"))}).replace_schema_metadata({"k": "v"})
    pq.write_table(table, p)
    shard = discover(p)[0]
    assert parquet.parquet_schema(shard).equals(pq.read_schema(p), check_metadata=True)
    assert parquet.parquet_schema(shard).field("text").type == pa.dictionary(pa.int32(), pa.string())
