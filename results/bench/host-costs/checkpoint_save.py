"""Checkpoint saves alone: a unit of the 10^7 run's size (buckets: 1.5 GB in 3 arrays), written by the writer
thread and waited for, old (np.savez) and new (dump_arrays) code in turn; wall and CPU of the process."""
import json, os, sys, time, shutil
import numpy as np
from gpu_dedup.run.checkpoint import Checkpoints
arm = sys.argv[1]
rng = np.random.default_rng(0)
n = 150_000_000 // 8 * 8 // 8  # 18.75 M rows
unit = {"buckets/members": rng.integers(0, 10**7, 10 * n, dtype=np.int64)[: 10 * n // 8 * 8],
        "buckets/offsets": np.arange(n, dtype=np.int64), "buckets/hash": rng.integers(0, 2**63, n, dtype=np.uint64)}
total = sum(a.nbytes for a in unit.values())
for rep in range(3):
    d = f"/tmp/ab/save-{arm}"
    shutil.rmtree(d, ignore_errors=True)
    ck = Checkpoints(d, "fp")
    t0, c0 = time.perf_counter(), os.times()
    ck.save("buckets", unit, {"stages": {}, "counts": {}})
    ck.wait()
    t1, c1 = time.perf_counter(), os.times()
    ck.remove()
    t2 = time.perf_counter()
    print(json.dumps({"arm": arm, "rep": rep, "gb": round(total / 1e9, 2), "save_s": round(t1 - t0, 3),
                      "user_s": round(c1.user - c0.user, 2), "sys_s": round(c1.system - c0.system, 2),
                      "remove_s": round(t2 - t1, 3)}), flush=True)
