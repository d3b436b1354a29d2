"""A seeded random search for cluster runs that differ from one process (tests/run/test_cluster_search.py).

Each case draws a corpus (shards of Parquet and JSON Lines, empty and one-row shards, null texts, repeated,
string, integer or absent ids, vectors, heavy duplication) and a config (keep policy, split_chains, star
rounds, verify method, exact dedup, shingles, threshold, layout, similarity, output.shards, block rows), runs it
in one process and on a running Dask cluster, and compares the outputs file by file."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from gpu_dedup.config import Config
from gpu_dedup.evaluation.sample import planted_corpus

SKIP = {"_SUCCESS", "report.json", "report.html"}
SAME_COUNTS = ("documents_read", "exact_stage_collapsed", "candidate_edges", "verified_edges", "clusters",
               "exact_duplicates", "near_duplicates", "removed", "kept", "chain_split_ejected")


def draw_config(rng: random.Random, ids: str, vectors: bool) -> dict:
    cfg: dict = {"backend": "cpu", "input": {"id_column": "id" if ids != "absent" else None}}
    keep = rng.choice(["first", "longest", "lowest_id", "score"])
    cfg["select"] = {"keep": keep, "split_chains": rng.random() < 0.6}
    if keep == "score":
        cfg["select"]["score_column"] = "score"
    cfg["verify"] = {"method": rng.choice(["exact", "signature", "none"])}
    cfg["exact_dedup"] = rng.random() < 0.7
    cos = rng.random() < 0.25
    if cos:
        cfg["similarity"] = "cosine"
        cfg["lsh"] = {"threshold": rng.choice([0.8, 0.9, 0.95]), "star_rounds": rng.randint(1, 4)}
        cfg["cosine"] = {"bad_vectors": "keep", "bits": rng.choice([256, 512])}
        if vectors and rng.random() < 0.7:
            cfg["input"]["vector_column"] = "emb"
        else:
            cfg["cosine"]["text"] = {"shingle": rng.choice(["word", "char"]), "ngram": rng.randint(1, 4)}
    else:
        shingle = rng.choice(["word", "char"])
        cfg["minhash"] = {"shingle": shingle, "ngram": rng.randint(1, 4) if shingle == "word" else rng.randint(3, 9),
                          "num_perm": rng.choice([32, 64, 128])}
        cfg["lsh"] = {"threshold": rng.choice([0.5, 0.7, 0.8, 0.9]), "star_rounds": rng.randint(1, 4)}
        if rng.random() < 0.3:
            rows = rng.choice([2, 4, 8])
            cfg["lsh"].update(bands=cfg["minhash"]["num_perm"] // rows // rng.choice([1, 2]), rows=rows)
    cfg["output"] = {"shards": rng.random() < 0.8}
    return cfg


def draw_cluster(rng: random.Random) -> dict:
    out = {"block_rows": rng.choice([1, 3, 7, 50, 333, 250_000])}
    if rng.random() < 0.3:
        out["components_gathered_edges"] = 0
    if rng.random() < 0.3:
        out["small_route_rows"] = 0
    if rng.random() < 0.2:
        out["shuffle"] = rng.choice(["tasks", "p2p"])
    if rng.random() < 0.3:
        out["spill_texts"] = rng.choice([True, False])
    return out


def draw_corpus(rng: random.Random, d: Path) -> tuple[str, bool, dict]:
    """Writes shards into ``d``; returns (ids kind, whether a vector column exists, a description)."""
    n = rng.choice([0, 1, 2, 5, 30, 120, 400])
    heavy = rng.random() < 0.2
    sample = planted_corpus(n_docs=max(n, 40), n_clusters=max(1, n // 10), words=(3, rng.choice([12, 60])),
                            edit_rate=(0, 0.1), seed=rng.randrange(10**6),
                            boilerplate_fraction=0.5 if heavy else 0.0, boilerplate_identical=rng.random() < 0.5,
                            empty_fraction=0.05 if rng.random() < 0.3 else 0.0)
    texts = sample.table.column("text").to_pylist()[:n]
    if rng.random() < 0.3:
        texts = [None if rng.random() < 0.1 else t for t in texts]
    ids = rng.choice(["int", "str", "dup_str", "dup_int", "null_str", "absent", "absent", "mixed"])
    if ids == "int":
        idv = pa.array(list(range(n)), pa.int64())
    elif ids == "str":
        idv = pa.array([f"d{i:05d}" for i in range(n)], pa.string())
    elif ids == "dup_str":
        idv = pa.array([f"d{rng.randrange(max(1, n // 3))}" for _ in range(n)], pa.string())
    elif ids == "dup_int":
        idv = pa.array([rng.randrange(max(1, n // 3)) for _ in range(n)], pa.int64())
    elif ids == "null_str":
        idv = pa.array([None if rng.random() < 0.2 else f"x{rng.randrange(n + 1)}" for _ in range(n)], pa.string())
    else:
        idv = None
    mixed = ids == "mixed"  # integer ids in some shards, string ids or none in others: both sides must refuse alike
    if mixed:
        idv = pa.array(list(range(n)), pa.int64())
    cols = {"text": pa.array(texts, pa.large_string())}
    if idv is not None:
        cols = {"id": idv, **cols}
    cols["score"] = pa.array([None if rng.random() < 0.1 else float(rng.randrange(4)) for _ in range(n)],
                             pa.float64())
    vectors = rng.random() < 0.4
    if vectors:
        dim = 8
        npr = np.random.default_rng(rng.randrange(10**6))
        base = npr.normal(size=(max(1, n // 4), dim)).astype(np.float32)
        v = base[npr.integers(0, len(base), n)] + npr.normal(scale=0.02, size=(n, dim)).astype(np.float32)
        cols["emb"] = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel(), pa.float32()), dim)
    table = pa.table(cols)
    d.mkdir(parents=True)
    # cut into shards: some empty, some of one row
    k = rng.choice([1, 2, 3, 5, 12])
    cuts = sorted(rng.randint(0, n) for _ in range(k - 1))
    bounds = [0, *cuts, n]
    use_jsonl = not vectors and rng.random() < 0.35
    fmts = []
    for i in range(k):
        piece = table.slice(bounds[i], bounds[i + 1] - bounds[i])
        if mixed and i % 2:
            piece = piece.drop_columns(["id"]) if rng.random() < 0.5 else piece.set_column(
                0, "id", pa.array([f"s{v}" for v in piece.column("id").to_pylist()], pa.string()))
        jsonl = use_jsonl and rng.random() < 0.5
        if jsonl:
            fmts.append("j")
            with open(d / f"s{i:03d}.jsonl", "w") as fh:
                for row in piece.to_pylist():
                    fh.write(json.dumps(row) + "\n")
        else:
            fmts.append("p")
            pq.write_table(piece, d / f"s{i:03d}.parquet", row_group_size=rng.choice([1, 4, 64, 1000]))
    return ids, vectors, {"n": n, "ids": ids, "shards": "".join(fmts), "bounds": bounds, "heavy": heavy,
                          "vectors": vectors}


def compare(single: Path, dist: Path) -> list[str]:
    """The differences between one process's outputs and a cluster's (empty: none)."""
    problems = []
    a = {p.name for p in single.iterdir() if p.is_file() and not p.name.startswith(".")}
    b = {p.name for p in dist.iterdir() if p.is_file() and not p.name.startswith(".")}
    if a != b:
        problems.append(f"file sets differ: only single {sorted(a - b)}, only cluster {sorted(b - a)}")
    for name in sorted(a & b - SKIP):
        if (single / name).read_bytes() != (dist / name).read_bytes():
            problems.append(f"{name} differs: {_content_diff(single / name, dist / name)}")
    ra = json.loads((single / "report.json").read_text())["counts"]
    rb = json.loads((dist / "report.json").read_text())["counts"]
    bad = {k: (ra.get(k), rb.get(k)) for k in SAME_COUNTS if ra.get(k) != rb.get(k)}
    if bad:
        problems.append(f"report counts differ: {bad}")
    return problems


def _content_diff(x: Path, y: Path) -> str:
    if x.suffix != ".parquet":
        lx, ly = x.read_text().splitlines(), y.read_text().splitlines()
        bad = [i for i in range(min(len(lx), len(ly))) if lx[i] != ly[i]]
        return f"lines {len(lx)} vs {len(ly)}, first differing {[(i, lx[i][:80], ly[i][:80]) for i in bad[:2]]}"
    ta, tb = pq.read_table(x), pq.read_table(y)
    if ta.schema != tb.schema or ta.num_rows != tb.num_rows:
        return f"schema/rows {ta.schema} {ta.num_rows} vs {tb.schema} {tb.num_rows}"
    out = []
    for c in ta.column_names:
        u, v = ta.column(c).to_pylist(), tb.column(c).to_pylist()
        bad = [i for i in range(len(u)) if u[i] != v[i] and not (u[i] != u[i] and v[i] != v[i])]
        if bad:
            out.append(f"{c}: {len(bad)} rows, first {[(i, u[i], v[i]) for i in bad[:3]]}")
    return "; ".join(out) or "same values, other bytes (metadata or encoding)"


def one_case(seed: int, scheduler: str, work: Path, run_dedup) -> dict:
    """Run case ``seed``; returns its description with ``problems`` (differences, or the error of one side)."""
    rng = random.Random(seed)
    case_dir = work / f"case-{seed}"
    if case_dir.exists():
        shutil.rmtree(case_dir)
    ids, vectors, desc = draw_corpus(rng, case_dir / "in")
    cfgd = draw_config(rng, ids, vectors)
    clus = draw_cluster(rng)
    desc.update(config=cfgd, cluster=clus, seed=seed)
    cfg = Config.from_dict(cfgd)
    errors = {}
    for name, c in (("single", cfg), ("cluster", cfg.with_overrides(
            {"cluster.scheduler": scheduler, **{f"cluster.{k}": v for k, v in clus.items()}}))):
        try:
            run_dedup(case_dir / "in", case_dir / name, c)
        except Exception as exc:  # noqa: BLE001 - recorded: the two sides must fail alike
            errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
    if errors:
        same_kind = len(errors) == 2 and errors["single"].split(":")[0] == errors["cluster"].split(":")[0]
        desc["problems"] = [] if same_kind else [f"errors: {errors}"]
        desc["both_failed"] = same_kind
    else:
        desc["problems"] = compare(case_dir / "single", case_dir / "cluster")
    if not desc["problems"]:
        shutil.rmtree(case_dir, ignore_errors=True)
    return desc
