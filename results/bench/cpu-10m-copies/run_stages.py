"""One removal-list run of the corpus make_corpus.py writes, on the CPU: the wall and the stages that group rows.

    PYTHONPATH=REPO python run_stages.py CORPUS OUT
"""
import shutil
import sys

from gpu_dedup.config import Config
from gpu_dedup.run.entry import run_dedup

shutil.rmtree(sys.argv[2], ignore_errors=True)
r = run_dedup(sys.argv[1], sys.argv[2], Config.from_dict({"backend": "cpu", "input": {"id_column": "id"},
                                                           "output": {"shards": False}}))
s = r.report["stages"]
print(r.report["wall_seconds"], {k: s[k]["seconds"] for k in ("exact", "components", "select", "write")},
      s["write"].get("frames_parts_seconds"), flush=True)
