"""Where the GPU write stage's time goes: one shard of the end-to-end corpus, step by step.

On the first tier-2 call (one H100, cuDF 26.10) the write stage took 17 to 18 s for 10^6 documents in 16
shards, one shard at a time through cuDF, against 2.2 s for pyarrow on 16 cores.  This times, on the
device: cuDF's read of a whole shard, the filter, the write with the shard's codec, with snappy and with
none, the SHA-256 of the output, pyarrow's read-filter-write of the same shard, and the GPU backend's
writer on 4 shards one after the other and 4 at once.

    python -m gpu_dedup.bench.write_probe CORPUS_DIR [--out FILE]     # CORPUS_DIR: a folder of Parquet shards
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.backends import get_backend
from gpu_dedup.storage.atomic import file_digest
from gpu_dedup.storage.discovery import discover
from gpu_dedup.storage.filter import resolve_codec


def _timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, round(time.perf_counter() - t, 4)


def probe(corpus: Path, work: Path) -> dict:
    import cudf

    from gpu_dedup.backends.gpu import CUDF_CODECS  # CUDA: imported on the device only

    paths = sorted(p for p in corpus.rglob("*.parquet"))
    if not paths:
        raise SystemExit(f"no Parquet shards under {corpus}")
    shards = discover(paths)
    src = str(paths[0])
    meta = pq.ParquetFile(src).metadata
    codec = resolve_codec("same", shards[0])
    rows = meta.num_rows
    keep = np.random.default_rng(0).random(rows) < 0.94
    env = {k: v for k, v in os.environ.items() if k.startswith(("LIBCUDF", "KVIKIO", "CUFILE", "RMM", "CUDF"))}
    res = {"shard": src, "rows": rows, "bytes": os.path.getsize(src), "codec": codec, "env": env,
           "cudf": cudf.__version__, "steps": {}}
    st = res["steps"]
    be = get_backend("gpu")
    _, st["cudf_read_first"] = _timed(cudf.read_parquet, src)
    frame, st["cudf_read"] = _timed(cudf.read_parquet, src)
    mask = cudf.Series(keep)
    kept, st["filter"] = _timed(lambda: frame[mask])
    names = {"same": CUDF_CODECS.get(codec, "ZSTD"), "snappy": "snappy", "none": None}
    for label, c in names.items():
        dst = work / f"cudf-{label}.parquet"
        _, st[f"cudf_write_{label}"] = _timed(kept.to_parquet, dst, compression=c, index=False)
        res[f"bytes_{label}"] = os.path.getsize(dst)
    _, st["sha256"] = _timed(file_digest, work / "cudf-same.parquet")
    _, st["read_schema"] = _timed(pq.read_schema, src)
    table, st["pyarrow_read"] = _timed(pq.read_table, src)
    ktab, st["pyarrow_filter"] = _timed(table.filter, pa.array(keep))
    _, st["pyarrow_write"] = _timed(pq.write_table, ktab, work / "pa.parquet", compression=codec)
    # the backend's writer (what the write stage calls), 4 shards one after the other, then 4 at once
    four = [str(p) for p in paths[:4]]
    keeps = [np.random.default_rng(i).random(pq.ParquetFile(p).metadata.num_rows) < 0.94 for i, p in enumerate(four)]

    def one(i):
        return be.write_parquet_cudf(four[i], keeps[i], str(work / f"w{i}.parquet"), codec)

    _, st["backend_writer_4_serial"] = _timed(lambda: [one(i) for i in range(len(four))])
    for threads in (4, 8):
        with ThreadPoolExecutor(threads) as pool:
            _, st[f"backend_writer_4_threads{threads}"] = _timed(lambda: list(pool.map(one, range(len(four)))))
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="write-probe-") as work:
        res = probe(args.corpus, Path(work))
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
