"""The bad-input matrix end to end: a clear error (problem, value, fix) or a documented behaviour."""

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from gpu_dedup.config import Config
from gpu_dedup.errors import InputError
from gpu_dedup.evaluation.sample import vocabulary
from gpu_dedup.run.entry import run_dedup
from tests.accounting import assert_accounted

CFG = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})


def _accounted(result, n):
    c = result.report["counts"]
    assert c["kept"] + c["removed"] == c["documents_read"] == n


def test_missing_text_column_exits_3_naming_columns(tmp_path, capsys):
    pq.write_table(pa.table({"id": [1], "body": ["x"]}), tmp_path / "a.parquet")
    assert main(["run", str(tmp_path / "a.parquet"), "-o", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err
    assert "text column 'text' is not in shard" in err and "'id', 'body'" in err and "--text-column" in err
    assert not (tmp_path / "o").exists()  # a new output directory is not left behind (nor its checkpoint directory)


def test_text_column_missing_in_one_shard_names_that_shard(tmp_path):
    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1], "text": ["x"]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"id": [2], "content": ["y"]}), tmp_path / "in" / "b.parquet")
    with pytest.raises(InputError, match=r"b\.parquet.*its columns are: 'id', 'content'"):
        run_dedup(tmp_path / "in", tmp_path / "out", CFG)


def test_invalid_utf8_is_hashed_as_replacement_and_written_verbatim(tmp_path):
    raw = [b"caf\xe9 au lait and more words here", b"caf\xe9 au lait and more words here", b"ok text here"]
    pq.write_table(pa.table({"id": [1, 2, 3], "text": pa.array(raw, pa.binary())}), tmp_path / "bin.parquet")
    result = run_dedup(tmp_path / "bin.parquet", tmp_path / "out", CFG)
    assert result.report["counts"]["invalid_utf8"] == 2
    assert result.kept.tolist() == [True, False, True]  # identical bytes -> exact copies
    out = pq.read_table(tmp_path / "out" / "bin.parquet")
    assert out.column("text").to_pylist() == [raw[0], raw[2]]  # original bytes kept
    _accounted(result, 3)


def test_invalid_utf8_inside_a_string_column(tmp_path):
    data = b"good textbad\xff\xfe text"
    offsets = np.array([0, 9, len(data)], np.int32)
    arr = pa.StringArray.from_buffers(2, pa.py_buffer(offsets), pa.py_buffer(data))
    pq.write_table(pa.table({"id": [1, 2], "text": arr}), tmp_path / "s.parquet")
    result = run_dedup(tmp_path / "s.parquet", tmp_path / "out", CFG)
    assert result.report["counts"]["invalid_utf8"] == 1
    _accounted(result, 2)


def test_duplicate_ids_are_counted_and_every_row_processed(tmp_path, caplog):
    texts = ["one two three four five six", "one two three four five six", "seven eight nine ten eleven"]
    pq.write_table(pa.table({"id": [7, 7, 7], "text": texts}), tmp_path / "d.parquet")
    result = run_dedup(tmp_path / "d.parquet", tmp_path / "out", CFG)
    assert result.report["counts"]["duplicate_ids"] == 2
    assert "repeat an id" in caplog.text
    assert result.kept.tolist() == [True, False, True]
    dup = result.duplicates.to_pylist()
    assert [(d["shard_row"], d["kept"]) for d in dup] == [(0, True), (1, False)]
    _accounted(result, 3)


def test_one_process_counts_repeated_ids_beside_the_stages_after_the_read(tmp_path, monkeypatch):
    """The count of repeated ids (a hash of every id) does not hold up the read stage: here it can only end once
    the exact stage has begun, and the report still has it, in the counts and the read stage's details."""
    import threading

    from gpu_dedup.run import local, sequence

    exact_began = threading.Event()
    count, exact = local.count_duplicate_ids, sequence.Sequence.exact

    def late_count(ids):
        assert exact_began.wait(30), "the read stage waited for the id count"
        return count(ids)

    def marked_exact(self):
        exact_began.set()
        return exact(self)

    monkeypatch.setattr(local, "count_duplicate_ids", late_count)
    monkeypatch.setattr(sequence.Sequence, "exact", marked_exact)
    texts = ["one two three four five six", "one two three four five six", "seven eight nine ten eleven"]
    pq.write_table(pa.table({"id": ["a", "b", "a"], "text": texts}), tmp_path / "d.parquet")
    result = run_dedup(tmp_path / "d.parquet", tmp_path / "out", CFG)
    assert result.report["counts"]["duplicate_ids"] == 1
    assert result.report["stages"]["read"]["duplicate_ids"] == 1


def test_shards_with_different_extra_columns_keep_their_own_schema(tmp_path):
    a = pa.table({"id": [1, 2], "text": ["alpha beta gamma delta epsilon", "zeta eta"], "url": ["u1", "u2"]})
    b = pa.table({"id": [3], "lang": ["en"], "text": ["alpha beta gamma delta epsilon"]})
    (tmp_path / "in").mkdir()
    pq.write_table(a, tmp_path / "in" / "a.parquet")
    pq.write_table(b, tmp_path / "in" / "b.parquet")
    result = run_dedup(tmp_path / "in", tmp_path / "out", CFG)
    assert pq.read_schema(tmp_path / "out" / "a.parquet").equals(a.schema)
    assert pq.read_schema(tmp_path / "out" / "b.parquet").equals(b.schema)
    assert pq.read_table(tmp_path / "out" / "b.parquet").num_rows == 0  # exact copy of a row in a.parquet
    _accounted(result, 3)


def test_empty_jsonl_shard_and_all_null_texts(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "empty.jsonl").write_text("\n\n")
    (tmp_path / "in" / "nulls.jsonl").write_text('{"id": 1, "text": null}\n{"id": 2, "text": null}\n')
    result = run_dedup(tmp_path / "in", tmp_path / "out", CFG)
    assert result.report["counts"]["null_text"] == 2 and result.kept.tolist() == [True, True]
    assert (tmp_path / "out" / "empty.jsonl").read_text() == ""
    assert_accounted(result, [pa.table({"id": [1, 2]})])


def test_a_single_50_mb_document(tmp_path):
    words = np.array(vocabulary(20000, 1), dtype=object)
    rng = np.random.default_rng(0)
    big = b" ".join(words[rng.integers(0, 20000, 6_500_000)]).decode()
    assert len(big) > 50_000_000
    texts = [big, "a short document of a few words", big[:1000]]
    pq.write_table(pa.table({"id": [1, 2, 3], "text": texts}), tmp_path / "big.parquet")
    result = run_dedup(tmp_path / "big.parquet", tmp_path / "out", CFG)
    assert result.kept.tolist() == [True, True, True]
    assert result.report["stages"]["signatures"]["shingles"] > 6_000_000
    _accounted(result, 3)


def test_ill_formed_utf8_inside_a_cluster_is_shown_with_replacement_characters(tmp_path):
    """The report's cluster examples decode ill-formed UTF-8 for display (U+FFFD); the outputs keep the bytes."""
    doc = b"bad \xff\xfe bytes in a document that has several more words"
    data = doc * 3 + b"another plain document with other words entirely"
    offsets = np.array([0, len(doc), 2 * len(doc), 3 * len(doc), len(data)], np.int32)
    texts = pa.StringArray.from_buffers(4, pa.py_buffer(offsets), pa.py_buffer(data))
    ids = pa.StringArray.from_buffers(4, pa.py_buffer(np.array([0, 2, 4, 6, 8], np.int32)),
                                      pa.py_buffer(b"a\xffb\xffc\xffd\xff"))
    pq.write_table(pa.table({"id": ids, "text": texts}), tmp_path / "u.parquet")
    result = run_dedup(tmp_path / "u.parquet", tmp_path / "out", CFG)
    assert result.kept.tolist() == [True, False, False, True]
    cluster = result.report["largest_clusters"][0]
    assert cluster["survivor"]["text"].startswith("bad \ufffd\ufffd bytes") and cluster["survivor"]["id"] == "a\ufffd"
    assert (tmp_path / "out" / "_SUCCESS").exists()
    assert pq.read_table(tmp_path / "out" / "u.parquet").column("text").cast(pa.binary()).to_pylist()[0] == doc


@pytest.mark.parametrize("kind", ["string_view", "binary_view"])
def test_columns_of_arrow_view_types_are_read_and_written_back_in_their_type(tmp_path, kind):
    """Arrow cannot filter or take view columns: the text and id are read as large strings and the
    shards keep their schema (view columns filtered as large strings and cast back)."""
    texts = ["one two three four five six seven"] * 3 + ["eight nine ten eleven twelve thirteen fourteen"]
    view = getattr(pa, kind)()
    as_view = (lambda v: pa.array(v, view)) if kind == "string_view" else \
        (lambda v: pa.array([x.encode() for x in v], view))
    table = pa.table({"id": pa.array(["a", "b", "c", "d"], pa.string_view()), "text": as_view(texts),
                      "note": as_view(["n1", "n2", "n3", "n4"])})
    (tmp_path / "in").mkdir()
    pq.write_table(table, tmp_path / "in" / "x.parquet")
    result = run_dedup(tmp_path / "in", tmp_path / "out", CFG)
    _accounted(result, 4)
    out = pq.read_table(tmp_path / "out" / "x.parquet")
    assert out.schema == table.schema
    note = table.column("note").to_pylist()
    assert out.column("id").to_pylist() == ["a", "d"] and out.column("note").to_pylist() == [note[0], note[3]]
    dup = pq.read_table(tmp_path / "out" / "duplicates.parquet")
    assert sorted(dup.column("id").to_pylist()) == ["a", "b", "c"]
