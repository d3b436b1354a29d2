"""Index.add (gpu_dedup/index/add.py): what it refuses names Index.add, the function the user called."""

import pytest

from gpu_dedup.errors import InputError
from gpu_dedup.index.add import add


@pytest.mark.parametrize("frame", [["text one", "text two"], {"text": ["a"]}, "text"])
def test_a_frame_of_the_wrong_type_is_refused_naming_index_add(frame):
    """The error named dedup(): ``Index.add(['a', 'b'])`` said "dedup() takes a pandas DataFrame, ..."."""
    with pytest.raises(InputError) as err:
        add(object(), frame)  # refused before the index is touched
    assert str(err.value).startswith("Index.add() takes a pandas DataFrame, a pyarrow Table")
    assert "dedup()" not in str(err.value)


def test_a_datasetdict_is_refused_naming_index_add():
    datasets = pytest.importorskip("datasets")
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["a b c"]})})
    with pytest.raises(InputError, match=r"^Index.add\(\) got a datasets.DatasetDict; .* e.g. Index.add\(ds\['train'\]\)"):
        add(object(), dd)


def test_rows_without_ids_are_not_appended_among_an_indexs_ids(tmp_path):
    """``Index.add(frame)`` without ``id=`` on an index of ids from a column stored the rows' numbers among those
    ids, nothing telling them apart (or, for string ids, failed after the whole dedup)."""
    import pandas as pd

    from gpu_dedup.config import Config
    from gpu_dedup.index import Index

    docs = [f"document number {i} about a subject of its own, words {i} {i + 1} {i + 2}" for i in range(40)]
    index = Index.create(tmp_path / "ix", Config())
    index.add(pd.DataFrame({"id": range(1000, 1040), "text": docs}), id="id")
    with pytest.raises(InputError, match=r"^Index.add\(\) without id= names the rows by number, but the index .* "
                                         r"holds ids from column 'id'; give id="):
        index.add(pd.DataFrame({"text": ["a new document of some words here"]}))
    assert Index.open(tmp_path / "ix").documents == 40
    assert index.add(pd.DataFrame({"id": [5000], "text": ["a new document of some words here"]}), id="id").kept.all()
    assert Index.open(tmp_path / "ix").documents == 41


def test_a_configs_text_and_id_columns_are_read_unless_text_or_id_name_others(tmp_path):
    """As ``dedup()`` does: ``Index.add(frame, config=...)`` read a column named ``text`` and no ids, whatever the
    config's ``input.text_column`` / ``input.id_column`` said."""
    import pandas as pd

    from gpu_dedup.config import Config
    from gpu_dedup.index import Index

    docs = [f"document number {i} about a subject of its own, words {i} {i + 1} {i + 2}" for i in range(40)]
    cfg = {"input": {"text_column": "body", "id_column": "url"}}
    index = Index.create(tmp_path / "ix", Config())
    got = index.add(pd.DataFrame({"url": [f"u{i}" for i in range(40)], "body": docs}), config=cfg)
    assert got.kept.all() and Index.open(tmp_path / "ix").id_column == "url"
    again = index.add(pd.DataFrame({"url": ["new"], "body": [docs[3]], "text": ["unrelated words entirely"]}),
                      config=cfg)
    assert not again.kept.any() and again.duplicates["survivor_id"].tolist() == ["u3"]
    other = index.add(pd.DataFrame({"url": ["n2"], "text": [docs[4]], "body": ["x"]}), text="text", config=cfg)
    assert not other.kept.any()  # text= names another column than the config's
