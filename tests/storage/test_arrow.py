"""Arrow IPC shards and Hugging Face datasets saved with save_to_disk, read by the CLI as shards."""

import json
import logging

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from gpu_dedup.evaluation.sample import planted_corpus

datasets = pytest.importorskip("datasets")  # the hf extra (and the test extra)

CPU = ["--backend", "cpu", "-q"]


@pytest.fixture(scope="module")
def table():
    s = planted_corpus(n_docs=1500, n_clusters=120, cluster_size=(2, 5), words=(40, 160), edit_rate=(0, 0.05),
                       seed=23)
    return s.table.select(["id", "text", "cluster"])


@pytest.fixture(scope="module")
def parquet_run(table, tmp_path_factory):
    d = tmp_path_factory.mktemp("arrow")
    pq.write_table(table, d / "all.parquet")
    assert main(["run", str(d / "all.parquet"), "-o", str(d / "out"), *CPU]) == 0
    return d / "out"


def _kept_ids(paths) -> list:
    return [i for p in paths for i in datasets.Dataset.from_file(str(p))["id"]]


def test_a_saved_dataset_is_read_as_its_arrow_files_and_written_back_as_arrow(table, parquet_run, tmp_path, caplog):
    datasets.Dataset(table).save_to_disk(str(tmp_path / "ds"), num_shards=3)
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    assert main(["run", str(tmp_path / "ds"), "-o", str(tmp_path / "out"), *CPU]) == 0
    assert "skipped" not in caplog.text  # state.json and dataset_info.json are the dataset's, not data
    names = [f"data-0000{i}-of-00003.arrow" for i in range(3)]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.arrow")) == names
    want = pq.read_table(parquet_run / "all.parquet").column("id").to_pylist()
    assert _kept_ids(tmp_path / "out" / n for n in names) == want  # the rows a Parquet run of the same table keeps
    dup = pq.read_table(tmp_path / "out" / "duplicates.parquet")
    same = pq.read_table(parquet_run / "duplicates.parquet")
    assert dup.select(["id", "row", "cluster_id", "kept", "similarity", "match"]).equals(
        same.select(["id", "row", "cluster_id", "kept", "similarity", "match"]))
    for name in names:  # each output: the input's IPC stream, schema and metadata (datasets' features)
        src = pa.ipc.open_stream(pa.memory_map(str(tmp_path / "ds" / name)))
        out = pa.ipc.open_stream(pa.memory_map(str(tmp_path / "out" / name)))
        assert out.schema.equals(src.schema, check_metadata=True) and b"huggingface" in out.schema.metadata
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    metadata = "metadata of a Hugging Face dataset saved with save_to_disk"
    assert {s["reason"] for s in report["inputs_skipped"]} == {metadata}
    # rerun: byte-identical outputs
    assert main(["run", str(tmp_path / "ds"), "-o", str(tmp_path / "again"), *CPU]) == 0
    assert all((tmp_path / "out" / n).read_bytes() == (tmp_path / "again" / n).read_bytes() for n in names)


def test_a_saved_dataset_dict_reads_its_splits_in_order_and_only_the_listed_files(table, tmp_path, caplog):
    dd = datasets.DatasetDict({"train": datasets.Dataset(table.slice(0, 1000)),
                               "test": datasets.Dataset(table.slice(1000))})
    dd.save_to_disk(str(tmp_path / "dd"))
    stray = tmp_path / "dd" / "train" / "cache-1234.arrow"  # a cache file: not part of the dataset
    stray.write_bytes((tmp_path / "dd" / "train" / "data-00000-of-00001.arrow").read_bytes())
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    assert main(["run", str(tmp_path / "dd"), "-o", str(tmp_path / "out"), *CPU]) == 0
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [i["path"] for i in report["inputs"]] == [str(tmp_path / "dd" / split / "data-00000-of-00001.arrow")
                                                     for split in ("train", "test")]  # dataset_dict.json's order
    assert any(s["path"] == str(stray) and "not listed in" in s["reason"] for s in report["inputs_skipped"])
    assert str(stray) in caplog.text  # a skipped file that looks like data is named
    assert report["counts"]["documents_read"] == 1500
    assert (tmp_path / "out" / "train" / "data-00000-of-00001.arrow").exists()


def test_a_saved_dataset_missing_a_listed_file_is_refused(table, tmp_path, capsys):
    datasets.Dataset(table).save_to_disk(str(tmp_path / "ds"), num_shards=2)
    (tmp_path / "ds" / "data-00001-of-00002.arrow").unlink()
    assert main(["run", str(tmp_path / "ds"), "-o", str(tmp_path / "out"), "--backend", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "lists" in err and "data-00001-of-00002.arrow" in err and "save it again" in err
    assert not (tmp_path / "out").exists()


def test_a_saved_dataset_listing_a_file_outside_its_directory_is_refused(table, tmp_path, capsys):
    """A state.json listing '../other/data.arrow' had its kept rows written to '<out>/../other/data.arrow', outside
    the output directory (an absolute name: at that very path)."""
    datasets.Dataset(table).save_to_disk(str(tmp_path / "other"))
    datasets.Dataset(table).save_to_disk(str(tmp_path / "ds"))
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    for name in ("../other/data-00000-of-00001.arrow", str(tmp_path / "other" / "data-00000-of-00001.arrow")):
        state["_data_files"] = [{"filename": name}]
        (tmp_path / "ds" / "state.json").write_text(json.dumps(state))
        assert main(["run", str(tmp_path / "ds"), "-o", str(tmp_path / "w" / "out"), "--backend", "cpu"]) == 3
        err = capsys.readouterr().err
        assert f"lists {name!r} in its state.json, a file outside its directory" in err
        assert not (tmp_path / "w").exists()


def test_an_arrow_ipc_file_keeps_its_flavour_and_a_corrupt_one_is_named(table, parquet_run, tmp_path, capsys):
    t = table.replace_schema_metadata({"source": "unit test"})
    (tmp_path / "in").mkdir()
    with pa.OSFile(str(tmp_path / "in" / "all.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        for batch in t.to_batches(max_chunksize=400):
            w.write_batch(batch)
    assert main(["run", str(tmp_path / "in"), "-o", str(tmp_path / "out"), *CPU]) == 0
    out = pa.ipc.open_file(pa.memory_map(str(tmp_path / "out" / "all.arrow")))  # an IPC file again
    assert out.schema.equals(t.schema, check_metadata=True)
    kept = out.read_all()
    assert kept.column("id").to_pylist() == pq.read_table(parquet_run / "all.parquet").column("id").to_pylist()
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.arrow").write_bytes(b"ARROW1\0\0 not really")
    assert main(["run", str(tmp_path / "bad"), "-o", str(tmp_path / "o2"), "--backend", "cpu"]) == 3
    err = capsys.readouterr().err
    assert "x.arrow" in err and "not a readable Arrow IPC file" in err and "Traceback" not in err


def _as_views(t: pa.Table) -> pa.Table:
    """``t`` as Polars writes strings to Arrow IPC (views), with a list and a struct of views beside them."""
    ids = t.column("id").cast(pa.string())
    return pa.table({"id": ids.cast(pa.string_view()), "text": t.column("text").cast(pa.string_view()),
                     "tags": pa.array([[s, s] for s in ids.to_pylist()], pa.list_(pa.string_view())),
                     "meta": pa.array([{"url": s} for s in ids.to_pylist()], pa.struct([("url", pa.string_view())]))})


def test_view_columns_are_read_and_written_back_as_views(table, parquet_run, tmp_path):
    """string_view / binary_view columns (Polars' strings), also inside lists and structs: Arrow's filter has no
    kernel for them; the kept rows are written with the shard's own schema.  The in-memory API takes them too."""
    import gpu_dedup

    t = _as_views(table)
    (tmp_path / "in").mkdir()
    with pa.OSFile(str(tmp_path / "in" / "all.arrow"), "wb") as f, pa.ipc.new_file(f, t.schema) as w:
        for batch in t.to_batches(max_chunksize=400):
            w.write_batch(batch)
    assert main(["run", str(tmp_path / "in"), "-o", str(tmp_path / "out"), *CPU]) == 0
    kept = pa.ipc.open_file(pa.memory_map(str(tmp_path / "out" / "all.arrow"))).read_all()
    assert kept.schema.equals(t.schema)
    want = [str(i) for i in pq.read_table(parquet_run / "all.parquet").column("id").to_pylist()]
    assert kept.column("id").to_pylist() == want
    assert kept.column("tags").to_pylist() == [[i, i] for i in want]
    res = gpu_dedup.dedup(t, backend="cpu")
    assert res.deduplicated.schema.equals(t.schema) and res.deduplicated.column("id").to_pylist() == want


def test_arrow_shards_stream_in_batches(table, tmp_path):
    from gpu_dedup.config import InputConfig
    from gpu_dedup.storage import discover, iter_columns, read_columns

    datasets.Dataset(table).save_to_disk(str(tmp_path / "ds"))
    shard = discover(str(tmp_path / "ds"))[0]
    whole = read_columns(shard, InputConfig(id_column="id"))
    parts = list(iter_columns(shard, InputConfig(id_column="id"), batch_bytes=50_000))
    assert len(parts) == 2 and pa.concat_tables(parts).equals(whole)  # datasets wrote batches of 1,000 rows
    assert whole.column("text").to_pylist() == table.column("text").to_pylist()
    assert np.array_equal(whole.column("id").to_numpy(zero_copy_only=False), table.column("id").to_numpy(
        zero_copy_only=False))
