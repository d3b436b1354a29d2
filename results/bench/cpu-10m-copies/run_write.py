"""One run of the corpus make_corpus.py writes, on the CPU, with shards or the removal list: the wall, every stage,
the fixed costs and the write stage's parts.

    PYTHONPATH=REPO python run_write.py CORPUS OUT shards|list
"""
import shutil
import sys

from gpu_dedup.config import Config
from gpu_dedup.run.entry import run_dedup

if __name__ == "__main__":
    shutil.rmtree(sys.argv[2], ignore_errors=True)
    r = run_dedup(sys.argv[1], sys.argv[2], Config.from_dict({"backend": "cpu", "input": {"id_column": "id"},
                                                              "output": {"shards": sys.argv[3] == "shards"}}))
    rep = r.report
    print("wall", rep["wall_seconds"], {k: v["seconds"] for k, v in rep["stages"].items()})
    print({k: v for k, v in rep.items() if k.endswith("seconds")})
    print("write", {k: v for k, v in rep["stages"]["write"].items() if "seconds" in k}, flush=True)
