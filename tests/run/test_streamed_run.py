"""A run reads, normalizes and writes shards in batches: its results are those of reading whole shards.

The digests below were computed by the code that read every shard whole and normalized the whole
text column at once (before reads were streamed), on the corpus this module builds; they cover
kept rows, cluster ids, the duplicate table's values and the report's counts.  The written shards
are compared byte for byte with what that code wrote (whole table read, filtered, written).
"""

import hashlib
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.storage import parquet as pqs

GOLDEN = {  # (format, select.keep) -> digest of the results of the whole-shard code
    ("parquet", "first"): "e58425064662eb04f0d3f0237831d18b0e3b32e5cc7337b3f5e69154ea3d42aa",
    ("parquet", "longest"): "a34bd6ba5150fff5fd97a01cd9a75a47b1a05d1c577673995fce7b603546aa96",
    ("parquet", "score"): "59535563f2891197bf603a4bf0a54e62e16f10fe6c5663df45bc1be7c61a5c3d",
    ("jsonl", "first"): "56c19f694f5df90e816986cd448f057a5b5d19221ab67db0c03d337820957186",
    ("jsonl", "longest"): "3ce6838980db6eda6c27b3892360c85eeb2baa0b16c2dc4280e35d9f168506a2",
    ("jsonl", "score"): "dde196eeb5b699bfe213aba02aa2bd4b580466376aa8385f8da4c4d5b58e4604",
}


def corpus_table() -> pa.Table:
    """Planted clusters plus what takes other paths: NFKC-unstable text, full-width letters, nulls, empty texts."""
    s = planted_corpus(n_docs=2400, n_clusters=120, cluster_size=(2, 5), words=(30, 150),
                       edit_rate=(0.0, 0.05), seed=28)
    texts = s.table.column("text").to_pylist()
    for i in range(0, len(texts), 97):
        texts[i] = texts[i].replace(" ", " \ufb01 ", 3)  # the fi ligature: utf8proc's slow path
    for i in range(11, len(texts), 53):
        texts[i] = "\uff26\uff55\uff4c\uff4c w\u00e9ird\u0301 " + texts[i]
    for i in range(5, len(texts), 211):
        texts[i] = None
    for i in range(7, len(texts), 307):
        texts[i] = ""
    score = np.arange(len(texts), dtype=np.float64) % 13
    return pa.table({"id": s.table.column("id"), "text": pa.array(texts, pa.string()), "score": score})


def write_corpus(table, d, fmt):
    """Two shards; Parquet ones of many row groups (100 and 137 rows)."""
    d.mkdir(parents=True, exist_ok=True)
    half = table.num_rows // 2 + 17
    for i, part in enumerate([table.slice(0, half), table.slice(half)]):
        if fmt == "parquet":
            pq.write_table(part, d / f"part-{i}.parquet", row_group_size=100 + 37 * i, compression="snappy")
        else:
            with open(d / f"part-{i}.jsonl", "w") as f:
                for row in part.to_pylist():
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")


def digest(result) -> str:
    dup = result.duplicates
    payload = {"kept": np.asarray(result.kept).astype(int).tolist(), "cluster": np.asarray(result.cluster).tolist(),
               "duplicates": {c: dup.column(c).to_pylist() for c in dup.column_names},
               "counts": dict(result.report["counts"])}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("streamed")
    t = corpus_table()
    for fmt in ("parquet", "jsonl"):
        write_corpus(t, d / fmt, fmt)
    return d


def _cfg(keep: str, **output) -> Config:
    return Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, "output": output,
                             "select": {"keep": keep, "score_column": "score" if keep == "score" else None}})


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("batches", ["small", "default"])
def test_results_are_the_whole_shard_codes(corpora, tmp_path, monkeypatch, fmt, batches):
    if batches == "small":  # batches of a few dozen rows: many per row group, across row groups and blocks
        monkeypatch.setattr(pqs, "BATCH_BYTES", 20_000)
        monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 30_000)
    for keep in ("first", "longest", "score"):
        result = run_dedup(corpora / fmt, tmp_path / keep, _cfg(keep))
        assert digest(result) == GOLDEN[fmt, keep], (fmt, keep)
        normalize = result.report["stages"]["normalize"]
        if result.report["backend"].startswith("cpu"):  # the host normalizes each batch as it is read
            assert normalize["normalized_while_reading_seconds"] >= 0
        else:  # a GPU backend (the name cpu under pytest --backend gpu) normalizes on the device, after reading
            assert "normalized_while_reading_seconds" not in normalize and normalize["text_mb"] > 0


def _whole_table_write(src, keep, dst, compression):
    """How a shard's kept rows were written before: the whole table read, filtered and written at once."""
    table = pq.ParquetFile(src).read()
    pq.write_table(table.filter(pa.array(keep)), dst, compression=compression)


@pytest.mark.parametrize("hold", [True, False])
def test_written_shards_are_byte_identical_to_the_whole_table_write(corpora, tmp_path, monkeypatch, hold):
    """Whether the write stage takes the kept rows from the batches the read stage held (output.hold_inputs) or
    reads each shard again, it writes the bytes of the whole table read, filtered and written at once."""
    monkeypatch.setattr(pqs, "BATCH_BYTES", 20_000)
    result = run_dedup(corpora / "parquet", tmp_path / "zstd", _cfg("first", compression="zstd", hold_inputs=hold))
    same = run_dedup(corpora / "parquet", tmp_path / "same", _cfg("first", hold_inputs=hold))  # compression: same
    starts = np.cumsum([0] + [s.rows for s in result.shards])
    for i, shard in enumerate(result.shards):
        keep = result.kept[starts[i]:starts[i + 1]]
        _whole_table_write(shard.path, keep, tmp_path / "old.parquet", "zstd")
        assert (tmp_path / "zstd" / shard.name).read_bytes() == (tmp_path / "old.parquet").read_bytes()
        _whole_table_write(shard.path, keep, tmp_path / "old.parquet", "snappy")  # the input's codec
        assert (tmp_path / "same" / shard.name).read_bytes() == (tmp_path / "old.parquet").read_bytes()
    assert np.array_equal(same.kept, result.kept)


def test_written_jsonl_keeps_the_kept_lines(corpora, tmp_path, monkeypatch):
    monkeypatch.setattr(storage.jsonl, "STREAM_BLOCK", 30_000)
    result = run_dedup(corpora / "jsonl", tmp_path / "out", _cfg("first"))
    starts = np.cumsum([0] + [s.rows for s in result.shards])
    for i, shard in enumerate(result.shards):
        lines = open(shard.path, "rb").read().splitlines(keepends=True)
        keep = result.kept[starts[i]:starts[i + 1]]
        assert (tmp_path / "out" / shard.name).read_bytes() == b"".join(np.array(lines, dtype=object)[keep])


def test_held_shards_are_read_once_for_the_write_stage_and_the_reports_samples(corpora, tmp_path, monkeypatch):
    from gpu_dedup.run import local
    from gpu_dedup.storage import filter as filt

    def again(*a, **k):
        raise AssertionError("a shard was read again")

    expected = run_dedup(corpora / "parquet", tmp_path / "reread", _cfg("first", hold_inputs=False))
    monkeypatch.setattr(filt, "iter_parquet", again)
    monkeypatch.setattr(local, "read_texts", again)
    held = run_dedup(corpora / "parquet", tmp_path / "held", _cfg("first", hold_inputs=True))
    assert digest(held) == digest(expected)
    for name in [s.name for s in held.shards] + ["duplicates.parquet"]:
        assert (tmp_path / "held" / name).read_bytes() == (tmp_path / "reread" / name).read_bytes()
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("held", "reread"))
    for key in ("largest_clusters", "largest_near_duplicate_clusters", "closest_to_threshold"):
        assert a[key] == b[key] and a[key] is not None
    assert any(c["survivor"]["text"] for c in a["largest_clusters"])  # (the largest: the empty texts)


def test_jsonl_shards_are_read_again_whatever_hold_inputs_says(corpora, tmp_path):
    result = run_dedup(corpora / "jsonl", tmp_path / "out", _cfg("first", hold_inputs=True))
    assert digest(result) == GOLDEN["jsonl", "first"]
