"""Pieces of a cluster run that need no cluster: moving rows between partitions keeps their order, and
the duplicates table merged from per-block parts is the very file one process writes."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.run.cluster import executor, routing
from gpu_dedup.stages import frames


def test_a_route_keeps_source_order_and_arrow_columns():
    parts = [{"k": np.array([3, 1, 3, 0], np.int64), "id": pa.array(["a", "b", "c", None])},
             {"k": np.array([1, 3], np.int64), "id": pa.array(["e", "f"])}]
    cut = [routing.split(p, i, frames.hash_dest, 3, on="k") for i, p in enumerate(parts)]
    out = [routing.gather_pieces(*[c[k] for c in cut]) for k in range(3)]
    assert sum(frames.size(o) for o in out) == 6
    for o in out:  # each destination: one key's rows (or several keys'), sources in order, positions in order
        ids = o["id"].to_pylist()
        for key in set(o["k"].tolist()):
            want = [i for p in parts for kk, i in zip(p["k"].tolist(), p["id"].to_pylist()) if kk == key]
            assert [i for kk, i in zip(o["k"].tolist(), ids) if kk == key] == want
    again = [routing.gather_pieces(*[c[k] for c in cut]) for k in range(3)]
    assert all(a["id"].equals(b["id"]) for a, b in zip(out, again))


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
                      "similarity": pa.array(rng.random(rows).astype(np.float32))})
    want = tmp_path / "one.parquet"
    pq.write_table(table, want, compression="zstd", row_group_size=64)
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
    loaded = B.load_block(block, shard, cfg)
    assert sys.getsizeof(loaded) >= loaded.table.nbytes > 300
    norm = B.normalize_block(loaded, cfg)
    assert sys.getsizeof(norm) >= norm.table.nbytes + norm.strings.data.nbytes + norm.strings.offsets.nbytes


@pytest.mark.parametrize("keep", ["longest", "lowest_id"])
def test_a_normalized_block_holds_no_original_texts_and_still_answers_for_them(tmp_path, keep):
    """After normalization a block keeps its normalized texts only; the longest policy's key (the original
    texts' lengths) is kept, and the report's sample texts are read from the shard again."""
    from gpu_dedup.stages.selection import text_lengths

    B, cfg, shard, block, texts = _one_block(tmp_path, keep)
    loaded = B.load_block(block, shard, cfg)
    want_key = B.block_rank_key(loaded, keep)
    norm = B.normalize_block(loaded, cfg)
    assert "text" not in norm.table.schema.names
    assert B.block_rank_key(norm, keep).equals(want_key)
    if keep == "longest":
        assert want_key.to_pylist() == text_lengths(pa.array(texts)).to_pylist()
    rows = np.array([3, 1, 0], np.int64)
    assert B.take_column(norm, rows, "text", shard, cfg).to_pylist() == [texts[3], None, texts[0]]
    assert B.take_column(norm, rows, "id", shard, cfg).to_pylist() == ["d3", "d1", "d0"]


def test_signature_values_go_with_the_task_that_makes_the_bands(tmp_path):
    """On workers a block's signatures and band hashes are one task: its result holds the band hashes, and
    the signature values only where the family keeps them for verification by signature."""
    from gpu_dedup.stages.families import family_for

    B, cfg, shard, block, _ = _one_block(tmp_path)
    data = B.normalize_block(B.load_block(block, shard, cfg), cfg)
    for method, kept in (("exact", False), ("signature", True)):
        c = cfg.with_overrides({"verify.method": method})
        fam = family_for(c, 5)
        rows = {"row": np.array([0, 2, 3], np.int64)}
        signed = B.block_signed(data, rows, fam)
        want = B.block_bands(B.block_signatures(data, rows, fam), fam)
        assert "values" not in signed and ("signatures" in signed["bands"]) == kept
        assert set(signed["bands"]) == set(want)
        assert all(np.array_equal(signed["bands"][k], want[k]) for k in want)


def test_route_pieces_carry_only_the_frames_columns():
    """The direct route's pieces are the frame's own columns (no source / position tags): a piece keeps its
    source's row order, and a destination gathers the pieces in source order."""
    part = {"k": np.arange(10, dtype=np.int64), "v": np.arange(10, dtype=np.int32)}
    pieces = routing.split(part, 0, frames.hash_dest, 3, on="k")
    assert all(set(p) == {"k", "v"} for p in pieces)
    assert all((np.diff(p["k"]) > 0).all() for p in pieces)


def test_blocks_are_spread_by_rows_over_the_workers():
    from gpu_dedup.run.cluster.blocks import spread_blocks

    rows = [100, 100, 50, 50, 100, 100]
    homes = spread_blocks(rows, ["a", "b"])
    assert [sum(r for r, h in zip(rows, homes) if h == w) for w in "ab"] == [250, 250]
    assert spread_blocks([5], []) == [None]
