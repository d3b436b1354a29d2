"""Removal-list runs at 10^6 docs: report samples from the pages that hold them (new) vs the row groups (old)."""
import json, subprocess, sys, time, shutil
corpus, rounds = sys.argv[1], int(sys.argv[2])  # planted shards: gpu_dedup.bench.corpora.planted_dir(root, 10**6)
py = sys.executable
code = {"old": "import importlib; importlib.import_module('gpu_dedup.stages.read').take_pages = lambda *a, **k: None\n",
        "new": ""}
for r in range(rounds):
    for name, pre in code.items():
        out = f"ab-out-{name}"
        shutil.rmtree(out, ignore_errors=True)
        t = time.perf_counter()
        subprocess.run([py, "-c", pre + f"from gpu_dedup.cli import main; raise SystemExit(main(['run', '{corpus}', '-o', '{out}', '-q', '--backend', 'cpu', '--no-shards']))"], check=True)
        wall = time.perf_counter() - t
        rep = json.load(open(f"{out}/report.json"))
        print(json.dumps({"round": r, "code": name, "wall": round(wall, 2), "report_wall": rep["wall_seconds"],
                          "samples": rep["fixed_seconds"]["samples"], "peak_rss_mb": rep["peak_rss_mb"]}), flush=True)
a, b = (json.load(open(f"ab-out-{n}/report.json")) for n in ("old", "new"))
print("samples equal:", all(a[k] == b[k] for k in ("largest_clusters", "largest_near_duplicate_clusters", "closest_to_threshold")))
