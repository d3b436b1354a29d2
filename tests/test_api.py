"""The DataFrame API (gpu_dedup.dedup) and the step-by-step stage functions (gpu_dedup.stages)."""

import json
import sys
import types

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import gpu_dedup
from gpu_dedup import Config, stages
from gpu_dedup.errors import ConfigError, InputError
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.run.entry import run_dedup
from tests.fake_columns import fake_plc_column

CPU = {"backend": "cpu"}


@pytest.fixture(scope="module")
def sample():
    return planted_corpus(n_docs=900, n_clusters=50, cluster_size=(2, 5), words=(40, 160), edit_rate=(0.0, 0.06),
                          seed=31)


@pytest.fixture(scope="module")
def frame(sample):
    df = sample.table.select(["id", "text"]).to_pandas()
    df["score"] = np.linspace(0.0, 1.0, len(df))
    df["tag"] = pd.Categorical(np.where(np.arange(len(df)) % 3 == 0, "a", "b"))
    df["count"] = pd.array(np.arange(len(df)) % 7, dtype="Int32")
    df.index = pd.Index(np.arange(len(df)) * 10 + 5, name="pos")
    return df


@pytest.fixture(scope="module")
def file_run(sample, tmp_path_factory):
    """The same rows as one Parquet shard through the file-based pipeline."""
    d = tmp_path_factory.mktemp("api")
    pq.write_table(sample.table.select(["id", "text"]), d / "all.parquet")
    return run_dedup(d / "all.parquet", d / "out", Config.from_dict({**CPU, "input": {"id_column": "id"}}))


def test_pandas_frame_equals_the_file_run(frame, file_run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = gpu_dedup.dedup(frame, text="text", id="id", backend="cpu")
    assert list(tmp_path.iterdir()) == []  # in memory: nothing written anywhere here
    assert res.report["counts"]["removed"] > 20
    assert (res.kept == file_run.kept).all() and (res.clusters == file_run.cluster).all()
    # deduplicated: the input frame's kept rows, same type, columns, dtypes and index, input order
    out = res.deduplicated
    assert isinstance(out, pd.DataFrame)
    assert list(out.columns) == list(frame.columns) and (out.dtypes == frame.dtypes).all()
    pd.testing.assert_frame_equal(out, frame[res.kept])
    assert out["id"].tolist() == pq.read_table(file_run.output_dir / "all.parquet").column("id").to_pylist()
    # duplicates: the file run's table with the frame position (row) for shard / shard_row
    dup = res.duplicates
    assert isinstance(dup, pd.DataFrame)
    assert list(dup.columns) == ["id", "row", "cluster_id", "kept", "similarity", "match", "survivor_id"]
    want = file_run.duplicates.drop_columns(["row", "shard"]).to_pandas().rename(columns={"shard_row": "row"})
    pd.testing.assert_frame_equal(dup, want[dup.columns])
    removed = dup[~dup["kept"]]
    assert sorted(removed["row"]) == np.flatnonzero(~res.kept).tolist()
    assert (frame["id"].to_numpy()[removed["row"]] == removed["id"].to_numpy()).all()
    assert len(res.edges) == len(file_run.edges) and res.removed.sum() == len(removed)
    assert res.report["inputs"][0]["format"] == "memory" and res.report["counts"]["accounted"]
    assert "largest_clusters" in res.report and res.report["resumed_from_checkpoint"] == []


def test_arrow_table_keeps_its_schema(sample, file_run):
    table = sample.table.replace_schema_metadata({"source": "unit test"})
    res = gpu_dedup.dedup(table, backend="cpu")  # id=None: rows named by position only
    assert isinstance(res.deduplicated, pa.Table) and isinstance(res.duplicates, pa.Table)
    assert res.deduplicated.schema.equals(table.schema, check_metadata=True)
    assert res.deduplicated.equals(table.filter(pa.array(res.kept)))
    assert res.duplicates.column_names == ["row", "cluster_id", "kept", "similarity", "match"]
    assert (res.kept == file_run.kept).all()
    rows = res.duplicates.column("row").to_numpy()
    assert (res.duplicates.column("cluster_id").to_numpy() == res.clusters[rows]).all()
    # an id column named like a column of the duplicates table would be mistaken for it: refused at once
    with pytest.raises(ConfigError, match="id column 'row' has the name of a column gpu_dedup writes"):
        gpu_dedup.dedup(table.rename_columns(["row" if c == "id" else c for c in table.column_names]), id="row",
                        backend="cpu")


def test_a_hugging_face_dataset_is_read_in_place_and_comes_back_as_one(sample, file_run, tmp_path, monkeypatch):
    """A datasets.Dataset (here saved with save_to_disk and loaded again: memory-mapped Arrow files) is
    deduplicated from its own Arrow buffers, and the kept rows come back as a Dataset over the same table."""
    datasets = pytest.importorskip("datasets")
    import gpu_dedup.run.dataframes as frames  # where a frame becomes the run's in-memory shard

    datasets.Dataset(sample.table.select(["id", "text", "cluster"])).save_to_disk(str(tmp_path / "ds"))
    files = sorted(p.name for p in (tmp_path / "ds").iterdir())
    ds = datasets.load_from_disk(str(tmp_path / "ds"))
    handed = []
    real = frames.memory_shard
    monkeypatch.setattr(frames, "memory_shard", lambda table, **kw: handed.append(table) or real(table, **kw))
    res = gpu_dedup.dedup(ds, text="text", id="id", backend="cpu")
    assert (res.kept == file_run.kept).all() and (res.clusters == file_run.cluster).all()
    mine = [c.buffers()[2].address for c in handed[0].column("text").chunks]
    theirs = [c.buffers()[2].address for c in ds.data.table.column("text").chunks]
    assert mine == theirs  # the text bytes the run read are the dataset's own (memory-mapped) buffers
    out = res.deduplicated
    assert isinstance(out, datasets.Dataset) and out.column_names == ["id", "text", "cluster"]
    assert out.features == ds.features and len(out) == int(res.kept.sum())
    assert out["id"] == pq.read_table(file_run.output_dir / "all.parquet").column("id").to_pylist()
    assert isinstance(res.duplicates, datasets.Dataset)
    assert res.duplicates.column_names == ["id", "row", "cluster_id", "kept", "similarity", "match", "survivor_id"]
    want = file_run.duplicates.drop_columns(["row", "shard"]).rename_columns(
        ["row" if c == "shard_row" else c for c in file_run.duplicates.drop_columns(["row", "shard"]).column_names])
    assert res.duplicates.with_format("arrow")[:].select(res.duplicates.column_names).equals(
        want.select(res.duplicates.column_names))
    assert sorted(p.name for p in (tmp_path / "ds").iterdir()) == files  # nothing written beside the dataset
    # a dataset with an indices mapping (shuffle, select, filter) is deduplicated in its own row order
    order = np.random.default_rng(3).permutation(len(ds))[:600]
    shuffled = ds.select(order, keep_in_memory=True)
    table = sample.table.select(["id", "text", "cluster"]).take(pa.array(order))
    again = gpu_dedup.dedup(shuffled, id="id", backend="cpu")
    assert (again.kept == gpu_dedup.dedup(table, id="id", backend="cpu").kept).all()
    assert again.deduplicated["id"] == table.filter(pa.array(again.kept)).column("id").to_pylist()
    with pytest.raises(InputError, match=r"DatasetDict holds splits: deduplicate one, e.g. dedup\(ds\['train'\]\)"):
        gpu_dedup.dedup(datasets.DatasetDict({"train": ds}))


class _FakeCudfFrame:
    """Just enough of cudf.DataFrame for dedup(): columns, [cols], to_arrow(), iloc."""

    __module__ = "cudf.core.dataframe"

    def __init__(self, pdf):
        self.pdf = pdf

    @property
    def columns(self):
        return self.pdf.columns

    def __getitem__(self, cols):
        if isinstance(cols, str):  # a column: a cudf.Series
            return _FakeCudfSeries(pa.array(self.pdf[cols], pa.large_string()))
        return _FakeCudfFrame(self.pdf[cols])

    def __len__(self):
        return len(self.pdf)

    def to_arrow(self, preserve_index=None):
        _FAKE_LOG.append(list(self.pdf.columns))
        table = pa.Table.from_pandas(self.pdf, preserve_index=False)
        if preserve_index is not False and not isinstance(self.pdf.index, pd.RangeIndex):
            # as cuDF: any other index becomes a column, named "index" when the index has no name
            table = table.append_column(self.pdf.index.name or "index", pa.array(self.pdf.index))
        return table

    @property
    def iloc(self):
        outer = self

        class _ILoc:
            def __getitem__(self, idx):
                return _FakeCudfFrame(outer.pdf.iloc[idx])

        return _ILoc()


class _FakeCudfSeries:
    """Just enough of a cudf.Series of strings: to_pylibcudf() (a zero-copy (Column, metadata) pair; the
    column here is a pylibcudf-like view of host buffers), len(), iloc (a gather) and to_arrow()."""

    __module__ = "cudf.core.series"

    def __init__(self, arr: pa.Array):
        self.arr = arr

    def __len__(self):
        return len(self.arr)

    def to_pylibcudf(self):
        return fake_plc_column(self.arr), {"name": None}

    @property
    def iloc(self):
        outer = self

        class _ILoc:
            def __getitem__(self, idx):
                return _FakeCudfSeries(outer.arr.take(pa.array(np.asarray(idx, np.int64))))

        return _ILoc()

    def to_arrow(self):
        _SERIES_TO_HOST.append(len(self.arr))
        return self.arr


_FAKE_LOG: list = []
_SERIES_TO_HOST: list = []  # rows each text Series copied to the host


def _fake_cudf_module(monkeypatch):
    """A ``cudf`` module with just ``DataFrame.from_arrow`` (tagging what it is given)."""
    fake = types.ModuleType("cudf")
    fake.DataFrame = types.SimpleNamespace(from_arrow=lambda t: ("cudf frame", t))
    monkeypatch.setitem(sys.modules, "cudf", fake)


def test_cudf_like_frame_round_trips_without_importing_cudf(frame, monkeypatch):
    sys.modules.pop("cudf", None)
    gpu_dedup.dedup(frame.head(50), id="id", backend="cpu")
    assert "cudf" not in sys.modules  # pandas input never imports cuDF
    _fake_cudf_module(monkeypatch)
    _FAKE_LOG.clear()
    res = gpu_dedup.dedup(_FakeCudfFrame(frame), text="text", id="id", backend="cpu")
    assert _FAKE_LOG == [["text", "id"]]  # only the needed columns leave the device
    assert isinstance(res.deduplicated, _FakeCudfFrame)
    pd.testing.assert_frame_equal(res.deduplicated.pdf, frame[res.kept])
    tag, table = res.duplicates
    assert tag == "cudf frame" and isinstance(table, pa.Table) and table.column_names[0] == "id"
    assert (res.kept == gpu_dedup.dedup(frame, id="id", backend="cpu").kept).all()


def test_cudf_like_frame_with_an_index_and_a_column_named_index(frame, monkeypatch):
    """A non-range index is not a column of the run: a user column named "index" is the id column as given."""
    _fake_cudf_module(monkeypatch)
    small = frame.head(200).rename(columns={"id": "index"})
    small.index = np.arange(200)[::-1] * 10  # not a RangeIndex: cuDF's to_arrow() would add it as "index"
    res = gpu_dedup.dedup(_FakeCudfFrame(small), text="text", id="index", backend="cpu")
    want = gpu_dedup.dedup(pa.Table.from_pandas(small, preserve_index=False), id="index", backend="cpu")
    assert (res.kept == want.kept).all() and res.duplicates[1].equals(want.duplicates)


@pytest.mark.parametrize("keep", ["first", "longest"])
def test_cudf_like_frame_text_stays_on_the_device_where_the_backend_reads_it(frame, monkeypatch, keep):
    """With a backend that reads text into device memory (GPU, ``gpu.reader: cudf``; here the CPU
    backend with a stand-in), only the id column of a cuDF frame is copied to the host; the text
    column's buffers go to normalization as they are; report examples copy only their rows."""
    from gpu_dedup.backends import get_backend

    _fake_cudf_module(monkeypatch)
    monkeypatch.setattr(get_backend("cpu"), "text_reader", lambda cfg: (lambda shard, column: None)
                        if cfg.gpu.reader == "cudf" else None, raising=False)
    small = frame.head(400)
    _FAKE_LOG.clear()
    _SERIES_TO_HOST.clear()
    res = gpu_dedup.dedup(_FakeCudfFrame(small), text="text", id="id", backend="cpu", keep=keep)
    assert _FAKE_LOG == [["id"]]  # the text did not leave the device ...
    assert len(_SERIES_TO_HOST) == 1 and 0 < _SERIES_TO_HOST[0] < len(small) // 4  # ... but the examples' rows
    want = gpu_dedup.dedup(pa.Table.from_pandas(small, preserve_index=False), id="id", backend="cpu", keep=keep)
    assert (res.kept == want.kept).all() and (res.clusters == want.clusters).all()
    assert res.duplicates[1].equals(want.duplicates)
    shown = json.dumps(res.report["largest_clusters"]).replace('"cudf frame"', '"arrow frame"')  # the shard's name
    assert shown == json.dumps(want.report["largest_clusters"]) and want.report["counts"]["removed"] > 0
    _FAKE_LOG.clear()
    gpu_dedup.dedup(_FakeCudfFrame(small), text="text", id="id", backend="cpu", **{"gpu.reader": "pyarrow"})
    assert _FAKE_LOG == [["text", "id"]]  # gpu.reader: pyarrow copies the text as before


def test_cudf_like_frame_text_is_copied_once_for_a_batched_gpu_run(frame, monkeypatch):
    """A corpus above gpu.memory_limit runs with its text on the host: the device column is copied."""
    from gpu_dedup.backends import get_backend

    _fake_cudf_module(monkeypatch)
    cpu = get_backend("cpu")
    monkeypatch.setattr(cpu, "text_reader", lambda cfg: (lambda shard, column: None), raising=False)
    monkeypatch.setattr(cpu, "plan_memory", lambda shards, cfg: {
        "memory_limit_bytes": 4096, "device_bytes": 0, "estimate_bytes": 10**6, "resident": False,
        "batch_bytes": 3000}, raising=False)
    small = frame.head(300)
    _SERIES_TO_HOST.clear()
    res = gpu_dedup.dedup(_FakeCudfFrame(small), text="text", id="id", backend="cpu")
    assert res.report["gpu"]["reader"] == "pyarrow"
    assert _SERIES_TO_HOST[0] == len(small) and _SERIES_TO_HOST.count(len(small)) == 1  # once, then examples
    assert (res.kept == gpu_dedup.dedup(small, id="id", backend="cpu").kept).all()


def test_config_forms_and_overrides(frame):
    small = frame.head(300)
    a = gpu_dedup.dedup(small, config={"backend": "cpu", "lsh": {"threshold": 0.7}})
    b = gpu_dedup.dedup(small, config=Config(backend="cpu"), threshold=0.7)
    c = gpu_dedup.dedup(small, backend="cpu", **{"lsh.threshold": 0.7})
    assert a.report["config"]["lsh"]["threshold"] == b.report["config"]["lsh"]["threshold"] == 0.7
    assert (a.kept == b.kept).all() and (a.kept == c.kept).all()
    f = gpu_dedup.dedup(small, config="fineweb", backend="cpu")
    assert (f.report["lsh"]["bands"], f.report["lsh"]["rows"]) == (14, 8)
    s = gpu_dedup.dedup(small, backend="cpu", keep="score", score="score")
    assert s.report["config"]["select"] == {"keep": "score", "score_column": "score", "split_chains": True}
    # highest score survives: every removed row's survivor has a higher score
    rows = np.flatnonzero(~s.kept)
    assert (small["score"].to_numpy()[s.clusters[rows]] > small["score"].to_numpy()[rows]).all()


def test_bad_input_names_problem_value_and_fix(frame):
    with pytest.raises(InputError,
                       match=r"text column 'body' is not in the frame; its columns are: 'id', 'text'.*text="):
        gpu_dedup.dedup(frame, text="body", backend="cpu")
    with pytest.raises(InputError, match=r"id column 'url' is not in the frame.*id="):
        gpu_dedup.dedup(frame, id="url", backend="cpu")
    with pytest.raises(InputError, match=r"score column 'quality'.*score="):
        gpu_dedup.dedup(frame, keep="score", score="quality", backend="cpu")
    with pytest.raises(InputError, match=r"text column 'count' has type int32; it must hold strings"):
        gpu_dedup.dedup(frame, text="count", backend="cpu")
    with pytest.raises(InputError, match=r"column 'text' cannot be converted to Arrow"):
        gpu_dedup.dedup(pd.DataFrame({"text": ["a b c", 3, None]}), backend="cpu")
    with pytest.raises(InputError, match=r"a Hugging Face datasets.Dataset, not builtins.dict; convert it first"):
        gpu_dedup.dedup({"text": ["a"]})
    with pytest.raises(ConfigError, match=r"unknown keyword 'treshold'; use one of .*threshold"):
        gpu_dedup.dedup(frame, treshold=0.7)
    with pytest.raises(ConfigError, match=r"lsh.threshold"):
        gpu_dedup.dedup(frame, threshold=1.5)
    with pytest.raises(ConfigError, match=r"one process; drop cluster.workers"):
        gpu_dedup.dedup(frame, **{"cluster.workers": 2})


def test_empty_null_and_categorical_text():
    empty = gpu_dedup.dedup(pd.DataFrame({"text": pd.Series([], dtype=object), "x": []}), backend="cpu")
    assert empty.deduplicated.shape == (0, 2) and empty.report["counts"]["documents_read"] == 0
    assert len(empty.duplicates) == 0 and empty.kept.shape == (0,)
    words = " ".join(f"w{i}" for i in range(40))
    df = pd.DataFrame({"text": pd.Categorical([words, None, words, words.upper(), "other text entirely", None])})
    res = gpu_dedup.dedup(df, backend="cpu")
    assert res.kept.tolist() == [True, True, False, False, True, True]  # nulls kept, never deduplicated
    assert res.report["counts"]["null_text"] == 2
    assert isinstance(res.deduplicated["text"].dtype, pd.CategoricalDtype)


def test_result_report_page(frame, tmp_path):
    res = gpu_dedup.dedup(frame, id="id", backend="cpu")
    assert "removed=" in repr(res) and "kept" in res.summary()
    page = res.html()
    assert page.count("<svg ") == 5
    path = res.save_report(tmp_path / "rep")
    assert path.read_text() == page  # rendering is deterministic
    assert (tmp_path / "rep" / "report.json").exists()


@pytest.mark.parametrize("method", ["exact", "signature"])
def test_stages_step_by_step_equal_dedup(sample, method):
    """The stage functions chained by hand give the pipeline's clusters (plain components)."""
    cfg = Config.from_dict({**CPU, "verify": {"method": method}, "select": {"split_chains": False}})
    text = sample.table.column("text")
    n = len(text)
    buf = stages.string_buffers(stages.normalize(text, cfg.normalize))
    ranks = np.arange(n)
    rep = stages.exact_groups(stages.exact_keys(buf, cfg.minhash.seed, backend="cpu"), ranks)
    cand = np.flatnonzero(rep == np.arange(n))
    sig = stages.signatures(buf, cfg.minhash, num_perm=cfg.signature_perms, docs=cand, backend="cpu")
    bk = stages.buckets(stages.bands(sig, cfg))
    edges = stages.verified_edges(bk, cfg, texts=buf, signatures=sig, docs=cand)
    labels = stages.components(edges, n, backend="cpu")[rep]
    survivor = stages.survivors(labels, ranks)
    res = gpu_dedup.dedup(sample.table, config=cfg)
    assert (survivor == res.clusters).all() and (~res.kept).sum() > 20
    assert len(edges) == len(res.edges)
    with pytest.raises(ValueError, match="pass texts="):
        stages.verified_edges(bk, Config(backend="cpu"))


def test_in_memory_pipeline_run_refuses_file_features(sample, tmp_path):
    from gpu_dedup.storage import memory_shard

    shard = memory_shard(sample.table.select(["text"]))
    res = run_dedup([shard], None, Config(backend="cpu"))
    assert res.output_dir is None and res.report["run_fingerprint"] is None
    kept = int(res.kept.sum())
    assert res.report["inputs"] == [{"path": "<memory>", "name": "memory", "format": "memory",
                                     "rows": len(sample.table), "bytes": shard.size, "kept": kept,
                                     "removed": len(sample.table) - kept}]
    with pytest.raises(ConfigError, match="without an output directory.*index_out"):
        run_dedup([shard], None, Config(backend="cpu"), index_out=tmp_path / "index")
    with pytest.raises(InputError, match=r"text column 'body' is not in shard '<memory>'"):
        run_dedup([shard], None, Config.from_dict({"backend": "cpu", "input": {"text_column": "body"}}))


def test_a_missing_score_column_names_the_argument_and_save_report_refuses_a_file(tmp_path):
    from gpu_dedup.errors import OutputError

    df = pd.DataFrame({"text": ["a b c d e f", "a b c d e f"], "url": ["x", "y"]})
    with pytest.raises(InputError) as exc:
        gpu_dedup.dedup(df, keep="score", score="nope", backend="cpu")
    assert str(exc.value).endswith("Pass one of them as score= (select.score_column)")
    res = gpu_dedup.dedup(df, backend="cpu")
    (tmp_path / "file").write_text("mine\n")
    with pytest.raises(OutputError, match="exists and is not a directory"):
        res.save_report(tmp_path / "file")
    assert (tmp_path / "file").read_text() == "mine\n"


def test_a_configs_text_and_id_columns_are_read_unless_text_or_id_name_others(tmp_path):
    """``dedup(df, config="mine.yaml")`` with ``input: {text_column: body, id_column: url}`` read neither: the
    keyword defaults (text="text", id=None) replaced them, so the run stopped with "text column 'text' is not in the
    frame", and a config naming only an id column lost its ids from ``duplicates`` without a word."""
    words = " ".join(f"w{i}" for i in range(40))
    df = pd.DataFrame({"url": ["u0", "u1", "u2"], "body": [words, words, "something else entirely"]})
    (tmp_path / "mine.yaml").write_text("backend: cpu\ninput:\n  text_column: body\n  id_column: url\n")
    for config in (tmp_path / "mine.yaml", {"backend": "cpu", "input": {"text_column": "body", "id_column": "url"}},
                   Config.from_yaml(tmp_path / "mine.yaml")):
        res = gpu_dedup.dedup(df, config=config)
        assert res.kept.tolist() == [True, False, True]
        assert res.duplicates["url"].tolist() == ["u0", "u1"] and res.duplicates["survivor_id"].tolist() == ["u0"] * 2
        assert res.report["config"]["input"]["text_column"] == "body"
    both = df.rename(columns={"body": "text", "url": "key"})  # text= / id= still name other columns
    res = gpu_dedup.dedup(both.assign(body="x"), text="text", id="key", config=tmp_path / "mine.yaml")
    assert res.kept.tolist() == [True, False, True] and res.duplicates["key"].tolist() == ["u0", "u1"]
    plain = gpu_dedup.dedup(both, backend="cpu")  # no config: the column text, documents named by row only
    assert list(plain.duplicates.columns) == ["row", "cluster_id", "kept", "similarity", "match"]


def test_a_column_name_given_twice_is_one_input_error():
    """A pandas frame or Arrow table with two columns named ``text`` (a concat or a join gone wrong) ended in a
    ``KeyError: 0`` from pandas (pyarrow: 'Field "text" exists 2 times in schema'), with a traceback."""
    words = " ".join(f"w{i}" for i in range(40))
    df = pd.DataFrame([[words, words, "u"]] * 2, columns=["text", "text", "url"])
    with pytest.raises(InputError, match=r"the frame has 2 columns named 'text' \(the text column\); rename or drop"):
        gpu_dedup.dedup(df, backend="cpu")
    table = pa.table([pa.array([words] * 2), pa.array(["a", "b"]), pa.array(["c", "d"])], names=["text", "id", "id"])
    with pytest.raises(InputError, match=r"the frame has 2 columns named 'id' \(the id column\)"):
        gpu_dedup.dedup(table, id="id", backend="cpu")
    res = gpu_dedup.dedup(table, backend="cpu")  # a name given twice among the columns not read is no problem
    assert res.kept.tolist() == [True, False] and res.deduplicated.column_names == ["text", "id", "id"]


def test_a_lone_surrogate_in_a_pandas_text_column_is_one_input_error_naming_the_row():
    """A Python str holding a lone surrogate (bytes decoded with surrogateescape, e.g. file names or a log read with
    errors="surrogateescape") in an object column ended in ``UnicodeEncodeError: 'utf-8' codec can't encode
    character '\\udc80'`` from pyarrow, with a traceback; the fix the message gives runs."""
    words = " ".join(f"w{i}" for i in range(40))
    df = pd.DataFrame({"text": pd.Series(["fine", words + "\udc80", words + "\udc80"], dtype=object, index=list("abc"))})
    with pytest.raises(InputError) as exc:
        gpu_dedup.dedup(df, backend="cpu")
    msg = str(exc.value)
    assert msg.startswith("column 'text' row 1 (index 'b') holds '\\udc80' at character 149: a lone surrogate")
    assert "str.encode('utf-8', 'surrogateescape')" in msg
    df["text"] = df["text"].str.encode("utf-8", "surrogateescape")  # the fix: the original bytes
    assert gpu_dedup.dedup(df, backend="cpu").kept.tolist() == [True, True, False]


def test_an_empty_or_all_missing_text_column_of_any_type_is_null_text():
    """``dedup(pd.DataFrame({"text": []}))``, the empty frame a notebook filter leaves, was refused with "text column
    'text' has type double; it must hold strings": pandas makes an empty (or all-NaN) column float64.  With no text
    at all there is nothing to refuse: every row is a null text, kept, as in an all-None object column."""
    empty = gpu_dedup.dedup(pd.DataFrame({"text": [], "x": []}), backend="cpu")
    assert empty.kept.shape == (0,) and empty.deduplicated.shape == (0, 2)
    assert empty.report["counts"]["documents_read"] == 0
    missing = gpu_dedup.dedup(pd.DataFrame({"text": [np.nan, np.nan, np.nan]}, index=[7, 8, 9]), backend="cpu")
    none = gpu_dedup.dedup(pd.DataFrame({"text": [None, None, None]}, dtype=object), backend="cpu")
    assert missing.kept.tolist() == none.kept.tolist() == [True] * 3
    assert missing.report["counts"]["null_text"] == none.report["counts"]["null_text"] == 3
    assert missing.deduplicated.index.tolist() == [7, 8, 9]
    with pytest.raises(InputError, match=r"text column 'text' has type double; it must hold strings"):
        gpu_dedup.dedup(pd.DataFrame({"text": [1.5, np.nan]}), backend="cpu")  # numbers are still refused


def test_the_same_frame_gives_the_same_result_and_shuffled_pairs_the_same_removals():
    """Determinism: the same frame and config twice give the same clusters; shuffled rows under keep=lowest_id remove
    the same documents (by id) where each cluster is a pair, which the bucket's star always compares.  Clusters of
    three or more may differ with the row order (docs/reliability.md, Limits: star edges)."""
    pairs = planted_corpus(n_docs=300, n_clusters=40, cluster_size=(2, 2), words=(40, 120), edit_rate=(0.0, 0.05),
                           seed=5).table.select(["id", "text"]).to_pandas()
    a = gpu_dedup.dedup(pairs, id="id", backend="cpu", keep="lowest_id")
    b = gpu_dedup.dedup(pairs, id="id", backend="cpu", keep="lowest_id")
    assert (a.kept == b.kept).all() and (a.clusters == b.clusters).all() and a.duplicates.equals(b.duplicates)
    removed = set(pairs["id"][~a.kept])
    assert len(removed) > 20
    for seed in range(3):
        shuffled = pairs.sample(frac=1, random_state=seed)
        res = gpu_dedup.dedup(shuffled, id="id", backend="cpu", keep="lowest_id")
        assert set(shuffled["id"][~res.kept]) == removed
        assert res.deduplicated.index.tolist() == shuffled.index[res.kept].tolist()  # the frame's own order
