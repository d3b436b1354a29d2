"""Inputs on the Hugging Face Hub (``hf://datasets/...``), read through fsspec as any store's.

Without network, the ``hf`` protocol is served by a local directory laid out as a Hub dataset repository
(README, .gitattributes, data/*.parquet); the real protocol's missing package is simulated."""

import importlib
import sys

import pyarrow.parquet as pq
import pytest

from gpu_dedup.cli import main
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.storage import filesystems

fsspec = pytest.importorskip("fsspec")
REGISTRY = importlib.import_module("fsspec.registry")._registry  # fsspec's protocol -> class (fsspec.registry: a view)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A local directory behind the ``hf`` protocol: hf://datasets/user/corpus/... is hub/datasets/user/corpus/."""
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    root = tmp_path / "hub"
    repo = root / "datasets" / "user" / "corpus"
    s = planted_corpus(n_docs=600, n_clusters=60, cluster_size=(2, 4), words=(40, 150), edit_rate=(0, 0.05), seed=8)
    write_shards(s.table.select(["id", "text"]), repo / "data", shards=2, prefix="train")
    (repo / "README.md").write_text("---\nlicense: mit\n---\n# corpus\n")
    (repo / ".gitattributes").write_text("*.parquet filter=lfs\n")

    class LocalHub(DirFileSystem):
        protocol = "hf"

        def __init__(self, *args, **kwargs):
            super().__init__(path=str(root), fs=LocalFileSystem())

    monkeypatch.setitem(REGISTRY, "hf", LocalHub)
    monkeypatch.setattr(filesystems, "_FS", {})  # no file system object of another test's
    return repo


def test_a_hub_dataset_path_is_read_as_shards(hub, tmp_path, capsys):
    assert main(["run", "hf://datasets/user/corpus/", "-o", str(tmp_path / "out"), "--backend", "cpu", "-q"]) == 0
    assert main(["run", str(hub / "data"), "-o", str(tmp_path / "local"), "--backend", "cpu", "-q"]) == 0
    for name in ("train-00000.parquet", "train-00001.parquet"):  # the repository's layout below the path
        assert pq.read_table(tmp_path / "out" / "data" / name).equals(pq.read_table(tmp_path / "local" / name))
    assert pq.read_table(tmp_path / "out" / "duplicates.parquet").drop_columns(["shard"]).equals(
        pq.read_table(tmp_path / "local" / "duplicates.parquet").drop_columns(["shard"]))
    # a glob, as the Hub's dataset viewer names files
    assert main(["run", "hf://datasets/user/corpus/data/train-*.parquet", "-o", str(tmp_path / "glob"),
                 "--backend", "cpu", "-q"]) == 0
    assert (tmp_path / "glob" / "train-00001.parquet").exists()
    # the Hub is read, not written
    assert main(["run", str(hub / "data"), "-o", "hf://datasets/user/corpus/out/", "--backend", "cpu"]) == 4
    assert "hf:// URLs are read-only" in capsys.readouterr().err


def test_hub_paths_without_huggingface_hub_name_the_install(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(filesystems, "_FS", {})
    monkeypatch.delitem(REGISTRY, "hf", raising=False)  # as in a process that never used it
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    assert main(["run", "hf://datasets/user/corpus/", "-o", str(tmp_path / "out"), "--backend", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "hf://datasets/user/corpus/" in err and "pip install huggingface_hub" in err, err
    assert "pip install 'gpu_dedup[hf]'" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_remote_path_keys_are_kept_exactly():
    """An object store's key may hold '//' or start with '/': another object than the one without.  RemotePath
    folded runs of slashes (re.sub('/+', '/')), so such an input was read as a missing key and an output
    prefix s3://b/x//o/ was written to x/o/.  Only one trailing slash is dropped (the prefix)."""
    from gpu_dedup.errors import ConfigError
    from gpu_dedup.storage.filesystems import RemotePath

    p = RemotePath("s3://bkt/crawl//part-0.parquet")
    assert str(p) == "s3://bkt/crawl//part-0.parquet" and p.key == "bkt/crawl//part-0.parquet"
    assert p != RemotePath("s3://bkt/crawl/part-0.parquet") and p.name == "part-0.parquet"
    assert str(RemotePath("s3://bkt//lead/")) == "s3://bkt//lead" and RemotePath("s3://bkt//lead").key == "bkt//lead"
    assert RemotePath("s3://bkt/out/") == RemotePath("s3://bkt/out") == RemotePath(RemotePath("s3://bkt/out/"))
    x = RemotePath("s3://bkt/x//o")
    assert str(x / "a/b.parquet") == "s3://bkt/x//o/a/b.parquet" and RemotePath(str(x)) == x  # round trip
    assert (x / "a.parquet").relative_to(x) == "a.parquet"
    assert RemotePath("s3://bkt/crawl//a").relative_to(RemotePath("s3://bkt/crawl")) == "/a"
    with pytest.raises(ValueError):  # /lead/a is not under the prefix lead
        RemotePath("s3://bkt//lead/a").relative_to(RemotePath("s3://bkt/lead"))
    assert (x / "a.parquet").parent == x and RemotePath("s3://bkt/crawl//a").parent == RemotePath("s3://bkt/crawl")
    with pytest.raises(ConfigError, match=r"ends in '//'.*'s3://bkt/out/'"):  # problem, value, fix
        RemotePath("s3://bkt/out//")
    # what an input URL lists, and the output name of a key below it
    from gpu_dedup.storage.filesystems import input_prefix, output_name

    assert input_prefix("s3://bkt/crawl") == input_prefix("s3://bkt/crawl/") == "s3://bkt/crawl/"
    assert input_prefix("s3://bkt/crawl//") == "s3://bkt/crawl//"
    assert input_prefix("s3://bkt/crawl//*.parquet") == "s3://bkt/crawl//"
    assert output_name("/a.parquet") == "a.parquet" and output_name("sub//b.jsonl") == "sub/b.jsonl"
