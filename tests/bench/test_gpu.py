"""The GPU benchmark command imports and runs its CPU part on a tiny corpus (no GPU needed)."""

import json
import sys

import pytest

from gpu_dedup.bench import gpu as bench_gpu


def test_bench_cpu_part_runs_and_writes_json(tmp_path, capsys):
    out = tmp_path / "bench.json"
    rc = bench_gpu.main(["--docs", "60", "120", "--perms", "8", "12", "--shingles", "char:5", "word:2",
                         "--backends", "cpu", "--out", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    rows = res["rows"]
    assert len(rows) == 2 * 2 * 2 and {r["backend"] for r in rows} == {"cpu"}
    assert {(r["docs"], r["shingle"], r["num_perm"]) for r in rows} == {
        (d, s, p) for d in (60, 120) for s in ("char:5", "word:2") for p in (8, 12)}
    assert all(r["mb_per_s"] > 0 and r["docs_per_s"] > 0 for r in rows)
    assert res["date"] and res["cores"] >= 1 and "numba" in res["versions"]
    printed = capsys.readouterr().out
    assert "MB/s" in printed and "docs/s" in printed


def test_bench_auto_says_why_gpu_is_not_measured(tmp_path, monkeypatch):
    from gpu_dedup import backends as registry

    monkeypatch.setitem(sys.modules, "cupy", None)
    monkeypatch.delitem(registry._CACHE, "gpu", raising=False)
    lines = []
    res = bench_gpu.run_benchmark(docs=(30,), perms=(4,), shingles=("word:3",), log=lines.append)
    assert res["device"] is None and "CuPy" in res["gpu_not_measured"]
    assert any(line.startswith("GPU not measured:") for line in lines)
    assert bench_gpu.main(["--docs", "30", "--perms", "4", "--backends", "gpu"]) == 2  # asked for, not usable


def test_bench_rejects_bad_shingle_spec():
    with pytest.raises(SystemExit):
        bench_gpu.main(["--shingles", "chars5"])


def test_bench_end_to_end_suite_writes_json_and_markdown(tmp_path, capsys):
    out = tmp_path / "e2e.json"
    rc = bench_gpu.main(["--suite", "end-to-end", "--e2e-docs", "150", "--e2e-backends", "cpu", "--out", str(out),
                         "--workdir", str(tmp_path)])
    assert rc == 0
    res = json.loads(out.read_text())
    (row,) = res["end_to_end"]
    assert row["backend"] == "cpu" and row["docs"] == 150 and row["docs_per_s"] > 0 and row["gb_per_s"] > 0
    assert row["transfers"] == {} and row["cpu_threads"] >= 1 and "signatures" in row["stage_seconds"]
    env = res["environment"]
    assert env["date"] and env["cores"] >= 1 and "numba" in env["versions"]
    md = (tmp_path / "e2e.md").read_text()
    assert "## End to end" in md and "| 150 |" in md
    assert "## End to end" in capsys.readouterr().out


def test_bench_dask_suite_without_gpu_workers_says_what_is_missing(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert bench_gpu.main(["--suite", "dask", "--e2e-docs", "40", "--workdir", str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err


def test_corpus_suite_writes_planted_shards_once_and_reuses_them(tmp_path):
    args = ["--suite", "corpus", "--e2e-docs", "40", "--words", "5", "15", "--configs", "default", "cosine-vectors",
            "--corpus-dir", str(tmp_path), "--out", str(tmp_path / "c.json")]
    assert bench_gpu.main(args) == 0
    res = json.loads((tmp_path / "c.json").read_text())
    assert sorted((c["kind"], c["rows"]) for c in res["corpus"]) == [("text", 40), ("vectors", 40)]
    text_dir = next(c["path"] for c in res["corpus"] if c["kind"] == "text")
    first = {p.name: p.stat().st_mtime_ns for p in (tmp_path / text_dir).iterdir()}
    assert bench_gpu.main(args) == 0  # found by its marker: not written again
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / text_dir).iterdir()} == first
    assert len([n for n in first if n.endswith(".parquet")]) == 16


def test_compare_outputs_finds_a_changed_byte_and_ignores_the_report(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        (d / "part-0.parquet").write_bytes(b"same bytes")
        (d / "_SUCCESS").write_text("")
    (a / "report.json").write_text('{"seconds": 1}')
    (b / "report.json").write_text('{"seconds": 2}')
    assert bench_gpu.compare_outputs(a, b) == {"identical": True, "files": 2, "differ": [], "only_in_one": [],
                                               "same_table": [], "content_identical": True, "content_differs": {}}
    (b / "part-0.parquet").write_bytes(b"same bytez")
    (b / "duplicates.parquet").write_bytes(b"")
    got = bench_gpu.compare_outputs(a, b)
    assert not got["identical"] and got["differ"] == ["part-0.parquet"] and got["only_in_one"] == ["duplicates.parquet"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"id": [1, 2], "text": ["a", "b"]})
    pq.write_table(table, a / "part-0.parquet")
    pq.write_table(table, b / "part-0.parquet", compression="zstd")  # other bytes, the same table
    got = bench_gpu.compare_outputs(a, b)
    assert got["differ"] == ["part-0.parquet"] and got["same_table"] == ["part-0.parquet"] and not got["identical"]
    assert got["content_identical"] is False  # duplicates.parquet is in one directory only
    (a / "duplicates.parquet").write_bytes(b"")
    got = bench_gpu.compare_outputs(a, b)
    assert got["content_identical"] and not got["identical"]  # other bytes, the same content
    pq.write_table(table.slice(1), b / "part-0.parquet")
    got = bench_gpu.compare_outputs(a, b)
    assert not got["content_identical"] and got["content_differs"] == {"part-0.parquet": "rows: 2 and 1"}


def test_a_run_differs_by_content_where_the_row_says_else_by_bytes():
    """cuDF's shards are the same tables in other bytes: the benchmark fails only on other content."""
    assert not bench_gpu.differs({"identical": False, "content_identical": True})
    assert bench_gpu.differs({"identical": False, "content_identical": False})
    assert bench_gpu.differs({"identical": False})  # a components row: labels compared as they are
    assert not bench_gpu.differs({"identical": True}) and not bench_gpu.differs({})


def test_end_to_end_skips_what_would_start_after_the_deadline(tmp_path):
    import time

    kw = dict(words=(5, 15), workdir=tmp_path, corpus_dir=tmp_path / "corpus")
    rows = bench_gpu.end_to_end([60], ["cpu", "cpu"], configs=["default"], deadline=time.time() + 120, **kw)
    assert [r["config"] for r in rows] == ["default", "default"] and all("seconds" in r for r in rows)
    assert rows[1]["identical"] is True and rows[1]["compared"]["files"] >= 2  # the same backend twice
    rows = bench_gpu.end_to_end([60], ["cpu", "cpu"], configs=["default", "fineweb"], deadline=time.time() + 1, **kw)
    assert [r["config"] for r in rows] == ["default", "default", "fineweb", "fineweb"]
    assert all("deadline" in r["skipped"] for r in rows)


def test_replicated_corpus_is_near_duplicate_copies_with_new_ids(tmp_path):
    import pyarrow.parquet as pq

    src, payload, rows = bench_gpu.planted_dir(tmp_path, 60, words=(5, 15), shards=2)
    path, big, n = bench_gpu.replicated_dir(src, 3)
    assert n == 3 * rows and big > 3 * payload
    table = pq.read_table(sorted(path.glob("*.parquet")))
    original = pq.read_table(sorted(src.glob("*.parquet")))
    assert table.num_rows == 180 and len(set(table.column("id").to_pylist())) == 180
    texts = set(table.column("text").to_pylist())
    first = original.column("text")[0].as_py()
    assert first in texts and f"w1 {first}" in texts and f"w2 {first}" in texts
    assert bench_gpu.replicated_dir(src, 3)[0] == path  # found by its marker, not written again


def test_end_to_end_rows_book_every_second_in_both_output_modes(tmp_path):
    rows = bench_gpu.end_to_end((120,), ("cpu",), words=(5, 15), shards=2, workdir=tmp_path, modes=("shards", "list"),
                                log=lambda *a: None)
    assert [r["mode"] for r in rows] == ["shards", "list"]
    for r in rows:
        booked = sum(r["stage_seconds"].values()) + sum(r["fixed_seconds"].values()) + r["unbooked_seconds"] + \
            r["publish_seconds"]
        assert booked == pytest.approx(r["seconds"], abs=0.02)
    assert rows[0]["removed"] == rows[1]["removed"] > 0 and rows[1]["stage_seconds"]["write"] < 1
    md = "\n".join(bench_gpu.end_to_end_markdown(rows))
    assert "| list | cpu |" in md and "| publish |" in md


def test_kernel_ratios_compare_the_warp_kernel_with_cudf_and_the_block_kernel():
    def row(backend, seconds, shingle="char:24", perms=260):
        return {"docs": 10, "shingle": shingle, "num_perm": perms, "backend": backend, "seconds": seconds,
                "mb_per_s": round(100 / seconds, 1)}

    rows = [row("cpu", 4.0), row("gpu-kernel", 0.1), row("gpu-block-kernel", 0.5), row("cudf", 0.3),
            row("gpu-kernel", 0.2, "word:5", 128), row("cudf", 0.1, "word:5", 128),
            {"docs": 10, "shingle": "char:5", "num_perm": 128, "backend": "all", "skipped": "deadline"}]
    assert bench_gpu.kernel_ratios(rows) == [
        {"docs": 10, "shingle": "char:24", "num_perm": 260, "gpu_kernel_mb_per_s": 1000.0, "vs_cudf": 3.0,
         "vs_block_kernel": 5.0},
        {"docs": 10, "shingle": "word:5", "num_perm": 128, "gpu_kernel_mb_per_s": 500.0, "vs_cudf": 0.5}]


def test_bench_cases_pick_shingle_and_permutation_pairs(tmp_path):
    out = tmp_path / "bench.json"
    assert bench_gpu.main(["--docs", "60", "--cases", "char:5x8", "word:2x12", "--backends", "cpu",
                           "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["shingle"], r["num_perm"]) for r in rows] == [("char:5", 8), ("word:2", 12)]
    with pytest.raises(SystemExit):
        bench_gpu.main(["--cases", "char:5"])


def test_the_kernels_first_arm_loads_the_kernels_before_the_read_and_puts_the_backend_back(monkeypatch):
    """``gpu-kernels-first``: the GPU backend's kernels load before the read stage for that run only, even when the
    run fails; the other arms keep the load beside the read."""
    from gpu_dedup.backends.gpu import GPUBackend

    seen = []
    with bench_gpu._kernels_first(False):
        seen.append(GPUBackend.loads_beside_read)
    with pytest.raises(RuntimeError):
        with bench_gpu._kernels_first(True):
            seen.append(GPUBackend.loads_beside_read)
            raise RuntimeError("the run failed")
    assert seen == [True, False] and GPUBackend.loads_beside_read is True
