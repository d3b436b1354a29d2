"""A run owns only what it creates: lock, manifest, collisions, staging and commit of the output directory."""

import errno
import json
import os
import socket
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpu_dedup import storage
from gpu_dedup.cli import main
from gpu_dedup.config import Config
from gpu_dedup.errors import InputError, OutputError
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run import local
from gpu_dedup.run.checkpoint import CHECKPOINT_DIR
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.outdir import LOCK_NAME, MANIFEST_NAME, OutputDir
from tests.accounting import assert_accounted

CFG = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
OUTPUTS = ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("outdir")
    sample = planted_corpus(n_docs=300, n_clusters=20, words=(30, 80), edit_rate=(0, 0.04), seed=3)
    write_shards(sample.table.select(["id", "text"]), d / "in", shards=3)
    run_dedup(d / "in", d / "clean", CFG)
    return d


def _visible(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts)}


def _inputs(d):
    return [pq.read_table(p, columns=["id"]) for p in sorted(d.glob("*.parquet"))]


# ---------------------------------------------------------------------- lock


def test_a_second_run_on_a_locked_directory_stops_with_exit_4(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    with OutputDir(out, storage.discover(corpus / "in")):  # another run holds the directory
        assert main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "-q"]) == 4
        err = capsys.readouterr().err
        assert "in use by another gpu-dedup run" in err and f"pid {os.getpid()}" in err and "Traceback" not in err
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME]  # the refused run wrote nothing
    assert not out.exists()  # the holder created it and left nothing behind


def test_concurrent_runs_never_interleave(corpus, tmp_path):
    """Two processes started together on one directory: one completes, the other stops with exit 4; the output
    is exactly the completed run's."""
    out = tmp_path / "out"
    cmds = [[sys.executable, "-m", "gpu_dedup", "run", str(corpus / "in"), "-o", str(out), "--id-column", "id",
             "--backend", "cpu", "-q", *extra] for extra in ([], ["--threshold", "0.6"])]
    procs = [subprocess.Popen(c, stderr=subprocess.PIPE, text=True) for c in cmds]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(rc for rc, _ in results)
    assert codes == [0, 4], results
    winner = [i for i, (rc, _) in enumerate(results) if rc == 0][0]
    assert "in use by another gpu-dedup run" in [e for rc, e in results if rc == 4][0]
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["lsh"]["threshold"] == (0.8 if winner == 0 else 0.6)
    ref = tmp_path / "ref"
    run_dedup(corpus / "in", ref, CFG.with_overrides({"lsh.threshold": report["config"]["lsh"]["threshold"]}))
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


def test_a_lock_file_left_by_a_killed_run_is_taken_over(corpus, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (out / LOCK_NAME).write_text(f"pid {dead.stdout.strip()} on {socket.gethostname()}, started 2020-01-01\n")
    run_dedup(corpus / "in", out, CFG)
    assert (out / "_SUCCESS").exists() and not (out / LOCK_NAME).exists()


# ---------------------------------------------------------------------- ownership


def test_files_the_run_did_not_write_are_never_touched(corpus, tmp_path):
    out = tmp_path / "out"
    (out / "sub").mkdir(parents=True)
    mine = {"notes.txt": b"mine", ".draft.tmp": b"a temp file of another tool", "sub/.x.parquet.tmp": b"t",
            "sub/keep.parquet": b"not a shard of this run"}
    for name, data in mine.items():
        (out / name).write_bytes(data)
    run_dedup(corpus / "in", out, CFG)
    run_dedup(corpus / "in", out, CFG.with_overrides({"lsh.threshold": 0.7}))  # a rerun over its own output
    for name, data in mine.items():
        assert (out / name).read_bytes() == data, name


@pytest.mark.parametrize("name", ["part-00001.parquet", "duplicates.parquet", "report.json", "_SUCCESS"])
def test_a_foreign_file_where_the_run_would_write_is_refused_before_anything_is_written(corpus, tmp_path, name,
                                                                                       capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / name).write_bytes(b"the user's file")
    assert main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "-q"]) == 4
    err = capsys.readouterr().err
    assert "was not written by gpu_dedup" in err and name in err
    assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_bytes() == b"the user's file"


def test_an_output_file_changed_by_the_user_is_not_overwritten(corpus, tmp_path):
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG)
    (out / "report.json").write_text("my edited report")
    with pytest.raises(OutputError, match="changed after gpu_dedup wrote it"):
        run_dedup(corpus / "in", out, CFG)
    assert (out / "report.json").read_text() == "my edited report"


def test_stale_shards_of_an_earlier_run_are_removed_when_the_new_run_commits(corpus, tmp_path):
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG)
    fewer = tmp_path / "fewer"
    fewer.mkdir()
    for name in ("part-00000.parquet", "part-00001.parquet"):
        (fewer / name).write_bytes((corpus / "in" / name).read_bytes())
    run_dedup(fewer, out, CFG)
    assert not (out / "part-00002.parquet").exists()
    manifest = json.loads((out / MANIFEST_NAME).read_text())
    assert sorted(manifest["files"]) == ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet",
                                         "report.html", "report.json"]
    assert_accounted(out, _inputs(fewer))


def test_a_failing_rerun_keeps_the_previous_complete_output(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG)
    before = _visible(out)
    rc = main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "--text-column", "txet", "-q"])
    assert rc == 3 and "text column 'txet'" in capsys.readouterr().err
    assert _visible(out) == before  # _SUCCESS, reports and shards of the earlier run, as they were


# ---------------------------------------------------------------------- collisions


def test_output_directory_inside_the_input_directory_is_refused(corpus, tmp_path, capsys):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.parquet").write_bytes((corpus / "in" / "part-00000.parquet").read_bytes())
    assert main(["run", str(inp), "-o", str(inp / "out"), "--backend", "cpu", "-q"]) == 4
    err = capsys.readouterr().err
    assert "inside the input directory" in err and "choose an output directory outside the inputs" in err
    assert main(["run", str(inp), "-o", str(inp), "--backend", "cpu", "-q"]) == 4
    assert sorted(p.name for p in inp.iterdir()) == ["a.parquet"]


def test_an_earlier_runs_outputs_under_an_input_glob_are_excluded_and_named_once(corpus, tmp_path, caplog):
    """``-o`` under the reach of the input pattern: the rerun skips the output directory (its manifest marks
    it), says so in one warning, and publishes the same outputs."""
    import logging

    data = tmp_path / "data"
    (data / "in").mkdir(parents=True)
    for p in (corpus / "in").iterdir():
        (data / "in" / p.name).write_bytes(p.read_bytes())
    pattern = str(data / "**" / "*.parquet")
    assert main(["run", pattern, "-o", str(data / "out"), "--backend", "cpu", "-q"]) == 0
    before = _visible(data / "out")
    caplog.clear()
    caplog.set_level(logging.WARNING, logger="gpu_dedup")
    assert main(["run", pattern, "-o", str(data / "out"), "--backend", "cpu", "-q"]) == 0
    said = [r.getMessage() for r in caplog.records if "outputs of a gpu-dedup run" in r.getMessage()]
    assert len(said) == 1 and repr(str(data / "out")) in said[0]
    after = _visible(data / "out")
    report = json.loads(after.pop("report.json"))
    assert report["counts"]["documents_read"] == json.loads(before.pop("report.json"))["counts"]["documents_read"]
    assert {k: v for k, v in after.items() if k != "report.html"} == \
        {k: v for k, v in before.items() if k != "report.html"}


def test_inputs_named_like_outputs_are_refused(tmp_path, capsys):
    inp = tmp_path / "in"
    inp.mkdir()
    pq.write_table(pa.table({"text": ["one two three four five six"]}), inp / "a.parquet")
    pq.write_table(pa.table({"text": ["seven eight nine ten eleven"]}), inp / "duplicates.parquet")
    (inp / "report.json").write_text('{"text": "a json lines shard"}\n')
    assert main(["run", str(inp), "-o", str(tmp_path / "out"), "--backend", "cpu", "-q"]) == 4
    err = capsys.readouterr().err
    assert "a name gpu_dedup uses for its own output" in err and "duplicates.parquet" in err
    assert not (tmp_path / "out").exists()


def test_output_that_is_an_existing_file_is_refused(corpus, tmp_path, capsys):
    target = tmp_path / "file"
    target.write_text("x")
    assert main(["run", str(corpus / "in"), "-o", str(target), "--backend", "cpu", "-q"]) == 4
    assert "is not a directory" in capsys.readouterr().err and target.read_text() == "x"


def test_an_output_shard_that_would_overwrite_its_input_is_refused(corpus, tmp_path):
    inp = tmp_path / "d"
    inp.mkdir()
    (inp / "a.parquet").write_bytes((corpus / "in" / "part-00000.parquet").read_bytes())
    with pytest.raises(OutputError, match="would overwrite input shard"):
        run_dedup(inp / "a.parquet", inp, CFG)


# ---------------------------------------------------------------------- inputs changing, full disk, read-only


def test_an_input_replaced_during_the_run_with_the_same_rows_fails_and_publishes_nothing(corpus, tmp_path,
                                                                                         monkeypatch):
    inp = tmp_path / "in"
    inp.mkdir()
    for p in (corpus / "in").iterdir():
        (inp / p.name).write_bytes(p.read_bytes())
    swapped = pq.read_table(inp / "part-00001.parquet")
    swapped = swapped.set_column(0, "id", pa.array([f"new-{i}" for i in range(swapped.num_rows)]))
    backend = local.get_backend("cpu")
    original = backend.normalize_column

    def normalize_and_swap(*args, **kwargs):  # a shard replaced during normalize: same texts, new ids
        pq.write_table(swapped, inp / "part-00001.parquet")
        return original(*args, **kwargs)

    monkeypatch.setattr(backend, "normalize_column", normalize_and_swap)
    out = tmp_path / "out"
    with pytest.raises(InputError, match="changed during the run"):
        run_dedup(inp, out, CFG)
    assert not (out / "_SUCCESS").exists() and not [p for p in out.iterdir() if not p.name.startswith(".")]


def test_full_disk_is_one_error_and_leaves_no_partial_file(corpus, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG)
    before = _visible(out)
    real = pq.write_table

    def full(table, where, **kw):
        real(table.slice(0, 1), where, **kw)  # a partial file, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    real_group = pq.ParquetWriter.write_table

    def full_group(self, table, *args, **kw):  # the same through a writer of row groups (the duplicates table's)
        real_group(self, table.slice(0, 1), *args, **kw)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq, "write_table", full)
    monkeypatch.setattr(pq.ParquetWriter, "write_table", full_group)
    rc = main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "--id-column", "id", "--threshold",
               "0.7", "-q"])
    err = capsys.readouterr().err
    assert rc == 5 and "disk full writing" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not [p for p in out.rglob("*.tmp")]
    assert _visible(out) == before  # the earlier complete output is untouched


def test_read_only_output_directory_is_one_error(corpus, tmp_path, monkeypatch, capsys):
    import tempfile

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    monkeypatch.setattr(os, "open", read_only)
    rc = main(["run", str(corpus / "in"), "-o", str(tmp_path / "ro"), "--backend", "cpu", "-q"])
    err = capsys.readouterr().err
    assert rc == 4 and "Read-only file system" in err and "writable" in err and "Traceback" not in err


def test_rerun_with_the_same_inputs_publishes_identical_files(corpus, tmp_path):
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG)
    first = _visible(out)
    time.sleep(0.01)
    run_dedup(corpus / "in", out, CFG)
    again = _visible(out)
    for name in OUTPUTS:
        assert first[name] == again[name] == (corpus / "clean" / name).read_bytes()
    assert not (out / CHECKPOINT_DIR).exists() and not (out / LOCK_NAME).exists()


def test_an_output_directory_that_cannot_be_created_is_an_output_error(corpus, tmp_path, capsys):
    (tmp_path / "a-file").write_text("mine\n")
    for out in (tmp_path / "a-file" / "out", "/proc/gpu-dedup-cannot-be-here"):
        rc = main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "-q"])
        err = capsys.readouterr().err
        assert rc == 4, err
        assert f"cannot create output directory {str(out)!r}" in err and "choose an -o" in err
    assert (tmp_path / "a-file").read_text() == "mine\n"


# ---------------------------------------------------------------------- commit


def test_the_commit_does_not_read_again_the_shards_the_write_stage_digested(corpus, tmp_path, monkeypatch):
    from gpu_dedup.run import outdir

    read = []
    real = outdir.file_digest
    monkeypatch.setattr(outdir, "file_digest", lambda p: read.append(os.path.basename(p)) or real(p))
    run_dedup(corpus / "in", tmp_path / "out", CFG)
    assert not [n for n in read if n.startswith("part-")]  # the small outputs are digested at the commit
    manifest = json.loads((tmp_path / "out" / MANIFEST_NAME).read_text())["files"]
    for name in OUTPUTS:  # and the manifest's digests are the files'
        assert {k: manifest[name][k] for k in ("size", "sha256")} == storage.file_digest(tmp_path / "out" / name)


def test_a_staged_shard_changed_after_it_was_written_is_never_published(corpus, tmp_path, monkeypatch, capsys):
    """Same size, other bytes, written after the write stage: the stamp differs, the commit reads the file and
    refuses it."""
    from gpu_dedup.run import outdir

    real = outdir.OutputDir.commit

    def tamper(self, fingerprint, expected_rows, recorded=None):
        staged = self.staging / "part-00001.parquet"
        data = bytearray(staged.read_bytes())
        data[100] ^= 0xFF
        time.sleep(0.01)
        staged.write_bytes(bytes(data))
        return real(self, fingerprint, expected_rows, recorded)

    monkeypatch.setattr(outdir.OutputDir, "commit", tamper)
    out = tmp_path / "out"
    assert main(["run", str(corpus / "in"), "-o", str(out), "--id-column", "id", "--backend", "cpu", "-q"]) == 4
    err = capsys.readouterr().err
    assert "changed after it was written" in err and "nothing was published" in err and "Traceback" not in err
    assert not (out / "_SUCCESS").exists() and not (out / "part-00001.parquet").exists()


@pytest.mark.parametrize("fmt", ["parquet", "jsonl", "index"])
def test_every_output_is_on_the_disk_before_it_is_renamed_into_place(corpus, tmp_path, monkeypatch, fmt):
    """Each file a run publishes (shards, duplicates.parquet, reports, manifest, _SUCCESS) was fsynced before the
    rename that made it an output: a power loss after ``_SUCCESS`` must not leave a file it vouches for with its
    blocks never written (Parquet shards and duplicates.parquet were renamed unsynced).  An index's segment files
    are synced before its manifest names them.  Checkpoints, whose loss only costs a recomputation, are not."""
    import threading

    inp = corpus / "in"
    if fmt == "jsonl":
        inp = tmp_path / "jsonl"
        inp.mkdir()
        for p in sorted((corpus / "in").glob("*.parquet")):
            pq.read_table(p).to_pandas().to_json(inp / (p.stem + ".jsonl"), orient="records", lines=True)
    synced, renamed, lock = set(), [], threading.Lock()
    real_fsync, real_replace = os.fsync, os.replace

    synced_dirs, events = {}, []  # a directory's last sync, as a position among the renames

    def fsync(fd):
        with lock:
            target = os.readlink(f"/proc/self/fd/{fd}")
            synced.add(target)
            if os.path.isdir(target):
                synced_dirs[target] = len(events)
        real_fsync(fd)

    def replace(src, dst, *a, **k):
        with lock:
            renamed.append((str(src), str(dst)))
            events.append(str(dst))
        real_replace(src, dst, *a, **k)

    def last_rename_into(folder, but):  # the position of the last rename into ``folder`` other than ``but``
        return max(i for i, d in enumerate(events) if os.path.dirname(d) == folder and os.path.basename(d) != but)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    out = tmp_path / "out"
    run_dedup(inp, out, CFG, index_out=tmp_path / "index" if fmt == "index" else None)
    if fmt == "index":
        segments = sorted(p.name for p in (tmp_path / "index").rglob("*.arrow"))  # written in a folder then renamed
        assert segments == sorted(os.path.basename(s) for s in synced if s.startswith(str(tmp_path / "index"))
                                  and s.endswith(".arrow"))
    fresh = [(s, d) for s, d in renamed if os.path.basename(s).startswith(".") and CHECKPOINT_DIR + "/" not in d
             or "/staged/" in d]  # a new file becoming an output (or a staged one); not a staged one's move
    published = {os.path.basename(d) for _, d in fresh}
    suffix = ".jsonl" if fmt == "jsonl" else ".parquet"
    assert {f"part-0000{i}{suffix}" for i in range(3)} | {"duplicates.parquet", "report.json", "_SUCCESS"} <= published
    assert [(s, d) for s, d in fresh if s not in synced and not os.path.isdir(d)] == []  # a segment: its files
    saves = [s for s, d in renamed if d.endswith(".arrays")]
    assert (saves or fmt == "index") and not any(s in synced for s in saves)  # checkpoints (an index run has none)
    # the renames themselves: the output directory synced after its last rename and before _SUCCESS's
    assert str(out) in synced_dirs and synced_dirs[str(out)] > last_rename_into(str(out), "_SUCCESS")
    if fmt == "index":  # each segment's folder, and the index's after the segments' renames into it
        assert str(tmp_path / "index") in synced_dirs
        assert any(d.startswith(str(tmp_path / "index") + "/") for d in synced_dirs)


def test_a_symbolic_link_at_the_lock_files_name_is_never_written_through(corpus, tmp_path, capsys):
    """``out/.gpu_dedup.lock`` a link to a user's file: the run opened the lock through the link and wrote its
    holder line over the user's file (then removed the link)."""
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's data\n")
    (out / LOCK_NAME).symlink_to(victim)
    assert main(["run", str(corpus / "in"), "-o", str(out), "--backend", "cpu", "-q"]) == 4
    assert "Traceback" not in capsys.readouterr().err
    assert victim.read_text() == "the user's data\n"
    assert (out / LOCK_NAME).is_symlink()


@pytest.mark.parametrize("link", ["sub", CHECKPOINT_DIR])
def test_a_symbolic_link_to_a_directory_inside_the_output_is_never_written_through(tmp_path, capsys, link):
    """``out/sub`` a link to another directory, with an input shard ``sub/b.jsonl``: the run wrote ``b.jsonl``
    into the link's target.  ``out/.gpu_dedup_checkpoint`` a link: the run wrote its checkpoints there, then
    failed with a traceback (exit 1) removing it."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"id": "a", "text": "one document " * 8}) + "\n")
    (tmp_path / "in" / "sub" / "b.jsonl").write_text(json.dumps({"id": "b", "text": "another one " * 8}) + "\n")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    (out / link).symlink_to(elsewhere)
    assert main(["run", str(tmp_path / "in"), "-o", str(out), "--backend", "cpu", "-q"]) == 4
    err = capsys.readouterr().err
    assert "symbolic link" in err and "Traceback" not in err, err
    assert sorted(p.name for p in elsewhere.iterdir()) == ["precious"]
    assert (out / link).is_symlink() and sorted(p.name for p in out.iterdir()) == [link]


def test_a_file_where_a_shards_subdirectory_goes_is_refused_before_anything_is_written(tmp_path, capsys):
    """``out/sub`` a user's file, with an input shard ``sub/b.jsonl``: the commit failed with a traceback
    (FileExistsError, exit 1) after publishing part of the outputs, and every rerun failed the same way finishing
    that commit."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"id": "a", "text": "one document " * 8}) + "\n")
    (tmp_path / "in" / "sub" / "b.jsonl").write_text(json.dumps({"id": "b", "text": "another one " * 8}) + "\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "sub").write_text("the user's file")
    for _ in range(2):
        assert main(["run", str(tmp_path / "in"), "-o", str(out), "--backend", "cpu", "-q"]) == 4
        err = capsys.readouterr().err
        assert "is a file where gpu_dedup would make a directory" in err and "Traceback" not in err, err
        assert sorted(p.name for p in out.iterdir()) == ["sub"] and (out / "sub").read_text() == "the user's file"


def test_a_stale_output_behind_a_directory_the_user_replaced_with_a_link_is_left_in_place(tmp_path):
    """Run 1 writes ``out/sub/b.jsonl``; the user moves ``out/sub`` to another disk and links it back; run 2
    (without ``sub/b.jsonl``) deleted the moved file through the link, in the link's target."""
    (tmp_path / "in" / "sub").mkdir(parents=True)
    (tmp_path / "in" / "a.jsonl").write_text(json.dumps({"id": "a", "text": "one document " * 8}) + "\n")
    (tmp_path / "in" / "sub" / "b.jsonl").write_text(json.dumps({"id": "b", "text": "another one " * 8}) + "\n")
    out, moved = tmp_path / "out", tmp_path / "data" / "sub"
    args = ["run", str(tmp_path / "in"), "-o", str(out), "--backend", "cpu", "-q"]
    assert main(args) == 0
    moved.parent.mkdir()
    os.rename(out / "sub", moved)
    (out / "sub").symlink_to(moved)
    (tmp_path / "in" / "sub" / "b.jsonl").unlink()
    (tmp_path / "in" / "sub").rmdir()
    assert main(args) == 0
    assert sorted(p.name for p in moved.iterdir()) == ["b.jsonl"]
    assert (out / "sub").is_symlink()


def test_a_file_put_at_an_output_name_during_an_interrupted_commit_is_not_overwritten_by_the_next_run(tmp_path,
                                                                                                     capsys):
    """A run killed after moving its first output; the user writes a file at another output name; the next run
    finished the commit over it (exit 0, the user's file gone)."""
    (tmp_path / "in").mkdir()
    for n in "abc":
        (tmp_path / "in" / f"{n}.jsonl").write_text(json.dumps({"id": n, "text": f"document {n} " * 8}) + "\n")
    out = tmp_path / "out"
    args = [sys.executable, "-m", "gpu_dedup", "run", str(tmp_path / "in"), "-o", str(out), "--backend", "cpu", "-q"]
    env = dict(os.environ, GPU_DEDUP_FAULT="commit:renamed")
    assert subprocess.run(args, env=env).returncode == -9
    assert not (out / "c.jsonl").exists()
    (out / "c.jsonl").write_text("the user's file")
    assert main(args[3:]) == 4
    err = capsys.readouterr().err
    assert "c.jsonl" in err and "Traceback" not in err, err
    assert (out / "c.jsonl").read_text() == "the user's file"
    (out / "c.jsonl").unlink()  # moved away: the next run finishes the commit
    assert main(args[3:]) == 0
    assert (out / "c.jsonl").read_text() == (tmp_path / "in" / "c.jsonl").read_text()


def test_the_commit_does_not_read_back_the_reports_it_wrote_from_memory(corpus, tmp_path, monkeypatch):
    """report.json and report.html are recorded with the digests of their bytes: the commit reads neither, and the
    manifest's digests are the published files'."""
    from gpu_dedup.run import outdir

    read = []
    real = outdir.file_digest
    monkeypatch.setattr(outdir, "file_digest", lambda p: read.append(os.path.basename(p)) or real(p))
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, CFG.with_overrides({"output.shards": False}))
    assert not [n for n in read if n.startswith("report")]
    manifest = json.loads((out / MANIFEST_NAME).read_text())["files"]
    for name in ("report.json", "report.html", "duplicates.parquet"):
        assert {k: manifest[name][k] for k in ("size", "sha256")} == storage.file_digest(out / name)


def test_a_staged_report_changed_after_it_was_written_is_never_published(corpus, tmp_path, monkeypatch, capsys):
    """The reports' digests come from memory; a staged report replaced before the commit (its stamp differs) is
    read and refused."""
    from gpu_dedup.run import outdir

    real = outdir.OutputDir.commit

    def tamper(self, fingerprint, expected_rows, recorded=None):
        staged = self.staging / "report.json"
        data = staged.read_bytes()
        time.sleep(0.01)
        staged.write_bytes(data.replace(b'"', b"'", 1))
        return real(self, fingerprint, expected_rows, recorded)

    monkeypatch.setattr(outdir.OutputDir, "commit", tamper)
    out = tmp_path / "out"
    assert main(["run", str(corpus / "in"), "-o", str(out), "--id-column", "id", "--backend", "cpu", "--no-shards",
                 "-q"]) == 4
    err = capsys.readouterr().err
    assert "report.json" in err and "changed after it was written" in err and "Traceback" not in err
    assert not (out / "report.json").exists() and not (out / "_SUCCESS").exists()


def test_the_commit_drops_the_checkpoints_and_leaves_no_work_directory(corpus, tmp_path, monkeypatch):
    """The checkpoints are deleted beside the publication (their manifest first, so a directory left half-deleted
    never resumes); when _SUCCESS is written nothing of the work directory is left."""
    from gpu_dedup.run import outdir
    from gpu_dedup.run.checkpoint import MANIFEST

    seen = {}
    real_drop = outdir.OutputDir._drop_checkpoints
    real_write = outdir.atomic_write_bytes

    def drop(self):
        seen["units_before"] = sorted(p.name for p in self.work.glob("*.arrays"))
        thread = real_drop(self)
        seen["manifest_after"] = (self.work / MANIFEST).exists()
        return thread

    def write(path, payload, *a, **k):
        if os.path.basename(path) == "_SUCCESS":
            seen["work_at_success"] = (tmp_path / "out" / CHECKPOINT_DIR).exists()
        return real_write(path, payload, *a, **k)

    monkeypatch.setattr(outdir.OutputDir, "_drop_checkpoints", drop)
    monkeypatch.setattr(outdir, "atomic_write_bytes", write)
    run_dedup(corpus / "in", tmp_path / "out", CFG.with_overrides({"output.shards": False}))
    assert seen["units_before"]  # there were checkpoints to drop
    assert seen["manifest_after"] is False
    assert seen["work_at_success"] is False
    assert (tmp_path / "out" / "_SUCCESS").exists() and not (tmp_path / "out" / CHECKPOINT_DIR).exists()


def test_a_removal_list_run_reads_its_sample_texts_beside_the_write_stage(corpus, tmp_path, monkeypatch):
    """With no shards written (nothing held), the report's sample texts are read again from the shards on a thread
    of their own while the write stage runs; the report is the one a run taking them at once writes."""
    import threading

    where = []
    real = local._ShardTexts.take

    def take(self, rows):
        where.append(threading.current_thread().name)
        return real(self, rows)

    monkeypatch.setattr(local._ShardTexts, "take", take)
    cfg = CFG.with_overrides({"output.shards": False})
    res = run_dedup(corpus / "in", tmp_path / "soon", cfg)
    assert where == ["gpu_dedup-sample-texts"]
    real_soon = local.LocalExecutor.take_soon
    monkeypatch.setattr(local.LocalExecutor, "take_soon", lambda self, rows, column, at_once=False:
                        real_soon(self, rows, column, at_once=True))
    now = run_dedup(corpus / "in", tmp_path / "now", cfg)
    assert where[-1] == threading.main_thread().name
    assert res.report["largest_clusters"] and res.report["closest_to_threshold"]
    for key in ("largest_clusters", "largest_near_duplicate_clusters", "closest_to_threshold"):
        assert res.report[key] == now.report[key]
    assert (tmp_path / "soon" / "duplicates.parquet").read_bytes() == (tmp_path / "now" / "duplicates.parquet").read_bytes()
