"""Runs SIGKILLed at random moments (not only at stage boundaries), one process and Dask workers.

Every run is killed after a random delay drawn over the length of a clean run, then the same command runs
again; after each kill any ``_SUCCESS`` in the output directory must vouch for exactly the reference outputs,
and the final run must publish byte-identical outputs.  The seed is printed on failure
(``GPU_DEDUP_KILL_SEED`` reproduces a sequence of kill times).
"""

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpu_dedup.evaluation.sample import planted_corpus, write_shards

OUTPUTS = ["duplicates.parquet", "part-00000.parquet", "part-00001.parquet", "part-00002.parquet"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("kill")
    sample = planted_corpus(n_docs=1000, n_clusters=60, words=(30, 120), edit_rate=(0, 0.04), seed=21)
    write_shards(sample.table.select(["id", "text"]), d / "in", shards=3)
    return d


def _cmd(inp: Path, out: Path, extra=()):
    return [sys.executable, "-m", "gpu_dedup", "run", str(inp), "-o", str(out), "--id-column", "id", "--backend",
            "cpu", "-q", *extra]


def _start(cmd):
    env = {k: v for k, v in os.environ.items() if k != "GPU_DEDUP_FAULT"}
    # its own process group: a kill takes the Dask workers and nannies with the driver
    return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)


def _kill_group(p) -> None:
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()
    p.stderr.close()


def _visible(d: Path) -> dict:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*"))
            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(d).parts)}


def _check_vouched(out: Path, ref: Path) -> None:
    """Whatever a _SUCCESS vouches for is the reference result (the same command's complete output)."""
    if (out / "_SUCCESS").exists():
        for name in OUTPUTS:
            assert (out / name).read_bytes() == (ref / name).read_bytes(), name


def _kill_randomly(corpus: Path, tmp: Path, kills: int, extra=(), length=None):
    """``length``: seconds a clean run takes (None: measured on the reference run, which then uses ``extra``;
    else the reference is the one-process run, whose outputs every executor must reproduce)."""
    seed = int(os.environ.get("GPU_DEDUP_KILL_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    ref = tmp / "ref"
    t0 = time.perf_counter()
    clean = subprocess.run(_cmd(corpus / "in", ref, extra if length is None else ()), capture_output=True, text=True,
                           timeout=600)
    assert clean.returncode == 0, clean.stderr
    length = length or time.perf_counter() - t0
    out = tmp / "out"
    delays = []
    for _ in range(kills):
        delay = rng.uniform(0.05, length * 1.1)
        delays.append(round(delay, 3))
        p = _start(_cmd(corpus / "in", out, extra))
        try:
            p.wait(timeout=delay)
            p.stderr.read()  # finished before the kill: fine, it must be complete and correct
            p.stderr.close()
        except subprocess.TimeoutExpired:
            _kill_group(p)
        _check_vouched(out, ref)
        assert not (p.returncode not in (0, -signal.SIGKILL)), (seed, delays, p.returncode)
    final = subprocess.run(_cmd(corpus / "in", out, extra), capture_output=True, text=True, timeout=600)
    assert final.returncode == 0, (seed, delays, final.stderr)
    assert "Traceback" not in final.stderr, (seed, delays, final.stderr)
    for name in OUTPUTS:
        assert (out / name).read_bytes() == (ref / name).read_bytes(), (seed, delays, name)
    assert (out / "_SUCCESS").exists()
    assert set(_visible(out)) == set(_visible(ref)), (seed, delays)  # nothing stale, nothing missing
    assert not [p for p in out.rglob("*.tmp")], (seed, delays)


def test_random_kills_one_process_short(corpus, tmp_path):
    _kill_randomly(corpus, tmp_path, kills=2)


def test_random_kills_dask_workers_short(corpus, tmp_path):
    pytest.importorskip("distributed")
    _kill_randomly(corpus, tmp_path, kills=1, extra=("--workers", "2"), length=30.0)


@pytest.mark.slow
def test_random_kills_one_process_long(corpus, tmp_path):
    _kill_randomly(corpus, tmp_path, kills=30)


@pytest.mark.slow
def test_random_kills_dask_workers_long(corpus, tmp_path):
    pytest.importorskip("distributed")
    _kill_randomly(corpus, tmp_path, kills=8, extra=("--workers", "2"))
