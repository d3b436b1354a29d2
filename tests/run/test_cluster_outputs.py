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
