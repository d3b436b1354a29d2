"""Row groups written one at a time (gpu_dedup/storage/atomic.py): the file is the one a single write of the
whole table makes, whatever the tables it was handed; a failure leaves nothing."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.errors import OutputError
from gpu_dedup.stages.write import duplicates_parquet_options
from gpu_dedup.storage import atomic_write_parquet_groups, row_groups


def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    return pa.table({"id": pa.array([f"doc-{i}" for i in rng.permutation(n)], pa.large_string()),
                     "row": pa.array(np.arange(n), pa.int64()),
                     "shard": pa.array(np.where(np.arange(n) < n // 2, "a", "b"))})


def _one_write(table, rows):
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, row_group_size=rows, compression="zstd", **duplicates_parquet_options(table.schema))
    return sink.getvalue().to_pybytes()


@pytest.mark.parametrize("n", [0, 1, 7, 16, 45])
@pytest.mark.parametrize("cuts", [[], [3], [16], [5, 9, 30]], ids=["whole", "3", "16", "uneven"])
def test_tables_regrouped_and_written_a_group_at_a_time_are_one_writes_file(tmp_path, n, cuts):
    table = _table(n)
    bounds = [0, *[c for c in cuts if c < n], n]
    parts = [table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])]
    groups = list(row_groups(iter(parts), 16))
    assert [g.num_rows for g in groups] == ([16] * (n // 16) + ([n % 16] if n % 16 or n == 0 else []))
    path = tmp_path / "t.parquet"
    assert atomic_write_parquet_groups(path, iter(groups), "zstd", duplicates_parquet_options) == n
    assert path.read_bytes() == _one_write(table, 16)
    assert list(tmp_path.iterdir()) == [path]


def test_no_tables_is_one_empty_row_group_of_the_schema(tmp_path):
    schema = _table(1).schema
    path = tmp_path / "t.parquet"
    atomic_write_parquet_groups(path, row_groups(iter([]), 16, schema), "zstd", duplicates_parquet_options)
    assert path.read_bytes() == _one_write(schema.empty_table(), 16)


def test_a_failure_while_the_groups_are_made_leaves_no_file(tmp_path):
    def groups():
        yield _table(16)
        raise OutputError("a stand-in failure making the second row group")

    with pytest.raises(OutputError, match="stand-in"):
        atomic_write_parquet_groups(tmp_path / "t.parquet", groups(), "zstd", duplicates_parquet_options)
    assert list(tmp_path.iterdir()) == []
