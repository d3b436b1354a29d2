"""duplicates.parquet's encodings (gpu_dedup/stages/write.py): the columns of few values dictionary-encoded, the
document numbers delta-encoded, the ids plain; what is read back is the table written, byte for byte again."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.stages.write import duplicates_parquet_options, duplicates_table


class _NoPrior:
    active = False


def _table(n=5000, ids=True, in_index=False):
    rng = np.random.default_rng(n)
    rows = np.sort(rng.choice(4 * n, n, replace=False)).astype(np.int64)
    cluster = rng.integers(0, 4 * n, n)
    kept = rng.random(n) < 0.2
    names = [f"part-{i:05d}.parquet" for i in range(4)]
    ids_of = (lambda r: pa.array([f"doc-{x}" for x in r], pa.large_string())) if ids else None
    return duplicates_table(rows=rows, shard_starts=[0, n, 2 * n, 3 * n, 4 * n], shard_names=names, kept=kept,
                            cluster=cluster, similarity=rng.random(n).astype(np.float32),
                            exact=rng.random(n) < 0.5, first_row=7,
                            ids=ids_of(rows) if ids else None, survivor_ids=ids_of(cluster) if ids else None,
                            id_column="doc" if ids else None,
                            in_index=(rng.random(n) < 0.5) if in_index else None)


def _encodings(path) -> dict:
    meta = pq.ParquetFile(path).metadata
    return {meta.row_group(0).column(i).path_in_schema: set(meta.row_group(0).column(i).encodings)
            for i in range(meta.num_columns)}


@pytest.mark.parametrize("ids,in_index", [(True, False), (False, False), (True, True)])
def test_the_duplicates_table_reads_back_as_written_with_its_encodings(tmp_path, ids, in_index):
    table = _table(ids=ids, in_index=in_index)
    path = tmp_path / "duplicates.parquet"
    storage.atomic_write_parquet(path, table, "same", options=duplicates_parquet_options(table.schema))
    back = pq.read_table(path)
    assert back.schema == table.schema and back.equals(table)  # same columns, types, values, row order
    enc = _encodings(path)
    for name in ("row", "cluster_id", "shard_row"):  # document numbers: delta-encoded, no dictionary
        assert "DELTA_BINARY_PACKED" in enc[name] and "RLE_DICTIONARY" not in enc[name], (name, enc[name])
    for name in ("similarity", "match", "shard"):  # few values: a dictionary
        assert "RLE_DICTIONARY" in enc[name], (name, enc[name])
    if ids:  # a user's ids and the survivors' ids: plain (nearly unique values; no hash of each)
        assert enc["doc"] <= {"PLAIN", "RLE"} and enc["survivor_id"] <= {"PLAIN", "RLE"}, enc
    meta = pq.ParquetFile(path).metadata.row_group(0)
    assert all(meta.column(i).is_stats_set for i in range(meta.num_columns))  # readers still skip row groups
    assert all(meta.column(i).compression == "ZSTD" for i in range(meta.num_columns))
    again = tmp_path / "again.parquet"
    storage.atomic_write_parquet(again, table, "same", options=duplicates_parquet_options(table.schema))
    assert again.read_bytes() == path.read_bytes()


def test_a_user_id_column_of_integers_keeps_pyarrow_s_plain_encoding():
    table = pa.table({"doc": pa.array([5, 3], pa.int64()), "row": pa.array([0, 1], pa.int64()),
                      "shard_row": pa.array([0, 1], pa.int32())})
    options = duplicates_parquet_options(table.schema)
    assert options["column_encoding"] == {"row": "DELTA_BINARY_PACKED"}  # int64 document numbers only
    assert options["use_dictionary"] == []
