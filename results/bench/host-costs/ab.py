"""Whole `gpu-dedup run` commands on one corpus, arms taken in turn, every mode each round; one JSON line per run.

    python ab.py CORPUS ROUNDS NAME=GPU_DEDUP[,VAR=VALUE...] ...

Each arm is the gpu-dedup executable of a venv (one commit each) and the environment variables it runs with
(VAR= alone: unset). MODES=list,shards picks the modes: a removal list (--no-shards) and written shards; EXTRA="--set KEY=VALUE ..."
adds options to every run (e.g. EXTRA="--set similarity=cosine --set lsh.threshold=0.9" for cosine-text).
The corpus: planted shards, e.g. gpu_dedup.bench.corpora.planted_dir(root, 10**6).
  pool.jsonl:  ab.py CORPUS 3 mimalloc=.venv/bin/gpu-dedup,ARROW_DEFAULT_MEMORY_POOL=mimalloc \\
                              default=.venv/bin/gpu-dedup,ARROW_DEFAULT_MEMORY_POOL=
  join.jsonl:  ab.py CORPUS 3 old=OLD/bin/gpu-dedup new=NEW/bin/gpu-dedup
  decay.jsonl: ab.py CORPUS 3 kept=.venv/bin/gpu-dedup,JE_ARROW_MALLOC_CONF= \\
                              at-once=.venv/bin/gpu-dedup,JE_ARROW_MALLOC_CONF=dirty_decay_ms:0
  no-pandas-*.jsonl: ab.py CORPUS 7 old=OLD/bin/gpu-dedup,PYTHONDONTWRITEBYTECODE= new=NEW/bin/gpu-dedup,PYTHONDONTWRITEBYTECODE=
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time

corpus, rounds = sys.argv[1], int(sys.argv[2])
arms = {}
for spec in sys.argv[3:]:
    name, rest = spec.split("=", 1)
    exe, *assignments = rest.split(",")
    env = dict(os.environ)
    for a in assignments:
        var, value = a.split("=", 1)
        env.pop(var, None)
        if value:
            env[var] = value
    arms[name] = (exe, env)
modes = {k: v for k, v in {"list": ["--no-shards"], "shards": []}.items()
         if k in os.environ.get("MODES", "list,shards").split(",")}
for r in range(rounds):
    for mode, extra in modes.items():
        for name, (exe, env) in arms.items():
            out = f"ab-out-{name}"
            shutil.rmtree(out, ignore_errors=True)
            t, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([exe, "run", corpus, "-o", out, "-q", "--backend", "cpu", *extra,
                            *os.environ.get("EXTRA", "").split()], check=True, env=env)
            wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = {"user_s": round(after.ru_utime - before.ru_utime, 2),
                   "sys_s": round(after.ru_stime - before.ru_stime, 2)}
            rep = json.load(open(f"{out}/report.json"))
            st = {k: v["seconds"] for k, v in rep["stages"].items()}
            print(json.dumps({"round": r, "mode": mode, "arm": name, "pool": rep["machine"].get("arrow_memory_pool"),
                              "wall": round(wall, 2), **cpu, **st, "fixed": rep.get("fixed_seconds", {}),
                              "peak_rss_mb": rep["peak_rss_mb"]}), flush=True)
        first, *others = (open(f"ab-out-{n}/duplicates.parquet", "rb").read() for n in arms)
        print("duplicates.parquet equal:", all(o == first for o in others), flush=True)
