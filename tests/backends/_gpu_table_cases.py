"""The GPU backend's whole-table libcudf path under Numba's CUDA simulator, on ``tests/fake_pylibcudf.py`` (a
host pylibcudf 26.10.2) and ``tests/fake_cupy.py``'s stand-in device arrays: one read of every shard
(``GPUBackend.read_table``), the report's samples from it (``DeviceTable.take``), one write of every shard's kept
rows (``GPUBackend.write_table`` through ``storage.write_shards_on_device``), and whole runs that take that path,
against the CPU backend.

Run by ``tests/backends/test_gpu_table.py`` in a child process with ``NUMBA_ENABLE_CUDASIM=1`` (the GPU backend
needs the simulator without a device; the rest of the suite keeps the real CPU kernels); by hand::

    NUMBA_ENABLE_CUDASIM=1 python -m pytest -q tests/backends/_gpu_table_cases.py

``text_reader`` (cuDF's per-shard reader, which the backend offers only with cuDF and never under the
simulator) is patched on the backend: a stand-in that reads through the fake pylibcudf and records each call,
so a test can say that the whole-table read, not the per-shard one, ran.  pylibcudf 26.10's deprecation
warnings are errors here.
"""

import os
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from numba import config as numba_config

from gpu_dedup.backends import to_host, transfer_totals
from gpu_dedup.storage.content import file_difference

pytestmark = [
    pytest.mark.skipif(not numba_config.ENABLE_CUDASIM,
                       reason="run with NUMBA_ENABLE_CUDASIM=1 (tests/backends/test_gpu_table.py does)"),
    pytest.mark.filterwarnings("ignore:overflow encountered in scalar:RuntimeWarning"),  # hash family v2 wraps
    pytest.mark.filterwarnings("error::FutureWarning"),  # pylibcudf 26.10's deprecations
]


@pytest.fixture
def plc(monkeypatch):
    """The fake pylibcudf, with the fake cupy (stand-in device arrays) beside it."""
    from tests.fake_cupy import fake_cupy
    from tests.fake_pylibcudf import install

    monkeypatch.setitem(sys.modules, "cupy", fake_cupy())
    return install(monkeypatch)


@pytest.fixture
def be(plc):
    """The GPU backend on the stand-in device arrays, with cuDF "installed"."""
    from gpu_dedup.backends.gpu import GPUBackend

    sys.setswitchinterval(2e-4)  # the simulator's threads get the GIL sooner (see tests/kernels/_cudasim_cases.py)
    return GPUBackend({"devices": 1, "frames": "cudf"}, xp=sys.modules["cupy"], threads=8, span=32, seg_bytes=64,
                      item_threads=8, max_blocks=4)


def moved(fn, *args, **kw):
    """(fn's result, the host->device bytes it counted)."""
    before = transfer_totals()["host_to_device_bytes"]
    got = fn(*args, **kw)
    return got, transfer_totals()["host_to_device_bytes"] - before


def chunk_bytes(paths, columns=None) -> int:
    """Compressed bytes of the column chunks of ``columns`` (all: None) in ``paths``, from their footers."""
    total = 0
    for p in paths:
        meta = pq.read_metadata(p)
        for g in range(meta.num_row_groups):
            for j in range(meta.num_columns):
                c = meta.row_group(g).column(j)
                if columns is None or c.path_in_schema.split(".")[0] in columns:
                    total += c.total_compressed_size
    return total


def mixed_table(n: int, seed: int = 0, zone: str | None = None) -> pa.Table:
    """Every column kind a shard may have: a required id, texts with nulls (and non-ASCII), a list with null lists
    and null items, a required list of required items, a struct with null rows and a required field, timestamps
    (in time zone ``zone``, none by default) and timestamps in seconds, a dictionary column, floats, booleans."""
    rng = np.random.default_rng(seed)
    words = ["alpha", "béta", "gamma 😀", "", "delta delta"]
    text = [None if k % 7 == 3 else " ".join(words[j] for j in rng.integers(0, 5, 3)) for k in range(n)]
    fields = [pa.field("id", pa.int64(), nullable=False), pa.field("text", pa.string()),
              pa.field("tags", pa.list_(pa.int64())),
              pa.field("spans", pa.list_(pa.field("item", pa.int32(), nullable=False)), nullable=False),
              pa.field("meta", pa.struct([pa.field("lang", pa.string()),
                                          pa.field("score", pa.float64(), nullable=False)])),
              pa.field("seen", pa.timestamp("us", tz=zone)), pa.field("day", pa.timestamp("s", tz=zone)),
              pa.field("source", pa.dictionary(pa.int32(), pa.string())), pa.field("flag", pa.bool_())]
    cols = [pa.array(np.arange(n, dtype=np.int64) + 1000 * seed), pa.array(text, pa.string()),
            pa.array([None if k % 5 == 0 else [k, None, -k][: k % 3 + 1] for k in range(n)]),
            pa.array([[k, k + 1][: k % 2 + 1] for k in range(n)], fields[3].type),
            pa.array([None if k % 6 == 1 else {"lang": None if k % 4 == 0 else "en", "score": k / 3} for k in range(n)],
                     fields[4].type),
            pa.array(rng.integers(0, 2**50, n), fields[5].type),
            pa.array([None if k % 4 == 2 else k * 86400 for k in range(n)], fields[6].type),
            pa.array([["web", "books", None][k % 3] for k in range(n)]).dictionary_encode(),
            pa.array([None if k % 9 == 0 else bool(k % 2) for k in range(n)])]
    return pa.Table.from_arrays(cols, schema=pa.schema(fields))


def write_mixed(d, sizes=(7, 0, 12), compression="snappy", zone=None):
    """Shards of :func:`mixed_table` rows (sizes ``sizes``), each with its own schema metadata."""
    os.makedirs(d, exist_ok=True)
    paths = []
    for k, n in enumerate(sizes):
        t = mixed_table(n, seed=k, zone=zone)
        t = t.replace_schema_metadata({"shard": f"number {k}", "huggingface": '{"x": 1}'})
        paths.append(os.path.join(d, f"part-{k}.parquet"))
        pq.write_table(t, paths[-1], compression=compression, row_group_size=5)
    return paths


def same_values(got: pa.Array, want: pa.Array) -> bool:
    """The same rows (struct fields by position: libcudf columns carry no field names)."""
    want = want.combine_chunks() if isinstance(want, pa.ChunkedArray) else want
    if pa.types.is_dictionary(want.type):
        want = want.dictionary_decode()
    if pa.types.is_struct(want.type):  # fields compared where the struct is valid (libcudf nulls them elsewhere)
        valid = want.is_valid()
        if not np.array_equal(np.asarray(got.is_valid()), np.asarray(valid)):
            return False
        return all(same_values(got.field(i).filter(valid), want.field(i).filter(valid))
                   for i in range(want.type.num_fields))
    if pa.types.is_timestamp(want.type):
        want = want.cast(pa.int64())
        got = got.cast(pa.int64())
    return got.to_pylist() == want.to_pylist()


# ------------------------------------------------------------------ one read of every shard


@pytest.mark.parametrize("large", [False, True])
def test_read_table_reads_every_shard_in_order_and_counts_the_bytes(be, tmp_path, monkeypatch, large):
    if large:  # libcudf's large-strings layout: INT64 offsets
        monkeypatch.setenv("LIBCUDF_LARGE_STRINGS_THRESHOLD", "0")
    paths = write_mixed(tmp_path / "in")
    held, nbytes = moved(be.read_table, paths)
    want = pa.concat_tables([pq.read_table(p) for p in paths])
    assert held is not None and held.whole and held.num_rows == 19 and held.names == want.column_names
    assert nbytes == chunk_bytes(paths) > 0
    for name in want.column_names:
        assert same_values(held.column(name).to_arrow(), want.column(name)), name
    for s, p in zip(held.schemas, paths):
        assert s.equals(pq.read_schema(p))  # each file's own schema, its own metadata
        assert s.metadata[b"shard"] == pq.read_schema(p).metadata[b"shard"]
    width = held.column("text").child(0).type().id().name
    assert width == ("INT64" if large else "INT32")

    text, nbytes = moved(be.read_table, paths, columns=["text"])
    assert text.names == ["text"] and not text.whole and text.num_rows == 19
    assert nbytes == chunk_bytes(paths, ["text"]) and 0 < nbytes < chunk_bytes(paths)
    assert same_values(text.column("text").to_arrow(), want.column("text"))


def test_read_table_of_shards_it_cannot_read_as_one_table_is_none(be, tmp_path):
    paths = write_mixed(tmp_path / "in", sizes=(4, 5))
    other = mixed_table(3).set_column(0, pa.field("id", pa.string()), pa.array(["a", "b", "c"]))
    pq.write_table(other, tmp_path / "in" / "part-9.parquet")
    mixed = paths + [str(tmp_path / "in" / "part-9.parquet")]
    got, nbytes = moved(be.read_table, mixed)
    assert got is None and nbytes == 0  # their schemas differ: each shard's text column is read instead
    assert be.read_table(paths, columns=["nope"]) is None  # a column the shards lack
    pq.write_table(mixed_table(3).drop_columns(["text"]), tmp_path / "in" / "part-8.parquet")
    assert be.read_table(paths + [str(tmp_path / "in" / "part-8.parquet")], columns=["text"]) is None


def test_the_text_alone_is_read_as_one_table_from_shards_whose_other_columns_differ(be, tmp_path):
    """A removal list reads the text column alone: shards that differ in other columns are one table for it
    (libcudf compares the whole Parquet schema unless told the files may differ outside the columns read)."""
    paths = write_mixed(tmp_path / "in", sizes=(4, 5))
    other = mixed_table(3).set_column(0, pa.field("id", pa.string()), pa.array(["a", "b", "c"]))
    pq.write_table(other, tmp_path / "in" / "part-9.parquet")
    mixed = paths + [str(tmp_path / "in" / "part-9.parquet")]
    text, nbytes = moved(be.read_table, mixed, columns=["text"])
    assert text is not None and text.names == ["text"] and text.num_rows == 12
    assert nbytes == chunk_bytes(mixed, ["text"])
    want = pa.concat_arrays([pq.read_table(p).column("text").combine_chunks() for p in mixed])
    assert same_values(text.column("text").to_arrow(), want)


def test_shards_that_differ_only_in_large_types_are_one_table_written_back_with_their_own(be, tmp_path):
    """string / large_string, list / large_list: one Parquet schema (only the ARROW:schema hint differs), so libcudf
    reads them as one table; each file comes back with its own shard's Arrow types."""
    from gpu_dedup import storage

    os.makedirs(tmp_path / "in")
    pq.write_table(pa.table({"text": ["a", "bb", None], "tags": [[1], [], None]}), tmp_path / "in" / "a.parquet")
    pq.write_table(pa.table({"text": pa.array(["c", "d"], pa.large_string()),
                             "tags": pa.array([[2, 3], [4]], pa.large_list(pa.int64()))}), tmp_path / "in" / "b.parquet")
    shards = shards_of([str(tmp_path / "in" / "a.parquet")])
    held = be.read_table([s.path for s in shards])
    assert held is not None and held.num_rows == 5
    keep = np.array([True, False, True, True, False])
    done = storage.write_shards_on_device(shards, keep, [0, 3, 5], tmp_path / "dev", "zstd", held, be.write_table)
    assert set(done) == {0, 1}
    host_written(shards, keep, [0, 3, 5], tmp_path / "host", "zstd")
    for s in shards:
        assert pq.read_table(tmp_path / "dev" / s.name).equals(pq.read_table(tmp_path / "host" / s.name)), s.name


def test_a_failed_read_counts_no_bytes(be, plc, tmp_path, monkeypatch):
    paths = write_mixed(tmp_path / "in", sizes=(4, 5))

    def refuse(options, stream=None, mr=None, parquet_metadatas=None):
        raise RuntimeError("CUDF failure at: parquet reader: unsupported")

    monkeypatch.setattr(plc.io.parquet, "read_parquet", refuse)
    got, nbytes = moved(be.read_table, paths)
    assert got is None and nbytes == 0  # nothing crossed: the text columns are read (and counted) instead


# ------------------------------------------------------------------ a cluster block's texts


def block_shards(d, large=False):
    """Shards of planted documents (texts with nulls and non-ASCII) in row groups of 4: 13, 6 and 9 rows."""
    rng = np.random.default_rng(5)
    words = ["alpha", "béta", "Gamma  😀", "delta", "ÉPSILON", "zeta\t"]
    os.makedirs(d, exist_ok=True)
    paths, row = [], 0
    for k, n in enumerate([13, 6, 9]):
        text = [None if (row + j) % 5 == 2 else " ".join(words[w] for w in rng.integers(0, 6, 4)) for j in range(n)]
        t = pa.table({"id": pa.array(np.arange(row, row + n, dtype=np.int64)),
                      "text": pa.array(text, pa.large_string() if large else pa.string()),
                      "score": pa.array(rng.random(n))})
        paths.append(os.path.join(d, f"part-{k}.parquet"))
        pq.write_table(t, paths[-1], row_group_size=4)
        row += n
    return paths


def blocks_of(paths, cfg, block_rows):
    from gpu_dedup.run.cluster import blocks as B
    from gpu_dedup.storage import discover

    shards = list(discover([str(p) for p in paths]))
    infos = [B.inspect_shard(s, cfg) for s in shards]
    shards = [s.with_rows(i["rows"]) for s, i in zip(shards, infos)]
    return [(b, [shards[i] for i in b.shard_indices]) for b in B.plan_blocks(infos, block_rows)]


@pytest.mark.parametrize("large", [False, True])
@pytest.mark.parametrize("keep", ["first", "longest", "score"])
def test_a_blocks_text_is_read_into_device_memory_in_one_call_and_equals_pyarrows(be, plc, tmp_path, large, keep):
    """A GPU worker's block: the text column of its pieces (row groups of one or more shards) in one libcudf read,
    the ids and scores by pyarrow; normalized, the same columns, nulls, texts and lengths as a block pyarrow read
    whole, and the compressed chunks of the text column's row groups read are the bytes counted."""
    from gpu_dedup import backends as registry
    from gpu_dedup.config import Config
    from gpu_dedup.run.cluster import blocks as B

    paths = block_shards(tmp_path / "in", large)
    cfg = Config.from_dict({"backend": "gpu", "input": {"id_column": "id"},
                            "select": {"keep": keep, **({"score_column": "score"} if keep == "score" else {})}})
    host_cfg = Config.from_dict({**cfg.to_dict(), "gpu": {"reader": "pyarrow"}})
    reads = []
    read_table = be.read_table

    def recorded(shards, columns=None, row_groups=None):
        reads.append(([s.path for s in shards], columns, row_groups))
        return read_table(shards, columns=columns, row_groups=row_groups)

    be.text_reader = lambda cfg: (lambda shard, column: None) if cfg.gpu.reader == "cudf" else None
    be.read_table = recorded
    registry._CACHE["gpu"] = be
    try:
        planned = blocks_of(paths, cfg, block_rows=10)
        assert len(planned) >= 3 and any(len(b.pieces) > 1 for b, _ in planned)  # pieces of several shards
        assert any(p.row_groups not in (None, ()) and p.row_groups[0] > 0 for b, _ in planned for p in b.pieces)
        for block, shards in planned:
            reads.clear()
            got, moved_bytes = moved(B.load_block, block, shards, cfg)
            assert got.raw_text is not None and "text" not in got.table.column_names
            assert reads == [([s.path for s in shards], ["text"], [p.row_groups for p in block.pieces])]
            want_moved = sum(chunk_groups(s.path, "text", p.row_groups) for p, s in zip(block.pieces, shards))
            assert moved_bytes == want_moved > 0
            want = B.load_block(block, shards, host_cfg)
            assert want.raw_text is None and len(reads) == 1  # pyarrow's read asked libcudf for nothing
            assert np.array_equal(got.null, want.null) and got.null.any()
            got, want = B.normalize_block(got, cfg), B.normalize_block(want, host_cfg)
            assert got.raw_text is None and got.table.equals(want.table), (got.table.schema, want.table.schema)
            assert got.invalid_utf8 == want.invalid_utf8
            assert got.norm.equals(want.norm)
    finally:
        registry._CACHE.pop("gpu", None)


def chunk_groups(path, column, groups) -> int:
    """Compressed bytes of ``column``'s chunks in row groups ``groups`` (None: all) of ``path``."""
    meta = pq.read_metadata(path)
    total = 0
    for g in range(meta.num_row_groups) if groups is None else groups:
        for j in range(meta.num_columns):
            c = meta.row_group(g).column(j)
            if c.path_in_schema.split(".")[0] == column:
                total += c.total_compressed_size
    return total


def test_a_block_libcudf_cannot_read_as_one_is_read_by_pyarrow(be, plc, tmp_path):
    """Pieces whose text columns libcudf cannot read as one (another Parquet type in one shard): the block is
    pyarrow's, as without cuDF, and the run goes on."""
    from gpu_dedup import backends as registry
    from gpu_dedup.config import Config
    from gpu_dedup.run.cluster import blocks as B

    d = tmp_path / "in"
    os.makedirs(d)
    pq.write_table(pa.table({"text": pa.array(["a b c", "d e f"], pa.string())}), d / "a.parquet")
    pq.write_table(pa.table({"text": pa.array(["g h i"], pa.string()), "more": [1]}), d / "b.parquet")
    pq.write_table(pa.table({"text": pa.array(["j k l", None], pa.string())}), d / "c.parquet",
                   use_dictionary=False, data_page_version="2.0", column_encoding={"text": "DELTA_BYTE_ARRAY"})
    cfg = Config.from_dict({"backend": "gpu"})
    be.text_reader = lambda cfg: (lambda shard, column: None)
    registry._CACHE["gpu"] = be
    try:
        (block, shards), = blocks_of(sorted(d.iterdir()), cfg, block_rows=100)
        got = B.load_block(block, shards, cfg)
        assert got.raw_text is not None  # other columns and encodings: still one text column
        assert B.normalize_block(got, cfg).norm.to_pylist() == ["a b c", "d e f", "g h i", "j k l", ""]
        be.read_table = lambda shards, columns=None, row_groups=None: None  # libcudf refuses them
        got = B.load_block(block, shards, cfg)
        assert got.raw_text is None and got.table.column("text").to_pylist()[-1] is None
    finally:
        registry._CACHE.pop("gpu", None)


def test_a_block_whose_shards_changed_since_planning_stops_with_one_clear_error(be, plc, tmp_path):
    from gpu_dedup import backends as registry
    from gpu_dedup.config import Config
    from gpu_dedup.errors import InputError
    from gpu_dedup.run.cluster import blocks as B

    paths = block_shards(tmp_path / "in")
    cfg = Config.from_dict({"backend": "gpu"})
    be.text_reader = lambda cfg: (lambda shard, column: None)
    registry._CACHE["gpu"] = be
    try:
        (block, shards), *_ = blocks_of(paths, cfg, block_rows=100)
        read_table = be.read_table  # libcudf finds fewer rows than the footers pyarrow planned by
        be.read_table = lambda shards, columns=None, row_groups=None: read_table(
            shards[:1], columns, row_groups=row_groups[:1])
        with pytest.raises(InputError, match=r"gave 13 text rows to cuDF, expected 28; inputs must not change"):
            B.load_block(block, shards, cfg)
        be.read_table = read_table
        pq.write_table(pa.table({"id": [1], "text": ["x"], "score": [0.5]}), paths[1])
        with pytest.raises(InputError, match="changed during the run"):  # (the footer pyarrow read then differs)
            B.load_block(block, shards, cfg)
    finally:
        registry._CACHE.pop("gpu", None)


# ------------------------------------------------------------------ the report's samples


@pytest.mark.parametrize("large", [False, True])
def test_take_gives_the_rows_asked_for_in_any_order_with_repeats(be, tmp_path, monkeypatch, large):
    if large:
        monkeypatch.setenv("LIBCUDF_LARGE_STRINGS_THRESHOLD", "0")
    paths = write_mixed(tmp_path / "in")
    want = pa.concat_tables([pq.read_table(p) for p in paths]).column("text").combine_chunks()
    held = be.read_table(paths)
    rows = [18, 3, 0, 3, 10, 18, 7]  # 3 and 10 are null texts
    got = held.take("text", rows)
    assert isinstance(got, pa.Array) and got.to_pylist() == [want[r].as_py() for r in rows]
    assert held.take("text", []).to_pylist() == []
    assert held.take("id", np.array([8, 1])).to_pylist() == [2001, 1]  # not only strings
    text = be.read_table(paths, columns=["text"])
    assert text.take("text", rows).to_pylist() == got.to_pylist()


# ------------------------------------------------------------------ one write of every shard


def shards_of(paths):
    from gpu_dedup import storage

    return [s.with_rows(pq.read_metadata(s.path).num_rows) for s in storage.discover(os.path.dirname(paths[0]))]


def host_written(shards, keep, starts, out, compression):
    """What the CPU backend's write stage writes for ``keep``: each shard through the host writer."""
    from gpu_dedup import storage

    for k, s in enumerate(shards):
        storage.write_shard(s, keep[starts[k]:starts[k + 1]], out, compression)


@pytest.mark.parametrize(("compression", "zone", "streams"), [("same", None, 1), ("zstd", "Europe/Paris", 1),
                                                               ("none", None, 1), ("lz4", "UTC", 1),
                                                               ("same", None, 3), ("zstd", "Europe/Paris", 16)])
def test_write_table_writes_each_shards_kept_rows_as_the_host_does(be, plc, tmp_path, monkeypatch, compression, zone,
                                                                   streams):
    """``streams`` 1: one libcudf write of every file; more: a write per file, each on a stream and thread of its
    own, its check and digest on that thread.  The files are the same either way."""
    import threading

    from gpu_dedup import storage

    paths = write_mixed(tmp_path / "in", sizes=(7, 0, 12, 6), zone=zone)
    shards = shards_of(paths)
    starts = np.cumsum([0] + [s.rows for s in shards])
    keep = np.random.default_rng(1).random(int(starts[-1])) < 0.6
    keep[starts[3]:starts[4]] = False  # every row of the last shard removed
    held = be.read_table([s.path for s in shards])
    calls, writes = [], []
    write_parquet = plc.io.parquet.write_parquet

    def counted(options, stream=None):
        writes.append((threading.current_thread().name, stream))
        return write_parquet(options, stream)

    monkeypatch.setattr(plc.io.parquet, "write_parquet", counted)

    def writer(*args):
        calls.append(args)
        return be.write_table(*args)

    done = storage.write_shards_on_device(shards, keep, starts, tmp_path / "dev", compression, held, writer, streams)
    assert list(done) == [0, 1, 2, 3] and len(calls) == 1  # every file published
    for k, s in enumerate(shards):  # each file's digest, taken as it was published
        assert done[k] == {"name": s.name, **storage.written_digest(tmp_path / "dev" / s.name)}
    if streams == 1:
        assert writes == [("MainThread", None)]  # one libcudf write
    else:
        assert len(writes) == 4 and all(name.startswith("gpu-dedup-device-write") for name, _ in writes)
        assert all(stream is not None and stream.non_blocking for _, stream in writes)
        assert len({id(stream) for _, stream in writes}) == 4  # a stream each
    host_written(shards, keep, starts, tmp_path / "host", compression)
    for k, s in enumerate(shards):
        dev, host = tmp_path / "dev" / s.name, tmp_path / "host" / s.name
        assert file_difference(dev, host) is None, s.name  # rows, values, nulls, names, nullability, metadata
        want = pq.read_table(s.path).filter(pa.array(keep[starts[k]:starts[k + 1]]))
        got = pq.read_table(dev)
        for name in want.column_names:
            assert got.column(name).equals(want.column(name)), (s.name, name)
        assert pq.read_schema(dev).metadata[b"shard"] == f"number {k}".encode()
        assert dev.read_bytes() != host.read_bytes()  # another writer wrote it
        meta = pq.read_metadata(dev)
        codecs = {meta.row_group(g).column(j).compression for g in range(meta.num_row_groups)
                  for j in range(meta.num_columns)}
        want_codec = {"same": "SNAPPY", "none": "UNCOMPRESSED"}.get(compression, compression.upper())
        assert codecs <= {want_codec, want_codec + "_RAW"}, (s.name, codecs)  # LZ4: LZ4_RAW in Parquet
    assert sorted(os.listdir(tmp_path / "dev")) == sorted(s.name for s in shards)  # no temporary files left


def test_a_file_libcudf_fails_to_write_on_its_stream_leaves_every_shard_to_the_host(be, plc, tmp_path, monkeypatch):
    """A write per stream: files other streams published before one failed are taken back, so that the host writes
    every shard (and the run says why), as when the one write of every file fails."""
    from gpu_dedup import storage

    paths = write_mixed(tmp_path / "in", sizes=(5, 6, 4))
    shards = shards_of(paths)
    starts = np.cumsum([0] + [s.rows for s in shards])
    held = be.read_table(paths)
    write_parquet = plc.io.parquet.write_parquet

    def fails_on_the_last(options, stream=None):
        if options._sink._paths[0].startswith(str(tmp_path / "dev" / f".{shards[2].name}.")):
            raise RuntimeError("cudaErrorMemoryAllocation out of memory")
        return write_parquet(options, stream)

    monkeypatch.setattr(plc.io.parquet, "write_parquet", fails_on_the_last)
    done = storage.write_shards_on_device(shards, np.ones(15, bool), starts, tmp_path / "dev", "zstd", held,
                                          be.write_table, 2)
    assert done == {} and not os.listdir(tmp_path / "dev")


@pytest.mark.parametrize("compression", ["gzip", "brotli"])
def test_a_codec_libcudf_does_not_write_is_left_to_the_host(be, tmp_path, compression):
    from gpu_dedup import storage

    paths = write_mixed(tmp_path / "in", sizes=(5, 6))
    shards = shards_of(paths)
    starts = np.cumsum([0] + [s.rows for s in shards])
    held = be.read_table(paths)
    keep = np.ones(11, bool)
    assert be.write_table(held, starts, keep, [str(tmp_path / "x.parquet")] * 2, compression) is None
    done = storage.write_shards_on_device(shards, keep, starts, tmp_path / "dev", compression, held, be.write_table)
    assert done == {} and not os.listdir(tmp_path / "dev")  # nothing left behind: the host writes them


def test_timestamps_with_and_without_a_zone_are_left_to_the_host(be, tmp_path):
    """libcudf writes every timestamp of a file UTC-adjusted or none: a table with both kinds would come back with
    one of them changed."""
    t = pa.table({"text": ["a", "b"], "naive": pa.array([1, 2], pa.timestamp("ms")),
                  "zoned": pa.array([3, 4], pa.timestamp("ms", tz="Asia/Tokyo"))})
    pq.write_table(t, tmp_path / "a.parquet")
    held = be.read_table([str(tmp_path / "a.parquet")])
    assert be.write_table(held, [0, 2], np.ones(2, bool), [str(tmp_path / "o.parquet")], "zstd") is None
    assert not (tmp_path / "o.parquet").exists()
    for name in ("naive", "zoned"):  # one kind alone: written as it came
        pq.write_table(t.select(["text", name]), tmp_path / f"{name}.parquet")
        held = be.read_table([str(tmp_path / f"{name}.parquet")])
        assert be.write_table(held, [0, 2], np.array([False, True]), [str(tmp_path / "o.parquet")], "zstd") == [1]
        assert pq.read_table(tmp_path / "o.parquet").equals(t.select(["text", name]).slice(1)), name


def test_a_map_column_is_left_to_the_host(be, tmp_path):
    t = pa.table({"text": ["a", "b"], "kv": pa.array([[("k", 1)], []], pa.map_(pa.string(), pa.int64()))})
    pq.write_table(t, tmp_path / "a.parquet")
    held = be.read_table([str(tmp_path / "a.parquet")])
    assert held is not None and held.column("kv").type().id().name == "LIST"  # libcudf reads a map as a list
    assert be.write_table(held, [0, 2], np.ones(2, bool), [str(tmp_path / "o.parquet")], "zstd") is None
    assert not (tmp_path / "o.parquet").exists()


def test_the_writer_is_given_the_names_and_nullability_of_every_column_and_child(be, tmp_path):
    """libcudf writes a column without nulls ``required`` unless told: every field, nested ones included, keeps
    the input's nullability, and each file its own key-value metadata."""
    paths = write_mixed(tmp_path / "in", sizes=(6, 4))
    held = be.read_table(paths)
    keep = np.arange(10) % 3 != 0
    out = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    assert be.write_table(held, [0, 6, 10], keep, out, "zstd") == [4, 2]
    for p, src in zip(out, paths):
        got, want = pq.read_schema(p), pq.read_schema(src)
        assert got.equals(want), (got, want)  # names, types, nullability (children too), own metadata
        assert pq.read_metadata(p).metadata[b"shard"] == pq.read_metadata(src).metadata[b"shard"]


# ------------------------------------------------------------------ whole runs


def corpus(d, extra_column_in=None, row_group_size=None):
    """A planted corpus of 40 documents in shards of 15, 0 and 25 rows, with a list column and nulls; with
    ``extra_column_in`` (a shard number), that shard has one more column than the others."""
    from gpu_dedup.evaluation.sample import planted_corpus

    sample = planted_corpus(n_docs=40, n_clusters=6, cluster_size=(2, 4), words=(8, 25), edit_rate=(0.0, 0.1), seed=3)
    texts = sample.table.column("text").to_pylist()
    texts[4] = None
    t = sample.table.select(["id"]).append_column("text", pa.array(texts, pa.string()))
    t = t.append_column("tags", pa.array([[k, None] if k % 3 else None for k in range(40)]))
    t = t.append_column(pa.field("n", pa.int32(), nullable=False), pa.array(np.arange(40, dtype=np.int32)))
    os.makedirs(d)
    for k, (lo, hi) in enumerate([(0, 15), (15, 15), (15, 40)]):
        part = t.slice(lo, hi - lo).replace_schema_metadata({"shard": str(k)})
        if k == extra_column_in:
            part = part.append_column("extra", pa.array([1.5] * part.num_rows))
        pq.write_table(part, os.path.join(d, f"part-{k}.parquet"), row_group_size=row_group_size)


def gpu_run(be, plc, inputs, out, cfg):
    """A run of the GPU backend whose device readers are the fake's: (result, per-shard reads, table reads)."""
    from gpu_dedup import backends as registry
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    shard_reads, table_reads = [], []

    def read_text(shard, column):  # cuDF's per-shard reader, through the fake pylibcudf
        shard_reads.append(shard.path)
        opts = plc.io.parquet.ParquetReaderOptions.builder(plc.io.types.SourceInfo([shard.path])).column_names([column])
        return plc.io.parquet.read_parquet(opts.build()).tbl.columns()[0]

    read_table = be.read_table

    def recorded(shards, columns=None, row_groups=None):
        got = read_table(shards, columns=columns, row_groups=row_groups)
        table_reads.append(([s.path for s in shards], columns, got is not None))
        return got

    be.text_reader = lambda cfg: read_text  # the simulator offers none: stand in for cuDF's
    be.read_table = recorded
    registry._CACHE["gpu"] = be
    try:
        got = run_dedup(inputs, out, Config.from_dict({**cfg, "backend": "gpu"}))
    finally:
        registry._CACHE.pop("gpu", None)
    return got, shard_reads, table_reads


CFG = {"input": {"id_column": "id"}, "minhash": {"num_perm": 16, "ngram": 3}, "lsh": {"threshold": 0.6}}


def same_outputs(c, g, cdir, gdir):
    assert np.array_equal(c.kept, g.kept) and c.report["counts"] == g.report["counts"]
    assert c.report["counts"]["removed"] > 0
    assert (cdir / "duplicates.parquet").read_bytes() == (gdir / "duplicates.parquet").read_bytes()
    assert c.report["largest_clusters"] == g.report["largest_clusters"]  # sample texts: the device table's take


@pytest.mark.parametrize("hold", [True, "auto"])
def test_a_gpu_run_reads_and_writes_every_shard_through_libcudf_and_equals_the_cpu(be, plc, tmp_path, hold):
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    corpus(tmp_path / "in")
    cfg = {**CFG, "output": {"hold_inputs": hold}}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    g, shard_reads, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", cfg)
    assert shard_reads == [] and table_reads == [([str(s.path) for s in g.shards], None, True)]
    assert g.report["gpu"]["reader"] == "cudf" and g.report["gpu"]["writer"] == {"cudf": 3, "pyarrow": 0}
    write = g.report["stages"]["write"]  # libcudf's write of every file, then each file checked, synced, digested
    assert write["device_write_seconds"] > 0 and write["device_files_seconds"] > 0
    assert write["device_write_seconds"] + write["device_files_seconds"] <= write["shards_seconds"] + 1e-3
    assert write["sync_thread_seconds"] > 0 and write["digest_thread_seconds"] > 0
    same_outputs(c, g, tmp_path / "cpu", tmp_path / "gpu")
    for s in c.shards:
        assert file_difference(tmp_path / "cpu" / s.name, tmp_path / "gpu" / s.name) is None, s.name


@pytest.mark.parametrize("cfg", [{}, {"output": {"shards": False}}, {"output": {"hold_inputs": False}}],
                         ids=["shards", "removal-list", "shards-read-again"])
def test_a_gpu_run_reads_each_input_footer_once_with_pyarrow(be, plc, tmp_path, monkeypatch, cfg):
    """The size estimate, the host read, libcudf's table read (its byte count and schemas), the samples and the
    write share one pyarrow footer read per shard (the process's footer cache); libcudf's own reads of the
    files are not pyarrow's and not counted."""
    from tests.footers import FooterReads, fresh_footers

    corpus(tmp_path / "in")
    fresh_footers(monkeypatch)
    reads = FooterReads(monkeypatch, tmp_path / "in")
    g, shard_reads, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", {**CFG, **cfg})
    assert shard_reads == [] and [r[2] for r in table_reads] == [True] and g.report["counts"]["removed"] > 0
    shards = sorted(os.path.realpath(p) for p in (tmp_path / "in").glob("*.parquet"))
    assert dict(reads.by_path) == dict.fromkeys(shards, 1)


def test_a_gpu_run_without_held_inputs_writes_its_shards_on_the_host(be, plc, tmp_path, caplog):
    """``output.hold_inputs: false``: the text column alone is read into device memory, so the device table
    holds no shard's rows and the host writes them (no libcudf write to throw away)."""
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    corpus(tmp_path / "in")
    cfg = {**CFG, "output": {"hold_inputs": False}}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    g, shard_reads, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", cfg)
    assert shard_reads == [] and [r[1:] for r in table_reads] == [(["text"], True)]
    assert g.report["gpu"]["writer"] == "pyarrow" and "gpu.writer" not in caplog.text
    same_outputs(c, g, tmp_path / "cpu", tmp_path / "gpu")
    for s in c.shards:
        assert (tmp_path / "cpu" / s.name).read_bytes() == (tmp_path / "gpu" / s.name).read_bytes(), s.name


def test_a_removal_list_reads_the_text_alone_as_one_table_and_equals_the_cpu(be, plc, tmp_path, monkeypatch):
    """``output.shards: false``: one libcudf read of the text columns (INT64 offsets here), from shards that
    differ in another column; the removal set, duplicates.parquet and the report's samples equal the CPU's."""
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    monkeypatch.setenv("LIBCUDF_LARGE_STRINGS_THRESHOLD", "0")
    corpus(tmp_path / "in", extra_column_in=2)
    cfg = {**CFG, "output": {"shards": False}}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    g, shard_reads, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", cfg)
    assert shard_reads == [] and [r[1:] for r in table_reads] == [(["text"], True)]
    assert g.report["gpu"]["reader"] == "cudf" and g.report["gpu"]["writer"] == "pyarrow"
    same_outputs(c, g, tmp_path / "cpu", tmp_path / "gpu")
    assert sorted(os.listdir(tmp_path / "gpu")) == sorted(os.listdir(tmp_path / "cpu"))
    assert to_host(g.kept).sum() == c.report["counts"]["kept"]


def test_the_kernels_load_beside_the_read_stage_and_the_run_books_what_it_waited(be, plc, tmp_path, monkeypatch):
    """The GPU backend's read runs no kernel (libcudf reads the shards), so its kernels load on a thread of their
    own meanwhile: here each side waits until the other has started, which only a load beside the read passes.
    The run waits for what is left after the read stage and books it to kernel_load; the outputs are the CPU's."""
    import threading

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    corpus(tmp_path / "in")
    loading, reading = threading.Event(), threading.Event()
    where = {}
    prepare, read_table = be.prepare, be.read_table

    def load(cfg):
        where["load"] = threading.current_thread()
        loading.set()
        assert reading.wait(20), "the read stage did not start while the kernels loaded"
        return prepare(cfg)

    def read(shards, columns=None, row_groups=None):
        where["read"] = threading.current_thread()
        reading.set()
        assert loading.wait(20), "the kernels did not start loading before the read stage"
        return read_table(shards, columns=columns, row_groups=row_groups)

    monkeypatch.setattr(be, "prepare", load)
    monkeypatch.setattr(be, "read_table", read)
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**CFG, "backend": "cpu"}))
    g, _, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", CFG)
    assert [r[2] for r in table_reads] == [True]
    assert where["load"] is not where["read"] and where["read"] is threading.main_thread()
    rep = g.report
    assert rep["kernels_loaded_beside_read"] is True and "kernels_loaded_beside_read" not in c.report
    assert rep["kernel_prepare_seconds"] > 0 and "kernel_load" in rep["fixed_seconds"]
    booked = rep["stage_seconds"] + sum(rep["fixed_seconds"].values())
    assert abs(rep["wall_seconds"] - booked - rep["unbooked_seconds"]) < 0.01
    same_outputs(c, g, tmp_path / "cpu", tmp_path / "gpu")


def test_kernels_that_fail_to_load_beside_the_read_stage_fail_the_run_with_their_error(be, plc, tmp_path, monkeypatch):
    """A load that fails on its thread (here: as a missing NVVM would) stops the run after the read stage with
    that error; nothing is published."""
    corpus(tmp_path / "in")

    def fails(cfg):
        raise RuntimeError("libNVVM cannot be found")

    monkeypatch.setattr(be, "prepare", fails)
    with pytest.raises(RuntimeError, match="libNVVM cannot be found"):
        gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", CFG)
    assert not (tmp_path / "gpu" / "_SUCCESS").exists() and not list((tmp_path / "gpu").glob("*.parquet"))


@pytest.mark.parametrize("streams", [1, 3])
def test_host_buffers_take_the_bytes_the_files_would(be, tmp_path, streams):
    """An ``io.BytesIO`` per shard (the write probe's host sink): each holds the bytes the file sink writes."""
    import io

    paths = write_mixed(tmp_path / "in", sizes=(7, 5, 9))
    shards = shards_of(paths)
    starts = np.cumsum([0] + [s.rows for s in shards])
    keep = np.random.default_rng(3).random(int(starts[-1])) < 0.7
    held = be.read_table(paths)
    files = [str(tmp_path / f"f{k}.parquet") for k in range(3)]
    bufs = [io.BytesIO() for _ in range(3)]
    assert be.write_table(held, starts, keep, files, "zstd", streams) == \
        be.write_table(held, starts, keep, bufs, "zstd", streams) == [int(keep[a:b].sum()) for a, b in zip(starts, starts[1:])]
    for f, b in zip(files, bufs):
        assert open(f, "rb").read() == b.getvalue()


@pytest.mark.parametrize("streams", [1, 3])
def test_the_host_sink_publishes_the_file_sinks_files_digested_from_memory(be, tmp_path, monkeypatch, streams):
    """``host_sink``: libcudf encodes into host buffers, each file is written, synced, checked and published from
    them, and its record (size, SHA-256, stamp) is taken from the bytes, not by reading the file back."""
    from gpu_dedup import storage
    from gpu_dedup.storage import atomic

    paths = write_mixed(tmp_path / "in", sizes=(7, 5, 9, 4))
    shards = shards_of(paths)
    starts = np.cumsum([0] + [s.rows for s in shards])
    keep = np.random.default_rng(4).random(int(starts[-1])) < 0.7
    held = be.read_table(paths)
    files = storage.write_shards_on_device(shards, keep, starts, tmp_path / "files", "zstd", held, be.write_table,
                                           streams)
    read_back = []
    real = atomic.file_digest
    monkeypatch.setattr(atomic, "file_digest", lambda path: read_back.append(path) or real(path))
    times = storage.no_busy()
    mem = storage.write_shards_on_device(shards, keep, starts, tmp_path / "mem", "zstd", held, be.write_table,
                                         streams, times, host_sink=True)
    assert read_back == [] and sorted(mem) == sorted(files) == [0, 1, 2, 3]
    for k, s in enumerate(shards):
        assert (tmp_path / "mem" / s.name).read_bytes() == (tmp_path / "files" / s.name).read_bytes()
        assert mem[k] == {"name": s.name, **storage.written_digest(tmp_path / "mem" / s.name)}
    assert sorted(os.listdir(tmp_path / "mem")) == sorted(s.name for s in shards)  # no temporary file left
    assert times["device_files_seconds"] >= 0
    assert times["sync_thread_seconds"] > 0 and times["digest_thread_seconds"] > 0


@pytest.mark.parametrize("keep", ["first", "longest"])
def test_gpu_workers_read_each_blocks_text_through_libcudf_and_equal_the_cpu(be, plc, tmp_path, monkeypatch, keep):
    """Two workers (threads of this process, so that they share the fake pylibcudf and the backend) read each
    block's text column in one libcudf read; the run equals one CPU process's."""
    from distributed import LocalCluster

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    corpus(tmp_path / "in", row_group_size=5)  # 15, 0 and 25 rows: blocks of 10 rows are two row groups each
    cfg = {**CFG, "select": {"keep": keep}, "output": {"hold_inputs": False}}
    c = run_dedup(tmp_path / "in", tmp_path / "cpu", Config.from_dict({**cfg, "backend": "cpu"}))
    one_launch_at_a_time(monkeypatch)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        g, shard_reads, table_reads = gpu_run(be, plc, tmp_path / "in", tmp_path / "gpu", {
            **cfg, "cluster": {"scheduler": cluster.scheduler_address, "block_rows": 10}})
    # a libcudf read per block: 40 rows in blocks of 10, and one block reading the ends of two shards
    assert shard_reads == [] and len(table_reads) == 4
    assert all(columns == ["text"] and ok for _, columns, ok in table_reads)
    assert sorted(len(paths) for paths, _, _ in table_reads) == [1, 1, 1, 2]
    assert g.report["cluster"]["text_readers"] == {"cudf": 4, "pyarrow": 0}
    same_outputs(c, g, tmp_path / "cpu", tmp_path / "gpu")
    for s in c.shards:
        assert file_difference(tmp_path / "cpu" / s.name, tmp_path / "gpu" / s.name) is None, s.name



def one_launch_at_a_time(monkeypatch) -> None:
    """Numba's simulator swaps each launched kernel's module globals and keeps its block and thread indices per
    Python thread: two threads (two in-process workers) launching at once break each other, so each launch of
    a kernel (not of a device function, which runs inside one) holds one lock here."""
    import threading

    from numba.cuda.simulator.kernel import FakeCUDAKernel

    lock, call = threading.Lock(), FakeCUDAKernel.__call__

    def launch(self, *args):
        if self._device:
            return call(self, *args)
        with lock:
            return call(self, *args)

    monkeypatch.setattr(FakeCUDAKernel, "__call__", launch)
