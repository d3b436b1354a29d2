"""Stage benchmark: read, normalize and write, each next to its own limit on the same data.

    gpu-dedup bench stages [--docs 100000] [--no-man] [--jsonl-mb 700] [--results DIR]

For each corpus (a planted corpus of ``--docs`` documents, and the Debian
manual pages when /usr/share/man has them) the table gives, per stage, our
throughput, the limit's throughput on the same bytes in the same process, and
their ratio:

* read Parquet: ``read`` of one shard (streamed, a batch of pages at a time) against
  ``pyarrow.parquet.read_table`` of the same file and the same columns;
* read JSONL: ``read`` (streamed, a block of lines at a time) against reading the file's bytes;
* read + normalize: ``read`` handing each batch's text to ``normalize_counted`` as it is read
  (what a run does: reading overlaps normalizing) against ``read_table`` then ``normalize_counted``
  one after the other;
* normalize: ``normalize_counted`` (the default NFKC, lowercase, punctuation,
  whitespace) against a memory copy of the text bytes and against one
  ``decode_utf8`` pass over every document (parallel, like ours);
* write Parquet: ``storage.write_shard`` (streams the shard, filters it, writes it in the shard's
  own codec: ``output.compression: same``) against the same three steps in plain pyarrow calls,
  against ``pyarrow.parquet.write_table`` of the same kept table with the same codec (no read, no
  filter), and against the codec alone on the same text bytes; the planted shards are written with
  zstd and with snappy (what pandas writes);
* write JSONL: ``write_shard`` against writing the kept lines' bytes.

MB/s counts the stage's input bytes: the file for read, the text for
normalize, the kept table (Arrow bytes) for write.  Each timing is the best
of ``--repeat`` runs.  ``--jsonl-mb`` adds a peak-memory check: a JSONL file
of about that size is read in a child process, and its VmHWM (peak resident
set) is reported as a multiple of the file size: the read stage as a run does it, each block's text
normalized as it is read and the raw text dropped.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.bench import machine, scratch, write_results
from gpu_dedup.bench.argtypes import non_negative_int, positive_int
from gpu_dedup.config import InputConfig, NormalizeConfig
from gpu_dedup.evaluation.sample import planted_corpus
from gpu_dedup.kernels.text_cpu import dev as _text_dev
from gpu_dedup.stages.normalize import normalize_counted, raw_buffers, repair_utf8
from gpu_dedup.stages.read import read
from gpu_dedup.storage import discover, write_shard

_decode = _text_dev.decode_utf8


@numba.njit(parallel=True, cache=True)
def _decode_pass(data, starts, ends, tasks, out):
    """One decode_utf8 pass over every document (the floor of any per-code-point kernel)."""
    for t in numba.prange(tasks.shape[0] - 1):
        acc = 0
        for k in range(tasks[t], tasks[t + 1]):
            pos = starts[k]
            end = ends[k]
            while pos < end:
                cp, pos = _decode(data, pos, end)
                acc += cp
        out[t] = acc


def _best(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _row(stage: str, mb: float, ours: float, limit: float, limit_name: str) -> dict:
    return {"stage": stage, "mb": round(mb, 1), "ours_s": round(ours, 4), "limit_s": round(limit, 4),
            "ours_mb_s": round(mb / ours, 1), "limit_mb_s": round(mb / limit, 1), "ratio": round(limit / ours, 3),
            "limit": limit_name}


def write_jsonl(table: pa.Table, path: Path, repeat: int = 1) -> Path:
    """JSON Lines with the text, an id and a metadata object per line (a crawl shard's shape)."""
    texts = table.column("text").to_pylist()
    ids = table.column("id").to_pylist()
    with open(path, "w", encoding="utf-8") as f:
        for r in range(repeat):  # benchmark data generation, once per run
            for i, (doc_id, text) in enumerate(zip(ids, texts)):
                f.write(json.dumps({"id": f"{doc_id}-{r}", "text": text,
                                    "meta": {"url": f"https://example.org/{r}/{i}", "lang": "en",
                                             "quality": round((i * 7919 % 1000) / 1000, 3), "tags": ["a", "b"]}},
                                   ensure_ascii=False))
                f.write("\n")
    return path


def bench_corpus(name: str, table: pa.Table, tmp: Path, repeat: int, codecs=("zstd",)) -> list[dict]:
    cfg = InputConfig(text_column="text", id_column="id")
    norm_cfg = NormalizeConfig()
    table = table.select(["id", "text"]).combine_chunks()
    pq_paths = {codec: tmp / f"{name}-{codec}.parquet" for codec in codecs}
    for codec, path in pq_paths.items():
        pq.write_table(table, path, compression=codec)
    pq_path = pq_paths[codecs[0]]
    js_path = write_jsonl(table, tmp / f"{name}.jsonl")
    rows = []
    for path, fmt in ((pq_path, "parquet"), (js_path, "jsonl")):
        shards = discover([str(path)])
        mb = os.path.getsize(path) / 1e6
        ours = _best(lambda: read(shards, cfg), repeat)
        if fmt == "parquet":
            limit = _best(lambda: pq.read_table(path, columns=["text", "id"]), repeat)
            rows.append(_row("read parquet", mb, ours, limit, "pq.read_table, same columns"))
        else:
            limit = _best(lambda: Path(path).read_bytes(), repeat)
            rows.append(_row("read jsonl", mb, ours, limit, "read the file's bytes"))
    corpus = read(discover([str(pq_path)]), cfg)
    text = corpus.text
    data, starts, ends = raw_buffers(text.chunk(0) if text.num_chunks == 1 else text.combine_chunks())
    mb = int(ends[-1] - starts[0]) / 1e6 if len(starts) else 0.0
    shards = discover([str(pq_path)])
    ours = _best(lambda: read(shards, cfg, text=lambda column: normalize_counted(column, norm_cfg)), repeat)
    limit = _best(lambda: normalize_counted(pq.read_table(pq_path, columns=["text", "id"]).column("text"), norm_cfg),
                  repeat)
    rows.append(_row("read + normalize", mb, ours, limit, "pq.read_table, then normalize"))
    ours = _best(lambda: normalize_counted(text, norm_cfg), repeat)
    ours_runner = _best(lambda: normalize_counted(repair_utf8(text)[0], norm_cfg), repeat)
    copy = _best(lambda: data.copy(), repeat)
    tasks = np.linspace(0, len(starts), 8 * numba.get_num_threads() + 1).astype(np.int64)
    acc = np.zeros(tasks.shape[0] - 1, np.int64)
    _decode_pass(data, starts, ends, tasks, acc)  # compile
    decode = _best(lambda: _decode_pass(data, starts, ends, tasks, acc), repeat)
    rows.append(_row("normalize", mb, ours, copy, "memory copy of the text bytes"))
    rows.append(_row("normalize", mb, ours, decode, "one decode_utf8 pass"))
    rows.append(_row("repair+normalize", mb, ours_runner, decode, "one decode_utf8 pass"))
    keep = np.ones(table.num_rows, bool)
    keep[::10] = False  # a tenth removed
    kept = table.filter(pa.array(keep))
    mb = kept.nbytes / 1e6
    out = tmp / "out"
    for codec, path in pq_paths.items():
        shard = discover([str(path)])[0]
        ours = _best(lambda: write_shard(shard, keep, out), repeat)  # output.compression: same

        def plain():  # the same work in plain pyarrow calls: read every column, filter, write
            pq.write_table(pq.read_table(path).filter(pa.array(keep)), tmp / "limit.parquet", compression=codec)

        limit = _best(plain, repeat)
        rows.append(_row("write parquet", mb, ours, limit, f"{codec} shard: pq.read_table + filter + pq.write_table"))
        limit = _best(lambda: pq.write_table(kept, tmp / "limit.parquet", compression=codec), repeat)
        rows.append(_row("write parquet", mb, ours, limit, f"{codec} shard: pq.write_table of the kept table"))
        limit = _best(lambda: pq.read_table(path), repeat)
        rows.append(_row("write parquet", mb, ours, limit, f"{codec} shard: pq.read_table of it (reading it)"))
        tdata, ts, te = raw_buffers(kept.column("text").combine_chunks())
        limit = _best(lambda: pa.compress(tdata, codec), repeat)
        rows.append(_row("write parquet", mb, ours, limit, f"{codec} shard: {codec} of the kept text bytes"))
    shard = discover([str(js_path)])[0]
    ours = _best(lambda: write_shard(shard, keep, out), repeat)
    body = Path(out / shard.name).read_bytes()
    limit = _best(lambda: Path(tmp / "limit.jsonl").write_bytes(body), repeat)
    rows.append(_row("write jsonl", len(body) / 1e6, ours, limit, "write the kept lines' bytes"))
    for r in rows:
        r["corpus"] = name
    return rows


_CHILD = r"""
import sys
from gpu_dedup.config import InputConfig
from gpu_dedup.stages.normalize import normalize_counted
from gpu_dedup.stages.read import read
from gpu_dedup.storage import discover
c = read(discover([sys.argv[1]]), InputConfig(text_column="text", id_column="id"), text=normalize_counted)
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
print(c.table.num_rows, hwm * 1024)
"""


def jsonl_peak_memory(tmp: Path, target_mb: int) -> dict:
    """Peak RSS (VmHWM) of a child process that reads one ~``target_mb`` MB JSONL shard."""
    base = planted_corpus(20_000, 400, seed=3).table.select(["id", "text"])
    one = write_jsonl(base, tmp / "unit.jsonl").stat().st_size
    path = write_jsonl(base, tmp / "big.jsonl", repeat=max(1, round(target_mb * 1e6 / one)))
    baseline = subprocess.run([sys.executable, "-c", "import gpu_dedup.stages.read, gpu_dedup.kernels.lines_cpu\n"
                               "print(next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM')) * 1024)"],
                              capture_output=True, text=True, check=True)
    t = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, str(path)], capture_output=True, text=True, check=True)
    seconds = time.perf_counter() - t
    rows, hwm = map(int, proc.stdout.split())
    size = path.stat().st_size
    return {"file_mb": round(size / 1e6, 1), "rows": rows, "peak_rss_mb": round(hwm / 1e6, 1),
            "import_rss_mb": round(int(baseline.stdout) / 1e6, 1), "peak_over_file": round(hwm / size, 2),
            "child_seconds": round(seconds, 2), "mb_per_s_including_start": round(size / 1e6 / seconds, 1)}


def _markdown(rows, mem, info) -> str:
    lines = [f"# Stage throughput against limits ({info['date']})", "",
             f"Machine: {info['machine']['cpu']}, {info['machine']['cores']} cores; {info['note']}", "",
             "| corpus | stage | MB | ours MB/s | limit MB/s | ratio | limit |", "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['corpus']} | {r['stage']} | {r['mb']} | {r['ours_mb_s']} | {r['limit_mb_s']} | "
                     f"{r['ratio']} | {r['limit']} |")
    if mem:
        lines += ["", "JSONL read peak memory (child process, VmHWM):", "",
                  f"{mem['file_mb']} MB file, {mem['rows']} rows: peak RSS {mem['peak_rss_mb']} MB "
                  f"= {mem['peak_over_file']}x the file (imports alone: {mem['import_rss_mb']} MB), "
                  f"{mem['mb_per_s_including_start']} MB/s including interpreter start"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="gpu-dedup bench stages", description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=positive_int, default=100_000,
                    help="documents of the planted corpus (default 100000)")
    ap.add_argument("--no-man", action="store_true", help="skip the Debian manual pages corpus")
    ap.add_argument("--repeat", type=positive_int, default=3, help="runs per timing, best taken (default 3)")
    ap.add_argument("--jsonl-mb", type=non_negative_int, default=0,
                    help="also measure peak memory reading a JSONL file of this "
                    "many MB (e.g. 700; 0: skip)")
    ap.add_argument("--results", default=None, help="write stages.json / stages.md to this directory")
    ap.add_argument("--workdir", default=None, help="directory for the temporary files (default: system temp)")
    args = ap.parse_args(argv)
    rows = []
    with scratch(args.workdir) as tmp:
        tmp = Path(tmp)
        corpora = [(f"planted-{args.docs // 1000}k", lambda: planted_corpus(args.docs, max(1, args.docs // 20), seed=1).table)]
        if not args.no_man:
            from gpu_dedup.evaluation.datasets import debian_man

            corpora.append(("debian-man", debian_man))
        for name, load in corpora:
            try:
                table = load()
            except Exception as exc:  # no manual pages installed: say so and go on
                print(f"skipping {name}: {exc}")
                continue
            if table.num_rows == 0:
                print(f"skipping {name}: no documents")
                continue
            (tmp / name).mkdir()
            rows += bench_corpus(name, table, tmp / name, args.repeat,
                                 codecs=("zstd", "snappy") if name.startswith("planted") else ("zstd",))
        mem = jsonl_peak_memory(tmp, args.jsonl_mb) if args.jsonl_mb else None
    info = {"date": _dt.date.today().isoformat(), "machine": machine(), "threads": numba.get_num_threads(),
            "note": "best of %d runs per timing, ours and limit side by side in one process" % args.repeat}
    print(f"{'corpus':<14} {'stage':<18} {'MB':>8} {'ours MB/s':>10} {'limit MB/s':>11} {'ratio':>6}  limit")
    for r in rows:
        print(f"{r['corpus']:<14} {r['stage']:<18} {r['mb']:>8} {r['ours_mb_s']:>10} {r['limit_mb_s']:>11} "
              f"{r['ratio']:>6}  {r['limit']}")
    if mem:
        print(f"JSONL read: {mem['file_mb']} MB file -> peak RSS {mem['peak_rss_mb']} MB = {mem['peak_over_file']}x "
              f"the file (imports alone {mem['import_rss_mb']} MB), {mem['mb_per_s_including_start']} MB/s "
              "including interpreter start")
    if args.results:
        write_results(args.results, "stages", {**info, "rows": rows, "jsonl_memory": mem}, _markdown(rows, mem, info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
