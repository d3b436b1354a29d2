"""Peers benchmark: gpu_dedup against rensa, datasketch and datatrove (and cuDF) on the same data.

``gpu-dedup bench peers`` times, in one invocation on one machine, every tool
on the same corpora with the same parameters (num_perm, shingles, bands x
rows, threshold), each tool in a child process of its own (its own peak RSS,
its imports and start-up counted):

* **End to end**: Parquet shards on disk -> the set of removed document ids.
  gpu_dedup runs ``gpu-dedup run --no-shards`` (it writes ``duplicates.parquet``,
  the report and its manifest); the row ``gpu_dedup+shards`` is the default
  ``gpu-dedup run``, which also writes the deduplicated shards (a job the peers
  leave to their user).  The peers are used the way their own
  documentation shows, with the shingling they need written in Python and
  counted in their time, as a user pays it: texts lowercased and split on
  whitespace into word n-grams (or character n-grams); datasketch builds
  ``MinHash.bulk`` signatures and keeps a document unless ``MinHashLSH.query``
  finds an earlier kept one (query before insert); rensa builds
  ``RMinHash.from_token_sets`` signatures and feeds them to its
  ``RMinHashDeduplicator`` (LSH candidates checked by the signature estimate).
  datatrove (the CPU tool FineWeb was built with) runs its own four steps as its
  documentation shows, each a ``LocalPipelineExecutor`` with one task per shard
  (signatures, filter) or per band (buckets) on every core: ``MinhashDedupSignature``
  (its default English word tokenizer and text normalization, 64-bit xxhash),
  ``MinhashDedupBuckets``, ``MinhashDedupCluster`` and ``MinhashDedupFilter``, whose
  exclusion writer gives the removed documents; it reads the Parquet shards itself
  and verifies nothing (every LSH candidate pair is joined).  Its normalization folds
  every digit to 0 (``2024`` and ``1999`` are one word), so it is run only on the
  planted corpora, whose words are letters only (checked: the row says how many texts
  hold a digit), and it replaces a document id that is falsy (``0``) by its own (the
  planted ids are strings).  With datatrove among the tools the planted corpora are
  written as 4 shards, so its per-shard tasks can use every core.
  The LSH layout is the same for all: gpu_dedup's (bands, rows).
* **Signature stage alone**, on input each tool gets ready-made (not timed):
  gpu_dedup gets the normalized text buffers and shingles and hashes them
  inside its kernel (counted); rensa gets the shingles as lists of str
  (``digest_matrix_from_token_sets``) and, faster still, as one flat buffer of
  token hashes (``digest_matrix_from_flat_token_hashes``); datasketch gets the
  shingles as bytes (``MinHash.bulk``).  Timed on one thread
  (``NUMBA_NUM_THREADS=1``, ``RAYON_NUM_THREADS=1``) for the per-core ratio,
  and with every core; the fastest of three calls counts.  The per-core ratio
  uses process CPU time (rensa converts its input on a helper thread even
  with one rayon thread).  ``python -m gpu_dedup.bench.signatures`` runs the
  one-thread comparison with rensa side by side in one process.
* **Quality** of each removed set against exact Jaccard of the shingle sets
  (gpu_dedup's normalization and shingles, one definition for every tool), on a
  random sample of documents: every partner of a sampled document anywhere in
  the corpus with J >= threshold (sparse incidence products of the sample
  against the whole corpus).  *Recall*: the fraction of such pairs where the
  tool removed at least one side (a pair with both sides kept is a duplicate
  left in the output).  *Precision*: the fraction of removed sampled documents
  that have a partner with J >= threshold which the tool kept (a removed
  document without one lost content: a false positive of the LSH, or a chain).
* **Scaling**: gpu_dedup at every size (default 10 k, 100 k, 1 M documents)
  with the growth exponent of time and memory; peers up to ``--peer-max-docs``.

Results go to ``peers.json``, ``peers.md`` (the tables) and ``peers.png``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from gpu_dedup.bench import child_env, growth_exponent, machine, run_cli_job, scratch, write_results
from gpu_dedup.bench.workers import make_corpus

TOOLS = ("gpu_dedup", "rensa", "datasketch")  # the default; datatrove on request (--tools ... datatrove)
PEERS = ("rensa", "datasketch", "datatrove")
PLANTED_ONLY = ("datatrove",)  # tools run on the planted corpora only (digits folded: see the module doc)
DATATROVE_SHARDS = 4
PLAIN = "gpu_dedup+plain_components"  # select.split_chains: false (one survivor per connected component, as the peers)
SHARDS = "gpu_dedup+shards"  # the default run: the deduplicated shards written too (the peers write removed ids only)
EVERY_SIZE = ("gpu_dedup", "gpu_dedup[gpu]", SHARDS)  # run at every size (the peers up to --peer-max-docs)
SIG_TOOLS = ("gpu_dedup", "rensa", "rensa_hashes", "datasketch")

# ---------------------------------------------------------------- child side (one tool, one process)


def _read_corpus(directory, text_column="text", id_column="id"):
    """The shards of ``directory`` in name order, as one Arrow table of (id, text)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = sorted(Path(directory).glob("*.parquet")) if Path(directory).is_dir() else [Path(directory)]
    tables = [pq.read_table(f, columns=[id_column, text_column]) for f in files]
    table = pa.concat_tables(tables) if tables else pa.table({id_column: [], text_column: []})
    return table.rename_columns(["id", "text"])


_PUNCT = None


def peer_shingles(texts, shingle: str, ngram: int) -> list:
    """Shingles the way peers' users write them: per document, in Python (counted in their time).

    The text gets gpu_dedup's default normalization in plain Python (NFKC,
    lowercase, punctuation removed, whitespace collapsed by ``split``), so
    every tool hashes the same shingles and recall compares the algorithms,
    not the tokenizers.
    """
    global _PUNCT
    import re
    import unicodedata

    if _PUNCT is None:
        _PUNCT = re.compile(r"[^\w\s]+")
    out = []
    for t in texts:  # the peers' own per-document loop: this is the cost their users pay
        t = _PUNCT.sub("", unicodedata.normalize("NFKC", t or "").lower())
        if shingle == "word":
            w = t.split()
            out.append([" ".join(w[i:i + ngram]) for i in range(max(1, len(w) - ngram + 1))] if w else [])
        else:
            out.append([t[i:i + ngram] for i in range(max(1, len(t) - ngram + 1))] if t else [])
    return out


def _e2e_rensa(texts, p):
    import rensa

    tokens = peer_shingles(texts, p["shingle"], p["ngram"])
    mh = rensa.RMinHash.from_token_sets(tokens, p["num_perm"], p["seed"])
    dedup = rensa.RMinHashDeduplicator(p["threshold"], p["num_perm"], True, num_bands=p["bands"], seed=p["seed"])
    added = dedup.add_pairs([(str(i), m) for i, m in enumerate(mh)])
    return np.flatnonzero(~np.asarray(added, bool)), sum(map(len, tokens)), None  # candidates: not exposed


def _e2e_datasketch(texts, p):
    from datasketch import MinHash, MinHashLSH

    tokens = peer_shingles(texts, p["shingle"], p["ngram"])
    mhs = MinHash.bulk([[s.encode("utf-8") for s in toks] for toks in tokens], num_perm=p["num_perm"], seed=p["seed"])
    lsh = MinHashLSH(threshold=p["threshold"], num_perm=p["num_perm"], params=(p["bands"], p["rows"]))
    removed, candidates = [], 0
    for i, m in enumerate(mhs):  # datasketch's documented dedup loop: query, then insert the kept
        found = lsh.query(m)
        if found:
            removed.append(i)
            candidates += len(found)
        else:
            lsh.insert(i, m)
    return np.asarray(removed, np.int64), sum(map(len, tokens)), candidates


def _e2e_datatrove(corpus, p, work: Path):
    """datatrove's MinhashDedup steps on the shards of ``corpus`` (see the module doc); the removed rows."""
    import glob as _glob

    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (
        MinhashConfig,
        MinhashDedupBuckets,
        MinhashDedupCluster,
        MinhashDedupFilter,
        MinhashDedupSignature,
    )
    from datatrove.pipeline.readers import ParquetReader
    from datatrove.pipeline.writers import ParquetWriter
    from datatrove.utils.typeshelper import Languages

    if p["shingle"] != "word":
        raise ValueError("datatrove shingles words only; run it with minhash.shingle: word")
    files = sorted(Path(corpus).glob("*.parquet"))
    cores = len(os.sched_getaffinity(0))
    cfg = MinhashConfig(n_grams=p["ngram"], num_buckets=p["bands"], hashes_per_bucket=p["rows"], seed=p["seed"])

    def reader():
        return ParquetReader(str(corpus), text_key="text", id_key="id", glob_pattern="*.parquet")

    def step(pipeline, tasks, name, depends=None):
        return LocalPipelineExecutor(pipeline=pipeline, tasks=tasks, workers=min(tasks, cores),
                                     logging_dir=str(work / "logs" / name), depends=depends)

    s1 = step([reader(), MinhashDedupSignature(output_folder=str(work / "signatures"), config=cfg,
                                                language=Languages.english)], len(files), "signatures")
    s2 = step([MinhashDedupBuckets(input_folder=str(work / "signatures"), output_folder=str(work / "buckets"),
                                   config=cfg)], cfg.num_buckets, "buckets", s1)
    s3 = step([MinhashDedupCluster(input_folder=str(work / "buckets"), output_folder=str(work / "remove_ids"),
                                   config=cfg)], 1, "cluster", s2)
    s4 = step([reader(), MinhashDedupFilter(input_folder=str(work / "remove_ids"),
                                            exclusion_writer=ParquetWriter(str(work / "removed")))],
              len(files), "filter", s3)
    s4.run()
    removed = []
    for f in sorted(_glob.glob(str(work / "removed" / "*.parquet"))):  # one file per filter task
        removed += pq.read_table(f, columns=["id"]).column("id").to_pylist()
    table = _read_corpus(corpus)
    ids = table.column("id")
    digits = pc.sum(pc.match_substring_regex(table.column("text"), r"[0-9]")).as_py() or 0
    pos = pc.index_in(pa.array(removed, ids.type), value_set=ids)
    if pos.null_count:
        raise RuntimeError(f"datatrove removed {pos.null_count} ids that are not in the corpus (ids it replaced: a "
                           "falsy id such as 0 or an empty string?)")
    rows = np.sort(pos.to_numpy().astype(np.int64))
    return rows, None, None, {"texts_with_digits": int(digits), "shards": len(files)}


SIG_REPEATS = 3  # timed calls per tool (after an untimed one that loads its code); the fastest counts


def _best_of(fn, repeats: int = SIG_REPEATS):
    """(wall seconds, process CPU seconds) of the fastest of ``repeats`` calls, after one untimed call.

    CPU time is what a call costs the machine: a tool may run helper threads beside the one asked for
    (rensa converts its Python input on a second thread), so per-core rates use it.
    """
    fn()
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        best = min(best, (time.perf_counter() - w0, time.process_time() - c0))
    return best


def _signature_child(tool, texts_or_buf, p):
    """Prepare the tool's ready-made input (untimed), then time its signature call:
    (wall seconds, shingles, CPU seconds)."""
    if tool == "gpu_dedup":
        from gpu_dedup.backends.strings import string_buffers
        from gpu_dedup.config import Config
        from gpu_dedup.stages.minhash import signatures
        from gpu_dedup.stages.normalize import normalize

        cfg = Config.from_dict(p["config"])
        buf = string_buffers(normalize(texts_or_buf, cfg.normalize))
        shingles = int(signatures(buf, cfg.minhash, num_perm=p["num_perm"]).shingles.sum())
        wall, cpu = _best_of(lambda: signatures(buf, cfg.minhash, num_perm=p["num_perm"]))
        return wall, shingles, cpu
    texts = texts_or_buf.to_pylist()
    tokens = peer_shingles(texts, p["shingle"], p["ngram"])
    count = sum(map(len, tokens))
    if tool == "rensa":
        import rensa

        wall, cpu = _best_of(lambda: rensa.RMinHash.digest_matrix_from_token_sets(tokens, p["num_perm"], p["seed"]))
        return wall, count, cpu
    if tool == "rensa_hashes":
        import rensa

        hashed = rensa.RMinHash.hash_token_sets(tokens)
        flat = np.fromiter((h for doc in hashed for h in doc), np.uint64, count)
        offsets = np.zeros(len(hashed) + 1, np.uint64)
        np.cumsum([len(doc) for doc in hashed], out=offsets[1:])
        wall, cpu = _best_of(lambda: rensa.RMinHash.digest_matrix_from_flat_token_hashes(flat, offsets, p["num_perm"],
                                                                                        p["seed"]))
        return wall, count, cpu
    if tool == "datasketch":
        from datasketch import MinHash

        data = [[s.encode("utf-8") for s in toks] for toks in tokens]
        wall, cpu = _best_of(lambda: MinHash.bulk(data, num_perm=p["num_perm"], seed=p["seed"]), repeats=1)
        return wall, count, cpu
    raise ValueError(f"unknown signature tool {tool!r}; choose one of {', '.join(SIG_TOOLS)}")


def child_main(argv) -> int:
    """``python -m gpu_dedup.bench.peers MODE TOOL CORPUS PARAMS_JSON [OUT]``: prints one JSON line."""
    from gpu_dedup.run.stagelog import peak_rss_mb

    mode, tool, corpus, params = argv[0], argv[1], argv[2], json.loads(argv[3])
    t0 = time.perf_counter()
    table = _read_corpus(corpus)
    if params.get("limit"):
        table = table.slice(0, params["limit"])
    if mode == "e2e":
        extra = {}
        if tool == "datatrove":  # it reads the shards itself (its readers, its time)
            removed, shingles, candidates, extra = _e2e_datatrove(corpus, params, Path(argv[4]).with_suffix(".work"))
        else:
            fn = {"rensa": _e2e_rensa, "datasketch": _e2e_datasketch}[tool]
            removed, shingles, candidates = fn(table.column("text").to_pylist(), params)
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": table.column("id").take(pa.array(removed, pa.int64()))}), argv[4])
        out = {"seconds": time.perf_counter() - t0, "removed": int(removed.shape[0]), "shingles": shingles,
               "candidates": candidates, **extra}
    else:
        seconds, shingles, cpu = _signature_child(tool, table.column("text"), params)
        out = {"seconds": seconds, "shingles": shingles, "cpu_seconds": cpu}
    out.update(documents=table.num_rows, peak_rss_mb=round(peak_rss_mb(), 1))
    print(json.dumps(out))
    return 0


def _child(args, env=None) -> dict:
    cmd = [sys.executable, "-m", "gpu_dedup.bench.peers", *map(str, args)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=child_env(env))
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"benchmark child failed: {' '.join(cmd[:6])}\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["wall_seconds"] = wall
    return out


def _env(threads: int | None) -> dict:
    env = dict(os.environ)
    if threads:
        env.update(NUMBA_NUM_THREADS=str(threads), RAYON_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    return env


# ---------------------------------------------------------------- exact truth on a sample


def sample_truth(texts, cfg, rows, threshold: float):
    """Every pair (r, j), r in ``rows``, j anywhere, with exact Jaccard >= ``threshold``.

    Shingle sets as the pipeline defines them (normalize, shingles, hashes);
    one sparse product of the sampled rows against the whole corpus per block.
    Returns (left, right, jaccard, set_sizes).
    """
    from gpu_dedup.backends import get_backend
    from gpu_dedup.backends.strings import string_buffers
    from gpu_dedup.evaluation.evaluate import incidence_matrix
    from gpu_dedup.kernels.params import hash_params
    from gpu_dedup.stages.normalize import normalize, repair_utf8

    strings = string_buffers(normalize(repair_utf8(texts)[0], cfg.normalize))
    params = hash_params(cfg.minhash.seed, cfg.minhash.num_perm)
    offsets, values = get_backend("cpu").shingle_sets(strings, params, cfg.minhash.shingle, cfg.minhash.ngram)
    x, size = incidence_matrix(offsets, values)
    xt = x.T.tocsr()
    rows = np.asarray(rows, np.int64)
    lefts, rights, sims = [], [], []
    for lo in range(0, rows.shape[0], 2000):  # a few sparse products, one per block of sampled rows
        r = rows[lo:lo + 2000]
        prod = (x[r] @ xt).tocoo()
        i = r[prod.row]
        j = prod.col.astype(np.int64)
        inter = prod.data.astype(np.int64)
        jac = inter / (size[i] + size[j] - inter)
        keep = (j != i) & (jac >= threshold)
        lefts.append(i[keep])
        rights.append(j[keep])
        sims.append(jac[keep])
    cat = (lambda a, t: np.concatenate(a) if a else np.zeros(0, t))  # noqa: E731
    return cat(lefts, np.int64), cat(rights, np.int64), cat(sims, np.float64), size


def quality(removed: np.ndarray, truth, rows, threshold: float) -> dict:
    """Recall (pairs with J >= t, and >= t + 0.05, not both kept) and precision of the removed set on the sample."""
    left, right, jac, size = truth
    out = {}
    for name, bound in (("recall", threshold), ("recall_t+0.05", threshold + 0.05)):
        sel = jac >= bound
        out[name] = float(np.mean(removed[left[sel]] | removed[right[sel]])) if sel.any() else None
        out[f"pairs_{name}"] = int(sel.sum())
    sampled_removed = rows[removed[rows] & (size[rows] > 0)]  # empty texts have no shingles: not scored
    justified = np.zeros(removed.shape[0], bool)
    justified[left[(jac >= threshold) & ~removed[right]]] = True  # a partner with J >= t that the tool kept
    out["precision"] = float(np.mean(justified[sampled_removed])) if sampled_removed.shape[0] else None
    out["removed_in_sample"] = int(sampled_removed.shape[0])
    return out


# ---------------------------------------------------------------- parent side


def _removed_mask(ids_index, removed_ids) -> np.ndarray:
    pos = ids_index.get_indexer(removed_ids)
    if (pos < 0).any():
        raise RuntimeError(f"{int((pos < 0).sum())} removed ids are not in the corpus")
    mask = np.zeros(len(ids_index), bool)
    mask[pos] = True
    return mask


def _ours_removed(out_dir: Path):
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    dup = pq.read_table(out_dir / "duplicates.parquet", columns=["id", "kept"])
    return dup.filter(pc.invert(dup.column("kept"))).column("id").to_pylist()


def _params(cfg, limit=None) -> dict:
    bands, rows = cfg.layout
    return {"num_perm": cfg.minhash.num_perm, "shingle": cfg.minhash.shingle, "ngram": cfg.minhash.ngram,
            "seed": cfg.minhash.seed, "threshold": cfg.lsh.threshold, "bands": bands, "rows": rows,
            "config": cfg.to_dict(), "limit": limit}


# the shard layouts of a planted corpus: files of 100,000 documents, one row group each (what make_corpus
# writes); every document in one file with one row group (what pandas.to_parquet writes for up to ~10^6
# rows); every document in one file with row groups of MANY_ROW_GROUP_ROWS rows
LAYOUTS = ("files", "one-row-group", "many-row-groups")
MANY_ROW_GROUP_ROWS = 10_000


def lay_out(directory: Path, layout: str) -> None:
    """Rewrite the shards of ``directory`` (as make_corpus wrote them) into ``layout``, in place."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if layout == "files":
        return
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {', '.join(LAYOUTS)}")
    files = sorted(Path(directory).glob("*.parquet"))
    table = pa.concat_tables([pq.read_table(f) for f in files])
    rows = max(1, table.num_rows) if layout == "one-row-group" else MANY_ROW_GROUP_ROWS
    pq.write_table(table, Path(directory) / "corpus.parquet.tmp", row_group_size=rows)
    for f in files:
        f.unlink()
    (Path(directory) / "corpus.parquet.tmp").rename(Path(directory) / "corpus.parquet")


def _label(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return str(n)


# what each peer needs importable: datatrove's English word tokenizer is spaCy's, its hash xxhash; its dedup
# package imports Hugging Face tokenizers
NEEDS = {"datatrove": ("datatrove", "spacy", "xxhash", "tokenizers")}


def _importable(tool: str) -> bool:
    if tool == "gpu_dedup":
        return True
    try:
        for module in NEEDS.get(tool, (tool,)):
            __import__(module)
        return True
    except ImportError as exc:
        print(f"  {tool} is not usable ({exc}): skipped (pip install -e '.[bench]' installs the peers)", flush=True)
        return False


def _gpu_usable() -> bool:
    try:
        from gpu_dedup.backends.gpu_probe import probe

        probe()
        return True
    except Exception:
        return False


def end_to_end(name, corpus: Path, cfg, tools, work: Path, quality_sample: int, quality_max_docs: int,
               seed: int = 0) -> list:
    """Every tool on one corpus: wall, peak RSS, removed, and quality against the exact sample truth."""
    import pandas as pd
    import pyarrow.compute as pc

    table = _read_corpus(corpus)
    n = table.num_rows
    text_mb = pc.sum(pc.binary_length(table.column("text"))).as_py() / 2**20
    ids_index = pd.Index(table.column("id").to_pylist())
    if not ids_index.is_unique:
        raise RuntimeError(f"corpus {name} has duplicate ids; the benchmark maps removed ids to rows")
    rows_out = []
    for tool in tools:
        out = work / f"{name}-{tool}"
        t0 = time.perf_counter()
        if tool.startswith("gpu_dedup"):
            backend = "gpu" if tool.endswith("[gpu]") else "cpu"
            conf = work / "config.yaml"
            conf.write_text(cfg.to_yaml())
            extra = ["--set", "select.split_chains=false"] if tool == PLAIN else []
            if tool != SHARDS:  # the peers' workload: shards in, removed ids out
                extra.append("--no-shards")
            rep = run_cli_job(corpus, out, ["-c", conf, "--backend", backend, "--id-column", "id", "--restart", *extra])
            wall = time.perf_counter() - t0
            removed_ids = _ours_removed(out)
            r = {"seconds": wall, "peak_rss_mb": rep["peak_rss_mb"], "candidates": rep["counts"].get("candidate_edges"),
                 "stages": {k: v["seconds"] for k, v in rep["stages"].items()}, "report_seconds": rep["wall_seconds"],
                 "fixed": {**rep.get("fixed_seconds", {}), "unbooked": rep.get("unbooked_seconds", 0.0)},
                 "rows_written": rep["stages"]["write"].get("rows_written")}
        else:
            r = _child(["e2e", tool, corpus, json.dumps(_params(cfg)), f"{out}.parquet"])
            import pyarrow.parquet as pq

            removed_ids = pq.read_table(f"{out}.parquet").column("id").to_pylist()
            r["seconds"] = r["wall_seconds"]
            shutil.rmtree(f"{out}.work", ignore_errors=True)  # datatrove's intermediate files
        mask = _removed_mask(ids_index, removed_ids)
        rows_out.append({"corpus": name, "tool": tool, "documents": n, "text_mb": round(text_mb, 1),
                         "seconds": round(r["seconds"], 2), "docs_per_s": round(n / r["seconds"]),
                         "mb_per_s": round(text_mb / r["seconds"], 2), "peak_rss_mb": round(r["peak_rss_mb"]),
                         "removed": int(mask.sum()), "candidates": r.get("candidates"), "_mask": mask,
                         **{k: r[k] for k in ("texts_with_digits", "shards") if k in r},
                         **({"stages": r["stages"], "report_seconds": r["report_seconds"], "fixed": r["fixed"],
                             "pipeline_seconds": round(r["report_seconds"] - r["fixed"].get("startup", 0.0)
                                                       - r["fixed"].get("kernel_load", 0.0), 3),
                             "rows_written": r["rows_written"]} if "stages" in r else {})})
        print(f"  {name:>16} {tool:<14} {r['seconds']:8.2f} s  removed {int(mask.sum()):,}", flush=True)
    if n <= quality_max_docs and n > 0:
        rng = np.random.default_rng(seed)
        sample = np.sort(rng.choice(n, min(n, quality_sample), replace=False))
        t0 = time.perf_counter()
        truth = sample_truth(table.column("text"), cfg, sample, cfg.lsh.threshold)
        print(f"  {name:>16} exact truth on {sample.shape[0]:,} sampled documents: {truth[0].shape[0]:,} pairs "
              f"(J >= {cfg.lsh.threshold}) in {time.perf_counter() - t0:.1f} s", flush=True)
        for row in rows_out:
            row.update(quality(row["_mask"], truth, sample, cfg.lsh.threshold))
    for row in rows_out:
        del row["_mask"]
    return rows_out


def signature_stage(corpus: Path, cfg, tools, cores: int, datasketch_docs: int) -> list:
    """Each tool's signature call alone, on one thread and on every core."""
    out = []
    for threads in sorted({1, cores}):
        for tool in tools:
            if threads > 1 and tool == "datasketch":
                continue  # pure Python/NumPy: one thread whatever the setting
            limit = datasketch_docs if tool == "datasketch" else None
            r = _child(["sig", tool, corpus, json.dumps(_params(cfg, limit))], env=_env(threads))
            out.append({"tool": tool, "threads": threads, "documents": r["documents"], "shingles": r["shingles"],
                        "seconds": round(r["seconds"], 3), "cpu_seconds": round(r["cpu_seconds"], 3),
                        "docs_per_s": round(r["documents"] / r["seconds"]),
                        "shingles_per_s_per_thread": round(r["shingles"] / r["seconds"] / threads),
                        "shingles_per_cpu_s": round(r["shingles"] / r["cpu_seconds"])})
            print(f"  signatures {tool:<13} {threads} thread(s) {r['seconds']:8.3f} s "
                  f"{r['shingles'] / r['seconds'] / 1e6:7.2f} M shingles/s; {r['cpu_seconds']:8.3f} CPU s "
                  f"{r['shingles'] / r['cpu_seconds'] / 1e6:7.2f} M shingles per CPU second", flush=True)
    return out


def bench_peers(sizes=(10_000, 100_000, 1_000_000), peer_max_docs: int = 100_000, real: str | None = "debian-man",
                tools=TOOLS, quality_sample: int = 5000, quality_max_docs: int = 200_000, sig_docs: int = 100_000,
                datasketch_sig_docs: int = 20_000, results="bench-results", workdir=None, config=None,
                layouts=("files",)) -> dict:
    """``layouts``: how the planted corpora are sharded (see :data:`LAYOUTS`), each size in each layout."""
    from gpu_dedup.config import Config

    cfg = config or Config(backend="cpu")
    m = machine()
    tools = [t for t in tools if _importable(t)]
    if "gpu_dedup" in tools:
        tools.insert(tools.index("gpu_dedup") + 1, PLAIN)
        tools.insert(tools.index("gpu_dedup") + 1, SHARDS)
        if _gpu_usable():
            tools.insert(tools.index("gpu_dedup") + 1, "gpu_dedup[gpu]")
    e2e, scaling = [], []
    with scratch(workdir) as tmp:
        tmp = Path(tmp)
        corpora = []
        for n in sorted(sizes):
            for layout in layouts:  # the same documents in each shard layout
                d = tmp / f"planted-{n}-{layout}"
                make_corpus(d, n)
                if layout == "files" and "datatrove" in tools:  # one datatrove task per shard: a shard per core
                    _reshard(d, DATATROVE_SHARDS)
                lay_out(d, layout)
                corpora.append((f"planted-{_label(n)}" + ("" if layout == "files" else f"-{layout}"), d, n))
        if real:
            from gpu_dedup.evaluation import datasets

            try:
                info = datasets.build(real, tmp / f"{real}.parquet")
                if info["documents"] > 0:
                    corpora.append((real, tmp / f"{real}.parquet", info["documents"]))
            except Exception as exc:  # the Debian packages are not installed here
                print(f"  real corpus {real} skipped: {exc}", flush=True)
        warm = tmp / "warm-up"  # load (or compile, after an upgrade) the kernels once, untimed, as any first run does
        make_corpus(warm, 200)
        for t in tools:
            if t in ("gpu_dedup", "gpu_dedup[gpu]"):
                run_cli_job(warm, tmp / "warm-up-out", ["--backend", "gpu" if t.endswith("[gpu]") else "cpu", "--restart"])
        for name, path, n in corpora:
            use = [t for t in tools if (t in EVERY_SIZE or n <= peer_max_docs)
                   and (t not in PLANTED_ONLY or name.startswith("planted"))]
            rows = end_to_end(name, path, cfg, use, tmp, quality_sample, quality_max_docs)
            e2e += rows
            if name.startswith("planted") and path.name.endswith(layouts[0]):
                scaling += rows
            for t in (*EVERY_SIZE, PLAIN):  # their output directories: disk, not results
                if t in tools:
                    shutil.rmtree(tmp / f"{name}-{t}", ignore_errors=True)
        sig_corpus = min((c for c in corpora if c[0].startswith("planted")), key=lambda c: abs(c[2] - sig_docs))
        sig_tools = [t for t in SIG_TOOLS if t.split("_hashes")[0] in tools]
        sig = signature_stage(sig_corpus[1], cfg, sig_tools, m["cores"], datasketch_sig_docs)
        limit = back_of_envelope(cfg, sig, _text_bytes(sig_corpus[1]))
    bands, rows_ = cfg.layout
    payload = {
        "benchmark": "peers", "date": _dt.date.today().isoformat(), "machine": m, "versions": _versions(),
        "parameters": {"num_perm": cfg.minhash.num_perm, "shingle": cfg.minhash.shingle, "ngram": cfg.minhash.ngram,
                       "hash_bits": cfg.minhash.hash_bits, "bands": bands, "rows": rows_,
                       "threshold": cfg.lsh.threshold, "verify": cfg.verify.method},
        "end_to_end": e2e, "signatures": sig, "signature_corpus": sig_corpus[0],
        "growth": _growth(scaling), "ratios": _ratios(e2e, sig),
        "limit": limit,
    }
    md = markdown(payload)
    write_results(results, "peers", payload, md)
    try:
        plot(payload, Path(results) / "peers.png")
    except ImportError as exc:  # matplotlib missing: tables only
        print(f"  no figure: {exc}")
    print(md)
    return payload


def _reshard(directory: Path, shards: int) -> None:
    """Rewrite the Parquet shards of ``directory`` as ``shards`` files of the same rows, in order."""
    import pyarrow.parquet as pq

    from gpu_dedup.evaluation.sample import write_shards

    files = sorted(directory.glob("*.parquet"))
    table = _read_corpus(directory)
    for f in files:
        f.unlink()
    write_shards(table, directory, shards=shards, prefix="part")
    assert sum(pq.read_metadata(f).num_rows for f in directory.glob("*.parquet")) == table.num_rows


def _versions() -> dict:
    from importlib import metadata

    out = {}
    for dist in ("gpu_dedup", "numba", "rensa", "datasketch", "datatrove", "pyarrow", "numpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _growth(rows) -> dict:
    out = {}
    for tool in sorted({r["tool"] for r in rows}):
        rs = sorted((r for r in rows if r["tool"] == tool), key=lambda r: r["documents"])
        if len(rs) >= 2:
            sizes = [r["documents"] for r in rs]
            secs = [r["seconds"] for r in rs]
            out[tool] = {"sizes": sizes, "time_exponent": round(growth_exponent(sizes, secs), 3),
                         "time_exponent_largest_two": round(growth_exponent(sizes[-2:], secs[-2:]), 3),
                         "memory_exponent": round(growth_exponent(sizes, [r["peak_rss_mb"] for r in rs]), 3)}
            if all("pipeline_seconds" in r for r in rs):  # without the fixed start-up cost
                out[tool]["pipeline_time_exponent"] = round(
                    growth_exponent(sizes, [r["pipeline_seconds"] for r in rs]), 3)
    return out


def _ratios(e2e, sig) -> dict:
    """gpu_dedup's speed over each peer's: end to end per corpus, signatures per thread."""
    out = {"end_to_end": {}, "signatures_per_core": {}}
    for corpus in dict.fromkeys(r["corpus"] for r in e2e):
        rs = {r["tool"]: r for r in e2e if r["corpus"] == corpus}
        if "gpu_dedup" in rs:
            out["end_to_end"][corpus] = {t: round(rs[t]["seconds"] / rs["gpu_dedup"]["seconds"], 2)
                                         for t in rs if t != "gpu_dedup"}
    one = {r["tool"]: r for r in sig if r["threads"] == 1}
    if "gpu_dedup" in one:  # per core: shingles per CPU second of one-thread calls (helper threads included)
        ours = one["gpu_dedup"]["shingles_per_cpu_s"]
        out["signatures_per_core"] = {t: round(ours / r["shingles_per_cpu_s"], 2)
                                      for t, r in one.items() if t != "gpu_dedup"}
    return out


# integer operations per permutation of one shingle key (hash family v2, kernels/hash_scalar.py): a 32-bit
# multiply, an add and the running minimum, in 32-bit vector lanes
OPS_PER_PERM = 3
LANES = 16  # 32-bit lanes of a 512-bit vector (AVX-512); a 256-bit unit halves this


def _text_bytes(corpus) -> int:
    import pyarrow.compute as pc

    return pc.sum(pc.binary_length(_read_corpus(corpus).column("text"))).as_py() or 0


def back_of_envelope(cfg, sig, nbytes: int) -> dict:
    """What one core could do at best: permutation work per byte against the integer vector throughput."""
    ghz = _clock_ghz()
    one = next((r for r in sig if r["tool"] == "gpu_dedup" and r["threads"] == 1), None)
    if one is None or one["seconds"] <= 0 or not nbytes:  # a corpus too small to time says nothing
        return {}
    shingles_per_byte = one["shingles"] / nbytes
    ops_per_byte = shingles_per_byte * cfg.minhash.num_perm * OPS_PER_PERM
    lanes = LANES
    limit = ghz * 1e9 * lanes / ops_per_byte / 2**20  # one vector op per cycle
    measured = nbytes / (one["seconds"]) / 2**20
    return {"clock_ghz": ghz, "shingles_per_byte": round(shingles_per_byte, 4), "ops_per_perm": OPS_PER_PERM,
            "ops_per_byte": round(ops_per_byte, 1), "vector_lanes": lanes,
            "limit_mb_per_s_per_core": round(limit, 1), "measured_mb_per_s_per_core": round(measured, 1),
            "fraction_of_limit": round(measured / limit, 3)}


def _clock_ghz() -> float:
    try:
        with open("/proc/cpuinfo") as f:
            mhz = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        return round(max(mhz) / 1000, 2) if mhz else 3.0
    except OSError:
        return 3.0


def markdown(p: dict) -> str:
    par = p["parameters"]
    m = p["machine"]
    lines = [f"Measured {p['date']} on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; "
             f"versions {', '.join(f'{k} {v}' for k, v in p['versions'].items() if v)}.", "",
             f"Parameters for every tool: {par['num_perm']} permutations, {par['shingle']} {par['ngram']}-grams, "
             f"{par['bands']} bands x {par['rows']} rows, threshold {par['threshold']}; gpu_dedup verifies "
             f"candidates ({par['verify']}), {par['hash_bits']}-bit hashes.", "",
             "**End to end** (Parquet shards -> removed ids; each tool in its own process, start-up included, "
             "Python caching bytecode as in a user's shell; "
             f"`{SHARDS}` also writes the deduplicated shards, which no peer does):", "",
             "| corpus | tool | docs | seconds | docs/s | MB/s | peak RSS MiB | candidate pairs | removed "
             "| recall (J>=t) | recall (J>=t+0.05) | precision | its time / gpu_dedup's |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["end_to_end"]:
        ratio = p["ratios"]["end_to_end"].get(r["corpus"], {}).get(r["tool"])
        lines.append(f"| {r['corpus']} | {r['tool']} | {r['documents']:,} | {r['seconds']} | {r['docs_per_s']:,} | "
                     f"{r['mb_per_s']} | {r['peak_rss_mb']:,} | {_n(r.get('candidates'))} | "
                     f"{r['removed']:,} | {_f(r.get('recall'))} | "
                     f"{_f(r.get('recall_t+0.05'))} | {_f(r.get('precision'))} | "
                     f"{'1' if r['tool'] == 'gpu_dedup' else (f'{ratio}x' if ratio else '-')} |")
    dt = [r for r in p["end_to_end"] if r["tool"] == "datatrove"]
    if dt:
        digits = sum(r.get("texts_with_digits", 0) for r in dt)
        lines += ["", "datatrove's rows: its MinhashDedup steps (signature, buckets, cluster, filter), each a "
                  "LocalPipelineExecutor on every core, its default English word tokenizer (spaCy) and text "
                  f"normalization; on the planted corpora only, whose words are letters only ({digits} texts with a "
                  "digit: datatrove folds every digit to 0), written as "
                  f"{', '.join(sorted({str(r.get('shards', '?')) for r in dt}))} shards (one datatrove task per "
                  "shard); it verifies no candidate pair, so each LSH collision joins two clusters."]
    lines += ["", f"**Signature stage alone** ({p['signature_corpus']}; ready-made input not timed: gpu_dedup "
              "normalized text, shingled and hashed inside the kernel; rensa str shingles, or flat u64 token "
              "hashes; datasketch bytes shingles):", "",
              "| tool | threads | docs | seconds | CPU seconds | docs/s | M shingles/s per thread "
              "| M shingles per CPU second | gpu_dedup's rate per core / its rate |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in p["signatures"]:
        ratio = p["ratios"]["signatures_per_core"].get(r["tool"]) if r["threads"] == 1 else None
        lines.append(f"| {r['tool']} | {r['threads']} | {r['documents']:,} | {r['seconds']} | "
                     f"{r.get('cpu_seconds', '-')} | {r['docs_per_s']:,} | {r['shingles_per_s_per_thread'] / 1e6:.2f} | "
                     f"{r['shingles_per_cpu_s'] / 1e6:.2f} | {f'{ratio}x' if ratio else '-'} |")
    if p["growth"]:
        lines += ["", "**Scaling** (planted corpora; exponent of a power-law fit, 1.0 = linear; a fixed start-up "
                  "cost pulls the fit over all sizes below 1, so the two largest sizes and the pipeline's own "
                  "seconds are shown too):", "",
                  "| tool | sizes | time exponent | two largest sizes | without start-up and kernels "
                  "| peak-memory exponent |", "| --- | --- | --- | --- | --- | --- |"]
        for tool, g in p["growth"].items():
            lines.append(f"| {tool} | {', '.join(f'{s:,}' for s in g['sizes'])} | {g['time_exponent']} | "
                         f"{g['time_exponent_largest_two']} | {g.get('pipeline_time_exponent', '-')} | "
                         f"{g['memory_exponent']} |")
    profiled = [r for r in p["end_to_end"] if "stages" in r]
    if profiled:
        names = list(dict.fromkeys(k for r in profiled for k in r["stages"]))
        lines += ["", "**Where gpu_dedup's time goes** (seconds per stage, then the named fixed costs, from its "
                  "report; *startup*: the interpreter and the imports; *kernels*: loading the compiled kernels "
                  "(Numba's cache); *samples*: the report's example texts; *other*: setup, checkpoints, the report, "
                  "the output directory's verified commit and any unbooked glue; *process*: what the report's clock "
                  "cannot see, the process's creation and exit):", "",
                  "| corpus | tool | " + " | ".join(names)
                  + " | startup | kernels | samples | other | process | wall |",
                  "| --- | --- | " + " | ".join("---" for _ in names) + " | --- | --- | --- | --- | --- | --- |"]
        for r in profiled:
            fixed = dict(r["fixed"])
            named = [fixed.pop(k, 0.0) for k in ("startup", "kernel_load", "samples")]
            lines.append(f"| {r['corpus']} | {r['tool']} | " + " | ".join(f"{r['stages'].get(k, 0):.2f}" for k in names)
                         + "".join(f" | {v:.2f}" for v in (*named, sum(fixed.values()),
                                                           r["seconds"] - r["report_seconds"]))
                         + f" | {r['seconds']} |")
    lim = p.get("limit")
    if lim:
        lines += ["", f"**Back of the envelope** (one core): {lim['shingles_per_byte']} shingles per byte x "
                  f"{par['num_perm']} permutations x {lim['ops_per_perm']} integer ops = {lim['ops_per_byte']} ops "
                  f"per byte; at {lim['clock_ghz']} GHz x {lim['vector_lanes']} 32-bit lanes, one vector op per "
                  f"cycle, the permutations alone allow {lim['limit_mb_per_s_per_core']} MB/s per core; the kernel "
                  f"does {lim['measured_mb_per_s_per_core']} MB/s ({lim['fraction_of_limit']:.0%} of it, shingling "
                  "included)."]
    return "\n".join(lines) + "\n"


def _n(x) -> str:
    return "-" if x is None else f"{x:,}"


def _f(x) -> str:
    return "-" if x is None else f"{x:.4f}"


def plot(p: dict, path: Path) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4.2))
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    corpora = list(dict.fromkeys(r["corpus"] for r in p["end_to_end"]))
    tools = list(dict.fromkeys(r["tool"] for r in p["end_to_end"]))
    width = 0.8 / max(1, len(tools))
    for k, tool in enumerate(tools):
        vals = [next((r["docs_per_s"] for r in p["end_to_end"] if r["corpus"] == c and r["tool"] == tool), 0)
                for c in corpora]
        ax1.bar(np.arange(len(corpora)) + k * width, vals, width, label=tool)
        rs = sorted((r for r in p["end_to_end"] if r["tool"] == tool and r["corpus"].startswith("planted")),
                    key=lambda r: r["documents"])
        if rs:
            ax2.loglog([r["documents"] for r in rs], [r["seconds"] for r in rs], "o-", label=tool)
    ax1.set_xticks(np.arange(len(corpora)) + 0.4 - width / 2, corpora, rotation=20, fontsize=8)
    ax1.set_yscale("log")
    ax1.set_ylabel("documents / s (end to end)")
    ax1.legend(fontsize=8)
    ax2.set_xlabel("documents")
    ax2.set_ylabel("seconds (end to end)")
    ax2.legend(fontsize=8)
    one = [r for r in p["signatures"] if r["threads"] == 1]
    ax3.barh([r["tool"] for r in one], [r["shingles_per_s_per_thread"] / 1e6 for r in one])
    ax3.set_xlabel("M shingles / s, one thread (signatures)")
    fig.suptitle(f"gpu_dedup vs peers, {p['date']}, {p['machine']['cores']} cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(child_main(sys.argv[1:]))
