"""Report stage: parameters, counts and seconds per stage, histograms, S-curve.

``report.json`` is machine-readable and written atomically, last: its
presence marks a complete run.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform

import numpy as np

from . import __version__
from .lsh import error_areas, s_curve, s_curve_points


def log2_histogram(sizes) -> dict[str, int]:
    """Counts of sizes in power-of-two bins: '2', '3-4', '5-8', ... (keys are bin ranges)."""
    sizes = np.asarray(sizes, np.int64)
    sizes = sizes[sizes > 0]
    if sizes.shape[0] == 0:
        return {}
    exp = np.ceil(np.log2(sizes)).astype(np.int64)
    counts = np.bincount(exp)
    out = {}
    for e, c in enumerate(counts):
        if c == 0:
            continue
        lo, hi = (1 if e == 0 else 2 ** (e - 1) + 1), 2**e
        out[str(lo) if lo == hi else f"{lo}-{hi}"] = int(c)
    return out


def _quantiles(values) -> dict[str, float]:
    values = np.asarray(values, np.float64)
    if values.shape[0] == 0:
        return {}
    qs = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 1.0)
    return {f"p{int(q * 100)}": round(float(v), 4) for q, v in zip(qs, np.quantile(values, qs))}


def build_report(*, cfg, backend, shards, counts, stages, bucket_sizes, cluster_sizes, removed_similarity,
                 threshold, wall_seconds, peak_rss_mb) -> dict:
    bands, rows = cfg.layout
    fp, fn = error_areas(cfg.lsh.threshold, [bands], [rows])
    computed = cfg.signature_perms
    below = int(np.count_nonzero(np.asarray(removed_similarity) < threshold))
    near = max(int(np.asarray(removed_similarity).shape[0]), 1)
    return {
        "gpu_dedup_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": cfg.fingerprint,
        "backend": backend.mode,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": _cpus()},
        "config": cfg.to_dict(),
        "inputs": [{"path": s.path, "name": s.name, "format": s.format, "rows": s.rows, "bytes": s.size}
                   for s in shards],
        "lsh": {
            "threshold": cfg.lsh.threshold,
            "verify_threshold": threshold,
            "num_perm": cfg.minhash.num_perm,
            "bands": bands,
            "rows": rows,
            "permutations_computed": computed,
            "permutations_not_computed": cfg.minhash.num_perm - computed,
            "permutations_computed_but_unused_by_bands": computed - bands * rows,
            "note": (
                "only the bands*rows permutations the bands use are computed (verification reads the texts)"
                if computed < cfg.minhash.num_perm
                else "all permutations are computed; those beyond bands*rows serve the similarity estimate"
            ),
            "candidate_probability_at_threshold": round(float(s_curve(cfg.lsh.threshold, bands, rows)), 6),
            "false_positive_area": round(float(fp[0]), 6),
            "false_negative_area": round(float(fn[0]), 6),
            "s_curve": s_curve_points(bands, rows),
        },
        "counts": {**counts, "accounted": counts["kept"] + counts["removed"] == counts["documents_read"]},
        "stages": stages,
        "histograms": {
            "bucket_sizes": log2_histogram(bucket_sizes),
            "cluster_sizes": log2_histogram(cluster_sizes),
        },
        "chaining": {
            "near_duplicates_removed": int(np.asarray(removed_similarity).shape[0]),
            "below_threshold_to_survivor": below,
            "fraction_below_threshold": round(below / near, 6),
            "similarity_to_survivor": _quantiles(removed_similarity),
            "note": "clusters are connected components, so a member can join through an intermediate "
                    "document and be less similar to the survivor than the threshold",
        },
        "wall_seconds": round(wall_seconds, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
    }


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def write_report(path, report: dict) -> None:
    from .io import atomic_write_bytes

    atomic_write_bytes(path, (json.dumps(report, indent=2, sort_keys=False) + "\n").encode())


def summary(report: dict) -> str:
    """A few human-readable lines about a run."""
    c = report["counts"]
    lsh = report["lsh"]
    lines = [
        f"read {c['documents_read']:,} documents from {len(report['inputs'])} shard(s); "
        f"kept {c['kept']:,}, removed {c['removed']:,} "
        f"({c['exact_duplicates']:,} exact copies, {c['near_duplicates']:,} near duplicates) "
        f"in {c['clusters']:,} clusters",
        f"LSH: {lsh['bands']} bands x {lsh['rows']} rows of {lsh['num_perm']} permutations, "
        f"threshold {lsh['threshold']}; {c['candidate_edges']:,} candidate edges, "
        f"{c['verified_edges']:,} verified ({report['config']['verify']['method']})",
        "seconds: " + ", ".join(f"{k} {v['seconds']:.2f}" for k, v in report["stages"].items())
        + f"; total {report['wall_seconds']:.2f}s, peak RSS {report['peak_rss_mb']:.0f} MiB",
        f"backend: {report['backend']}",
    ]
    return "\n".join(lines)
