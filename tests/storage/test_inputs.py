"""What a run reads: directory policy, non-regular files, links, names, column types, identity, memory."""

import json
import os
import re
import threading

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import InputConfig
from gpu_dedup.errors import InputError, ResourceError
from gpu_dedup.stages.read import read
from gpu_dedup.storage import check_unchanged, discover, read_columns, shard_identity


def _shard(path, **cols):
    pq.write_table(pa.table(cols or {"text": ["a b c d e"]}), path)
    return path


def test_hidden_and_private_files_and_directories_are_skipped_alike(tmp_path):
    for rel in ("a.parquet", "sub/b.parquet", ".hidden/c.parquet", "_temporary/0/d.parquet", ".e.parquet",
                "_f.parquet", "sub/.git/g.parquet"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        _shard(tmp_path / rel)
    assert [s.name for s in discover(tmp_path)] == ["a.parquet", os.path.join("sub", "b.parquet")]
    assert [s.name for s in discover(str(tmp_path / "**" / "*.parquet"))] == ["a.parquet",
                                                                              os.path.join("sub", "b.parquet")]
    assert [s.name for s in discover(tmp_path / ".e.parquet")] == [".e.parquet"]  # named explicitly: read


def test_a_fifo_among_the_inputs_is_refused_instead_of_hanging(tmp_path):
    _shard(tmp_path / "a.parquet")
    os.mkfifo(tmp_path / "b.jsonl")
    result = {}

    def go():
        try:
            discover(tmp_path)
        except InputError as exc:
            result["err"] = str(exc)

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(20)
    assert "FIFO" in result.get("err", "") and "b.jsonl" in result["err"]
    with pytest.raises(InputError, match="FIFO"):
        discover(tmp_path / "b.jsonl")


def test_broken_and_looping_symlinks_are_named(tmp_path):
    _shard(tmp_path / "a.parquet")
    os.symlink(tmp_path / "gone.parquet", tmp_path / "broken.parquet")
    with pytest.raises(InputError, match="broken symbolic link"):
        discover(tmp_path)
    os.unlink(tmp_path / "broken.parquet")
    os.symlink(tmp_path / "loop2.parquet", tmp_path / "loop1.parquet")
    os.symlink(tmp_path / "loop1.parquet", tmp_path / "loop2.parquet")
    with pytest.raises(InputError, match="looping symbolic link"):
        discover(tmp_path)
    with pytest.raises(InputError, match="looping symbolic link"):
        discover(tmp_path / "loop1.parquet")


def test_a_file_name_that_is_not_utf8_is_refused_with_a_fix(tmp_path):
    _shard(tmp_path / "a.parquet")
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.parquet"), "wb") as f:
        f.write((tmp_path / "a.parquet").read_bytes())
    with pytest.raises(InputError, match="not valid UTF-8; rename it"):
        discover(tmp_path)


def test_dictionary_typed_text_and_id_columns_are_decoded(tmp_path):
    texts = pa.array(["one two three", "four five six", "one two three"]).dictionary_encode()
    ids = pa.array(["x", "y", "z"]).dictionary_encode()
    pq.write_table(pa.table({"id": ids, "text": texts}), tmp_path / "cat.parquet")
    c = read(tmp_path / "cat.parquet", InputConfig(id_column="id"))
    assert c.text.to_pylist() == ["one two three", "four five six", "one two three"]
    assert c.ids.to_pylist() == ["x", "y", "z"]


@pytest.mark.parametrize("ids", [pa.array([[1], [2]]), pa.array([{"a": 1}, {"a": 2}])])
def test_an_id_column_of_nested_type_is_refused(tmp_path, ids):
    pq.write_table(pa.table({"id": ids, "text": ["a b", "c d"]}), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"ids must be scalars.*--no-id-column"):
        read(tmp_path / "n.parquet", InputConfig(id_column="id"))


def test_two_columns_named_like_the_text_column_are_refused(tmp_path):
    table = pa.Table.from_arrays([pa.array(["a b"]), pa.array(["c d"])], names=["text", "text"])
    pq.write_table(table, tmp_path / "dup.parquet")
    with pytest.raises(InputError, match="2 columns named 'text'"):
        read(tmp_path / "dup.parquet")


def test_running_out_of_memory_does_not_blame_the_shard(tmp_path, monkeypatch):
    _shard(tmp_path / "a.parquet")

    class Exhausted:
        def __init__(self, *a, **k):
            raise pa.ArrowMemoryError("malloc of size 1073741824 failed")

    monkeypatch.setattr(pq, "ParquetFile", Exhausted)
    with pytest.raises(ResourceError) as info:
        read(tmp_path / "a.parquet")
    assert "may be fine" in str(info.value) and "corrupt" not in str(info.value)


def test_identity_changes_when_a_shard_is_rewritten_with_the_same_size(tmp_path):
    p = tmp_path / "a.parquet"
    pq.write_table(pa.table({"id": [1, 2], "text": ["a b", "c d"]}), p)
    shard = discover(p)[0]
    assert shard.identity == shard_identity(str(p))
    check_unchanged([shard])
    size, mtime = p.stat().st_size, p.stat().st_mtime_ns
    pq.write_table(pa.table({"id": [3, 4], "text": ["a b", "c d"]}), p)
    assert p.stat().st_size == size
    os.utime(p, ns=(mtime, mtime))  # even with the old modification time, the footer differs
    with pytest.raises(InputError, match="changed during the run"):
        check_unchanged([shard])


def test_jsonl_identity_covers_both_ends(tmp_path):
    p = tmp_path / "a.jsonl"
    line = b'{"text": "x"}\n'
    p.write_bytes(line * 20000)
    before = shard_identity(str(p))
    st = p.stat()
    p.write_bytes(line * 19999 + b'{"text": "y"}\n')
    os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert shard_identity(str(p)) != before


def test_read_columns_still_reads_row_groups(tmp_path):
    pq.write_table(pa.table({"text": ["a", "b", "c", "d"]}), tmp_path / "g.parquet", row_group_size=2)
    shard = discover(tmp_path / "g.parquet")[0]
    assert read_columns(shard, InputConfig(), row_groups=[1]).column("text").to_pylist() == ["c", "d"]


def test_json_ids_beyond_int64_are_refused_not_rounded(tmp_path):
    """pyarrow reads JSON integers beyond int64 as doubles: 30 distinct ids would become one rounded float."""
    big = tmp_path / "big.jsonl"
    big.write_text("".join(f'{{"id": {2**70 + i}, "text": "document {i}"}}\n' for i in range(30)))
    with pytest.raises(InputError, match=r"id column 'id' of shard .*big.jsonl.* as large as 1\.18059e\+21.*JSON "
                                         r"strings.*--no-id-column"):
        read(discover(str(big)), InputConfig(id_column="id"))
    ok = tmp_path / "ok.jsonl"  # float ids a double holds exactly, and int64 ids, stay as they are
    ok.write_text("".join(f'{{"id": {i + 0.5}, "text": "a"}}\n' for i in range(3)))
    assert read(discover(str(ok)), InputConfig(id_column="id")).table.column("id").to_pylist() == [0.5, 1.5, 2.5]
    wide = tmp_path / "wide.jsonl"
    wide.write_text("".join(f'{{"id": {2**62 + i}, "text": "b"}}\n' for i in range(3)))
    assert read(discover(str(wide)), InputConfig(id_column="id")).table.column("id").to_pylist() == [
        2**62, 2**62 + 1, 2**62 + 2]


# ---------------------------------------------------------------- a walk reads everything it is given, or says why


def test_a_symlinked_subdirectory_is_read_as_the_equivalent_glob_reads_it(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    _shard(tmp_path / "elsewhere" / "b.parquet")
    (tmp_path / "in").mkdir()
    _shard(tmp_path / "in" / "a.parquet")
    os.symlink(tmp_path / "elsewhere", tmp_path / "in" / "linked")
    walked = [s.name for s in discover(tmp_path / "in")]
    assert walked == ["a.parquet", os.path.join("linked", "b.parquet")]
    assert [s.name for s in discover(str(tmp_path / "in" / "**" / "*.parquet"))] == walked
    os.symlink(tmp_path / "in", tmp_path / "in" / "loop")  # a link to a directory holding it: one error
    with pytest.raises(InputError, match=r"loop.*a symbolic link to a directory that contains it"):
        discover(tmp_path / "in")


def test_an_unreadable_subdirectory_is_an_error_naming_it(tmp_path, monkeypatch):
    _shard(tmp_path / "a.parquet")
    (tmp_path / "locked").mkdir()
    _shard(tmp_path / "locked" / "b.parquet")
    real = os.scandir

    def scandir(path="."):
        if os.fspath(path) == str(tmp_path / "locked"):
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InputError, match=r"cannot read directory '.*locked' .*Permission denied"):
        discover(tmp_path)


def test_files_a_walk_skips_are_named_in_a_warning_and_listed_in_the_report(tmp_path, caplog):
    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    (tmp_path / "in" / "sub").mkdir(parents=True)
    _shard(tmp_path / "in" / "a.parquet", text=["one two three four five six", "seven eight nine ten eleven"])
    (tmp_path / "in" / "b.jsonl.xz").write_bytes(b"\xfd7zXZ")  # a compression gpu_dedup does not read
    (tmp_path / "in" / "sub" / "part-00000").write_bytes(b"PAR1")  # Spark's part file without extension
    _shard(tmp_path / "in" / "_c.parquet")
    (tmp_path / "in" / "_SUCCESS").write_text("")
    with caplog.at_level("WARNING", logger="gpu_dedup"):
        result = run_dedup(tmp_path / "in", tmp_path / "out", Config(backend="cpu"))
    assert "skipped 3 input file(s)" in caplog.text
    for name in ("b.jsonl.xz", "part-00000", "_c.parquet"):
        assert name in caplog.text
    assert "_SUCCESS" not in caplog.text  # expected beside shards: listed, not warned about
    listed = {os.path.basename(s["path"]): s["reason"] for s in result.report["inputs_skipped"]}
    assert set(listed) == {"b.jsonl.xz", "part-00000", "_c.parquet", "_SUCCESS"}
    assert "not a shard file name" in listed["b.jsonl.xz"] and "hidden or private" in listed["_c.parquet"]
    assert result.report["inputs_skipped"] == __import__("json").loads(
        (tmp_path / "out" / "report.json").read_text())["inputs_skipped"]


def test_a_pattern_reads_the_directories_it_matches_and_lists_what_it_skips(tmp_path):
    (tmp_path / "d").mkdir()
    _shard(tmp_path / "d" / "a.parquet")
    (tmp_path / "d" / "spark.parquet").mkdir()  # Spark writes a dataset as a directory of part files
    _shard(tmp_path / "d" / "spark.parquet" / "part-0.parquet")
    _shard(tmp_path / "d" / "_b.parquet")
    shards = discover(str(tmp_path / "d" / "*.parquet"))
    assert [s.name for s in shards] == ["a.parquet", os.path.join("spark.parquet", "part-0.parquet")]
    assert [(os.path.basename(s["path"]), s["reason"].split(" (")[0]) for s in shards.skipped] == \
        [("_b.parquet", "matched by " + repr(str(tmp_path / "d" / "*.parquet")) + " under a hidden or private name")]
    with pytest.raises(InputError, match="matches no files"):
        discover(str(tmp_path / "d" / "_*.parquet"))


def test_a_file_whose_name_looks_like_a_pattern_is_read_as_named(tmp_path):
    _shard(tmp_path / "x1.parquet", text=["not this one"])
    _shard(tmp_path / "x[1].parquet", text=["this one"])
    shards = discover(str(tmp_path / "x[1].parquet"))
    assert [s.name for s in shards] == ["x[1].parquet"]


def test_one_file_reached_twice_is_read_once_and_listed(tmp_path):
    (tmp_path / "in" / "2024").mkdir(parents=True)
    _shard(tmp_path / "in" / "2024" / "a.parquet")
    os.symlink(tmp_path / "in" / "2024", tmp_path / "in" / "current")
    shards = discover(tmp_path / "in")
    assert [s.name for s in shards] == [os.path.join("2024", "a.parquet")]
    assert [(os.path.relpath(s["path"], tmp_path), s["reason"].split(",")[0]) for s in shards.skipped] == \
        [(os.path.join("in", "current", "a.parquet"), f"the same file as {str(tmp_path / 'in' / '2024' / 'a.parquet')!r}")]


# ---------------------------------------------------------------- JSON Lines values a reader would silently change


def test_a_json_line_that_is_not_an_object_is_refused_naming_its_line(tmp_path):
    for value in ("null", "  null", "true", '"text"', "[1, 2]", "7"):
        path = tmp_path / "a.jsonl"
        path.write_text(f'{{"text": "one"}}\n\n{value}\n{{"text": "two"}}\n')
        with pytest.raises(InputError, match=rf"line 3 of shard .*a.jsonl.* is .{re.escape(value.strip())}., not a JSON "
                                             r"object \(1 such line\(s\)\)"):
            read(discover(str(path)))


def test_a_json_array_or_indented_json_file_is_named_with_the_conversion(tmp_path):
    """A .json file is read as JSON Lines; an exported array of documents, or indented JSON, was refused as
    "line 1 … is '[{…', not a JSON object … fix or remove those lines": the message says what the file is and how
    to convert it."""
    docs = [{"text": "document one"}, {"text": "document two"}]
    (tmp_path / "array.json").write_text(json.dumps(docs))
    (tmp_path / "lines.json").write_text(json.dumps(docs, indent=1))
    (tmp_path / "pretty.json").write_text("\n".join(json.dumps(d, indent=2) for d in docs))
    for name, fix in [("array.json", r"looks like one JSON array, not JSON Lines: convert it, e.g. jq -c '\.\[\]' "),
                      ("lines.json", r"looks like one JSON array"),
                      ("pretty.json", r"looks like indented JSON, a document over several lines: .* jq -c \. ")]:
        with pytest.raises(InputError, match=rf"{name}.* not a JSON object .*; the file {fix}"):
            read(discover(str(tmp_path / name)))



def test_a_shard_with_carriage_return_line_ends_is_named_with_the_conversion(tmp_path):
    """Lines ended by a carriage return alone are one line to the line scanner and several records to the JSON
    parser: "1 non-blank lines but 3 JSON records" said nothing of why."""
    path = tmp_path / "mac.jsonl"
    path.write_bytes(b'{"text": "a b c"}\r{"text": "d e f"}\r{"text": "g h i"}\r')
    with pytest.raises(InputError, match=r"1 non-blank lines but 3 JSON records; its lines end with a carriage "
                                         r"return alone .* tr '\\r' '\\n' < mac\.jsonl > NEW\.jsonl"):
        read(discover(str(path)))
    path.write_bytes(b'{"text": "a b c"}\r\n{"text": "d e f"}\r\n')  # CRLF: read as it is
    assert read(discover(str(path))).table.num_rows == 2

def test_integer_ids_mixed_with_fractions_are_refused_naming_both_lines(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"id": 1, "text": "a"}\n{"id": 4.5, "text": "b"}\n{"text": "c", "id": 4}\n')
    with pytest.raises(InputError, match=r"mixes integers \(line 1: 1\) and numbers with a fraction or exponent "
                                         r"\(line 2: 4\.5\).*1 would be kept as 1\.0.*JSON strings"):
        read(discover(str(path)), InputConfig(id_column="id"))
    path.write_text('{"id": 1, "text": "a"}\n{"id": 2e0, "text": "b"}\n')
    with pytest.raises(InputError, match=r"\(line 2: 2e0\)"):
        read(discover(str(path)), InputConfig(id_column="id"))
    path.write_text('{"id": 1.0, "text": "a"}\n{"id": 2.5, "text": "b"}\n')  # floats only: kept as they are
    assert read(discover(str(path)), InputConfig(id_column="id")).table.column("id").to_pylist() == [1.0, 2.5]


def test_a_line_without_the_text_field_is_named_in_a_warning(tmp_path, caplog):
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "a"}\n{"text": null}\n{"body": "b"}\n{"text": "c"}\n')
    with caplog.at_level("WARNING", logger="gpu_dedup"):
        corpus = read(discover(str(path)))
    assert corpus.table.column("text").to_pylist() == ["a", None, None, "c"]
    assert "1 line(s) of shard" in caplog.text and "have no 'text' field (first: line 3)" in caplog.text
    caplog.clear()
    path.write_text('{"text": "a"}\n{"text": null}\n')
    with caplog.at_level("WARNING", logger="gpu_dedup"):
        read(discover(str(path)))
    assert "field" not in caplog.text  # an explicit null is a document without text, as documented


@pytest.mark.parametrize("types", [(pa.string(), pa.large_string()), (pa.int32(), pa.int64()),
                                   (pa.uint16(), pa.int64()), (pa.binary(), pa.large_binary())])
def test_id_columns_differing_only_in_physical_type_keep_their_ids(tmp_path, types):
    """Writers store one kind of id differently (pandas large_string, Spark string, int32 or int64): the ids
    are kept, in a run with --id-column and in one that finds the column named id by itself."""
    from gpu_dedup.cli import main

    def value(i):
        return str(i).encode() if pa.types.is_binary(types[0]) else (str(i) if pa.types.is_string(types[0]) else i)

    for k, t in enumerate(types):
        (tmp_path / "in").mkdir(exist_ok=True)
        pq.write_table(pa.table({"id": pa.array([value(10 + 2 * k), value(11 + 2 * k)], t),
                                 "text": [f"shard {k} first document text", "the same text in both shards"]}),
                       tmp_path / "in" / f"{k}.parquet")
    corpus = read(discover(tmp_path / "in"), InputConfig(id_column="id"))
    assert [str(v) if not isinstance(v, bytes) else v.decode() for v in corpus.table.column("id").to_pylist()] == \
        ["10", "11", "12", "13"]
    assert main(["run", str(tmp_path / "in"), "-o", str(tmp_path / "out"), "-q", "--backend", "cpu"]) == 0
    dup = pq.read_table(tmp_path / "out" / "duplicates.parquet")
    assert {v.decode() if isinstance(v, bytes) else str(v) for v in dup.column("id").to_pylist()} == {"11", "13"}


def test_jsonl_with_an_upper_case_extension_or_a_byte_order_mark_is_read(tmp_path):
    import gzip

    lines = "".join(f'{{"id": "d{i}", "text": "document number {i}"}}\n' for i in range(5)).encode()
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "A.JSONL.GZ").write_bytes(gzip.compress(lines))  # compression told by the extension, any case
    (tmp_path / "in" / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + lines.replace(b'"d', b'"e'))  # Windows editors
    corpus = read(discover(tmp_path / "in"), InputConfig(id_column="id"))
    assert corpus.table.num_rows == 10 and corpus.table.column("id").to_pylist()[:1] == ["d0"]
    from gpu_dedup.storage import id_column_type

    assert {id_column_type(s, "id") for s in discover(tmp_path / "in")} == {"any"}  # the CLI finds the id column


def test_a_utf16_jsonl_shard_is_named_as_utf16_with_the_conversion(tmp_path):
    """PowerShell's ``>`` writes UTF-16 (with a byte order mark); other tools without one. Such a shard was refused
    as "line 1 ... is '\ufffd\ufffd{\\x00\"\\x00t...', not a JSON object": the message names the encoding and the fix."""
    lines = "".join(f'{{"id": "d{i}", "text": "document number {i}"}}\r\n' for i in range(3))
    for name, body in [("bom.jsonl", b"\xff\xfe" + lines.encode("utf-16-le")), ("le.jsonl", lines.encode("utf-16-le")),
                       ("be.jsonl", lines.encode("utf-16-be"))]:
        (tmp_path / name).write_bytes(body)
        with pytest.raises(InputError, match=rf"{name}' is UTF-16 text .*must be UTF-8; convert it, e.g. iconv -f UTF-16"):
            read(discover(tmp_path / name), InputConfig(id_column="id"))
    (tmp_path / "nul.jsonl").write_bytes(b"\x00\x00" + lines.encode())  # not UTF-16: the line is named as before
    with pytest.raises(InputError, match=r"line 1 of shard .*nul.jsonl.* not a JSON object"):
        read(discover(tmp_path / "nul.jsonl"))


def test_a_damaged_compressed_jsonl_shard_is_named_with_a_fix(tmp_path):
    """A truncated, zero-padded or mis-named compressed shard said only "cannot read shard …: zlib inflate
    failed: unknown compression method": the message now says what to check and do."""
    import bz2
    import gzip

    body = "".join(f'{{"text": "document number {i}"}}\n' for i in range(50)).encode()
    for name, data, tool in [("pad.jsonl.gz", gzip.compress(body) + b"\0" * 512, "gzip -t"),
                             ("plain.jsonl.gz", body, "gzip -t"), ("cut.jsonl.bz2", bz2.compress(body)[:60], "bzip2 -t")]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(InputError, match=rf"cannot read shard .*{name}'.*; it is not valid .* data as its name says "
                                             rf".*test it with {tool}, then replace or remove it"):
            read(discover(tmp_path / name))


def test_a_runs_output_directory_inside_the_inputs_is_never_read_as_more_input(tmp_path, caplog):
    """``run 'in/*.parquet' -o in/out`` then ``run 'in/**/*.parquet' -o out3`` read the first run's output
    shards as more input (the copies sorted first and survived).  A directory holding a run's manifest, or
    the work directory of a run under way, is skipped by walks and patterns, named once in a warning and
    listed in report.json; named itself, its shards are read and its own files are not."""
    import json
    import logging

    from gpu_dedup.cli import main

    base = "the quick brown fox jumps over the lazy dog near the river bank today and tomorrow"
    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(pa.table({"text": [base, base + " x", "other words entirely here now"]}), inp / "a.parquet")
    pq.write_table(pa.table({"text": [base + " y", "more other words entirely here"]}), inp / "b.parquet")
    assert main(["run", str(inp / "*.parquet"), "-o", str(inp / "out"), "--backend", "cpu", "-q"]) == 0
    (inp / "busy" / ".gpu_dedup_checkpoint" / "staged").mkdir(parents=True)  # a run under way
    pq.write_table(pa.table({"text": [base]}), inp / "busy" / ".gpu_dedup_checkpoint" / "staged" / "a.parquet")
    pq.write_table(pa.table({"text": [base]}), inp / "busy" / "c.parquet")
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    for given in (str(inp / "**" / "*.parquet"), str(inp), str(inp / "*")):
        caplog.clear()
        shards = discover(given)
        assert sorted(s.name for s in shards) == ["a.parquet", "b.parquet"], given
        assert sorted(s["path"] for s in shards.skipped if "outputs of a gpu_dedup run" in s["reason"]) == \
            [str(inp / "busy"), str(inp / "out")], given
        said = [r.getMessage() for r in caplog.records if "outputs of a gpu-dedup run" in r.getMessage()]
        assert len(said) == 1 and repr(str(inp / "out")) in said[0] and repr(str(inp / "busy")) in said[0]
    assert main(["run", str(inp / "**" / "*.parquet"), "-o", str(tmp_path / "out3"), "--backend", "cpu", "-q"]) == 0
    report = json.loads((tmp_path / "out3" / "report.json").read_text())
    assert report["counts"]["documents_read"] == 5
    assert str(inp / "out") in [s["path"] for s in report["inputs_skipped"]]
    # the output directory named itself: a second pass reads its shards, never its duplicates table or report
    caplog.clear()
    shards = discover(inp / "out")
    assert sorted(s.name for s in shards) == ["a.parquet", "b.parquet"]
    assert {os.path.basename(s["path"]) for s in shards.skipped} >= {"duplicates.parquet", "report.json"}
    assert not [r for r in caplog.records if "not read as shards" in r.getMessage()]  # its own files: no warning
    assert sorted(s.name for s in discover(str(inp / "out" / "*.parquet"))) == ["a.parquet", "b.parquet"]


def test_integer_scores_beyond_two_to_the_53_rank_by_their_nearest_float_with_a_warning(tmp_path, caplog):
    """Nanosecond timestamps and uint64 hashes as select.score_column: Arrow's checked cast to float64 refused
    them (a raw ArrowInvalid, exit 1).  They rank by their nearest float64; closer than its spacing, they tie
    and the earlier row wins."""
    import logging

    import numpy as np

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    words = [" ".join(f"w{k}-{i}" for i in range(40)) for k in range(3)]
    text = [words[0], words[0], words[1], words[1], words[2], words[2]]
    ns = 1_700_000_000_000_000_000  # 2023 in nanoseconds since 1970, beyond 2**53
    cases = {
        "int64": pa.array([ns, ns + 10**12, ns + 10**12, ns, ns + 1, ns], pa.int64()),
        "uint64": pa.array([2**63, 2**63 + 2**20, 2**63 + 2**20, 2**63, 2**63 + 1, 2**63], pa.uint64()),
    }
    for name, score in cases.items():
        path = tmp_path / f"{name}.parquet"
        pq.write_table(pa.table({"text": text, "score": score}), path)
        cfg = Config.from_dict({"select": {"keep": "score", "score_column": "score"}, "backend": "cpu"})
        with caplog.at_level(logging.WARNING, logger="gpu_dedup.storage.columns"):
            caplog.clear()
            res = run_dedup([str(path)], None, cfg)
        assert any("beyond 2**53" in r.getMessage() and "'score'" in r.getMessage() for r in caplog.records), name
        # the higher score survives where the scores are far apart; the last pair is closer than float64's
        # spacing there (1 against 256 or 2048): a tie, which the earlier row wins
        assert np.asarray(res.cluster).tolist() == [1, 1, 2, 2, 4, 4], name


# ---------------------------------------------------------------- JSON Lines nested deeper than the parser takes


def _deep_line(depth: int, kind: str) -> bytes:
    """A document whose field ``m`` nests arrays (``[[[…]]]``) or objects (``{"a":{"a":…}}``) ``depth`` levels
    deep under the line's own object (``depth + 1`` levels in all)."""
    if kind == "arrays":
        return b'{"text": "deep doc", "m": ' + b"[" * depth + b"]" * depth + b"}"
    return b'{"text": "deep doc", "m": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}"


def _run_cli(*args):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "gpu_dedup", *map(str, args)], capture_output=True, text=True,
                          timeout=600)


@pytest.mark.parametrize("kind,name,depth", [("arrays", "deep.jsonl", 50_000), ("objects", "deep.jsonl", 50_000),
                                             ("arrays", "deep.jsonl.gz", 50_000), ("objects", "deep.jsonl", 5_000)])
def test_a_deeply_nested_json_line_is_refused_naming_its_line_not_crashing(tmp_path, kind, name, depth):
    """A line nesting arrays or objects 50,000 levels deep crashed pyarrow's JSON parser (it recurses per level
    and overflows its thread's stack: a segmentation fault, exit 139, at about 16,000 levels with an 8 MiB
    stack); one 5,000 deep, in a shard's first 64 KiB, ended in a RecursionError traceback from the look for an
    id column. Run as the CLI in a process of its own, so that a crash shows as one."""
    import gzip

    body = b'{"text": "first doc"}\n\n' + _deep_line(depth, kind) + b'\n{"text": "last doc"}\n'
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / name).write_bytes(gzip.compress(body) if name.endswith(".gz") else body)
    proc = _run_cli("run", tmp_path / "in", "-o", tmp_path / "out", "--backend", "cpu", "-q")
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])  # input error, not -11 (SIGSEGV)
    err = proc.stderr.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    assert re.search(rf"line 3 of shard .*{re.escape(name)}.* nests arrays/objects {depth + 1} levels deep \(1 such "
                     r"line\(s\)\), beyond the 512 levels the JSON reader takes .*; flatten or drop the deep field, "
                     rf"e\.g\. jq -c 'del\(\.FIELD\)' {re.escape(name)} > NEW\.jsonl, or remove the line", err), err


def test_json_nesting_is_refused_from_one_level_beyond_the_limit(tmp_path):
    """512 levels are read (Python's json, which reads some lines too, takes about 1,000; pyarrow crashes at
    about 4,000 with 2 MiB thread stacks); 513 are refused, naming the line."""
    DEPTH_LIMIT = 512
    path = tmp_path / "a.jsonl"
    for kind in ("arrays", "objects"):
        path.write_bytes(b'{"text": "one"}\n' + _deep_line(DEPTH_LIMIT - 1, kind) + b"\n")  # the limit itself: read
        assert read(discover(str(path))).table.num_rows == 2
        path.write_bytes(b'{"text": "one"}\n' + _deep_line(DEPTH_LIMIT, kind) + b"\n")
        with pytest.raises(InputError, match=rf"line 2 of shard .* nests arrays/objects {DEPTH_LIMIT + 1} levels deep"):
            read(discover(str(path)))


def test_a_deep_line_in_a_later_block_of_a_streamed_shard_is_refused_not_crashing(tmp_path):
    """The streamed reader parses a block of lines at a time with the types its first lines fixed, skipping
    other fields: a deep line past the first block was read without a word there, though the whole read (types
    inferred) crashed on it. It is refused wherever it lies: the whole read the streamed one falls back to
    names it (in a process of its own, so that a crash shows as one)."""
    import subprocess
    import sys

    path = tmp_path / "a.jsonl"
    lines = [json.dumps({"id": f"d{i}", "text": f"document number {i} " * 20}).encode() for i in range(20_000)]
    lines.insert(15_000, _deep_line(50_000, "arrays").replace(b'{"text"', b'{"id": "deep", "text"'))
    path.write_bytes(b"\n".join(lines) + b"\n")
    script = ("import sys\nfrom gpu_dedup.config import InputConfig\nfrom gpu_dedup.errors import InputError\n"
              "from gpu_dedup.storage import ReadWhole, discover, iter_columns, read_columns\n"
              "shard = discover([sys.argv[1]])[0]\ncfg = InputConfig(id_column='id')\ntables = 0\n"
              "try:\n    for t in iter_columns(shard, cfg, batch_bytes=1 << 20):\n        tables += 1\n"
              "except ReadWhole:\n    print('whole after', tables)\n"
              "    try:\n        read_columns(shard, cfg)\n    except InputError as e:\n        print(e)\n")
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    said = proc.stdout.splitlines()
    assert len(said) == 2, said
    assert said[0].startswith("whole after ") and int(said[0].split()[-1]) > 0, said  # blocks before it streamed
    assert re.search(r"line 15001 of shard .*a.jsonl.* nests arrays/objects 50001 levels deep", said[1]), said


def test_brackets_inside_json_strings_do_not_count_as_nesting(tmp_path):
    """A page whose text holds 10,000 ``[`` or ``{`` (escaped quotes and backslashes among them) is no deep
    document: it is read and deduplicated as any other."""
    page = "see [" * 10_000 + ' a \\" quote { and a \\\\ backslash ' + "{" * 10_000 + "]] [1] " * 3000
    docs = [{"id": "p1", "text": page}, {"id": "p2", "text": page}, {"id": "p3", "text": "[" * 600 + "other"},
            {"id": "q", "text": "a plain short document about nothing in particular"}]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "pages.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    proc = _run_cli("run", tmp_path / "in", "-o", tmp_path / "out", "--backend", "cpu", "--id-column", "id", "-q")
    assert proc.returncode == 0, proc.stderr[-2000:]
    kept = [json.loads(line)["id"] for line in (tmp_path / "out" / "pages.jsonl").read_text().splitlines()]
    assert kept == ["p1", "p3", "q"]  # p2 is p1's duplicate
    from gpu_dedup.storage.jsonl import json_depth

    assert json_depth(json.dumps({"t": "x\\", "m": [[["[[[", "\\\"]]"]]]}).encode()) == 4
    assert json_depth(b'{"t": "not closed [[[[[[') == 1  # the parser names this line's own fault


def test_a_score_column_of_no_values_is_null_scores_ranked_last(tmp_path):
    """A writer gives a shard of no rows, or a JSON field that is always null, the type null: it was refused as
    'has type null; it must be numeric'.  Its scores are nulls, which rank last."""
    import numpy as np

    from gpu_dedup.config import Config
    from gpu_dedup.run.entry import run_dedup

    words = " ".join(f"w{i}" for i in range(40))
    pq.write_table(pa.table({"text": pa.array([], pa.string()), "score": pa.array([], pa.null())}),
                   tmp_path / "a-empty.parquet")
    pq.write_table(pa.table({"text": [words, words], "score": pa.array([None, None], pa.null())}),
                   tmp_path / "b-nulls.parquet")
    pq.write_table(pa.table({"text": [words], "score": [0.5]}), tmp_path / "c-scored.parquet")
    cfg = Config.from_dict({"select": {"keep": "score", "score_column": "score"}, "backend": "cpu"})
    res = run_dedup([str(tmp_path)], None, cfg)
    assert np.asarray(res.cluster).tolist() == [2, 2, 2]  # the one scored document survives
