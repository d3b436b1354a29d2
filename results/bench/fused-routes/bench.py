"""Stage seconds of block-route runs joining one local CPU cluster (2 workers x 1 thread, processes)."""
import contextlib, json, logging, os, shutil, sys, time
from pathlib import Path
from distributed import Client
from gpu_dedup.config import Config
from gpu_dedup.run.cluster.connection import local_cluster, worker_threads
from gpu_dedup.run.cluster.executor import prepare_worker
from gpu_dedup.run.entry import run_dedup

# the planted corpora (gpu_dedup.bench builds them); WORK: outputs and results.jsonl
CORPUS = os.environ.get("CORPUS", "/work/corpora/text-100000-s0-16shards")
WARM = os.environ.get("WARM", "/work/corpora/text-2000-s0-2shards")
WORK = Path(os.environ.get("WORK", "fused-routes-work"))
logging.getLogger("distributed").setLevel(logging.ERROR)

def settings(**cl):
    return {"backend": "cpu", "input": {"id_column": "id"}, "output": {"shards": True}, "cluster": cl}

@contextlib.contextmanager
def warm_cluster(settings, block_rows):
    """A local CPU cluster as a run starts it, its workers' kernels loaded and one warm-up run joined by
    address: yields (a client of it, the cluster settings a run joins it with, the output directory)."""
    cluster = local_cluster(2, "auto", {"NUMBA_NUM_THREADS": str(worker_threads(2))})
    try:
        with Client(cluster) as c:
            c.run(prepare_worker, Config.from_dict(settings()))
            cl = {"scheduler": cluster.scheduler_address, "whole_on_one_worker": False,
                  **({"block_rows": block_rows} if block_rows else {})}
            out = WORK / "out"
            shutil.rmtree(out, ignore_errors=True)
            run_dedup(WARM, out, Config.from_dict(settings(**cl)))
            yield c, cl, out
    finally:
        cluster.close()


if __name__ == "__main__":
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    block_rows = (int(sys.argv[2]) or None) if len(sys.argv) > 2 else None
    tag = sys.argv[3] if len(sys.argv) > 3 else "run"
    with warm_cluster(settings, block_rows) as (_, cl, out):
        for i in range(runs):
            shutil.rmtree(out, ignore_errors=True)
            t0 = time.perf_counter()
            res = run_dedup(CORPUS, out, Config.from_dict(settings(**cl)))
            sec = time.perf_counter() - t0
            r = res.report
            row = {"tag": tag, "i": i, "seconds": round(sec, 2),
                   "stages": {k: v.get("seconds") for k, v in r["stages"].items()},
                   "blocks": r["cluster"]["blocks"], "routes": r["cluster"]["routes"]}
            print(json.dumps(row), flush=True)
            with open(WORK / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")
