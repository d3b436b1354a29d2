"""Footer reads of a corpus's Parquet shards during one whole `gpu-dedup run`, and its store requests.

    python footers.py local   CORPUS [RUN FLAGS...]   # in this process: footer reads by shard and by caller
    python footers.py s3      CORPUS [RUN FLAGS...]   # the shards in moto's S3 server on 127.0.0.1: requests too
    python footers.py cluster CORPUS [RUN FLAGS...]   # the gpu-dedup command beside this python, with its
                                                      # workers (--workers N): footer reads per process

A footer read is a ``pq.ParquetFile`` made without ``metadata=`` over a shard (pyarrow reads the FileMetaData
then) or a ``pq.read_schema`` / ``pq.read_metadata`` of one.  The gpu_dedup measured is the one installed
for the python that runs this script (run it with each venv's python for an A/B).  The output directory is
a temporary one, removed.  One JSON line.
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))

COUNTER = '''
import atexit, collections, json, os, traceback
import pyarrow.parquet as pq, pyarrow.parquet.core as core

ROOT = os.environ["FOOTERS_ROOT"]  # a directory, or bucket/prefix of objects
READS, CALLERS = collections.Counter(), collections.Counter()


def _path(src):
    if isinstance(src, (str, os.PathLike)):
        return os.path.realpath(src)
    name = getattr(src, "path", None) or getattr(src, "name", None)  # an fsspec file: bucket/key
    return name if isinstance(name, str) else None


def _count(src):
    path = _path(src)
    if path and path.startswith(ROOT + "/"):
        READS[path[len(ROOT) + 1:]] += 1
        frames = [f for f in traceback.extract_stack()[:-2] if "gpu_dedup" in f.filename]
        CALLERS[f"{os.path.basename(frames[-1].filename)}:{frames[-1].name}" if frames else "?"] += 1


class Counting(core.ParquetFile):
    def __init__(self, source, *args, metadata=None, **kwargs):
        if metadata is None:
            _count(source)
        super().__init__(source, *args, metadata=metadata, **kwargs)


def _counted(fn):
    def wrapper(where, *args, **kwargs):
        _count(where)
        return fn(where, *args, **kwargs)
    return wrapper


for module in (pq, core):
    module.ParquetFile = Counting
    module.read_schema = _counted(core.read_schema)
    module.read_metadata = _counted(core.read_metadata)

if os.environ.get("FOOTERS_LOG"):
    @atexit.register
    def _dump():
        if READS:
            with open(os.environ["FOOTERS_LOG"], "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "reads": READS, "callers": CALLERS}) + "\\n")
'''


def _summary(reads: collections.Counter, shards: int) -> dict:
    return {"shards": shards, "footer_reads": sum(reads.values()),
            "per_shard": sorted(set(reads.values())) if reads else [0]}


def _counter(root: str) -> dict:
    os.environ["FOOTERS_ROOT"] = root
    scope: dict = {}
    exec(COUNTER, scope)  # noqa: S102 - the counter above, in this process
    return scope


def local(corpus: str, flags: list) -> dict:
    shards = len([p for p in os.listdir(corpus) if p.endswith(".parquet")])
    scope = _counter(os.path.realpath(corpus))
    from gpu_dedup.cli import main

    out = tempfile.mkdtemp(prefix="footers-")
    try:
        t = time.perf_counter()
        rc = main(["run", corpus, "-o", f"{out}/o", "-q", "--backend", "cpu", *flags])
        wall = time.perf_counter() - t
    finally:
        shutil.rmtree(out)
    return {"rc": rc, "wall_s": round(wall, 2), **_summary(scope["READS"], shards), "callers": dict(scope["CALLERS"])}


def s3(corpus: str, flags: list) -> dict:
    sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "tests", "storage"))  # s3server.py alone
    from s3server import S3Server, use

    server = S3Server()
    try:
        use(server)
        client = server.client()
        client.create_bucket(Bucket="corpus")
        names = sorted(p for p in os.listdir(corpus) if p.endswith(".parquet"))
        for name in names:
            client.upload_file(os.path.join(corpus, name), "corpus", f"in/{name}")
        scope = _counter("corpus/in")
        import s3fs

        requests, gets = collections.Counter(), collections.Counter()
        call = s3fs.S3FileSystem._call_s3

        async def counted(self, method, *args, **kwargs):
            requests[method] += 1
            if method == "get_object":
                gets[kwargs.get("Key")] += 1
            return await call(self, method, *args, **kwargs)

        s3fs.S3FileSystem._call_s3 = counted
        from gpu_dedup.cli import main

        out = tempfile.mkdtemp(prefix="footers-")
        try:
            t = time.perf_counter()
            rc = main(["run", "s3://corpus/in", "-o", f"{out}/o", "-q", "--backend", "cpu", *flags])
            wall = time.perf_counter() - t
        finally:
            shutil.rmtree(out)
        return {"rc": rc, "wall_s": round(wall, 2), **_summary(scope["READS"], len(names)),
                "requests": dict(requests), "gets_per_shard": sorted(set(gets.values())),
                "callers": dict(scope["CALLERS"])}
    finally:
        server.stop()


def cluster(corpus: str, flags: list) -> dict:
    shards = len([p for p in os.listdir(corpus) if p.endswith(".parquet")])
    site = tempfile.mkdtemp(prefix="footers-site-")
    out = tempfile.mkdtemp(prefix="footers-")
    try:
        with open(os.path.join(site, "sitecustomize.py"), "w") as f:  # every process of the run counts
            f.write(COUNTER)
        log = os.path.join(site, "reads.jsonl")
        env = dict(os.environ, FOOTERS_ROOT=os.path.realpath(corpus), FOOTERS_LOG=log,
                   PYTHONPATH=os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p))
        exe = os.path.join(os.path.dirname(sys.executable), "gpu-dedup")
        t = time.perf_counter()
        rc = subprocess.run([exe, "run", corpus, "-o", f"{out}/o", "-q", "--backend", "cpu", *flags], env=env,
                            check=False).returncode
        wall = time.perf_counter() - t
        rows = []
        if os.path.exists(log):
            with open(log) as f:
                rows = [json.loads(line) for line in f]
    finally:
        shutil.rmtree(site)
        shutil.rmtree(out)
    reads: collections.Counter = collections.Counter()
    for r in rows:
        reads.update(r["reads"])
    return {"rc": rc, "wall_s": round(wall, 2), **_summary(reads, shards),
            "per_process": [sum(r["reads"].values()) for r in rows]}


if __name__ == "__main__":
    mode, corpus, *flags = sys.argv[1:]
    try:
        got = {"local": local, "s3": s3, "cluster": cluster}[mode](corpus, flags)
    except Exception:  # noqa: BLE001 - printed, the line says which run failed
        traceback.print_exc()
        got = {"rc": "error"}
    print(json.dumps({"mode": mode, "flags": flags, **got}))
