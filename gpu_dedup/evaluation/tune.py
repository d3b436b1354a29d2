"""``gpu-dedup tune``: compare LSH layouts (bands x rows) for a threshold and pick one.

The pick is ``lsh.optimal_layout`` (the layout the pipeline derives): the
(b, r) with b * r <= num_perm minimising ``fp_weight * FP + fn_weight * FN``,
the areas under / over the S-curve ``1-(1-s^r)^b`` below / above the
threshold.  The table shows it with the next-best layouts and its
neighbours; ``confirm`` runs the pipeline with the top layouts on a sample of
a corpus and measures them against exact Jaccard (see ``evaluate``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from gpu_dedup.config import Config
from gpu_dedup.curves import error_areas, optimal_layout, s_curve
from gpu_dedup.evaluation.evaluate import Evaluation
from gpu_dedup.report.plots import plot_layouts
from gpu_dedup.run.outdir import check_report_files
from gpu_dedup.storage import atomic_write_bytes

TUNE_KEYS = ("threshold", "pick", "layouts")  # what marks a tune.json gpu_dedup wrote


def s_points(threshold: float) -> list[float]:
    """Similarities at which the table shows P(candidate): around the threshold."""
    pts = [threshold - 0.2, threshold - 0.1, threshold, threshold + 0.05, threshold + 0.1]
    return [round(p, 4) for p in pts if 0.0 < p <= 1.0]


def candidate_layouts(threshold: float, num_perm: int, fp_weight: float = 0.05, fn_weight: float = 0.95,
                      top: int = 6) -> list[dict]:
    """The ``top`` cheapest layouts plus the pick's neighbours (b +- 1, r +- 1), cheapest first."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold = {threshold} must be in (0, 1]; e.g. 0.8")
    if num_perm < 1:
        raise ValueError(f"num_perm = {num_perm} must be >= 1; e.g. 128")
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)])
    fp, fn = error_areas(threshold, pairs[:, 0], pairs[:, 1])
    cost = fp_weight * fp + fn_weight * fn
    pick = optimal_layout(threshold, num_perm, fp_weight, fn_weight)
    rank = np.empty(cost.shape[0], np.int64)
    rank[np.argsort(cost, kind="stable")] = np.arange(cost.shape[0])
    chosen = set(np.flatnonzero(rank < top).tolist())
    index = {(int(b), int(r)): i for i, (b, r) in enumerate(pairs)}
    for db in (-1, 0, 1):
        for dr in (-1, 0, 1):
            i = index.get((pick[0] + db, pick[1] + dr))
            if i is not None:
                chosen.add(i)
    pts = s_points(threshold)
    rows = []
    for i in sorted(chosen, key=lambda i: (rank[i], i)):  # a dozen table rows
        b, r = int(pairs[i, 0]), int(pairs[i, 1])
        rows.append({
            "bands": b,
            "rows": r,
            "permutations_used": b * r,
            "rank": int(rank[i]) + 1,
            "s_curve_midpoint": round((1.0 / b) ** (1.0 / r), 4),  # where P rises fastest, about
            "fp_area": round(float(fp[i]), 6),
            "fn_area": round(float(fn[i]), 6),
            "cost": round(float(cost[i]), 6),
            "p": {f"{s:g}": round(float(s_curve(s, b, r)), 4) for s in pts},
            "pick": (b, r) == pick,
        })
    return rows


def format_table(rows: list[dict], threshold: float) -> str:
    pts = list(rows[0]["p"]) if rows else []
    head = (f"{'':2}{'bands':>5} {'rows':>4} {'b*r':>4} {'rank':>5} {'~s*':>6} {'FP area':>9} {'FN area':>9} "
            f"{'cost':>9}  " + " ".join(f"{'P(' + s + ')':>8}" for s in pts))
    lines = [head]
    for row in rows:
        lines.append(
            f"{'*' if row['pick'] else ' ':2}{row['bands']:>5} {row['rows']:>4} {row['permutations_used']:>4} "
            f"{row['rank']:>5} {row['s_curve_midpoint']:>6.3f} {row['fp_area']:>9.5f} {row['fn_area']:>9.5f} "
            f"{row['cost']:>9.5f}  " + " ".join(f"{row['p'][s]:>8.4f}" for s in pts)
        )
    lines.append(f"(* marks the pick, lsh.optimal_layout; ~s* = (1/b)^(1/r), where P rises fastest; threshold {threshold})")
    return "\n".join(lines)


def tune(cfg: Config, *, top: int = 6, output_dir=None, sample_inputs=None, sample: int = 5000, seed: int = 0,
         confirm: int = 3, floor: float | None = None, plot: bool = True) -> dict:
    """Table of layouts for ``cfg``'s threshold, num_perm and weights; optionally confirmed on a sample."""
    t = cfg.lsh.threshold
    if output_dir is not None:  # before the work: never overwrite a file of the user's, nor write into the inputs
        check_report_files(output_dir, "tune.json", "tune.png", TUNE_KEYS, sample_inputs)
    rows = candidate_layouts(t, cfg.minhash.num_perm, cfg.lsh.fp_weight, cfg.lsh.fn_weight, top)
    pick = next(r for r in rows if r["pick"])
    result = {
        "threshold": t,
        "num_perm": cfg.minhash.num_perm,
        "fp_weight": cfg.lsh.fp_weight,
        "fn_weight": cfg.lsh.fn_weight,
        "pick": {"bands": pick["bands"], "rows": pick["rows"]},
        "layouts": rows,
    }
    if sample_inputs is not None:
        result["empirical"] = confirm_layouts(cfg, rows[:max(confirm, 1)], sample_inputs, sample=sample, seed=seed,
                                              floor=floor if floor is not None else min(0.3, t))
    if output_dir is not None:

        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "tune.json", (json.dumps(result, indent=2) + "\n").encode())
        if plot:
            png = plot_layouts(rows, t, out / "tune.png")
            if png is not None:
                result["png"] = str(png)
    return result


def confirm_layouts(cfg: Config, rows: list[dict], inputs, *, sample: int, seed: int, floor: float) -> dict:
    """Run the pipeline with each layout on one sample; measure against its exact all-pairs Jaccard."""
    import tempfile


    with tempfile.TemporaryDirectory(prefix="gpu-dedup-tune-") as tmp:
        ev = Evaluation(inputs, cfg, tmp, sample=sample, seed=seed, floor=floor)
        measured = []
        for row in rows:  # one pipeline run per layout (a few)
            layout_cfg = cfg.with_overrides({"lsh.bands": row["bands"], "lsh.rows": row["rows"]})
            sec = ev.run(layout_cfg, f"b{row['bands']}r{row['rows']}")
            p = sec["pairs"]
            measured.append({
                "bands": row["bands"], "rows": row["rows"], "pick": row["pick"],
                "recall_at_threshold": p["recall_at_threshold"],
                "recall_at_threshold_plus_0.05": p["recall_at_threshold_plus_0.05"],
                "candidate_recall_at_threshold": p["candidate_recall_at_threshold"],
                "candidate_pairs_at_or_above_floor": p["candidate_pairs_at_or_above_floor"],
                "candidate_edges": sec["run"]["counts"]["candidate_edges"],
                "never_candidate": sec["misses"]["never_candidate"],
                "verified_edge_precision": sec["verified_edges"]["precision"],
                "seconds": sec["run"]["seconds"],
            })
    return {"corpus": ev.info, "layouts": measured}


def format_empirical(emp: dict) -> str:
    c = emp["corpus"]
    lines = [f"measured on {c['sample']:,} of {c['documents']:,} documents "
             f"({c['exact_pairs_at_or_above_floor']:,} exact pairs with J >= {c['floor']}):",
             f"{'':2}{'bands':>5} {'rows':>4} {'recall@t':>9} {'recall@t+.05':>12} {'cand.recall@t':>13} "
             f"{'cand. edges':>11} {'never cand.':>11} {'seconds':>8}"]
    for m in emp["layouts"]:
        f = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
        lines.append(f"{'*' if m['pick'] else ' ':2}{m['bands']:>5} {m['rows']:>4} {f(m['recall_at_threshold']):>9} "
                     f"{f(m['recall_at_threshold_plus_0.05']):>12} {f(m['candidate_recall_at_threshold']):>13} "
                     f"{m['candidate_edges']:>11,} {m['never_candidate']:>11,} {m['seconds']:>8.2f}")
    return "\n".join(lines)


# ---------------------------------------------------------------- similarity: cosine
#
# The same table for random-projection signatures: (bands, rows) with
# bands * rows <= cosine.bits and min_rows <= rows <= 64, cost from the FP/FN
# areas on the angle axis (gpu_dedup.curves.cosine_layout), P(candidate) at
# cosines around the threshold from the S-curve 1-(1-(1-arccos(s)/pi)^k)^m.

from gpu_dedup.curves import (
    cosine_error_areas,
    cosine_layout,
    cosine_min_rows,
    cosine_s_curve,
    cosine_s_curve_points,
)


def cosine_s_points(threshold: float) -> list[float]:
    """Cosines at which the cosine table shows P(candidate): around the threshold."""
    pts = [threshold - 0.1, threshold - 0.05, threshold, threshold + 0.02, threshold + 0.05]
    return [round(p, 4) for p in pts if -1.0 < p <= 1.0]


def cosine_candidate_layouts(threshold: float, bits: int, fp_weight: float = 0.05, fn_weight: float = 0.95,
                             top: int = 6, min_rows: int = 1) -> list[dict]:
    """The ``top`` cheapest cosine layouts plus the pick's neighbours (bands +- 1, rows +- 1), cheapest first.

    ``rows_in_bucket_per_100k`` is how many unrelated rows (bit agreement 1/2)
    a bucket of one band holds next to a row in a run of 100,000 rows:
    ``1e5 * 2**-rows`` (see ``cosine.min_rows``).
    """
    if not -1.0 < threshold < 1.0:
        raise ValueError(f"threshold = {threshold} must be in (-1, 1) for cosine; e.g. 0.9")
    if bits < 1:
        raise ValueError(f"bits = {bits} must be >= 1; e.g. 1024")
    pairs = np.array([(b, r) for b in range(1, bits // min_rows + 1)
                      for r in range(min_rows, min(64, bits // b) + 1)])
    fp, fn = cosine_error_areas(threshold, pairs[:, 0], pairs[:, 1])
    cost = fp_weight * fp + fn_weight * fn
    pick = cosine_layout(threshold, bits, fp_weight, fn_weight, min_rows=min_rows)
    rank = np.empty(cost.shape[0], np.int64)
    rank[np.argsort(cost, kind="stable")] = np.arange(cost.shape[0])
    chosen = set(np.flatnonzero(rank < top).tolist())
    index = {(int(b), int(r)): i for i, (b, r) in enumerate(pairs)}
    for db in (-1, 0, 1):
        for dr in (-1, 0, 1):
            i = index.get((pick[0] + db, pick[1] + dr))
            if i is not None:
                chosen.add(i)
    pts = cosine_s_points(threshold)
    rows = []
    for i in sorted(chosen, key=lambda i: (rank[i], i)):  # a dozen table rows
        b, r = int(pairs[i, 0]), int(pairs[i, 1])
        p_mid = (1.0 / b) ** (1.0 / r)  # bit agreement where P rises fastest, about
        rows.append({
            "bands": b,
            "rows": r,
            "bits_used": b * r,
            "rank": int(rank[i]) + 1,
            "s_curve_midpoint": round(float(np.cos(np.pi * (1.0 - p_mid))), 4),
            "fp_area": round(float(fp[i]), 6),
            "fn_area": round(float(fn[i]), 6),
            "cost": round(float(cost[i]), 6),
            "rows_in_bucket_per_100k": round(1e5 * 0.5**r, 4),
            "p": {f"{s:g}": round(float(cosine_s_curve(s, b, r)), 4) for s in pts},
            "pick": (b, r) == pick,
        })
    return rows


def format_cosine_table(rows: list[dict], threshold: float) -> str:
    pts = list(rows[0]["p"]) if rows else []
    head = (f"{'':2}{'bands':>5} {'rows':>4} {'bits':>5} {'rank':>5} {'~cos*':>6} {'FP area':>9} {'FN area':>9} "
            f"{'cost':>9} {'unrel/100k':>10}  " + " ".join(f"{'P(' + s + ')':>8}" for s in pts))
    lines = [head]
    for row in rows:
        lines.append(
            f"{'*' if row['pick'] else ' ':2}{row['bands']:>5} {row['rows']:>4} {row['bits_used']:>5} "
            f"{row['rank']:>5} {row['s_curve_midpoint']:>6.3f} {row['fp_area']:>9.5f} {row['fn_area']:>9.5f} "
            f"{row['cost']:>9.5f} {row['rows_in_bucket_per_100k']:>10.4f}  "
            + " ".join(f"{row['p'][s]:>8.4f}" for s in pts)
        )
    lines.append(f"(* marks the pick, curves.cosine_layout; ~cos* = cos(pi (1 - (1/b)^(1/r))), where P rises "
                 f"fastest; unrel/100k: unrelated rows per bucket per 100,000 rows; cosine threshold {threshold})")
    return "\n".join(lines)


def tune_cosine(cfg: Config, *, top: int = 6, rows_in_run: int | None = None, output_dir=None,
                plot: bool = True) -> dict:
    """Table of cosine layouts for ``cfg``'s threshold, ``cosine.bits``, weights and ``min_rows``
    (``cosine.min_rows``, or derived from ``rows_in_run`` as the pipeline does)."""
    t = cfg.lsh.threshold
    if output_dir is not None:
        check_report_files(output_dir, "tune.json", "tune.png", TUNE_KEYS)
    min_rows = cfg.cosine.min_rows
    if min_rows is None:
        min_rows = cosine_min_rows(rows_in_run) if rows_in_run else 1
    rows = cosine_candidate_layouts(t, cfg.cosine.bits, cfg.lsh.fp_weight, cfg.lsh.fn_weight, top, min_rows)
    pick = next(r for r in rows if r["pick"])
    result = {
        "similarity": "cosine",
        "threshold": t,
        "bits": cfg.cosine.bits,
        "min_rows": min_rows,
        "rows_in_run": rows_in_run,
        "fp_weight": cfg.lsh.fp_weight,
        "fn_weight": cfg.lsh.fn_weight,
        "pick": {"bands": pick["bands"], "rows": pick["rows"]},
        "s_curve": cosine_s_curve_points(pick["bands"], pick["rows"], step=0.02, lo=0.5),
        "layouts": rows,
    }
    if output_dir is not None:
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(out / "tune.json", (json.dumps(result, indent=2) + "\n").encode())
        if plot:
            png = plot_layouts(rows, t, out / "tune.png", similarity="cosine")
            if png is not None:
                result["png"] = str(png)
    return result
