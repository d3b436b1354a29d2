"""bench/signatures.py: the side-by-side signature benchmark runs and reports what it claims."""

import json

import pytest

from gpu_dedup.bench import signatures


def test_permutation_families_agree_on_their_definition():
    rows = signatures.permutation_families(keys=1 << 12, num_perm=32, repeats=1)
    assert [r["family"] for r in rows] == ["affine32 (v2)", "multiply-shift 64-bit key", "multiply-add-shift 32-bit key"]
    assert all(r["m_keys_per_s"] > 0 and r["keys"] == 1 << 12 for r in rows)


def test_tiny_run_writes_tables(tmp_path):
    pytest.importorskip("rensa")
    import numba

    threads = numba.get_num_threads()
    payload = signatures.bench_signatures(docs=300, repeats=1, results=tmp_path, workdir=tmp_path)
    assert numba.get_num_threads() == threads  # the one-thread timing leaves the caller's threads as they were
    s = payload["signatures"]
    assert s["documents"] == 300 and s["num_perm"] == 128 and s["shingle"] == "word:5"
    ours, rensa = s["tools"]["gpu_dedup"], s["tools"]["rensa"]
    assert ours["shingles"] > 0 and rensa["shingles"] > 0 and s["ratio_cpu"] > 0
    assert json.loads((tmp_path / "signatures.json").read_text())["benchmark"] == "signatures"
    md = (tmp_path / "signatures.md").read_text()
    assert "| gpu_dedup |" in md and "| rensa |" in md and "affine32 (v2)" in md
