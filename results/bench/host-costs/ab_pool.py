"""gpu-dedup run at 10^6 docs: Arrow pool mimalloc (chosen by ARROW_DEFAULT_MEMORY_POOL) vs the command's default."""
import json, os, subprocess, sys, time, shutil
corpus, rounds = sys.argv[1], int(sys.argv[2])  # planted shards: gpu_dedup.bench.corpora.planted_dir(root, 10**6)
exe = os.path.join(os.path.dirname(sys.executable), "gpu-dedup")
envs = {"mimalloc": {**os.environ, "ARROW_DEFAULT_MEMORY_POOL": "mimalloc"},
        "default": {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}}
modes = {"list": ["--no-shards"], "shards": []}
for r in range(rounds):
    for mode, extra in modes.items():
        for name, env in envs.items():
            out = f"ab-out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run([exe, "run", corpus, "-o", out, "-q", "--backend", "cpu", *extra], check=True, env=env)
            wall = time.perf_counter() - t
            rep = json.load(open(f"{out}/report.json"))
            st = {k: v["seconds"] for k, v in rep["stages"].items()}
            print(json.dumps({"round": r, "mode": mode, "pool": rep["machine"]["arrow_memory_pool"], "wall": round(wall, 2),
                              "read": st["read"], "normalize": st["normalize"], "write": st["write"],
                              "peak_rss_mb": rep["peak_rss_mb"]}), flush=True)
