"""The read stage's device readers (``gpu_dedup.backends.placement.Readers``) on the CPU: which reader takes
which shards.  The device's own readers are in ``test_device_gpu.py``."""
import pyarrow as pa
import pytest

from gpu_dedup.backends.placement import Readers
from gpu_dedup.stages.read import read
from gpu_dedup.storage.discovery import memory_shard


def _refuse(shards):  # a table reader reads files, never a frame already in memory
    pytest.fail(f"the table reader was given {[s.path for s in shards]}")


def test_a_frame_in_memory_keeps_its_own_text_column_where_the_device_reads_tables():
    texts = pa.array(["a b c", "d e f", "g h i"], pa.large_string())
    shard = memory_shard(pa.table({"id": pa.array([3, 1, 2])}), name="cudf frame", text=texts)
    readers = Readers(text=lambda s, c: pytest.fail("a memory shard has its column"), table=_refuse)
    corpus = read([shard], readers=readers)
    assert corpus.table.num_rows == 3
    assert corpus.device_text == [texts] and corpus.device_table is None
