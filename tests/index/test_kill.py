"""Index appends and builds SIGKILLed at random moments: the index is always whole (its checksums verify)
and holds the documents of the runs that appended, once; the rerun converges on the uninterrupted result.

``GPU_DEDUP_KILL_SEED`` reproduces a sequence of kill times (printed on failure)."""

import os
import random
import shutil
import subprocess
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.index.store import Index
from gpu_dedup.run.entry import run_dedup
from tests.run.test_kill_random import _kill_group, _start


@pytest.fixture(scope="module")
def halves(tmp_path_factory):
    d = tmp_path_factory.mktemp("ixkill")
    sample = planted_corpus(n_docs=1600, n_clusters=120, words=(30, 120), edit_rate=(0, 0.05), seed=23)
    t = sample.table.select(["id", "text"])
    write_shards(t.slice(0, 800), d / "a", shards=2, prefix="a")
    write_shards(t.slice(800), d / "b", shards=2, prefix="b")
    run_dedup(d / "a", d / "out_a", Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}}), index_out=d / "ix")
    return d


def _cmd(*args):
    return [sys.executable, "-m", "gpu_dedup", *map(str, args), "--id-column", "id", "--backend", "cpu", "-q"]


def _content(path) -> dict:
    """What an index holds, segment by segment (opening it verifies its checksums)."""
    index = Index.open(path)
    docs = np.arange(index.documents)
    return {"documents": index.documents, "ids": index.ids(docs).to_pylist(), "kept": index.kept(docs).tolist(),
            "survivors": index.survivors(docs).tolist(),
            "bands": [(s.band_hash.tolist(), s.band_doc.tolist()) for s in index.segments],
            "centres": [(s.centre_hash.tolist(), s.centre_round.tolist(), s.centre_doc.tolist())
                        for s in index.segments]}


def _kill_and_rerun(cmd, ref_time, kills, check):
    seed = int(os.environ.get("GPU_DEDUP_KILL_SEED", random.SystemRandom().randrange(2**32)))
    rng = random.Random(seed)
    delays = []
    for _ in range(kills):
        delay = rng.uniform(0.05, ref_time * 1.1)
        delays.append(round(delay, 3))
        p = _start(cmd)
        try:
            p.wait(timeout=delay)
            p.stderr.close()
        except subprocess.TimeoutExpired:
            _kill_group(p)
        assert p.returncode in (0, -9), (seed, delays, p.returncode)
        check((seed, delays))
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert final.returncode == 0 and "Traceback" not in final.stderr, (seed, delays, final.stderr)
    return seed, delays


@pytest.mark.parametrize("kills", [3, pytest.param(20, marks=pytest.mark.slow)])
def test_random_kills_of_an_update_index_run(halves, tmp_path, kills):
    shutil.copytree(halves / "ix", tmp_path / "ref_ix")
    shutil.copytree(halves / "ix", tmp_path / "ix")
    t0 = time.perf_counter()
    ref = subprocess.run(_cmd("run", halves / "b", "-o", tmp_path / "ref", "--against", tmp_path / "ref_ix",
                              "--update-index"), capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    length = time.perf_counter() - t0
    before, after = _content(halves / "ix"), _content(tmp_path / "ref_ix")
    assert after["documents"] == 1600

    def check(ctx):  # whole, and either as it was or with the documents appended once
        assert _content(tmp_path / "ix") in (before, after), ctx

    ctx = _kill_and_rerun(_cmd("run", halves / "b", "-o", tmp_path / "out", "--against", tmp_path / "ix",
                               "--update-index"), length, kills, check)
    assert _content(tmp_path / "ix") == after, ctx
    names = ["duplicates.parquet"] + sorted(p.name for p in (tmp_path / "ref").glob("b-*"))
    for name in names:
        assert (tmp_path / "out" / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), (ctx, name)
    assert not list((tmp_path / "ix").glob(".*.tmp")), ctx


@pytest.mark.parametrize("kills", [3, pytest.param(20, marks=pytest.mark.slow)])
def test_random_kills_of_an_index_build(halves, tmp_path, kills):
    t0 = time.perf_counter()
    ref = subprocess.run(_cmd("index", "build", halves / "b", "-o", tmp_path / "ref_ix"), capture_output=True,
                         text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr
    length = time.perf_counter() - t0
    want = _content(tmp_path / "ref_ix")
    ix = tmp_path / "ix"

    def check(ctx):  # no index, or the whole one
        if (ix / "manifest.json").exists():
            assert _content(ix) == want, ctx

    # once the index is written, the build run again finds it built from these inputs and config (exit 0)
    ctx = _kill_and_rerun(_cmd("index", "build", halves / "b", "-o", ix), length, kills, check)
    assert _content(ix) == want, ctx
    assert set(pq.read_table(halves / "b").column("id").to_pylist()) == set(want["ids"])
