"""How much a checkpoint save holds back the run's own thread: a pure-Python loop on the main thread while the
writer thread saves a 1.8 GB unit; loop iterations per second during the save against alone."""
import json, sys, time, shutil
import numpy as np
from gpu_dedup.run.checkpoint import Checkpoints
arm = sys.argv[1]
rng = np.random.default_rng(0)
n = 18_750_000
unit = {"buckets/members": rng.integers(0, 10**7, 10 * n, dtype=np.int64)[: 10 * n // 8 * 8],
        "buckets/offsets": np.arange(n, dtype=np.int64), "buckets/hash": rng.integers(0, 2**63, n, dtype=np.uint64)}
def spin(seconds):
    k, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        k += 1
    return k / seconds
alone = spin(1.0)
for rep in range(4):
    d = f"/tmp/ab/gil-{arm}"
    shutil.rmtree(d, ignore_errors=True)
    ck = Checkpoints(d, "fp")
    t0 = time.perf_counter()
    ck.save("buckets", unit, {"stages": {}, "counts": {}})
    k = 0
    while ck._writer._jobs or ck._writer._busy:
        k += 1
        time.perf_counter()
    s = time.perf_counter() - t0
    ck.wait(); ck.remove()
    print(json.dumps({"arm": arm, "rep": rep, "save_s": round(s, 3), "loop_share_of_alone": round(k / s / alone, 3)}), flush=True)
