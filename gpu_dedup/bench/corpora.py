"""The corpora and the output comparison the GPU and cluster benchmarks share: planted Parquet shards written once
and reused (:func:`planted_dir`), near-duplicate copies of them built in seconds (:func:`replicated_dir`), and
two output directories compared by bytes and by content (:func:`compare_outputs`)."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from gpu_dedup.evaluation.sample import planted_corpus, planted_embeddings, write_shards
from gpu_dedup.storage.content import file_difference

VECTOR_DIM = 256
# a corpus's marker, written last: what it holds (JSON). Named like _SUCCESS, not like a shard, so that a run over
# the folder skips it without a warning (its first name, _planted.json, looked like a JSON shard behind a private
# name); a marker under that name is renamed when found
MARKER = "_PLANTED"
LEGACY_MARKER = "_planted.json"


def marker_of(path: Path) -> Path:
    """The marker file of the corpus folder ``path`` (renamed from its former name where found)."""
    marker, legacy = path / MARKER, path / LEGACY_MARKER
    if not marker.is_file() and legacy.is_file():
        legacy.rename(marker)
    return marker


def planted_dir(root, n_docs: int, seed: int = 0, words=(60, 400), shards: int = 16, kind: str = "text",
                log=print) -> tuple:
    """(directory, payload bytes, rows) of planted Parquet shards under ``root``: text (id, text) or
    vectors (id, emb: ``VECTOR_DIM`` float32).  Written once; a later call with the same parameters
    finds them by their marker file (written last) and reuses them."""
    path = Path(root) / f"{kind}-{n_docs}-s{seed}-{shards}shards"
    spec = {"kind": kind, "docs": n_docs, "seed": seed, "words": list(words), "shards": shards, "dim": VECTOR_DIM}
    marker = marker_of(path)
    if marker.is_file():
        info = json.loads(marker.read_text())
        if info.get("spec") == spec:
            return path, info["bytes"], info["rows"]
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    if kind == "text":
        table = planted_corpus(n_docs=n_docs, n_clusters=max(1, n_docs // 40), words=words, seed=seed).table
        payload = int(pc.sum(pc.binary_length(table.column("text"))).as_py() or 0)
        table = table.select(["id", "text"])
    else:
        emb = planted_embeddings(n=n_docs, dim=VECTOR_DIM, n_clusters=max(1, n_docs // 10), seed=seed)
        table = emb.table("emb").select(["id", "emb"])
        payload = int(emb.vectors.nbytes)
    write_shards(table, path, shards=shards)
    marker.write_text(json.dumps({"spec": spec, "bytes": payload, "rows": table.num_rows,
                                  "seconds": round(time.perf_counter() - t0, 2)}))
    log(f"planted {kind} corpus: {table.num_rows:,} rows, {payload / 1e6:,.0f} MB in {time.perf_counter() - t0:.1f}s "
        f"({path})")
    return path, payload, table.num_rows


def replicated_dir(src, copies: int, log=print) -> tuple:
    """(directory, payload bytes, rows) of ``copies`` copies of the planted text shards in ``src``, beside it:
    copy ``c`` of a document has the id ``c<c>:<id>`` and one more word in front of its text, ``w<c>``, so
    every document is ``copies`` near duplicates of each other (Jaccard about 0.99), each copy signed,
    bucketed and verified.  Built from the shards in a few seconds (one shard read and ``copies`` written at
    a time on each core), not generated; reused by a later call like :func:`planted_dir`."""
    src = Path(src)
    info = json.loads(marker_of(src).read_text())
    path = src.parent / f"{src.name}-x{copies}"
    spec = {"from": info["spec"], "copies": copies}
    marker = marker_of(path)
    if marker.is_file() and json.loads(marker.read_text()).get("spec") == spec:
        got = json.loads(marker.read_text())
        return path, got["bytes"], got["rows"]
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    t0 = time.perf_counter()
    shards = sorted(p for p in src.glob("*.parquet"))

    def copy_shard(shard) -> int:
        table = pq.read_table(shard)
        if not pa.types.is_string(table.schema.field("id").type) and \
                not pa.types.is_large_string(table.schema.field("id").type):
            raise ValueError(f"{shard}: replicated copies need string ids (new ids are 'c<copy>:<id>')")
        extra = 0
        for c in range(copies):  # one step per copy
            ids, text = table.column("id"), table.column("text")
            ids = pc.binary_join_element_wise(pa.scalar(f"c{c}:", ids.type), ids, pa.scalar("", ids.type))
            if c:  # copy 0 keeps the planted texts
                text = pc.binary_join_element_wise(pa.scalar(f"w{c} ", text.type), text, pa.scalar("", text.type))
                extra += len(f"w{c} ") * table.num_rows
            out = table.set_column(0, "id", ids).set_column(1, "text", text)
            pq.write_table(out, path / f"c{c:03d}-{shard.name}", compression="snappy")
        return extra

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        extra = sum(pool.map(copy_shard, shards))
    payload, rows = info["bytes"] * copies + extra, info["rows"] * copies
    marker.write_text(json.dumps({"spec": spec, "bytes": payload, "rows": rows,
                                  "seconds": round(time.perf_counter() - t0, 2)}))
    log(f"replicated corpus: {rows:,} rows ({copies} copies), {payload / 1e9:,.2f} GB in "
        f"{time.perf_counter() - t0:.1f}s ({path})")
    return path, payload, rows


UNCOMPARED = ("report.json", "report.html", ".gpu_dedup_manifest.json")  # timings, machine, file dates


def compare_outputs(a, b) -> dict:
    """Every file of output directory ``a`` against ``b``, byte for byte (except the report and the
    manifest, whose timings and file dates differ; the manifests' sizes and checksums of the other files
    are compared).
    Returns {"identical": bool, "files": n, "differ": [names], "only_in_one": [names]}."""
    a, b = Path(a), Path(b)
    names_a = {p.name for p in a.iterdir() if p.is_file() and p.name not in UNCOMPARED}
    names_b = {p.name for p in b.iterdir() if p.is_file() and p.name not in UNCOMPARED}
    differ = sorted(n for n in names_a & names_b if not filecmp.cmp(a / n, b / n, shallow=False))
    manifest = ".gpu_dedup_manifest.json"
    if (a / manifest).is_file() and (b / manifest).is_file():
        def sums(d):
            files = json.loads((d / manifest).read_text()).get("files", {})
            return {k: (v.get("size"), v.get("sha256")) for k, v in files.items() if k not in UNCOMPARED}

        if sums(a) != sums(b):
            differ.append(manifest + " (sizes or checksums)")
    only = sorted(names_a ^ names_b)
    # a shard another writer wrote (cuDF's) differs in bytes from pyarrow's: its content must still be the same
    content = {n: file_difference(a / n, b / n) for n in differ if not n.startswith(manifest)}
    same_tables = sorted(n for n, why in content.items() if why is None)
    return {"identical": not differ and not only, "files": len(names_a & names_b), "differ": differ,
            "only_in_one": only, "same_table": same_tables,
            "content_identical": not only and all(why is None for why in content.values()),
            "content_differs": {n: why for n, why in content.items() if why is not None}}
