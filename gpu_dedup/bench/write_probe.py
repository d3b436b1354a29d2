"""Where the GPU write stage's time goes: the shards written from the device table the read stage held.

On one H200 (2026-11-29) the write stage took 1.21-1.35 s of a 1.9-2.6 s run for 10^6 documents in 16 shards
(5.4 s for 10^7 in 160 shards): one libcudf write of every file from the held table, each file's schema and row
count read back, and each file's SHA-256 on a thread per shard.  This probe times those parts apart, each in a
fresh process per variant, since libcudf reads its I/O settings once:

* ``default``: as a run writes (into a folder beside the corpus; KvikIO's thread pool, which reads and writes
  libcudf's files, one thread per core up to 16: :func:`gpu_dedup.backends.gpu_probe.io_threads`; one libcudf
  write of every shard, ``gpu_dedup.run.local.DEVICE_WRITE_STREAMS``);
* ``streams``: a libcudf write per shard, 16 at once, each from its own thread on its own CUDA stream, each
  file checked and digested on its thread as soon as it is written;
* ``kvikio1``: ``KVIKIO_NTHREADS=1`` (KvikIO's own default);
* ``policy-off``: ``LIBCUDF_CUFILE_POLICY=OFF`` (libcudf's own host sink instead of KvikIO);
* ``tmpfs``: the files into ``/dev/shm`` (the disk left out: encoding and the copy to host memory only);
* ``uncompressed``: no compression codec (the device's compression left out);
* ``buffered``: ``KVIKIO_AUTO_DIRECT_IO_WRITE=0``, KvikIO's writes through the page cache (with its opportunistic
  ``O_DIRECT`` writes the digests read every file back from the disk: 0.49-0.53 s on disk against 0.10 s in tmpfs
  on 2026-11-30);
* ``host-sink``: libcudf writes each file into host memory (an ``io.BytesIO``), and a thread per file writes those
  bytes, syncs and checks the file and takes its SHA-256 from them: nothing is read back from the disk (the write
  stage's ``host_sink``, ``gpu_dedup.run.local.DEVICE_WRITE_HOST_SINK``).

Each variant reports: the one-call read of every shard (``read_table``), the write of every shard (libcudf's
alone), twice (the first includes libcudf's first-use costs), the files' check, their digests on a thread per file,
the bytes written, and ``stage``: the write, check and digests as the write stage does them
(:func:`gpu_dedup.storage.filter.write_shards_on_device`), the sum a run waits for.

    python -m gpu_dedup.bench.write_probe CORPUS_DIR [--out FILE] [--variants default tmpfs ...]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from gpu_dedup import backends
from gpu_dedup.run.contract import shard_starts
from gpu_dedup.storage.atomic import no_busy, written_digest
from gpu_dedup.storage.discovery import discover
from gpu_dedup.run.local import DEVICE_WRITE_STREAMS
from gpu_dedup.storage.filter import resolve_codec, write_shards_on_device, written_difference
from gpu_dedup.storage.parquet import footer

VARIANTS = {  # the environment each variant's process runs with
    "default": {},
    "streams": {},
    "kvikio1": {"KVIKIO_NTHREADS": "1"},
    "policy-off": {"LIBCUDF_CUFILE_POLICY": "OFF"},
    "tmpfs": {},
    "uncompressed": {},
    "buffered": {"KVIKIO_AUTO_DIRECT_IO_WRITE": "0"},
    "host-sink": {},
}
STREAMS = 16  # the streams variant's writes at once
SHM = Path("/dev/shm")


def _timed(fn, *args, **kw):
    t = time.perf_counter()
    out = fn(*args, **kw)
    return out, round(time.perf_counter() - t, 4)


def probe_once(corpus: Path, variant: str, keep_share: float = 0.94) -> dict:
    """One variant's timings, in this process (libcudf's I/O settings are those of its environment)."""
    paths = sorted(corpus.glob("*.parquet"))
    if not paths:
        raise SystemExit(f"no Parquet shards in {corpus}")
    shards = [s.with_rows(footer(s).metadata.num_rows) for s in discover(paths)]  # as the read stage leaves them
    be = backends.get_backend("gpu")
    if be.info.get("frames") != "cudf":
        return {"variant": variant, "error": "cuDF is not installed: the device writer does not run"}
    codec = "none" if variant == "uncompressed" else resolve_codec("same", shards[0])
    starts = shard_starts(shards)
    n = int(starts[-1])
    keep = np.random.default_rng(0).random(n) < keep_share
    held, read_s = _timed(be.read_table, shards)
    if held is None:
        return {"variant": variant, "error": "libcudf did not read the shards as one table"}
    base = SHM if variant == "tmpfs" and SHM.is_dir() else corpus.parent
    res = {"variant": variant, "env": {k: v for k, v in os.environ.items() if k.startswith(("KVIKIO", "LIBCUDF"))},
           "shards": len(shards), "rows": n, "codec": codec, "target": str(base), "seconds": {"read_table": read_s}}
    st = res["seconds"]
    streams = STREAMS if variant == "streams" else DEVICE_WRITE_STREAMS
    res["streams"] = streams
    with tempfile.TemporaryDirectory(prefix="write-probe-", dir=base) as work:
        if variant == "host-sink":
            return _host_sink(res, be, held, shards, starts, keep, codec, Path(work))
        for attempt in ("write_first", "write"):
            targets = [str(Path(work) / f"{attempt}-{s.name}") for s in shards]
            rows, st[attempt] = _timed(be.write_table, held, starts, keep, targets, codec, streams)
        if rows is None:
            res["error"] = "the device writer declined these shards"
            return res

        checked, st["check"] = _timed(lambda: [written_difference(t, s, r) for t, s, r in zip(targets, shards, rows)])
        with ThreadPoolExecutor(max(1, min(len(targets), os.cpu_count() or 1))) as pool:
            _, st["digests"] = _timed(lambda: list(pool.map(written_digest, targets)))
        res["rows_ok"] = not any(checked)
        res["bytes_written"] = sum(os.path.getsize(t) for t in targets)
        res["input_bytes"] = sum(os.path.getsize(p) for p in paths)
        published, st["stage"] = _timed(write_shards_on_device, shards, keep, starts, Path(work) / "stage", codec,
                                        held, be.write_table, streams)
        res["stage_published"] = len(published)
    return res


def _host_sink(res: dict, be, held, shards: list, starts, keep, codec: str, work: Path) -> dict:
    """The ``host-sink`` variant: every file encoded on the device into host memory in one libcudf call (``write``,
    twice), then the write stage's own call with ``host_sink`` (``stage``; ``files``: its seconds after the
    encoding, each file written, synced, checked and digested from memory on a thread of its own)."""
    st = res["seconds"]
    for attempt in ("write_first", "write"):
        rows, st[attempt] = _timed(be.write_table, held, starts, keep, [io.BytesIO() for _ in shards], codec, 1)
        if rows is None:
            res["error"] = "the device writer declined these shards"
            return res
    times = no_busy()
    published, st["stage"] = _timed(write_shards_on_device, shards, keep, starts, work / "stage", codec, held,
                                    be.write_table, 1, times, host_sink=True)
    st["files"] = times.get("device_files_seconds", 0.0)
    res["stage_published"] = len(published)
    res["rows_ok"] = len(published) == len(shards)
    res["bytes_written"] = sum(r["size"] for r in published.values())
    res["input_bytes"] = sum(os.path.getsize(s.path) for s in shards)
    # untimed: the digests taken from memory are the files' own (read back from the disk here)
    res["digests_match"] = all(r["sha256"] == written_digest(work / "stage" / r["name"])["sha256"]
                               for r in published.values())
    return res


def probe(corpus: Path, variants=tuple(VARIANTS), python: str = sys.executable, cap: float = 60.0,
          log=print) -> list:
    """Every variant in a fresh process (its environment set before libcudf loads): a row each."""
    rows = []
    for v in variants:
        env = {**os.environ, **VARIANTS[v]}
        t = time.perf_counter()
        try:
            done = subprocess.run([python, "-m", "gpu_dedup.bench.write_probe", str(corpus), "--one", v],
                                  env=env, capture_output=True, text=True, timeout=cap)
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else \
                {"variant": v, "error": (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]}
        except subprocess.TimeoutExpired:
            row = {"variant": v, "error": f"stopped after {cap:.0f}s"}
        row["process_seconds"] = round(time.perf_counter() - t, 2)
        log(f"write probe {v}: " + (row["error"] if "error" in row else
                                    " ".join(f"{k} {s:.3f}s" for k, s in row["seconds"].items())))
        rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", type=Path, help="a folder of Parquet shards")
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--one", choices=list(VARIANTS), help=argparse.SUPPRESS)  # a child process: one variant
    ap.add_argument("--out", type=Path)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(probe_once(args.corpus, args.one)))
        return 0
    rows = probe(args.corpus, args.variants)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))
    return 0 if not any("error" in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
