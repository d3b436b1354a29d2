"""gpu-dedup run at 10^6 docs, two installs taken in turn: ab_install.py CORPUS ROUNDS OLD_GPU_DEDUP NEW_GPU_DEDUP
(each the gpu-dedup executable of a venv holding one commit); MODES=list,shards picks the modes."""
import json, os, subprocess, sys, time, shutil
corpus, rounds = sys.argv[1], int(sys.argv[2])
exes = {"old": sys.argv[3], "new": sys.argv[4]}
modes = {k: v for k, v in {"list": ["--no-shards"], "shards": []}.items() if k in os.environ.get("MODES", "list,shards").split(",")}
for r in range(rounds):
    for mode, extra in modes.items():
        for name, exe in exes.items():
            out = f"ab-out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            t = time.perf_counter()
            subprocess.run([exe, "run", corpus, "-o", out, "-q", "--backend", "cpu", *extra], check=True)
            wall = time.perf_counter() - t
            rep = json.load(open(f"{out}/report.json"))
            st = {k: v["seconds"] for k, v in rep["stages"].items()}
            print(json.dumps({"round": r, "mode": mode, "code": name, "wall": round(wall, 2),
                              "read": st["read"], "normalize": st["normalize"], "exact": st["exact"], "signatures": st["signatures"],
                              "write": st["write"], "peak_rss_mb": rep["peak_rss_mb"]}), flush=True)
        a, b = (open(f"ab-out-{n}/duplicates.parquet", "rb").read() for n in ("old", "new"))
        print("duplicates.parquet equal:", a == b, flush=True)
