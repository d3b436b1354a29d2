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
