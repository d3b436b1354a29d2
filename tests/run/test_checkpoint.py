"""Crash and resume: a run SIGKILLed anywhere resumes to byte-identical outputs."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.checkpoint import CHECKPOINT_DIR
from gpu_dedup.run.entry import run_dedup
from tests.accounting import assert_accounted

OUTPUTS = ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]
CFG = {"backend": "cpu", "input": {"id_column": "id"}}


def _cli(inp, out, *extra, fault=None, quiet=True):
    env = dict(os.environ)
    env.pop("GPU_DEDUP_FAULT", None)
    if fault:
        env["GPU_DEDUP_FAULT"] = fault
    cmd = [sys.executable, "-m", "gpu_dedup", "run", str(inp), "-o", str(out), "--id-column", "id", "--backend",
           "cpu", *(["-q"] if quiet else []), *extra]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("crash")
    sample = planted_corpus(n_docs=600, n_clusters=40, words=(30, 120), edit_rate=(0, 0.04), seed=9)
    write_shards(sample.table.select(["id", "text"]), d / "in", shards=3)
    run_dedup(d / "in", d / "clean", Config.from_dict(CFG))
    return d


def _inputs(d: Path):
    return [pq.read_table(p, columns=["id"]) for p in sorted(d.glob("*.parquet"))]


def _same_outputs(a: Path, b: Path):
    for name in OUTPUTS:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


@pytest.mark.parametrize("fault,resumed", [
    ("read", []),
    ("normalize", []),
    ("exact", []),
    ("signatures", ["exact"]),
    ("bands", ["exact"]),
    ("save:bands", ["exact"]),
    ("buckets", ["bands", "exact"]),
    ("verify", ["bands", "buckets", "exact"]),
    ("save:verify", ["bands", "buckets", "exact"]),
    ("components", ["bands", "buckets", "exact", "verify"]),
    ("select", ["bands", "buckets", "components", "exact", "verify"]),
    ("write:first-shard", ["bands", "buckets", "components", "exact", "select", "verify"]),
    ("write", ["bands", "buckets", "components", "exact", "select", "verify"]),
    ("report:before-success", ["bands", "buckets", "components", "exact", "select", "verify"]),
])
def test_killed_run_resumes_to_identical_outputs(corpus, tmp_path, fault, resumed):
    out = tmp_path / "out"
    killed = _cli(corpus / "in", out, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "_SUCCESS").exists()  # nothing vouches for a killed run
    assert not list(out.rglob("*.arrays")) or (out / CHECKPOINT_DIR).is_dir()
    again = _cli(corpus / "in", out)
    assert again.returncode == 0, again.stderr
    assert (out / "_SUCCESS").exists() and not (out / CHECKPOINT_DIR).exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    report = json.loads((out / "report.json").read_text())
    assert report["resumed_from_checkpoint"] == resumed
    assert_accounted(out, _inputs(corpus / "in"))  # ids in the resumed run's shards and duplicates.parquet
    _same_outputs(corpus / "clean", out)


def test_stale_checkpoints_are_never_reused(corpus, tmp_path):
    out = tmp_path / "out"
    assert _cli(corpus / "in", out, fault="components").returncode == -signal.SIGKILL
    # other config: starts over and equals a clean run with that config
    again = _cli(corpus / "in", out, "--threshold", "0.7")
    assert again.returncode == 0
    assert json.loads((out / "report.json").read_text())["resumed_from_checkpoint"] == []
    run_dedup(corpus / "in", tmp_path / "clean07", Config.from_dict({**CFG, "lsh": {"threshold": 0.7}}))
    _same_outputs(tmp_path / "clean07", out)
    assert_accounted(out, _inputs(corpus / "in"))
    # other inputs (a shard rewritten in place, same path): starts over
    inp = tmp_path / "in2"
    shutil.copytree(corpus / "in", inp)
    out2 = tmp_path / "out2"
    assert _cli(inp, out2, fault="components").returncode == -signal.SIGKILL
    (inp / "part-00001.parquet").write_bytes((corpus / "in" / "part-00002.parquet").read_bytes())
    res = _cli(inp, out2, quiet=False)  # -q shows errors only
    assert res.returncode == 0 and "belong to another run" in res.stderr
    assert json.loads((out2 / "report.json").read_text())["resumed_from_checkpoint"] == []
    run_dedup(inp, tmp_path / "clean2", Config.from_dict(CFG))
    _same_outputs(tmp_path / "clean2", out2)
    assert_accounted(out2, _inputs(inp))  # the rewritten inputs


def test_restart_ignores_checkpoints(corpus, tmp_path):
    out = tmp_path / "out"
    assert _cli(corpus / "in", out, fault="verify").returncode == -signal.SIGKILL
    again = _cli(corpus / "in", out, "--restart")
    assert again.returncode == 0
    assert json.loads((out / "report.json").read_text())["resumed_from_checkpoint"] == []
    _same_outputs(corpus / "clean", out)
    assert_accounted(out, _inputs(corpus / "in"))


def _snapshot(d: Path) -> dict:
    """Every visible file of an output directory, by relative name (bookkeeping files excluded)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts)}


@pytest.mark.parametrize("fault,extra", [("verify", ("--threshold", "0.7")), ("write:first-shard", ()),
                                         ("commit:planned", ("--threshold", "0.7"))])
def test_killed_rerun_over_a_complete_run_keeps_the_previous_output(corpus, tmp_path, fault, extra):
    """A rerun killed before it commits leaves the earlier complete output as it was (its _SUCCESS, reports and
    shards agree with each other); the next run completes and publishes its own."""
    out = tmp_path / "out"
    shutil.copytree(corpus / "clean", out)  # an earlier complete run in the output directory
    before = _snapshot(out)
    assert "_SUCCESS" in before and "report.json" in before and "report.html" in before
    killed = _cli(corpus / "in", out, *extra, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert _snapshot(out) == before  # (killed after planning its commit: the next run on the directory finishes it)
    again = _cli(corpus / "in", out, *extra)
    assert again.returncode == 0, again.stderr
    assert (out / "_SUCCESS").exists()
    assert_accounted(out, _inputs(corpus / "in"))
    ref = tmp_path / "ref"
    run_dedup(corpus / "in", ref, Config.from_dict({**CFG, "lsh": {"threshold": float(extra[1]) if extra else 0.8}}))
    _same_outputs(ref, out)


@pytest.mark.parametrize("fault", ["commit:renamed", pytest.param("commit:before-success", marks=pytest.mark.slow)])
def test_run_killed_during_its_commit_is_completed_by_the_next(corpus, tmp_path, fault):
    out = tmp_path / "out"
    killed = _cli(corpus / "in", out, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not (out / "_SUCCESS").exists()
    again = _cli(corpus / "in", out)
    assert again.returncode == 0, again.stderr
    assert (out / "_SUCCESS").exists() and not (out / CHECKPOINT_DIR).exists()
    _same_outputs(corpus / "clean", out)


def test_truncated_checkpoint_is_discarded_and_recomputed(corpus, tmp_path):
    out = tmp_path / "out"
    assert _cli(corpus / "in", out, fault="components").returncode == -signal.SIGKILL
    unit = out / CHECKPOINT_DIR / "verify.arrays"
    unit.write_bytes(unit.read_bytes()[: unit.stat().st_size // 2])  # truncated (a full disk, a copy cut short)
    again = _cli(corpus / "in", out, quiet=False)  # the warning: -q shows errors only
    assert again.returncode == 0, again.stderr
    assert "unreadable" in again.stderr and "Traceback" not in again.stderr
    assert json.loads((out / "report.json").read_text())["resumed_from_checkpoint"] == ["bands", "buckets", "exact"]
    _same_outputs(corpus / "clean", out)


def test_garbled_staged_shard_of_a_killed_run_is_written_again(corpus, tmp_path):
    """A shard staged before a kill and damaged afterwards is never vouched for: the resumed run rewrites it."""
    out = tmp_path / "out"
    assert _cli(corpus / "in", out, fault="report:before-success").returncode == -signal.SIGKILL
    staged = out / CHECKPOINT_DIR / "staged"
    (staged / "part-00001.parquet").write_bytes(b"garbage")
    (staged / "part-00002.parquet").unlink()
    again = _cli(corpus / "in", out)
    assert again.returncode == 0, again.stderr
    _same_outputs(corpus / "clean", out)
    assert_accounted(out, _inputs(corpus / "in"))


# ---------------------------------------------------------------- the background writer


def _blocked(monkeypatch):
    """Checkpoints whose writer thread waits for ``release`` before each save it writes."""
    import threading

    from gpu_dedup.run import checkpoint

    release, started = threading.Event(), threading.Event()
    real = checkpoint.Checkpoints._save

    def slow(self, unit, arrays, meta):
        started.set()
        assert release.wait(30)
        real(self, unit, arrays, meta)

    monkeypatch.setattr(checkpoint.Checkpoints, "_save", slow)
    return release, started


def test_a_checkpoint_is_written_in_the_background_and_in_order(tmp_path, monkeypatch):
    import numpy as np

    from gpu_dedup.run.checkpoint import Checkpoints

    release, started = _blocked(monkeypatch)
    ck = Checkpoints(tmp_path, "fp")
    ck.save("exact", {"docs/row": np.arange(5)}, {"stages": {}, "counts": {"a": 1}})
    assert started.wait(30)  # the save returned while its file is still being written
    ck.save("bands", {"bands/x": np.arange(3)}, {"stages": {}, "counts": {}})
    ck.mark("shard-0", {"name": "a", "size": 1})
    assert not ck.has("exact") and not ck.has("bands")
    assert ck.marked("shard-0") == {"name": "a", "size": 1}  # this process's marks without waiting
    release.set()
    ck.wait()
    arrays, meta = ck.load("exact")
    assert list(arrays["docs/row"]) == [0, 1, 2, 3, 4] and meta["counts"] == {"a": 1}
    assert ck.has("bands") and json.loads((ck.dir / "shard-0.done").read_text()) == {"name": "a", "size": 1}
    assert not list(ck.dir.glob(".*.tmp"))


def test_a_commit_drops_the_checkpoints_still_queued(tmp_path, monkeypatch):
    import numpy as np

    from gpu_dedup.run.checkpoint import Checkpoints

    release, started = _blocked(monkeypatch)
    ck = Checkpoints(tmp_path, "fp")
    ck.save("exact", {"a/b": np.arange(2)}, {"stages": {}, "counts": {}})
    assert started.wait(30)
    for unit in ("bands", "buckets", "verify"):
        ck.save(unit, {"a/b": np.arange(2)}, {"stages": {}, "counts": {}})
    release.set()
    ck.remove()  # waits for the save being written, drops the three queued
    assert not ck.dir.exists()


def test_a_failed_background_save_stops_the_run_at_its_next_save(tmp_path, monkeypatch):
    import errno

    import numpy as np

    from gpu_dedup.errors import ResourceError
    from gpu_dedup.run import checkpoint

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "dump_arrays", full)
    ck = checkpoint.Checkpoints(tmp_path, "fp")
    ck.save("exact", {"a/b": np.arange(2)}, {"stages": {}, "counts": {}})
    ck.wait(raise_errors=False)  # the write failed on the writer thread: the error waits for the run
    with pytest.raises(ResourceError, match="disk full"):
        ck.save("bands", {"a/b": np.arange(2)}, {"stages": {}, "counts": {}})
    ck.wait()  # raised once
    assert not list(ck.dir.glob("*.arrays*")) and not list(ck.dir.glob(".*.tmp"))


def test_no_checkpoint_is_being_written_while_the_commit_removes_their_directory(corpus, tmp_path, monkeypatch):
    """The commit removes the checkpoint directory: writes still queued are dropped and the one in flight is
    waited for first (a slow disk here: every mark takes 0.2 s, so some are queued when the commit comes)."""
    import threading
    import time

    from gpu_dedup.run import checkpoint, outdir

    real_write, real_commit = checkpoint.atomic_write_bytes, outdir.OutputDir.commit
    state = {"committing": False, "in_flight": 0, "overlaps": 0, "writes": 0}
    lock = threading.Lock()

    def slow(path, payload, tmp_dir=None, durable=True):
        with lock:
            state["in_flight"] += 1
            state["overlaps"] += state["committing"]
        time.sleep(0.2)
        try:
            real_write(path, payload, tmp_dir, durable)
        finally:
            with lock:
                state["in_flight"] -= 1
                state["writes"] += 1

    def commit(self, *a, **k):
        with lock:
            state["committing"] = True
            state["overlaps"] += state["in_flight"]
        try:
            return real_commit(self, *a, **k)
        finally:
            state["committing"] = False

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", slow)
    monkeypatch.setattr(outdir.OutputDir, "commit", commit)
    out = tmp_path / "out"
    run_dedup(corpus / "in", out, Config.from_dict(CFG))
    assert state["overlaps"] == 0 and state["writes"] >= 1
    assert not (out / CHECKPOINT_DIR).exists() and (out / "_SUCCESS").exists()
    _same_outputs(corpus / "clean", out)


# ---------------------------------------------------------------- device arrays: copied by the writer's thread


def _device_unit(monkeypatch):
    """(stand-in CuPy, a unit's arrays on the device, the same on the host)."""
    import sys

    from tests.fake_cupy import fake_cupy

    cp = fake_cupy()
    monkeypatch.setitem(sys.modules, "cupy", cp)
    host = {"bands/lsh_row": np.arange(7, dtype=np.int64),
            "bands/band_hashes": np.arange(28, dtype=np.uint64).reshape(7, 4) * np.uint64(0x9E3779B97F4A7C15),
            "bands/usable": np.array([True, False] * 3 + [True]), "bands/empty": np.zeros(0, np.int32)}
    device = {k: cp.asarray(v) for k, v in host.items()}
    device["bands/lsh_row"] = host["bands/lsh_row"]  # a host array among them goes as it is
    return cp, device, host


def test_device_arrays_are_copied_by_the_writer_thread_into_the_file_host_arrays_make(tmp_path, monkeypatch):
    """``save`` returns before any device array is copied (no ``.get()`` on the run's thread); the writer's thread
    copies them, after the event recorded at the save, and writes the very arrays the host ones make."""
    import threading

    from gpu_dedup import backends
    from gpu_dedup.run.checkpoint import Checkpoints

    cp, device, host = _device_unit(monkeypatch)
    meta = {"stages": {"bands": {"seconds": 1.0}}, "counts": {"lsh_rows": 7}}
    plain = Checkpoints(tmp_path / "host", "fp")
    plain.save("bands", host, meta)
    plain.wait()
    release, started = _blocked(monkeypatch)
    ck = Checkpoints(tmp_path / "device", "fp")
    ck.save("bands", backends.host_later(device), meta)
    assert started.wait(30)  # the writer holds the job: nothing copied yet, the save has returned
    assert [what for what, _, _ in cp.calls] == ["record"] and cp.calls[0][1] == threading.current_thread().name
    release.set()
    ck.wait()
    gets = [thread for what, thread, _ in cp.calls if what == "get"]
    assert gets == ["gpu-dedup-checkpoints"] * 3  # the three device arrays, on the writer's thread
    assert (ck.dir / "bands.arrays").read_bytes() == (plain.dir / "bands.arrays").read_bytes()
    arrays, got = ck.load("bands")
    assert got == meta and all(np.array_equal(arrays[k], v) and arrays[k].dtype == v.dtype for k, v in host.items())


def test_a_checkpoint_dropped_at_the_commit_copies_nothing(tmp_path, monkeypatch):
    """A unit still queued when the run commits (``settle``) is dropped before its device arrays are copied."""
    import threading
    import time

    from gpu_dedup import backends
    from gpu_dedup.backends import CHECKPOINT_COPIES, transfer_totals
    from gpu_dedup.run.checkpoint import Checkpoints

    cp, device, host = _device_unit(monkeypatch)
    release, started = _blocked(monkeypatch)
    ck = Checkpoints(tmp_path, "fp")
    ck.save("exact", {"docs/row": np.arange(3)}, {"stages": {}, "counts": {}})
    assert started.wait(30)
    before = transfer_totals()[CHECKPOINT_COPIES]
    ck.save("bands", backends.host_later(device), {"stages": {}, "counts": {}})
    settling = threading.Thread(target=ck.settle)
    settling.start()
    writer = ck._writer
    deadline = time.monotonic() + 30
    while True:  # until the settle has dropped the queued unit (it then waits for the one being written)
        with writer._cv:
            if not writer._jobs:
                break
        assert time.monotonic() < deadline
        time.sleep(0.01)
    release.set()
    settling.join(30)
    assert not settling.is_alive() and ck.has("exact") and not ck.has("bands")
    assert [what for what, _, _ in cp.calls] == ["record"]  # no stream made, nothing copied
    assert transfer_totals()[CHECKPOINT_COPIES] == before


def test_arrays_files_give_back_every_array_bit_for_bit_and_refuse_garbled_ones(tmp_path):
    """A checkpoint file (``dump_arrays``) gives back each array's dtype, shape and bytes (0-d, empty, strided,
    bool, float, text), writable as ``np.load`` gave them; truncated, flipped or foreign bytes are refused
    (ValueError), whichever array they hit."""
    from gpu_dedup.run.checkpoint import ALIGN, MAGIC, arrays_bytes, dump_arrays, load_arrays

    rng = np.random.default_rng(5)
    arrays = {"a/u64": rng.integers(0, 2**63, 1000, dtype=np.uint64), "a/zero_d": np.array(7, np.int32),
              "b/empty": np.zeros(0, np.float64), "b/strided": np.arange(40, dtype=np.int16).reshape(8, 5)[::2, 1:4],
              "b/bool": rng.random(33) < 0.5, "c/f8": rng.random((3, 4)), "c/text": np.array(["x", "yz"])}
    path = tmp_path / "u.arrays"
    with open(path, "wb") as f:
        dump_arrays(f, arrays, "meta ü")
    assert path.read_bytes() == bytes(arrays_bytes(arrays, "meta ü"))  # to a file or to memory: the same bytes
    for source in (path, path.read_bytes()):
        got, meta = load_arrays(source)
        assert meta == "meta ü" and list(got) == list(arrays)
        for k, v in arrays.items():
            assert got[k].dtype == v.dtype and got[k].shape == v.shape and got[k].tobytes() == v.tobytes(), k
            assert got[k].flags.writeable
    data = path.read_bytes()
    assert len(data) % ALIGN == 0

    def flip(at: int, bit: int = 1) -> bytes:
        return data[:at] + bytes([data[at] ^ bit]) + data[at + 1:]

    at = data.index(arrays["a/u64"].tobytes()) + 4000  # a bit of the first array's values
    # one bit of the header that would still parse: a dtype's byte order ('<u8' as '>u8') or a digit of the meta
    order = data.index(b'"<u8"') + 1
    with_digit = arrays_bytes(arrays, '{"docs": 1000}')
    digit = with_digit.tobytes().index(b"1000")
    for bad in (data[: len(data) - ALIGN], data[:40], b"PK\x03\x04" + data[4:], flip(at), flip(order, 0x02),
                data[: len(MAGIC) + 8] + b"x" + data[len(MAGIC) + 9:],
                with_digit[:digit + 3].tobytes() + b"1" + with_digit[digit + 4:].tobytes()):
        with pytest.raises(ValueError):
            load_arrays(bad)
    assert load_arrays(with_digit)[1] == '{"docs": 1000}'

    def held(a) -> int:  # the bytes of the buffer ``a`` keeps alive
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a.nbytes if a.base is None else len(getattr(a.base, "obj", a.base))

    for source in (path, data):  # every array has a buffer of its own: keeping a small one keeps only it
        assert all(held(v) == v.nbytes for v in load_arrays(source)[0].values())
    with pytest.raises(TypeError, match="dtype object"):
        dump_arrays(open(tmp_path / "o", "wb"), {"o": np.array([None])})
