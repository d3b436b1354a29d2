"""Pieces of a cluster run that need no cluster: moving rows between partitions keeps their order, and
the duplicates table merged from per-block parts is the very file one process writes."""

import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.backends import on_device, to_host
from gpu_dedup.errors import InputError
from gpu_dedup.run.cluster import executor, routing
from gpu_dedup.backends.arrow_arrays import arrow_array
from gpu_dedup.stages import frames
from gpu_dedup.stages.write import duplicates_parquet_options


def test_a_route_keeps_source_order_and_arrow_columns():
    parts = [{"k": np.array([3, 1, 3, 0], np.int64), "id": pa.array(["a", "b", "c", None])},
             {"k": np.array([1, 3], np.int64), "id": pa.array(["e", "f"])}]
    cut = [routing.split(p, i, frames.hash_dest, 3, on="k") for i, p in enumerate(parts)]
    out = [routing.gather_pieces(0, [c[k] for c in cut]) for k in range(3)]
    assert sum(frames.size(o) for o in out) == 6
    for o in out:  # each destination: one key's rows (or several keys'), sources in order, positions in order
        ids = o["id"].to_pylist()
        for key in set(o["k"].tolist()):
            want = [i for p in parts for kk, i in zip(p["k"].tolist(), p["id"].to_pylist()) if kk == key]
            assert [i for kk, i in zip(o["k"].tolist(), ids) if kk == key] == want
    again = [routing.gather_pieces(0, [c[k] for c in cut]) for k in range(3)]
    assert all(a["id"].equals(b["id"]) for a, b in zip(out, again))
    # grouped by the worker that gathers them (destinations 0 and 2 on one, 1 on another): the same rows
    groups, place = routing.destination_groups(["w0", "w1", "w0"])
    assert groups == [[0, 2], [1]] and place == [(0, 0), (1, 0), (0, 1)]
    cut = [routing.split(p, i, frames.hash_dest, 3, groups=groups, on="k") for i, p in enumerate(parts)]
    grouped = [routing.gather_pieces(i, [c[g] for c in cut]) for g, i in place]
    whole = [routing.gather_group(i, g, None, *cut) for g, i in place]  # a small route: the whole cuts handed over
    for a, b, c in zip(out, grouped, whole):
        assert a["id"].equals(b["id"]) and np.array_equal(a["k"], b["k"])
        assert a["id"].equals(c["id"]) and np.array_equal(a["k"], c["k"])


class _Recorder:
    """A stand-in for a Dask client that records the tasks a route's graph is made of."""

    def __init__(self):
        self.tasks = []

    def submit(self, fn, *args, **kw):
        self.tasks.append(fn.__name__)
        return object()

    def map(self, fn, *iterables, **kw):
        self.tasks += [fn.__name__] * len(iterables[0])
        return [object() for _ in iterables[0]]


@pytest.mark.parametrize("whole_cuts", [True, False])
def test_a_small_route_hands_each_gathering_worker_the_whole_cuts(whole_cuts):
    client = _Recorder()
    out = routing.route(client, [object()] * 3, frames.hash_dest, 4, homes=["a", "b", "a", "b"],
                        whole_cuts=whole_cuts, on="k")
    assert len(out) == 4
    if whole_cuts:  # 3 cuts, 4 destinations: no task between them
        assert sorted(client.tasks) == ["gather_group"] * 4 + ["step_and_split"] * 3
    else:  # each cut's piece for each of the 2 gathering workers taken out by a getitem task first
        assert sorted(client.tasks) == ["gather_direct"] * 4 + ["getitem"] * 6 + ["step_and_split"] * 3


class _AtOnce:
    """A stand-in for a Dask client that runs each task as it is submitted (its value stands for its future)."""

    def __init__(self):
        self.tasks = []

    def submit(self, fn, *args, pure=None, priority=None, workers=None, allow_other_workers=None, **kw):
        self.tasks.append(fn.__name__)
        return fn(*args, **kw)

    def map(self, fn, *iterables, pure=None, priority=None, **kw):
        return [self.submit(fn, *a, **kw) for a in zip(*iterables)]


def _add_one(part: dict, column: str) -> dict:
    return {**part, column: part[column] + 1}


@pytest.mark.parametrize("whole_cuts", [True, False])
def test_a_lazy_routes_destinations_are_made_by_the_task_that_takes_them(whole_cuts):
    """Lazy: a route's destinations are no tasks yet; the next route's cutting tasks make them (one task, not a
    gather then a cut), and the rows are those of the same routes run task by task.  A destination asked for
    again is made again, as a task of its own, with the same rows; it never goes to a worker as itself."""
    import pickle

    from gpu_dedup.run.contract import Step

    parts = [{"k": np.array([3, 1, 3, 0, 7], np.int64), "v": np.arange(5, dtype=np.int64)},
             {"k": np.array([1, 3, 5], np.int64), "v": np.arange(5, 8, dtype=np.int64)}]
    homes = ["a", "b", "a"]

    def chain(lazy: bool):
        client = _AtOnce()
        first = routing.route(client, parts, frames.hash_dest, 3, homes=homes, whole_cuts=whole_cuts, on="k",
                              after=Step(_add_one, column="v"), lazy=lazy)
        before = list(client.tasks)
        second = routing.route(client, first, frames.hash_dest, 3, homes=homes, whole_cuts=whole_cuts, on="v",
                               lazy=lazy)
        return client, first, before, [routing.real(p) for p in second]

    eager_client, eager_first, _, eager = chain(False)
    client, first, before, lazy = chain(True)
    for a, b in zip(eager, lazy):
        assert np.array_equal(a["k"], b["k"]) and np.array_equal(a["v"], b["v"])
    assert all(isinstance(p, routing.Later) for p in first)
    gathers = {"gather_group", "gather_direct", "gather_pieces"}
    assert not gathers & set(before)  # the first route's destinations: no task yet
    assert client.tasks.count("made_then") == 3  # made by the second route's cuts, one task each
    assert len(client.tasks) == len(eager_client.tasks) - 3
    again = routing.real(first[0])  # asked for again: a task of its own, the same rows
    assert client.tasks[-1] in gathers
    assert np.array_equal(again["k"], eager_first[0]["k"]) and np.array_equal(again["v"], eager_first[0]["v"])
    assert routing.real(first[0]) is again  # submitted once
    with pytest.raises(TypeError):
        pickle.dumps(first[1])


def test_sources_tally_what_they_hand_to_a_route():
    part = {"k": np.arange(10, dtype=np.int64), "id": pa.array([f"d{i}" for i in range(10)])}
    routing.split(part, 0, frames.hash_dest, 3, account=("run-a", "exact"), on="k")
    routing.prepare(part, 1, frames.hash_dest, 3, account=("run-a", "exact"), on="k")
    routing.split(part, 0, frames.hash_dest, 3, account=("run-b", "exact"), on="k")
    rows, size = routing.moved(part)
    assert rows == 10 and size == 80 + part["id"].nbytes
    assert routing.take_moved("run-a") == {"exact": [20, 2 * size]}
    assert routing.take_moved("run-a") == {} and routing.take_moved("run-b") == {"exact": [10, size]}


def test_the_client_reorders_a_few_values_without_importing_pandas():
    """Arrow's ``pa.array`` imports pandas on its first call (0.4 s), which a cluster's client needs for
    nothing else; the report's sample rows are put back in order through a view of their positions."""
    positions = np.array([2, 0, 1], np.int64)
    view = arrow_array(positions)
    assert view.type == pa.int64() and view.to_pylist() == [2, 0, 1]
    assert pa.array(["a", "b", "c"]).take(view).to_pylist() == ["c", "a", "b"]
    code = ("import sys, numpy as np; import gpu_dedup.run.cluster.executor; "
            "from gpu_dedup.backends.arrow_arrays import arrow_array; "
            "assert arrow_array(np.arange(3)).to_pylist() == [0, 1, 2]; print('pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_frames_round_trip_through_pandas_with_arrow_columns():
    frame = {"x": np.arange(3, dtype=np.int64), "b": pa.array([b"\x00\xff", None, b""], pa.large_binary()),
             "s": pa.array(["x", "y", None])}
    back = routing.from_df(routing.to_df(frame))
    assert np.array_equal(back["x"], frame["x"]) and back["b"].equals(frame["b"]) and back["s"].equals(frame["s"])


@pytest.mark.parametrize("rows", [0, 5, 250])
def test_merged_parts_are_the_file_one_process_writes(tmp_path, monkeypatch, rows):
    monkeypatch.setattr(executor, "ROW_GROUP", 64)  # several row groups, and parts that straddle them
    rng = np.random.default_rng(rows)
    table = pa.table({"id": pa.array([f"d{i}" for i in rng.integers(0, 50, rows)], pa.string()),
                      "row": pa.array(np.arange(rows, dtype=np.int64)),
                      "cluster_id": pa.array(rng.integers(0, 50, rows)),
                      "similarity": pa.array(rng.random(rows).astype(np.float32)),
                      "shard": pa.array([f"s{i}" for i in rng.integers(0, 3, rows)], pa.string())})
    want = tmp_path / "one.parquet"  # what one process writes (run/local.py), in row groups of ROW_GROUP
    pq.write_table(table, want, compression="zstd", row_group_size=64, **duplicates_parquet_options(table.schema))
    cuts = [0, 3, 3, 70, 130, 131, rows] if rows else [0, 0]
    paths = []
    for i in range(len(cuts) - 1):
        piece = table.slice(min(cuts[i], rows), max(0, min(cuts[i + 1], rows) - min(cuts[i], rows)))
        paths.append(str(tmp_path / f"part-{i}.parquet"))
        executor._write_part(piece, paths[-1])
    executor._merge_parts(paths, str(tmp_path / "merged.parquet"), "zstd")
    assert (tmp_path / "merged.parquet").read_bytes() == want.read_bytes()


# --------------------------------------------------------------------------- what a worker holds


def _one_block(tmp_path, keep="longest"):
    from gpu_dedup.config import Config
    from gpu_dedup.run.cluster import blocks as B
    from gpu_dedup.storage.discovery import discover

    texts = ["Hello, World!  ", None, "ÅNGSTRÖM  x", "a" * 300, "Hello, World!  "]
    pq.write_table(pa.table({"id": [f"d{i}" for i in range(5)], "text": texts}), tmp_path / "s.parquet")
    shard = discover([tmp_path / "s.parquet"])[0]
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": keep}})
    info = B.inspect_shard(shard, cfg)
    block = B.plan_blocks([info], 100)[0]
    return B, cfg, shard.with_rows(info["rows"]), block, texts


def test_a_block_weighs_what_it_holds(tmp_path):
    """Dask weighs a block by ``sys.getsizeof`` (dask.sizeof's fallback): its columns and normalized texts,
    not an empty object's few hundred bytes (which had Dask copy blocks to whichever worker a task's small
    frame was on)."""
    import sys

    B, cfg, shard, block, _ = _one_block(tmp_path)
    loaded = B.load_block(block, [shard], cfg)
    assert sys.getsizeof(loaded) >= loaded.table.nbytes > 300
    norm = B.normalize_block(loaded, cfg)
    assert sys.getsizeof(norm) >= norm.table.nbytes + norm.strings.data.nbytes + norm.strings.offsets.nbytes


@pytest.mark.parametrize("keep", ["longest", "lowest_id"])
def test_a_normalized_block_holds_no_original_texts_and_still_answers_for_them(tmp_path, keep):
    """After normalization a block keeps its normalized texts only; the longest policy's key (the original
    texts' lengths) is kept, and the report's sample texts are read from the shard again."""
    from gpu_dedup.stages.selection import text_lengths

    B, cfg, shard, block, texts = _one_block(tmp_path, keep)
    loaded = B.load_block(block, [shard], cfg)
    want_key = B.block_rank_key(loaded, keep)
    norm = B.normalize_block(loaded, cfg)
    assert "text" not in norm.table.schema.names
    assert B.block_rank_key(norm, keep).equals(want_key)
    if keep == "longest":
        assert want_key.to_pylist() == text_lengths(pa.array(texts)).to_pylist()
    rows = np.array([3, 1, 0], np.int64)
    assert B.original_texts(shard, rows, cfg).to_pylist() == [texts[3], None, texts[0]]
    assert B.take_column(norm, rows, "id").to_pylist() == ["d3", "d1", "d0"]


def test_signature_values_go_with_the_task_that_makes_the_bands(tmp_path):
    """On workers a block's signatures and band hashes are one task: its result holds the band hashes, and
    the signature values only where the family keeps them for verification by signature."""
    from gpu_dedup.stages.families import family_for

    B, cfg, shard, block, _ = _one_block(tmp_path)
    data = B.normalize_block(B.load_block(block, [shard], cfg), cfg)
    for method, kept in (("exact", False), ("signature", True)):
        c = cfg.with_overrides({"verify.method": method})
        fam = family_for(c, 5)
        rows = {"row": np.array([0, 2, 3], np.int64)}
        signed = B.block_signed(data, rows, fam)
        want = B.block_bands(B.block_signatures(data, rows, fam), fam)
        assert "values" not in signed and ("signatures" in signed["bands"]) == kept
        assert set(signed["bands"]) == set(want)
        # the task's result is host arrays (what leaves a task); the bands made in place stay where the
        # backend computes (device arrays on a GPU backend)
        assert all(np.array_equal(signed["bands"][k], to_host(want[k])) for k in want)


def test_route_pieces_carry_only_the_frames_columns():
    """The direct route's pieces are the frame's own columns (no source / position tags): a piece keeps its
    source's row order, and a destination gathers the pieces in source order."""
    part = {"k": np.arange(10, dtype=np.int64), "v": np.arange(10, dtype=np.int32)}
    pieces = routing.split(part, 0, frames.hash_dest, 3, on="k")
    assert all(set(p) == {"k", "v"} and counts == [frames.size(p)] for p, counts in pieces)
    assert all((np.diff(p["k"]) > 0).all() for p, _ in pieces)


def test_blocks_are_spread_by_rows_over_the_workers():
    from gpu_dedup.run.cluster.blocks import spread_blocks

    rows = [100, 100, 50, 50, 100, 100]
    homes = spread_blocks(rows, ["a", "b"])
    assert [sum(r for r, h in zip(rows, homes) if h == w) for w in "ab"] == [250, 250]
    assert spread_blocks([5], []) == [None]
    # weighed by threads: a worker of three threads takes three times the rows of a worker of one
    rows = [10] * 8
    homes = spread_blocks(rows, ["a", "b"], {"a": 3, "b": 1})
    assert [homes.count(w) for w in "ab"] == [6, 2]


def test_a_worker_writes_its_shards_on_its_share_of_the_cores():
    from gpu_dedup.run.cluster.executor import write_shares

    everything = tuple(range(8))
    seen = {"a": ("h1", everything, 8), "b": ("h1", everything, 8),  # two workers on one host's 8 cores
            "c": ("h1", (0, 1), 2),  # one whose affinity is two cores of its own (a GPU worker's NUMA node)
            "d": ("h2", everything, 3),  # a cgroup quota of 3 cores
            "e": ("h3", (0,), 1), "f": ("h3", (0,), 1)}  # more workers than cores: one thread each
    assert write_shares(seen) == {"a": 4, "b": 4, "c": 2, "d": 3, "e": 1, "f": 1}


def test_workers_on_one_arrow_thread_are_told_how_to_start_them():
    """A cluster the user started with Dask's OMP_NUM_THREADS=1 decodes each block's shards on one core: the run
    says so, naming the setting and the value; workers with their share of the cores (or one core) are fine."""
    from gpu_dedup.run.cluster.executor import arrow_pool_advice

    everything = tuple(range(8))
    one = {"a": (1, ("h1", everything, 8)), "b": (1, ("h1", everything, 8))}
    advice = arrow_pool_advice(one)
    assert advice is not None and "the cluster's 2 workers decode" in advice and "OMP_NUM_THREADS=4" in advice
    assert arrow_pool_advice({"a": (4, ("h1", everything, 8)), "b": (4, ("h1", everything, 8))}) is None
    assert arrow_pool_advice({"e": (1, ("h3", (0,), 1)), "f": (1, ("h3", (0,), 1))}) is None  # one core each
    mixed = arrow_pool_advice({"a": (8, ("h1", everything, 8)), "c": (1, ("h2", (0, 1), 2))})
    assert mixed is not None and "1 of the cluster's 2 workers" in mixed and "OMP_NUM_THREADS=2" in mixed
    alone = arrow_pool_advice({"a": (1, ("h1", (0, 1), 2))})
    assert alone is not None and alone.startswith("the cluster's worker decodes")


def test_a_workers_share_of_the_shards_is_written_at_once_in_order(monkeypatch):
    import threading
    import types

    import gpu_dedup.run.cluster.executor as E

    shards = [types.SimpleNamespace(name=f"s{k}", format="jsonl") for k in range(3)]  # 64 MiB each to write
    together = threading.Barrier(3, timeout=20)  # three shards written at once, or the barrier breaks

    def write(shard, start, removed, out, compression, device_writer, wrote, held=None):
        together.wait()
        return {"name": shard.name, "rows": start}

    monkeypatch.setattr(E, "_write_shard", write)
    monkeypatch.setattr(E, "_worker_budget", lambda: 1 << 40)
    got = E._write_shards(shards, [0, 1, 2], [[], [], []], "out", "same", threads=3)
    assert got == {"threads": 3, "records": [{"name": f"s{k}", "rows": k} for k in range(3)], "writers": {},
                   "busy": {"sync_thread_seconds": 0.0, "digest_thread_seconds": 0.0}, "from_held": 0}
    threads = set()
    monkeypatch.setattr(E, "_write_shard", lambda shard, *a, **kw: threads.add(threading.get_ident()) or
                        {"name": shard.name})
    one = E._write_shards(shards[:2], [0, 1], [[], []], "out", "same", threads=1)  # one thread: the task's own
    assert [r["name"] for r in one["records"]] == ["s0", "s1"] and threads == {threading.get_ident()}
    monkeypatch.setattr(E, "_worker_budget", lambda: 100 << 20)  # room for one shard's write: one at a time
    threads.clear()
    got = E._write_shards(shards, [0, 1, 2], [[]] * 3, "out", "same", threads=3)
    assert got["threads"] == 1 and [r["name"] for r in got["records"]] == ["s0", "s1", "s2"]
    assert threads == {threading.get_ident()}


ID_COLUMNS = [
    pa.array(["a", "b", "a", None, "", None, "ab", "b"]),
    pa.array([b"\x00", b"", None, b"\x00\x00", b""], pa.large_binary()),
    pa.array([3, -1, 3, None, 2**40, -1], pa.int64()),
    pa.array([2**64 - 1, 0, 2**64 - 1, 5], pa.uint64()),
    pa.array([1.5, float("nan"), 1.5, None, 0.0]),
]


def _gpu_backend_or_skip():
    from gpu_dedup.backends import get_backend
    from gpu_dedup.errors import BackendError

    try:
        get_backend("gpu")
    except BackendError as exc:
        pytest.skip(f"no GPU backend here ({exc}); test_gpu_workers_hash_ids_as_cpu_workers_under_the_simulator "
                    "runs this under the CUDA simulator")


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("ids", ID_COLUMNS)
def test_distinct_ids_counted_from_their_hashes_as_arrow_counts_them(ids, backend):
    """The cluster's repeated-id count (two hashes per id, distinct pairs per partition) equals Arrow's count
    of distinct ids, nulls counted as one id, whichever way an id type is hashed."""
    import pyarrow.compute as pc

    from gpu_dedup.run.cluster import blocks as B

    if backend == "gpu":
        _gpu_backend_or_skip()
    data = B.BlockData(B.Block(0, 0, len(ids), ()), pa.table({"id": ids}))
    hashed = B.id_hashes(data, backend=backend)
    # two partitions by the first hash: every copy of an id is in one of them
    parts = [frames.take(hashed, frames.hash_dest(hashed, 2, on=("h1",)) == k) for k in range(2)]
    distinct = sum(B.distinct_pairs(p)["distinct"] for p in parts)
    assert distinct == pc.count_distinct(ids, mode="all").as_py()


def test_gpu_workers_hash_ids_as_cpu_workers_do():
    """A GPU worker's id hashes are a CPU worker's, bit for bit, for every id type: string and binary ids by
    the device's exact-key kernel (the CPU's, on the device), so the repeated-id count cannot depend on the
    workers; the warm-up a worker's prepare runs goes through the same call."""
    from gpu_dedup.run.cluster import blocks as B

    _gpu_backend_or_skip()
    for ids in ID_COLUMNS + [pa.array(["x" * 300, "é", "x" * 300, "y"], pa.string())]:
        data = B.BlockData(B.Block(0, 0, len(ids), ()), pa.table({"id": ids}))
        cpu, gpu = B.id_hashes(data, backend="cpu"), B.id_hashes(data, backend="gpu")
        assert all(isinstance(v, np.ndarray) for v in gpu.values())  # host arrays: the frame a route moves
        for k in ("h1", "h2"):
            np.testing.assert_array_equal(gpu[k], cpu[k])
    B.warm_id_hashes("gpu")


def test_gpu_workers_hash_ids_as_cpu_workers_under_the_simulator():
    from tests.simulated import run_simulated

    here = "tests/run/test_cluster_outputs.py::"
    run_simulated([here + "test_gpu_workers_hash_ids_as_cpu_workers_do",
                   here + "test_distinct_ids_counted_from_their_hashes_as_arrow_counts_them"],
                  exactly=11, env={"GPU_DEDUP_SIMULATOR": "1"})


def _host_normalized(B, loaded, cfg, run=None):
    """``normalize_block(loaded, cfg, run)`` with its texts in host memory, as a CPU worker holds them.  Under
    ``pytest --backend gpu`` the backend named cpu normalizes into device memory, and texts there never go to a
    file (checked here: a GPU worker keeps them on the device or in host memory); the same texts copied to the
    host then go through the choice a CPU worker's block goes through."""
    from dataclasses import replace

    from gpu_dedup.backends.strings import StringBuffers

    if not on_device(B.normalize_block(loaded, cfg).strings.offsets):
        return B.normalize_block(loaded, cfg, run=run)
    on_gpu = B.normalize_block(loaded, cfg, run="device-" + str(run))
    assert on_gpu.text_file is None  # device texts stay on the device or in host memory, never in a file
    out = B.normalize_block(loaded, cfg)
    host = StringBuffers(to_host(out.strings.offsets), to_host(out.strings.data))
    return B._kept(replace(out, strings=host), cfg, run)


def test_spilled_texts_are_the_normalized_texts_mapped_only_while_read(tmp_path, monkeypatch):
    """A CPU worker's normalized block keeps its texts in a file of the worker's local directory: the block
    no longer weighs them, every reader sees the same texts, and the file is unmapped once the reader lets
    them go; the run's texts go at its end."""
    import gc
    import os
    import sys

    B, cfg, shard, block, _ = _one_block(tmp_path)
    cfg = cfg.with_overrides({"cluster.spill_texts": True})
    monkeypatch.setattr(B, "text_dir", lambda run, worker=None: str(tmp_path / run))
    os.makedirs(tmp_path / "r1")
    loaded = B.load_block(block, [shard], cfg)
    kept = _host_normalized(B, loaded, cfg)
    spilled = _host_normalized(B, loaded, cfg, run="r1")
    assert kept.text_file is None and spilled.strings is None and spilled.text_file.startswith(str(tmp_path / "r1"))
    assert B.block_norm_info(spilled) == {**B.block_norm_info(kept), "spilled_bytes": kept.text_bytes,
                                          "spilled_blocks": 1} and kept.text_bytes > 0
    assert sys.getsizeof(spilled) <= sys.getsizeof(kept) - kept.text_bytes
    assert spilled.norm.equals(kept.norm)

    def mapped():
        with open("/proc/self/maps") as f:
            return spilled.text_file in f.read()

    texts = spilled.texts()
    assert np.array_equal(texts.offsets, kept.strings.offsets) and np.array_equal(texts.data, kept.strings.data)
    assert mapped()
    del texts
    gc.collect()
    assert not mapped()
    no_spill = cfg.with_overrides({"cluster.spill_texts": False})
    assert B.normalize_block(loaded, no_spill, run="r1").text_file is None
    assert B.drop_texts("r1") == 2 and not (tmp_path / "r1").exists()


def test_auto_keeps_a_runs_texts_in_memory_up_to_a_share_of_the_worker_and_spills_past_it(tmp_path, monkeypatch):
    """``spill_texts: auto``: a worker keeps a run's normalized texts in memory while they stay within
    SPILL_SHARE of its memory limit, and the blocks past that in files; each run counts its own, and a run's
    count goes with its texts."""
    B, cfg, shard, block, _ = _one_block(tmp_path)
    assert cfg.cluster.spill_texts == "auto"
    monkeypatch.setattr(B, "text_dir", lambda run, worker=None: str(tmp_path / run))
    loaded = B.load_block(block, [shard], cfg)
    size = _host_normalized(B, loaded, cfg).text_bytes
    monkeypatch.setattr(B, "_worker_memory", lambda: 2.5 * size / B.SPILL_SHARE)  # room for two blocks' texts
    got = [_host_normalized(B, loaded, cfg, run="r1").text_file is not None for _ in range(3)]
    assert got == [False, False, True]
    assert _host_normalized(B, loaded, cfg, run="r2").text_file is None  # another run's share is its own
    assert B.drop_texts("r1") == 2  # the one spilled block's two files
    assert _host_normalized(B, loaded, cfg, run="r1").text_file is None
    B.drop_texts("r1")
    B.drop_texts("r2")


@pytest.mark.parametrize("keep", ["first", "longest", "lowest_id"])
def test_a_block_read_and_normalized_in_one_pass_is_the_block_loaded_then_normalized(tmp_path, keep):
    """CPU workers read a block batch by batch, normalizing each batch as it is decoded (read_block): the same
    columns, nulls, normalized texts, invalid UTF-8 count and rank key as loading it whole and normalizing it."""
    B, cfg, shard, block, _ = _one_block(tmp_path, keep)
    assert B.streams_text(cfg)
    want = B.normalize_block(B.load_block(block, [shard], cfg), cfg)
    got = B.read_block(block, [shard], cfg)
    assert got.table.equals(want.table) and np.array_equal(got.null, want.null)
    assert got.norm.equals(want.norm) and got.text_bytes == want.text_bytes > 0
    assert B.block_norm_info(got) == B.block_norm_info(want)
    if keep != "first":  # the first policy's rank is the row: no key
        assert B.block_rank_key(got, keep).equals(B.block_rank_key(want, keep))
    assert not B.streams_text(cfg.with_overrides({"backend": "gpu"}))


def _many_pieces(tmp_path, shards=5):
    """A block of several pieces: ``shards`` small shards (one of them of two row groups) read as one block."""
    from gpu_dedup.config import Config
    from gpu_dedup.run.cluster import blocks as B
    from gpu_dedup.storage.discovery import discover

    texts = [f"Doc {i}: Ünïcode  text {'x' * (i % 7)}" if i % 5 else None for i in range(40)]
    paths = []
    for s in range(shards):
        lo, hi = s * 40 // shards, (s + 1) * 40 // shards
        path = tmp_path / f"s{s}.parquet"
        pq.write_table(pa.table({"id": [f"d{i}" for i in range(lo, hi)], "text": texts[lo:hi]}), path,
                       row_group_size=max(1, (hi - lo) // 2) if s == 1 else None)
        paths.append(path)
    found = discover(paths)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "select": {"keep": "longest"}})
    infos = [B.inspect_shard(s, cfg) for s in found]
    (block,) = B.plan_blocks(infos, 1000)
    return B, cfg, [found[i].with_rows(infos[i]["rows"]) for i in block.shard_indices], block, texts


@pytest.mark.parametrize("step", ["load", "read"])
def test_a_blocks_pieces_read_side_by_side_are_the_block_read_piece_after_piece(tmp_path, monkeypatch, step):
    """A block's pieces are decoded side by side (piece_readers, up to the worker's Arrow pool): the same
    table, nulls and normalized texts as one piece after another; a piece whose shard changed is still named."""
    B, cfg, shards, block, texts = _many_pieces(tmp_path)
    assert len(block.pieces) == 5

    def read(readers):
        monkeypatch.setattr(B, "piece_readers", lambda pieces: min(readers, pieces))
        if step == "load":
            return B.normalize_block(B.load_block(block, shards, cfg), cfg)
        return B.read_block(block, shards, cfg)

    want, got = read(1), read(3)
    assert got.table.equals(want.table) and np.array_equal(got.null, want.null)
    assert got.norm.equals(want.norm) and got.norm_rows(np.array([39, 0, 7])).equals(want.norm.take([39, 0, 7]))
    assert B.block_rank_key(got, "longest").to_pylist() == [len(t) if t is not None else -1 for t in texts]
    pq.write_table(pa.table({"id": ["x"], "text": ["changed"]}), shards[3].path)
    with pytest.raises(InputError, match="s3.parquet.*changed during the run"):
        read(3)


def test_a_workers_arrow_pool_is_its_share_of_the_cores():
    """Dask starts a worker with OMP_NUM_THREADS=1, which Arrow takes for its pool's size: a cluster gpu_dedup
    starts gives its workers their share of the cores instead (the share Numba gets), and the block reads
    decode that many pieces at once (capped by READERS and the pieces)."""
    from gpu_dedup.run.cluster import blocks as B
    from gpu_dedup.run.cluster.connection import worker_pools, worker_threads

    key = "distributed.nanny.pre-spawn-environ.OMP_NUM_THREADS"
    assert worker_pools(1)[key] == worker_threads(1) == len(os.sched_getaffinity(0))
    assert worker_pools(1)["distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"] is None
    assert B.piece_readers(1) == 1 and B.piece_readers(100) == min(B.READERS, pa.cpu_count())
