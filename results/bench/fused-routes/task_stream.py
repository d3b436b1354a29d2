import json, logging, os, shutil, sys, time, collections, contextlib
from pathlib import Path
import distributed
from distributed import Client, get_task_stream
from gpu_dedup.config import Config
from gpu_dedup.run.entry import run_dedup
from gpu_dedup.run.stagelog import StageLog

from bench import CORPUS, warm_cluster  # this folder's bench.py

SHOW = sys.argv[3] if len(sys.argv) > 3 else None
block_rows = int(sys.argv[1]) if len(sys.argv) > 1 else None
keep = sys.argv[2] if len(sys.argv) > 2 else "first"
logging.getLogger("distributed").setLevel(logging.ERROR)
SPANS = {}
orig = StageLog.stage
@contextlib.contextmanager
def stage(self, name, *a, **k):
    t0 = time.time()
    with orig(self, name, *a, **k) as info:
        yield info
    SPANS[name] = (t0, time.time())
StageLog.stage = stage

def settings(**cl):
    return {"backend": "cpu", "input": {"id_column": "id"}, "output": {"shards": True}, "select": {"keep": keep}, "cluster": cl}

if __name__ == "__main__":
    with warm_cluster(settings, block_rows) as (c, cl, out):
        shutil.rmtree(out, ignore_errors=True)
        with get_task_stream(client=c) as ts:
            res = run_dedup(CORPUS, out, Config.from_dict(settings(**cl)))
        print({k: v.get("seconds") for k, v in res.report["stages"].items()}, res.report["cluster"]["routes"])
        data = ts.data
        for name in ("exact", "components", "select"):
            a, b = SPANS[name]
            tasks = []
            for t in data:
                for s in t["startstops"]:
                    if s["action"] == "compute" and a <= s["start"] <= b:
                        tasks.append((s["start"], s["stop"], t["key"] if isinstance(t["key"], str) else str(t["key"]), t["worker"]))
            busy = sum(e - s for s, e, _, _ in tasks)
            print(f"{name}: span {b-a:.3f}s tasks {len(tasks)} compute {busy:.3f}s")
            byfn = collections.defaultdict(lambda: [0, 0.0])
            for s, e, k, w in tasks:
                fn = k.split("-")[0].strip("('")
                byfn[fn][0] += 1; byfn[fn][1] += e - s
            for fn, (n, sec) in sorted(byfn.items(), key=lambda kv: -kv[1][1])[:12]:
                print(f"   {fn:30s} {n:4d} {sec:.4f}")
            # timeline
            for s, e, k, w in (sorted(tasks) if name == SHOW else []):
                print(f"   {s-a:7.4f} {e-s:7.4f} {w[-5:]} {k[:60]}") if len(sys.argv) > 3 else None
