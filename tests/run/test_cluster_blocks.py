"""Blocks of a cluster run (gpu_dedup/run/cluster/blocks.py): how rows are cut into blocks, and a block of
several shards read, asked for its original texts and written back."""

import importlib
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.run.cluster import blocks as B
from gpu_dedup.storage.discovery import discover
from tests.footers import FooterReads, fresh_footers

read_stage = importlib.import_module("gpu_dedup.stages.read")  # the module (the package exports a function read)

STRING = pa.schema([("text", pa.large_string())])
BINARY = pa.schema([("text", pa.large_binary())])


def _info(rows, groups=None, schema=STRING):
    return {"rows": rows, "row_groups": groups, "id_type": None, "schema": schema}


def _rows_of(blocks):
    """(shard, row inside the shard) of every row, block after block."""
    out = []
    for b in blocks:
        for p in b.pieces:
            out += [(p.shard_index, p.shard_row0 + r) for r in range(p.rows)]
    return out


@pytest.mark.parametrize("block_rows", [1, 3, 50, 100, 120, 250, 10_000])
def test_blocks_hold_every_row_once_in_order_and_no_more_than_asked(block_rows):
    infos = [_info(100, [40, 40, 20]), _info(0, []), _info(30), _info(7, [7]), _info(60, [25, 35]),
             _info(5, None, BINARY), _info(5, None, BINARY)]
    blocks = B.plan_blocks(infos, block_rows)
    every = [(s, r) for s, info in enumerate(infos) for r in range(info["rows"])]
    assert _rows_of(blocks) == every
    assert [b.index for b in blocks] == list(range(len(blocks)))
    assert [b.row0 for b in blocks] == list(np.cumsum([0] + [b.rows for b in blocks])[:-1])
    largest_group = 40
    for b in blocks:
        assert b.rows == sum(p.rows for p in b.pieces) > 0
        # a block closes at the row group that reaches block_rows: at most block_rows + one group - 1
        assert b.rows <= block_rows + largest_group
        for p in b.pieces:
            groups = infos[p.shard_index]["row_groups"]
            if p.row_groups is None:
                assert not groups and p.rows == infos[p.shard_index]["rows"]  # a shard without row groups: whole
            else:
                assert sum(groups[g] for g in p.row_groups) == p.rows
        schemas = {infos[p.shard_index]["schema"].types[0] for p in b.pieces}
        assert len(schemas) == 1  # one table a block: shards of other column types start a new block


def test_small_shards_share_even_blocks_spread_evenly():
    infos = [_info(100, [100]) for _ in range(10)]
    blocks = B.plan_blocks(infos, 250)  # 4 blocks, each cut at the shard boundary nearest to a quarter
    assert [len(b.pieces) for b in blocks] == [2, 3, 2, 3]
    homes = B.spread_blocks([b.rows for b in blocks], ["a", "b"])
    assert sorted(sum(b.rows for b, h in zip(blocks, homes) if h == w) for w in "ab") == [500, 500]
    assert len(B.plan_blocks(infos, 100)) == 10  # shards as large as a block: a block each


def test_blocks_as_even_as_row_groups_allow():
    infos = [_info(1000, [10] * 100), _info(1001, [1] * 1001)]
    # 2001 rows in 3 blocks: cut at 670 (the boundary of groups of 10 nearest to 667) and at 1334
    assert [b.rows for b in B.plan_blocks(infos, 700)] == [670, 664, 667]


def test_the_largest_blocks_are_spread_first():
    assert B.spread_blocks([100, 300, 300, 300], ["a", "b"]) == ["b", "a", "b", "a"]  # 400 / 600, not 700 / 300


@pytest.fixture
def three_shards(tmp_path):
    texts = [f"Document number {i}, Some WORDS  here." for i in range(23)]
    ids = [f"d{i:02d}" for i in range(23)]
    vec = [None if i < 9 else [float(i), 1.0, 0.5] for i in range(23)]  # the first shard: null vectors only
    cuts = [0, 9, 12, 23]
    for k in range(3):
        lo, hi = cuts[k], cuts[k + 1]
        pq.write_table(pa.table({"id": ids[lo:hi], "text": texts[lo:hi],
                                 "emb": pa.array(vec[lo:hi], pa.list_(pa.float32()))}),
                       tmp_path / f"part-{k}.parquet", row_group_size=4)
    shards = discover(sorted(tmp_path.glob("*.parquet")))
    return tmp_path, shards, texts, ids, vec


def _plan(shards, cfg, block_rows):
    infos = [B.inspect_shard(s, cfg) for s in shards]
    shards = [s.with_rows(i["rows"]) for s, i in zip(shards, infos)]
    return shards, B.plan_blocks(infos, block_rows)


def test_a_block_of_several_shards_reads_them_in_order_and_gives_back_their_ids(three_shards):
    _, shards, _, ids, _ = three_shards
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    shards, blocks = _plan(shards, cfg, 14)
    assert [[p.shard_index for p in b.pieces] for b in blocks] == [[0, 1], [2]]  # 12 and 11 rows
    got_ids = []
    for b in blocks:
        data = B.load_block(b, [shards[i] for i in b.shard_indices], cfg)
        got_ids += data.table.column("id").to_pylist()
        norm = B.normalize_block(data, cfg)
        assert "text" not in norm.table.schema.names
        streamed = B.read_block(b, [shards[i] for i in b.shard_indices], cfg)  # as CPU workers read it
        assert streamed.table.equals(norm.table) and streamed.norm.equals(norm.norm)
        rows = np.arange(b.row0, b.row0 + b.rows)[::-1]  # every row, in an order of no piece
        assert B.take_column(norm, rows, "id").to_pylist() == [ids[r] for r in rows]
    assert got_ids == ids


def test_a_worker_reads_each_shards_footer_once_for_all_its_pieces(three_shards, monkeypatch):
    root, shards, texts, _, _ = three_shards
    fresh_footers(monkeypatch)
    reads = FooterReads(monkeypatch, root)
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    shards, blocks = _plan(shards, cfg, 4)  # the planner's inspection, then blocks of a row group or two
    assert len(blocks) > len(shards)
    for b in blocks:  # one process reads every block, as a worker reads the ones it holds
        B.read_block(b, [shards[i] for i in b.shard_indices], cfg)
    assert B.original_texts(shards[2], np.array([2, 1]), cfg).to_pylist() == [texts[14], texts[13]]
    assert sorted(reads.by_path.values()) == [1, 1, 1] and len(reads.by_path) == 3


@pytest.mark.parametrize("pages", [True, False], ids=["pages", "row-groups"])
def test_original_texts_are_read_from_the_pages_or_row_groups_that_hold_them_only(three_shards, monkeypatch, pages):
    _, shards, texts, _, _ = three_shards
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    shards, blocks = _plan(shards, cfg, 8)
    b = blocks[1]  # rows 8 to 15: shard 0's last row group (1 row), shard 1 (3 rows), shard 2's first group (4)
    assert [(p.shard_index, p.row_groups) for p in b.pieces] == [(0, (2,)), (1, (0,)), (2, (0,))]
    norm = B.normalize_block(B.load_block(b, [shards[i] for i in b.shard_indices], cfg), cfg)
    asked = []
    stream = read_stage.iter_columns

    def iter_columns(shard, cfg_input, *a, **k):
        asked.append((shard.name, cfg_input.id_column, k.get("row_groups")))
        return stream(shard, cfg_input, *a, **k)

    monkeypatch.setattr(read_stage, "iter_columns", iter_columns)
    if not pages:  # a layout the page reader leaves to the row groups
        monkeypatch.setattr(read_stage, "take_pages", lambda *a, **k: None)
    assert "text" not in norm.table.schema.names  # the block no longer holds them: read from the shards
    # the block's rows 8, 14 and 13: shard 0's row 8 (its group 2), shard 2's rows 2 and 1 (its group 0)
    assert B.original_texts(shards[0], np.array([8]), cfg).to_pylist() == [texts[8]]
    assert B.original_texts(shards[2], np.array([2, 1]), cfg).to_pylist() == [texts[14], texts[13]]
    # the text column alone (no id column), as one process reads its examples; from their pages, no batch
    assert asked == ([] if pages else [("part-0.parquet", None, [2]), ("part-2.parquet", None, [0])])


def test_vectors_of_a_block_of_several_shards_have_the_first_non_null_rows_length(three_shards):
    _, shards, _, _, vec = three_shards
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "input": {"id_column": "id",
                                                                                 "vector_column": "emb"}})
    shards, blocks = _plan(shards, cfg, 100)
    assert len(blocks) == 1 and len(blocks[0].pieces) == 3
    data = B.load_block(blocks[0], shards, cfg)
    assert data.vectors.matrix.shape == (23, 3)  # the null-only first shard has the others' length
    assert (data.vectors.status[:9] == B.NULL_ROW).all() and (data.vectors.status[9:] != B.NULL_ROW).all()
    np.testing.assert_array_equal(data.vectors.matrix[9:], np.array(vec[9:], np.float32))


def test_each_shard_is_written_from_the_removed_rows_of_the_blocks_that_read_it(three_shards, tmp_path_factory):
    from gpu_dedup.run.cluster.executor import _write_shard
    from gpu_dedup.run.contract import shard_starts

    _, shards, _, ids, _ = three_shards
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    shards, blocks = _plan(shards, cfg, 100)
    assert [b.shard_indices for b in blocks] == [[0, 1, 2]]  # one block reads the three shards
    out = tmp_path_factory.mktemp("out")
    removed = {"row": np.array([1, 8, 9, 20], np.int64)}  # one block's removed rows, in shards 0, 1 and 2
    starts = shard_starts(shards)
    kept = []
    for i, shard in enumerate(shards):
        rec = _write_shard(shard, int(starts[i]), [removed], str(out), "zstd")
        got = pq.read_table(out / shard.name).column("id").to_pylist()
        assert rec["rows"] == len(got)
        kept += got
    assert kept == [d for i, d in enumerate(ids) if i not in (1, 8, 9, 20)]


def test_a_gpu_workers_shards_go_to_its_device_writer_first_and_each_writer_is_counted(three_shards, monkeypatch,
                                                                                        tmp_path_factory):
    """``gpu.writer: cudf`` on a cluster: each of a worker's Parquet shards is offered to its backend's device
    writer (cuDF's on a GPU worker); a shard it declines goes to pyarrow, and the task counts what each wrote.
    The stand-in writes with pyarrow, so both files hold the kept rows whichever wrote them."""
    import gpu_dedup.run.cluster.executor as E
    from gpu_dedup.run.contract import shard_starts

    _, shards, _, ids, _ = three_shards
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
    shards, _ = _plan(shards, cfg, 100)
    offered = []

    def device_writer(shard, keep, dst, codec):  # writes the first shard, declines the others
        offered.append((shard.name, codec))
        if shard.name != "part-0.parquet":
            return None
        kept = pq.read_table(shard.path).filter(pa.array(keep))
        pq.write_table(kept, dst, compression=codec)
        return kept.num_rows

    real = E.get_backend
    monkeypatch.setattr(E, "get_backend", lambda name: types.SimpleNamespace(write_parquet=device_writer)
                        if name == "gpu" else real(name))
    monkeypatch.setattr(E, "_worker_budget", lambda: 1 << 40)
    out = tmp_path_factory.mktemp("out")
    removed = {"row": np.array([1, 8, 9, 20], np.int64)}
    starts = [int(s) for s in shard_starts(shards)[:-1]]
    got = E._write_shards(shards, starts, [[removed]] * 3, str(out), "zstd", 2, "gpu", "cudf")
    assert sorted(offered) == [(s.name, "zstd") for s in shards]
    assert got["writers"] == {"cudf": 1, "pyarrow": 2}
    kept = [i for s in shards for i in pq.read_table(out / s.name).column("id").to_pylist()]
    assert kept == [d for i, d in enumerate(ids) if i not in (1, 8, 9, 20)]
    assert [r["rows"] for r in got["records"]] == [7, 2, 10]
    offered.clear()
    for backend, setting in [("gpu", "auto"), ("gpu", "pyarrow"), ("cpu", "cudf")]:  # the device is not offered any
        host = E._write_shards(shards, starts, [[removed]] * 3, str(tmp_path_factory.mktemp("host")), "zstd", 1,
                               backend, setting)
        assert host["writers"] == {} and offered == [] and [r["rows"] for r in host["records"]] == [7, 2, 10]


class _DeviceArray:
    """Stands in for a CuPy array on a machine without one: its type's module is CuPy's (what
    ``on_device`` looks at) and ``get()`` copies it to the host."""

    __module__ = "cupy"

    def __init__(self, a):
        self.a = np.asarray(a)
        self.nbytes = self.a.nbytes

    def get(self):
        return self.a.copy()


class _KeysOnDevice:
    class cfg:  # what block_keys reads of a family's config
        backend = "gpu"

    def exact_keys(self, rows, backend):
        return _DeviceArray(np.arange(12, dtype=np.uint64).reshape(4, 3))


def test_what_a_gpu_workers_block_task_returns_is_on_the_host(monkeypatch):
    """A cluster's frames are host arrays on GPU workers too: a block's rows and ranks are NumPy, and a frame
    that mixed them with CuPy columns failed on the first Dask-CUDA run (``docs["eligible"] & keys["k0"]``)."""
    data = type("Data", (), {"rows": lambda self: None})()
    keys = B.block_keys(data, _KeysOnDevice())
    assert all(type(v) is np.ndarray for v in keys.values())
    assert keys["k1"].tolist() == [1, 4, 7, 10]

    row = np.array([5, 6], np.int64)
    monkeypatch.setattr(B, "block_signatures", lambda data, rows, family: {
        "row": row, "values": _DeviceArray([[1], [2]]), "features": _DeviceArray([3, 4]),
        "usable": _DeviceArray([True, True])})
    monkeypatch.setattr(B, "block_bands", lambda sig, family: {
        "lsh_row": row, "band_hashes": _DeviceArray([[7, 8], [9, 10]])})
    signed = B.block_signed(data, {"row": row}, None)
    assert signed["row"] is row and signed["features"].tolist() == [3, 4]
    assert type(signed["bands"]["band_hashes"]) is np.ndarray and signed["bands"]["band_hashes"].tolist() == [[7, 8],
                                                                                                           [9, 10]]
    assert all(type(v) is np.ndarray for part in (signed, signed["bands"]) for k, v in part.items() if k != "bands")


@pytest.mark.parametrize("keep", ["first", "longest"])
def test_a_block_of_pieces_with_no_column_but_their_texts_keeps_its_rows(tmp_path, keep):
    """Shards with only a text column: once the texts are normalized, each piece's table has no column left, and
    Arrow concatenates such tables into one of 0 rows.  A block of several pieces lost its rows: keep longest
    failed on workers (ArrowInvalid "Expected length 0 but got length 7", exit 1) where one process wrote a
    complete run."""
    for k, lo in enumerate(range(0, 12, 4)):  # 3 shards of 4 rows, row groups of 1: several pieces a block
        pq.write_table(pa.table({"text": [f"text number {i}" for i in range(lo, lo + 4)]}),
                       tmp_path / f"s{k}.parquet", row_group_size=1)
    shards = discover(sorted(tmp_path.glob("*.parquet")))
    cfg = Config.from_dict({"backend": "cpu", "select": {"keep": keep}})
    shards, blocks = _plan(shards, cfg, 7)
    assert max(len(b.pieces) for b in blocks) > 1
    for b in blocks:
        mine = [shards[i] for i in b.shard_indices]
        data = B.read_block(b, mine, cfg)
        assert data.table.num_rows == b.rows
        assert keep == "first" or len(B.block_rank_key(data, keep)) == b.rows
        assert data.norm.to_pylist() == [f"text number {i}" for i in range(b.row0, b.row0 + b.rows)]


def test_lowest_id_without_an_id_column_ranks_a_block_by_its_row_numbers(three_shards):
    """keep lowest_id with no id column: one process ranks by the row numbers (its table's 'id' is the row); a
    block has no 'id' column and the rank stage failed on workers (KeyError 'Field "id" does not exist in
    schema', exit 1)."""
    _, shards, _, _, _ = three_shards
    cfg = Config.from_dict({"backend": "cpu", "select": {"keep": "lowest_id"}})  # the 'id' column is not read
    shards, blocks = _plan(shards, cfg, 14)
    assert len(blocks) == 2
    for b in blocks:
        data = B.read_block(b, [shards[i] for i in b.shard_indices], cfg)
        assert "id" not in data.table.schema.names
        assert B.block_rank_key(data, "lowest_id").to_pylist() == list(range(b.row0, b.row0 + b.rows))
