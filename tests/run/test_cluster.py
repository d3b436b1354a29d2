"""Dask scale-out: results identical to the single-process pipeline for 2 and 4 workers."""

import ast
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus, write_shards
from gpu_dedup.run.entry import run_dedup
from tests.accounting import assert_accounted
from tests.run.clusters import scheduler_of
from tests.signals import interruptible

distributed = pytest.importorskip("distributed")

BASE = {"backend": "cpu", "input": {"id_column": "id"}}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("dist")
    sample = planted_corpus(n_docs=2400, n_clusters=120, words=(30, 150), edit_rate=(0, 0.05), seed=21)
    table = sample.table.select(["id", "text"])
    (d / "in").mkdir()
    for i, lo in enumerate(range(0, 2400, 800)):  # small row groups: several blocks per shard
        pq.write_table(table.slice(lo, 800), d / "in" / f"part-{i}.parquet", row_group_size=150)
    write_shards(table, d / "jsonl", shards=3, fmt="jsonl")
    return d


def _inputs(d):
    return [pq.read_table(p, columns=["id"]) for p in sorted((d / "in").glob("*.parquet"))]


@pytest.fixture(scope="module")
def cluster4():
    with scheduler_of(4) as address:
        yield address


def _identical(a, b, names):
    for name in names:
        if (a / name).read_bytes() != (b / name).read_bytes():
            pytest.fail(f"{name} differs between {a.name} and {b.name}: {_table_diff(a / name, b / name)}")


def _table_diff(pa_path, pb_path) -> str:
    """Which rows and columns of two Parquet files differ (the byte comparison alone does not say)."""
    ta, tb = pq.read_table(pa_path), pq.read_table(pb_path)
    if ta.schema != tb.schema or ta.num_rows != tb.num_rows:
        return f"schemas/rows {ta.schema} {ta.num_rows} vs {tb.schema} {tb.num_rows}"
    out = []
    for c in ta.column_names:
        x, y = ta.column(c).to_pylist(), tb.column(c).to_pylist()
        bad = [i for i in range(len(x)) if x[i] != y[i]]
        if bad:
            out.append(f"{c}: {len(bad)} rows, first {[(i, x[i], y[i]) for i in bad[:3]]}")
    return "; ".join(out) or "same values, different bytes (metadata or encoding)"


def _names(d):
    return ["duplicates.parquet"] + sorted(p.name for p in d.iterdir() if p.suffix in (".parquet", ".jsonl")
                                           and p.name != "duplicates.parquet")


def test_cli_two_local_workers_equal_single_process(corpus, tmp_path):
    single = run_dedup(corpus / "in", tmp_path / "single", Config.from_dict(BASE))
    proc = subprocess.run([sys.executable, "-m", "gpu_dedup", "run", str(corpus / "in"), "-o", str(tmp_path / "two"),
                           "--id-column", "id", "--backend", "cpu", "--workers", "2", "--set", "cluster.block_rows=300"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "Dask dashboard:" in proc.stderr and "Dask dashboard" not in proc.stdout
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))
    assert_accounted(single, _inputs(corpus))
    assert_accounted(tmp_path / "two", _inputs(corpus))
    import json

    report = json.loads((tmp_path / "two" / "report.json").read_text())
    assert report["cluster"]["workers"] == 2 and report["cluster"]["blocks"] > 3
    assert report["cluster"]["text_readers"] == {"cudf": 0, "pyarrow": report["cluster"]["blocks"]}  # CPU workers
    page = (tmp_path / "two" / "report.html").read_text()  # the page too, with the sample texts from the workers
    assert page.count("<svg ") >= 4 and report["largest_clusters"]
    assert report["largest_clusters"] == single.report["largest_clusters"]
    same = ("documents_read", "exact_stage_collapsed", "candidate_edges", "verified_edges", "clusters",
            "exact_duplicates", "near_duplicates", "removed", "kept")
    assert {k: report["counts"][k] for k in same} == {k: single.report["counts"][k] for k in same}


@pytest.mark.parametrize("extra", [
    {},
    {"verify": {"method": "signature"}},
    {"select": {"keep": "longest"}},
    {"exact_dedup": False, "minhash": {"shingle": "char", "ngram": 7}},
    {"cluster": {"spill_texts": False}},
])
def test_four_workers_equal_single_process(corpus, cluster4, tmp_path, extra):
    cfg = Config.from_dict({**BASE, **extra})
    single = run_dedup(corpus / "in", tmp_path / "single", cfg)
    dist = run_dedup(corpus / "in", tmp_path / "four",
               cfg.with_overrides({"cluster.scheduler": cluster4, "cluster.block_rows": 200}))
    _identical(tmp_path / "single", tmp_path / "four", _names(tmp_path / "single"))
    assert (dist.kept == single.kept).all() and (dist.cluster == single.cluster).all()
    assert dist.report["counts"]["removed"] == single.report["counts"]["removed"] > 0
    assert_accounted(single, _inputs(corpus))
    assert_accounted(dist, _inputs(corpus))


def test_jsonl_shards_on_workers(corpus, cluster4, tmp_path):
    cfg = Config.from_dict(BASE)
    single = run_dedup(corpus / "jsonl", tmp_path / "single", cfg)
    dist = run_dedup(corpus / "jsonl", tmp_path / "dist", cfg.with_overrides({"cluster.scheduler": cluster4}))
    _identical(tmp_path / "single", tmp_path / "dist", _names(tmp_path / "single"))
    assert_accounted(single, _inputs(corpus))  # the JSONL shards hold the same rows as the Parquet ones
    assert_accounted(dist, _inputs(corpus))


@pytest.fixture(scope="module")
def cluster2():
    with scheduler_of(2) as address:
        yield address


@pytest.mark.parametrize("method", ["exact", "signature"])
def test_split_chains_two_workers_equal_single_process(corpus, cluster2, tmp_path, method):
    cfg = Config.from_dict({**BASE, "verify": {"method": method}, "select": {"split_chains": True}})
    single = run_dedup(corpus / "in", tmp_path / "single", cfg)
    assert single.report["counts"]["chain_split_ejected"] > 0  # the corpus chains: the mode changes the output
    spill = method == "exact"  # texts in files (read by verification), or in memory (auto, a small corpus)
    dist = run_dedup(corpus / "in", tmp_path / "two",
               cfg.with_overrides({"cluster.scheduler": cluster2, "cluster.block_rows": 300,
                                   "cluster.spill_texts": True if spill else "auto"}))
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))
    assert (dist.kept == single.kept).all() and (dist.cluster == single.cluster).all()
    same = ("chain_split_ejected", "clusters", "exact_duplicates", "near_duplicates", "removed", "kept")
    assert {k: dist.report["counts"][k] for k in same} == {k: single.report["counts"][k] for k in same}
    assert_accounted(single, _inputs(corpus))
    assert_accounted(dist, _inputs(corpus))
    # spill_texts: true: the workers read the normalized texts from files of their local directories, which go
    # with the run; auto: a corpus this small stays in their memory
    assert (dist.report["cluster"]["spilled_text_mb"] > 0) == spill
    with distributed.Client(cluster2) as client:
        left = client.run(lambda dask_worker: os.listdir(dask_worker.local_directory))
    assert not any("gpu_dedup-texts" in names for names in left.values())


def test_workers_killed_by_memory_name_the_settings_to_change(corpus, tmp_path, monkeypatch):
    from distributed.scheduler import KilledWorker

    from gpu_dedup.errors import ResourceError
    from gpu_dedup.run.cluster import executor as dist

    class DyingClient:  # every task's workers die, as under a too-small memory limit
        def map(self, *args, **kwargs):
            return []

        def run(self, *args, **kwargs):  # per-worker set-up: no worker answers
            return {}

        def gather(self, futures):
            raise KilledWorker("map_block-1", "tcp://127.0.0.1:1", 3)

        def close(self):
            pass

    monkeypatch.setattr(dist, "connect", lambda cfg: (DyingClient(), None))
    cfg = Config(backend="cpu").with_overrides({"cluster.workers": 2, "cluster.memory_limit": "1GiB",
                                                 "cluster.block_rows": 100_000})
    with pytest.raises(ResourceError, match=r"memory limit 1GiB, cluster.block_rows = 100,000.*lower cluster.block_rows \(e.g. --set cluster.block_rows=25000\)"):
        run_dedup(corpus / "in", tmp_path / "out", cfg)
    assert not (tmp_path / "out" / "_SUCCESS").exists()


def test_a_task_placed_on_a_worker_runs_on_its_successor_when_every_worker_restarted(tmp_path):
    """A task placed loosely on a worker (routing.placed) waits in no-worker while no worker is left, and Dask
    gave it to a new worker only if its restrictions named it: a restarted worker has a new address, so a run
    whose workers all restarted for memory waited forever.  The runs' scheduler plugin lets it run."""
    import time

    from distributed import LocalCluster

    from gpu_dedup.run.cluster import connection
    from gpu_dedup.run.cluster.routing import placed

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        client = distributed.Client(cluster)
        connection.register_plugins(client)
        assert "gpu-dedup-loose-restrictions" in client.run_on_scheduler(lambda dask_scheduler: list(dask_scheduler.plugins))
        old = list(client.scheduler_info()["workers"])[0]
        fut = client.submit(time.sleep, 2, pure=False, **placed([old]))
        time.sleep(0.5)
        client.restart_workers([old])  # the only worker: the task is left with none
        fut.result(timeout=30)
        assert old not in client.scheduler_info()["workers"]
        client.close()


# ------------------------------------------------------------------ GPU workers: one per visible GPU


def test_visible_gpus_from_cuda_visible_devices(monkeypatch):
    from gpu_dedup.run.cluster import connection as cluster

    for env, want in (("0,1,2", ["0", "1", "2"]), ("", []), ("3", ["3"]), ("0,-1,1", ["0"]),
                      ("GPU-8f3e,GPU-aa01", ["GPU-8f3e", "GPU-aa01"])):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        assert cluster.visible_gpus() == want, env
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert cluster.gpu_devices(2) == "4,5"


@pytest.mark.parametrize("env, message", [
    ("0", "asks for 2 GPU workers (one per GPU), but 1 GPU(s) are visible (CUDA_VISIBLE_DEVICES='0'); use --workers 1"),
    ("", "needs a GPU per worker, but no GPU is visible (CUDA_VISIBLE_DEVICES=''); run with --backend cpu"),
])
def test_more_gpu_workers_than_gpus_is_one_clear_error_and_no_cuda_on_the_client(tmp_path, env, message):
    """Checked before dask-cuda starts anything, and the client imports neither CuPy nor numba.cuda."""
    sample = planted_corpus(n_docs=20, n_clusters=2, words=(5, 10), seed=1)
    write_shards(sample.table.select(["id", "text"]), tmp_path / "in", shards=1)
    code = (
        "import sys\n"
        "from gpu_dedup.config import Config\n"
        "from gpu_dedup.errors import ConfigError\n"
        "from gpu_dedup.run.entry import run_dedup\n"
        "cfg = Config.from_dict({'backend': 'gpu', 'cluster': {'workers': 2}})\n"
        "try:\n"
        f"    run_dedup({str(tmp_path / 'in')!r}, {str(tmp_path / 'out')!r}, cfg)\n"
        "except ConfigError as exc:\n"
        "    print('ERROR', exc)\n"
        "print('CUDA', sorted(m for m in sys.modules if m == 'cupy' or m.startswith('numba.cuda') or m == 'cudf'))\n"
    )
    env_vars = {**__import__("os").environ, "CUDA_VISIBLE_DEVICES": env}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env_vars, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert message in proc.stdout, proc.stdout
    assert "CUDA []" in proc.stdout, proc.stdout


# ------------------------------------------------------------------ no funnel: every stage on the workers


@pytest.fixture(scope="module")
def cluster3():
    with scheduler_of(3) as address:
        yield address


@pytest.mark.parametrize("extra, block_rows", [
    # large-star / small-star rounds, not union-find; every piece taken out of its cut by a task, small routes too
    ({"cluster": {"components_gathered_edges": 0, "small_route_rows": 0}}, 150),
    ({"select": {"keep": "lowest_id"}, "cluster": {"shuffle": "tasks"}}, 450),  # Dask's own shuffle; id ranks
    ({"select": {"split_chains": False}, "exact_dedup": False}, 700),
    # band hashes and edges through the device route (pandas frames on CPU workers), edges in star rounds
    ({"cluster": {"shuffle": "device", "components_gathered_edges": 0}}, 450),
])
def test_three_workers_any_block_size_equal_single_process(corpus, cluster3, tmp_path, extra, block_rows):
    cfg = Config.from_dict({**BASE, **{k: v for k, v in extra.items() if k != "cluster"}})
    single = run_dedup(corpus / "in", tmp_path / "single", cfg)
    dist = run_dedup(corpus / "in", tmp_path / "three",
               cfg.with_overrides({"cluster.scheduler": cluster3, "cluster.block_rows": block_rows,
                                   **{f"cluster.{k}": v for k, v in extra.get("cluster", {}).items()}}))
    _identical(tmp_path / "single", tmp_path / "three", _names(tmp_path / "single"))
    assert (dist.kept == single.kept).all() and (dist.cluster == single.cluster).all()  # read back from the output
    assert dist.edges is None  # the client never held the edges
    for key in ("chaining", "histograms", "largest_clusters", "largest_near_duplicate_clusters", "closest_to_threshold"):
        assert dist.report[key] == single.report[key], key
    assert dist.report["cluster"]["routes"] > 10 and dist.report["cluster"]["shuffled_rows"] > 0
    device = extra.get("cluster", {}).get("shuffle") == "device"
    assert (dist.report["cluster"]["device_routes"] > 8) == device  # buckets, edges, large-star / small-star rounds
    assert_accounted(dist, _inputs(corpus))


def test_ranks_with_string_ids_nulls_and_ties_equal_single_process(cluster2, tmp_path):
    """keep = lowest_id over string ids with nulls and repeats, and keep = score with NaN and null scores:
    the rank sort's ranges put every tie, NaN and null where one process's sort does."""
    import numpy as np
    import pyarrow as pa

    sample = planted_corpus(n_docs=900, n_clusters=60, words=(20, 60), edit_rate=(0, 0.05), seed=5)
    rng = np.random.default_rng(0)
    ids = [None if rng.random() < 0.1 else f"d{int(rng.integers(0, 400)):04d}" for _ in range(900)]
    score = [None if rng.random() < 0.1 else (float("nan") if rng.random() < 0.1 else float(rng.integers(0, 5)))
             for _ in range(900)]
    table = pa.table({"doc": pa.array(ids, pa.string()), "text": sample.table.column("text"),
                      "score": pa.array(score, pa.float64())})
    (tmp_path / "in").mkdir()
    for i, lo in enumerate(range(0, 900, 300)):
        pq.write_table(table.slice(lo, 300), tmp_path / "in" / f"p{i}.parquet", row_group_size=100)
    for keep in ({"keep": "lowest_id"}, {"keep": "score", "score_column": "score"}):
        cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "doc"}, "select": keep})
        name = keep["keep"]
        single = run_dedup(tmp_path / "in", tmp_path / f"single-{name}", cfg)
        run_dedup(tmp_path / "in", tmp_path / f"two-{name}",
            cfg.with_overrides({"cluster.scheduler": cluster2, "cluster.block_rows": 100}))
        assert single.report["counts"]["removed"] > 0
        _identical(tmp_path / f"single-{name}", tmp_path / f"two-{name}", _names(tmp_path / f"single-{name}"))


def test_inputs_without_rows_but_with_an_id_column_equal_single_process(cluster2, tmp_path):
    """Zero documents with an id column (an empty Parquet shard with 'id' found by itself, an empty JSON Lines
    shard with --id-column): the empty block had no id column and the write stage failed on workers
    (KeyError 'Field "id" does not exist in schema', exit 1); one process wrote a complete run."""
    import pyarrow as pa

    (tmp_path / "pq").mkdir()
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}),
                   tmp_path / "pq" / "empty.parquet")
    (tmp_path / "jl").mkdir()
    (tmp_path / "jl" / "empty.jsonl").write_text("")
    for name in ("pq", "jl"):
        cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}})
        single = run_dedup(tmp_path / name, tmp_path / f"single-{name}", cfg)
        two = run_dedup(tmp_path / name, tmp_path / f"two-{name}", cfg.with_overrides({"cluster.scheduler": cluster2}))
        assert single.report["counts"]["documents_read"] == two.report["counts"]["documents_read"] == 0
        _identical(tmp_path / f"single-{name}", tmp_path / f"two-{name}", _names(tmp_path / f"single-{name}"))


@pytest.mark.parametrize("extra", [
    {"select": {"keep": "score", "score_column": "score"}},
    {"similarity": "cosine", "input": {"id_column": "id", "vector_column": "emb"}, "lsh": {"threshold": 0.9}},
], ids=["keep-score", "cosine-vectors"])
def test_inputs_without_rows_with_a_score_or_vector_column_equal_single_process(cluster2, tmp_path, extra):
    """Zero documents under keep score, or with a vector column: the one empty block a cluster run makes had no
    score column and no vectors, and the rank stage (KeyError 'Field "score" does not exist in schema') or the
    exact stage (AttributeError "'NoneType' object has no attribute 'matrix'") failed on the workers, exit 1;
    one process wrote a complete run."""
    import pyarrow as pa

    (tmp_path / "in").mkdir()
    for name in ("a", "b"):
        pq.write_table(pa.table({"id": pa.array([], pa.int64()), "text": pa.array([], pa.string()),
                                 "score": pa.array([], pa.float64()),
                                 "emb": pa.array([], pa.list_(pa.float32()))}), tmp_path / "in" / f"{name}.parquet")
    cfg = Config.from_dict({"backend": "cpu", "input": {"id_column": "id"}, **extra})
    single = run_dedup(tmp_path / "in", tmp_path / "single", cfg)
    two = run_dedup(tmp_path / "in", tmp_path / "two", cfg.with_overrides({"cluster.scheduler": cluster2}))
    assert single.report["counts"]["documents_read"] == two.report["counts"]["documents_read"] == 0
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))


@pytest.mark.timeout(600)
def test_two_thousand_small_shards_on_workers_equal_single_process(cluster2, tmp_path):
    """The write stage passes every shard's name to its tasks; past 100 kB of names (about 1,500 shards) Client.map
    put them in the graph under the keyword's name, without a priority: the scheduler failed on that task
    ("assert ts.priority") and the run waited forever.  One process took 11 s."""
    import pyarrow as pa

    sample = planted_corpus(n_docs=2000, n_clusters=100, words=(10, 30), edit_rate=(0, 0.05), seed=8)
    table = sample.table.select(["id", "text"])
    (tmp_path / "in").mkdir()
    for i in range(2000):
        pq.write_table(table.slice(i, 1), tmp_path / "in" / f"part-with-a-long-name-{i:05d}.parquet")
    cfg = Config.from_dict(BASE)
    single = run_dedup(tmp_path / "in", tmp_path / "single", cfg)
    two = run_dedup(tmp_path / "in", tmp_path / "two", cfg.with_overrides({"cluster.scheduler": cluster2}))
    assert single.report["counts"]["removed"] > 0 and two.report["counts"] == single.report["counts"]
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))


def test_run_against_an_index_on_workers_equals_one_process(corpus, cluster2, tmp_path):
    from gpu_dedup.run.entry import run_dedup as index_run

    files = sorted((corpus / "in").glob("*.parquet"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for f in files[:2]:
        (tmp_path / "a" / f.name).write_bytes(f.read_bytes())
    (tmp_path / "b" / files[2].name).write_bytes(files[2].read_bytes())
    cfg = Config.from_dict(BASE)
    index_run(tmp_path / "a", tmp_path / "a-out", cfg, index_out=tmp_path / "ix")
    single = index_run(tmp_path / "b", tmp_path / "single", cfg, against=tmp_path / "ix")
    dist = index_run(tmp_path / "b", tmp_path / "two", cfg.with_overrides({"cluster.scheduler": cluster2,
                                                                         "cluster.block_rows": 150}),
                     against=tmp_path / "ix")
    assert single.report["counts"]["removed_against_index"] > 0
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))
    assert dist.report["counts"] == single.report["counts"]


def test_cosine_vectors_on_workers_equal_single_process(cluster2, tmp_path):
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(3)
    base = rng.normal(size=(60, 32)).astype(np.float32)
    vecs = np.concatenate([base[rng.integers(0, 60, 600)] + rng.normal(scale=0.02, size=(600, 32)).astype(np.float32)])
    vecs[5] = 0  # a vector without direction (never an exact key)
    vecs[400] = 0
    table = pa.table({"id": pa.array(np.arange(600)), "emb": pa.FixedSizeListArray.from_arrays(
        pa.array(vecs.ravel()), 32)})
    (tmp_path / "in").mkdir()
    for i, lo in enumerate(range(0, 600, 200)):
        pq.write_table(table.slice(lo, 200), tmp_path / "in" / f"v{i}.parquet", row_group_size=50)
    cfg = Config.from_dict({"backend": "cpu", "similarity": "cosine", "input": {"id_column": "id",
                                                                             "vector_column": "emb"},
                            "lsh": {"threshold": 0.9}, "cosine": {"bad_vectors": "keep"}})
    single = run_dedup(tmp_path / "in", tmp_path / "single", cfg)
    run_dedup(tmp_path / "in", tmp_path / "two", cfg.with_overrides({"cluster.scheduler": cluster2,
                                                               "cluster.block_rows": 50}))
    assert single.report["counts"]["removed"] > 100
    _identical(tmp_path / "single", tmp_path / "two", _names(tmp_path / "single"))


def test_a_killed_cluster_run_resumes_from_the_workers_checkpoints(corpus, tmp_path):
    """SIGKILL after the verify stage of a --workers run (client and its local workers), then the same
    command: the finished stages load from the parts the workers saved, and the outputs are the same."""
    import json
    import os

    args = [sys.executable, "-m", "gpu_dedup", "run", str(corpus / "in"), "-o", str(tmp_path / "out"), "--id-column",
            "id", "--backend", "cpu", "--workers", "2", "--set", "cluster.block_rows=300", "-q"]
    mark = f"killed-{os.getpid()}-{tmp_path.name}"
    killed = subprocess.run(args, capture_output=True, text=True, timeout=600,
                            env={**os.environ, "GPU_DEDUP_FAULT": "verify", "GPU_DEDUP_TEST_MARK": mark},
                            start_new_session=True)
    assert killed.returncode == -9, killed.stderr
    assert _survivors(mark) == []  # the local scheduler and workers end with the client, however it ends
    assert (tmp_path / "out" / ".gpu_dedup_checkpoint" / "exact").is_dir()
    again = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert {"exact", "bands", "buckets"} <= set(report["resumed_from_checkpoint"])
    assert report["cluster"]["scheduler_peak_rss_mb"] > 50  # a process of its own, measured
    assert report["stages"]["buckets"].get("resumed") is True and "resumed" not in report["stages"]["verify"]
    single = run_dedup(corpus / "in", tmp_path / "single", Config.from_dict(BASE))
    _identical(tmp_path / "single", tmp_path / "out", _names(tmp_path / "single"))
    assert_accounted(single, _inputs(corpus))


def _survivors(mark: str, wait: float = 20.0) -> list:
    """Processes still running with ``GPU_DEDUP_TEST_MARK=mark`` in their environment after ``wait`` seconds."""
    import time

    import psutil

    deadline = time.monotonic() + wait
    while True:
        left = []
        for proc in psutil.process_iter():
            try:
                if proc.environ().get("GPU_DEDUP_TEST_MARK") == mark and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append((proc.pid, " ".join(proc.cmdline())[:200]))
            except (psutil.Error, OSError):
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def test_a_local_cluster_runs_its_scheduler_in_a_child_process(corpus, tmp_path):
    """--workers N: the scheduler is a child process (its task state does not grow the client), the report
    gives its peak memory, and closing the run ends it and the workers."""
    import os

    import psutil

    from gpu_dedup.run.cluster.executor import DaskExecutor
    from gpu_dedup.run.stagelog import peak_rss_mb

    ex = DaskExecutor([], Config.from_dict({**BASE, "cluster": {"workers": 2}}))
    ex.connect()
    try:
        pid = ex.client.run_on_scheduler(os.getpid)
        assert pid != os.getpid() and psutil.Process(pid).ppid() == os.getpid()
        assert not ex.client.run_on_scheduler(lambda dask_scheduler: "stealing" in dask_scheduler.extensions)
        workers = list(ex.client.run(os.getpid).values())
        assert len(workers) == 2 and pid not in workers
        assert ex.client.run_on_scheduler(peak_rss_mb) > 50
    finally:
        ex.close()
    for p in [pid, *workers]:
        assert not psutil.pid_exists(p) or psutil.Process(p).status() == psutil.STATUS_ZOMBIE


def _imported(name: str) -> bool:
    return name in sys.modules


@pytest.mark.parametrize("shuffle", [None, "device"])
def test_the_device_routes_dataframes_are_imported_while_the_kernels_load(shuffle):
    """``cluster.shuffle: device``: Dask's DataFrame is imported on the workers and the scheduler as the run
    prepares (booked to kernel_load), not by the first device route (3 s of the buckets stage at 10^5
    documents on one CPU worker, the scheduler's event loop blocked as it imported it); the host routes never
    import it."""
    from gpu_dedup.run.cluster.executor import DaskExecutor
    from gpu_dedup.run.stagelog import StageLog

    ex = DaskExecutor([], Config.from_dict({**BASE, "cluster": {"workers": 1, "shuffle": shuffle}}))
    try:
        ex.prepare(StageLog())
        got = [*ex.client.run(_imported, "dask.dataframe").values(),
               ex.client.run_on_scheduler(_imported, "dask.dataframe")]
    finally:
        ex.close()
    assert got == [shuffle == "device"] * 2


WORKER_THREADS_SCRIPT = """
import numba  # as a script that imports gpu_dedup at its top does: each worker process imports it too
from gpu_dedup.config import Config
from gpu_dedup.run.cluster.connection import worker_threads
from gpu_dedup.run.cluster.executor import DaskExecutor, prepare_worker

if __name__ == "__main__":
    ex = DaskExecutor([], Config.from_dict({"backend": "cpu", "cluster": {"workers": 2}}))
    ex.connect()
    try:
        before = sorted(ex.client.run(lambda: numba.config.NUMBA_NUM_THREADS).values())
        ex.client.run(prepare_worker, ex.cfg)
        after = sorted(ex.client.run(numba.get_num_threads).values())
        print((before, after, worker_threads(2)))
    finally:
        ex.close()
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one core: every worker has one thread anyway")
def test_workers_of_a_script_that_imports_numba_run_their_share_of_the_cores(tmp_path):
    """A worker process imports its program's main module before the Nanny sets its environment: Numba,
    imported there, read no NUMBA_NUM_THREADS and took a thread per core (and failed its first compile).
    Preparing the worker has it read the run's thread count."""
    script = tmp_path / "main.py"
    script.write_text(WORKER_THREADS_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("NUMBA_NUM_THREADS", None)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, after, share = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    cores = len(os.sched_getaffinity(0))
    assert before == [cores, cores]  # what the workers' Numba read before the environment was set
    assert after == [share, share] and share < cores


CLOSE_WHILE_FETCHING_SCRIPT = """
import logging
import sys
import time

from gpu_dedup.config import Config
from gpu_dedup.run.cluster.executor import DaskExecutor


def produce(i):
    return bytes(40 * 2**20)


if __name__ == "__main__":
    ex = DaskExecutor([], Config.from_dict({"backend": "cpu", "cluster": {"workers": 2}}))
    ex.connect()
    try:
        ex.client.run(lambda: logging.getLogger("distributed.worker").error("a worker's error during the run"))
        a, b = sorted(ex.client.scheduler_info()["workers"])
        made = ex.client.map(produce, range(8), workers=[a], pure=False)
        used = [ex.client.submit(len, f, workers=[b], pure=False) for f in made]  # b fetches a's results
        time.sleep(0.5)
        print("closing", file=sys.stderr, flush=True)
    finally:
        ex.close()  # as run_dedup() does when Ctrl-C or SIGTERM stops it
"""


def test_closing_a_local_cluster_while_workers_fetch_data_prints_nothing_from_them(tmp_path):
    """Ctrl-C or SIGTERM closes the cluster while one worker fetches another's results: the workers and the
    scheduler, which share gpu-dedup's stderr, logged the broken transfers with tracebacks ("failed during get
    data ... StreamClosedError", "Closed comm", "Removing worker ... lose already computed task(s)") after the
    run's one line.  What a worker logs while the run goes on still shows."""
    script = tmp_path / "main.py"
    script.write_text(CLOSE_WHILE_FETCHING_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "DASK_LOGGING__DISTRIBUTED": "warning"}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    before, _, after = proc.stderr.partition("closing\n")
    assert "a worker's error during the run" in before, proc.stderr[-3000:]
    assert "Traceback" not in after and " - distributed." not in after, after[-3000:]


def test_local_workers_keep_glibc_memory_defaults(monkeypatch):
    """Dask starts workers with MALLOC_TRIM_THRESHOLD_=65536 (every freed array over 128 KiB goes back to the
    OS and faults in again: 2.65 M page faults at 10^6 documents on 2 workers, 0.30 M without); a local
    cluster of a run starts them without it, and does not leave it in this process's environment."""
    from gpu_dedup.run.cluster.executor import DaskExecutor

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    ex = DaskExecutor([], Config.from_dict({**BASE, "cluster": {"workers": 2}}))
    ex.connect()
    try:
        seen = ex.client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_"))
    finally:
        ex.close()
    assert list(seen.values()) == [None, None]
    assert "MALLOC_TRIM_THRESHOLD_" not in os.environ


def _double(frame):
    return {"a": frame["a"] * 2}


def _saved_left():
    from gpu_dedup.run.cluster import executor

    return len(executor._SAVED)


def test_saved_parts_go_on_without_the_tasks_that_computed_them(cluster2, tmp_path):
    """A finished unit's parts come back from ``save`` as futures with no dependencies (the scheduler can
    forget every task of the unit), the same frames taken where the worker left them; a worker without a
    part reads it from its checkpoint file."""
    import numpy as np

    from gpu_dedup.run.checkpoint import Checkpoints
    from gpu_dedup.run.cluster.executor import DaskExecutor, _reuse_or_load

    ex = DaskExecutor([], Config.from_dict({**BASE, "cluster": {"scheduler": cluster2}}))
    ex.connect()
    try:
        client = ex.client
        first = client.map(lambda k: {"a": np.arange(k, k + 5)}, range(3), pure=False)
        parts = client.map(_double, first, pure=False)
        history = {f.key for f in first} | {f.key for f in parts}
        out = ex.save(Checkpoints(tmp_path, "fp"), "unit", {"p": parts, "none": None}, {"counts": {}})
        assert out["none"] is None
        got = client.gather(out["p"])
        assert [g["a"].tolist() for g in got] == [(2 * np.arange(k, k + 5)).tolist() for k in range(3)]
        deps = client.run_on_scheduler(lambda dask_scheduler, keys: [len(dask_scheduler.tasks[k].dependencies)
                                                                     for k in keys], keys=[f.key for f in out["p"]])
        assert deps == [0, 0, 0]
        assert sum(client.run(_saved_left).values()) == 0  # each frame reused by the worker that held it
        del first, parts
        import time

        for _ in range(100):  # the scheduler forgets the unit's tasks once the client lets them go
            left = client.run_on_scheduler(lambda dask_scheduler, keys: sorted(set(keys) & set(dask_scheduler.tasks)),
                                           keys=sorted(history))
            if not left:
                break
            time.sleep(0.05)
        assert left == []
        path = tmp_path / ".gpu_dedup_checkpoint" / "unit" / "p-00001.arrays"
        assert _reuse_or_load(str(path), "cpu")["a"].tolist() == got[1]["a"].tolist()  # no frame here: the file
    finally:
        ex.close()


def _arrow_pool():
    import pyarrow as pa

    return pa.default_memory_pool().backend_name


def test_blocks_stay_on_the_worker_that_read_them(corpus, tmp_path):
    """Blocks are spread over the workers by rows and stay where they are read: every task that reads one runs
    there, so after a whole run no block has a copy on another worker (Dask copied blocks to the workers of
    the small frames they met, until one worker held every block); workers use an Arrow memory pool, the
    command's (jemalloc; storage.pool), not the system allocator (under Dask's trim threshold it faulted every
    array's pages in again)."""
    import collections

    from gpu_dedup.storage.pool import preferred_pool

    from gpu_dedup.run.checkpoint import NoCheckpoints
    from gpu_dedup.run.cluster.executor import DaskExecutor
    from gpu_dedup.run.sequence import Job, execute
    from gpu_dedup.storage.discovery import discover

    cfg = Config.from_dict({**BASE, "cluster": {"workers": 2, "block_rows": 300}})
    ex = DaskExecutor(discover([corpus / "in"]), cfg)
    try:
        result = execute(Job(cfg), ex, NoCheckpoints())
        assert result.report["counts"]["removed"] > 0
        held = ex.client.who_has(ex.loaded)
        holders = [sorted(held[f.key]) for f in ex.loaded]
        # 2,400 rows in 8 blocks, each cut at the row-group boundary (groups of 150 rows, and 50 at a shard's end)
        # nearest to its share: a block of 350 holds a shard's last 200 rows and the next one's first group
        assert [b.rows for b in ex.blocks] == [300, 300, 350, 300, 300, 200, 300, 350]
        assert len(ex.loaded) == 8 and all(len(h) == 1 for h in holders), holders
        rows = collections.Counter()
        for b, h in zip(ex.blocks, holders):
            rows[h[0]] += b.rows
        assert sorted(rows.values()) == [1150, 1250]  # largest first, to the fewest rows: 350 350 | 300 300 | ...
        assert set(ex.client.run(_arrow_pool).values()) == {preferred_pool() or _arrow_pool()}
    finally:
        ex.close()


def _weighted(part: dict, weights: dict, scale: int = 1, part_index: int = -1) -> dict:
    """A step that reads another part and its own index: ``k`` kept, ``v`` = k * weight * scale + index."""
    return {"k": part["k"], "v": part["k"] * weights["w"][0] * scale + part_index}


def _summed(part: dict, extra: dict) -> dict:
    order = np.lexsort((part["v"], part["k"]))
    return {"k": part["k"][order], "v": part["v"][order] + extra["w"][0]}


@pytest.mark.parametrize("sources", [3, 11])  # destinations take the pieces directly, or from a holding task
@pytest.mark.parametrize("shuffle", [None, "p2p", "device"])
def test_a_route_runs_its_steps_as_maps_around_it_would(cluster2, sources, shuffle):
    """route(before=Step(f, x), after=Step(g, y)) gives what map(f) -> route -> map(g) gives: the steps read
    other parts aligned with the sources (before) or the destinations (after), and their indices.  ``device``:
    the device route (frames of the named backend's arrays through Dask's p2p shuffle; CPU workers: pandas)."""
    from distributed import Client

    from gpu_dedup.run.cluster import routing
    from gpu_dedup.run.contract import Step
    from gpu_dedup.stages import frames

    rng = np.random.default_rng(sources)
    with Client(cluster2) as client:
        workers = sorted(client.nthreads())
        parts = client.scatter([{"k": rng.integers(0, 40, 30)} for _ in range(sources)])
        weights = client.scatter([{"w": np.array([i + 2])} for i in range(sources)])
        extras = client.scatter([{"w": np.array([100 * k])} for k in range(4)])
        homes = [workers[k % 2] for k in range(4)]
        how = {"device": "cpu"} if shuffle == "device" else {"shuffle_method": shuffle}
        fused = routing.route(client, parts, frames.hash_dest, 4, homes=homes, on="k", **how,
                              before=Step(_weighted, weights, scale=3, index=True), after=Step(_summed, extras))
        mapped = [client.submit(_weighted, p, w, scale=3, part_index=i) for i, (p, w) in enumerate(zip(parts, weights))]
        routed = routing.route(client, mapped, frames.hash_dest, 4, homes=homes, on="k", **how)
        want = [client.submit(_summed, r, e) for r, e in zip(routed, extras)]
        got, want = client.gather(fused), client.gather(want)
    assert sum(g["k"].shape[0] for g in got) == 30 * sources
    for g, w in zip(got, want):
        assert np.array_equal(g["k"], w["k"]) and np.array_equal(g["v"], w["v"])


def test_a_cluster_run_imports_dask_dataframe_only_for_dasks_shuffle(corpus, cluster2, tmp_path):
    """Routes move rows as futures unless Dask's shuffle is asked for: the client then needs no dask.dataframe,
    whose import took it about a second while the workers waited for the run's first route."""
    code = ("import sys\nfrom gpu_dedup.cli import main\n"
            f"code = main(['run', {str(corpus / 'in')!r}, '-o', {str(tmp_path / 'out')!r}, '--backend', 'cpu', "
            f"'--id-column', 'id', '-q', '--scheduler', {cluster2!r}])\n"
            "print((code, 'dask.dataframe' in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ast.literal_eval(proc.stdout.strip().splitlines()[-1]) == (0, False)
    assert (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize("started", [True, False], ids=["own-cluster", "joined"])
def test_an_interrupt_while_closing_still_silences_the_workers_and_closes(monkeypatch, started):
    """Ctrl-C as the cluster closes: the run's own workers are still silenced before their scheduler goes (each
    one that heartbeat meanwhile printed a traceback on the shared stderr), the client and the cluster still
    close, and the interrupt goes on.  A joined cluster is left as it was: nothing silenced, nothing closed
    but the client."""
    from gpu_dedup.config import Config
    from gpu_dedup.run.cluster import executor

    calls = []

    class Client:
        def run(self, fn, *args, **kwargs):
            calls.append(fn.__name__)

        def close(self):
            calls.append("client.close")

    class Cluster:
        def close(self):
            calls.append("cluster.close")

    def interrupt(point):
        calls.append(point)
        raise KeyboardInterrupt

    monkeypatch.setattr(executor, "maybe_crash", interrupt)
    monkeypatch.setattr(executor, "quiet_teardown", lambda client: calls.append("quiet_teardown"))
    ex = executor.DaskExecutor([], Config.from_dict({"backend": "cpu"}))
    ex.client, ex.cluster = Client(), Cluster() if started else None
    with pytest.raises(KeyboardInterrupt):
        ex.close()
    tail = ["quiet_teardown", "client.close", "cluster.close"] if started else ["client.close"]
    assert calls == ["cluster:closing", "_forget_saved", "drop_texts", *tail]


def _group_signal_run(corpus, out, moment, env_fault=None):
    """A ``--workers 2`` run in a session of its own, given the signal at ``moment`` to its whole process group
    (what a terminal's Ctrl-C and most schedulers send): a log line (signal after it) or a fault point
    (GPU_DEDUP_FAULT, the process signals its own group).  Returns (exit status, stderr, seconds from the signal
    to the end)."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k != "GPU_DEDUP_FAULT"}
    if env_fault:
        env["GPU_DEDUP_FAULT"] = env_fault
    p = subprocess.Popen([sys.executable, "-m", "gpu_dedup", "run", str(corpus / "in"), "-o", str(out), "--workers",
                          "2", "--backend", "cpu", "--id-column", "id"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True, start_new_session=True, env=env,
                         preexec_fn=interruptible)
    lines, sent = [], None
    try:
        for line in p.stderr:
            lines.append(line)
            if moment is not None and moment[0] in line:
                os.killpg(p.pid, moment[1])
                sent = time.monotonic()
                break
            if env_fault and sent is None and "Dask dashboard" in line:
                sent = time.monotonic()  # the cluster is up: the fault comes within the run's few seconds
        err = "".join(lines) + p.stderr.read()
        rc = p.wait(timeout=120)
    finally:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return rc, err, time.monotonic() - (sent or time.monotonic())


@pytest.mark.parametrize("moment, fault, completed", [
    (("Dask dashboard", "SIGINT"), None, False),  # workers and scheduler just started
    (None, "read:group-terminate", False),  # the blocks are read; the workers normalize them next
    (None, "commit:done:group-terminate", True),  # the outputs were just published
    (None, "cluster:closing:group-interrupt", True),  # the run is done; its cluster closes
])
def test_a_signal_to_the_whole_process_group_ends_a_cluster_run_with_one_line(corpus, tmp_path, moment, fault,
                                                                              completed):
    """Ctrl-C or SIGTERM to the process group of a --workers run reached the workers and the scheduler too: 4 to
    20 tracebacks, and some runs ended with exit 1 after 71 s (the client waiting for a scheduler that was
    gone); after the commit it said "the previous complete output (if any) is untouched" beside the new
    _SUCCESS.  Now: exit 130 within seconds, one line, no traceback, saying what the output directory holds."""
    import signal

    if moment is not None:
        moment = (moment[0], getattr(signal, moment[1]))
    rc, err, seconds = _group_signal_run(corpus, tmp_path / "out", moment, fault)
    lines = [line for line in err.splitlines() if line.startswith("gpu-dedup:")]
    assert rc == 130 and "Traceback" not in err and len(lines) == 1, err[-3000:]
    assert seconds < 30, (seconds, err[-2000:])
    if completed:
        assert "interrupted after the run completed" in lines[0] and "_SUCCESS is there" in lines[0], lines
        assert (tmp_path / "out" / "_SUCCESS").exists()
    else:
        assert "previous complete output (if any) is untouched" in lines[0], lines
        assert not (tmp_path / "out" / "_SUCCESS").exists()
