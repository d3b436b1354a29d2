import json, subprocess, sys, time, shutil
from distributed import LocalCluster

if __name__ == "__main__":
    corpus, rounds = sys.argv[1], int(sys.argv[2])
    env = {"ARROW_DEFAULT_MEMORY_POOL": "jemalloc", "JE_ARROW_MALLOC_CONF": "dirty_decay_ms:5000"}
    cl = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None, env=env)
    addr = cl.scheduler_address
    arms = {"one process": [], "whole": ["--scheduler", addr], "blocks": ["--scheduler", addr, "--set", "cluster.whole_on_one_worker=false"]}
    for k in range(rounds):
        for arm, extra in arms.items():
            out = "/tmp/clab-" + arm.replace(" ", "-")
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run([".venv/bin/gpu-dedup", "run", corpus, "-o", out, "-q", "--no-shards", *extra], check=True,
                           stderr=subprocess.DEVNULL)
            wall = time.perf_counter() - t
            r = json.load(open(f"{out}/report.json"))
            print(json.dumps({"round": k, "arm": arm, "wall": round(wall, 2), "report_wall": r["wall_seconds"],
                              "stages": {k: v["seconds"] for k, v in r["stages"].items()}, "fixed": r["fixed_seconds"],
                              "cluster": r.get("cluster", {}).get("run", r.get("cluster", {}).get("blocks"))}), flush=True)
        d = [open(f"/tmp/clab-{a.replace(' ', '-')}/duplicates.parquet", "rb").read() for a in arms]
        print("duplicates.parquet equal:", all(x == d[0] for x in d), flush=True)
    cl.close()
