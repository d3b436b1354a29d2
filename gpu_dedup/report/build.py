"""Report stage: parameters, counts and seconds per stage, histograms, S-curve.

``report.json`` is machine-readable and written atomically, last (then
``report.html``, its human-readable page, see :mod:`gpu_dedup.report.page`,
and ``_SUCCESS``).  It holds everything the page shows: exact size counts of
buckets and clusters besides the log2 histograms, and the largest clusters
with sample texts.
"""

from __future__ import annotations

import datetime as _dt
import json
import platform

import numpy as np
import pyarrow as pa

from gpu_dedup.version import __version__
from gpu_dedup.storage import atomic_write_bytes


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


def size_counts(sizes) -> dict[str, list[int]]:
    """Exact distribution of sizes: distinct ``sizes`` and how many times each occurs
    (at most ~sqrt(2 * total) distinct values, so it stays small)."""
    sizes = np.asarray(sizes, np.int64)
    values, counts = np.unique(sizes[sizes > 0], return_counts=True)
    return {"sizes": values.tolist(), "counts": counts.tolist()}


def _quantiles(values) -> dict[str, float]:
    values = np.asarray(values, np.float64)
    if values.shape[0] == 0:
        return {}
    qs = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 1.0)
    return {f"p{int(q * 100)}": round(float(v), 4) for q, v in zip(qs, np.quantile(values, qs))}


def build_report(*, cfg, backend, shards, counts, stages, bucket_sizes, cluster_sizes, removed_similarity,
                 threshold, wall_seconds, peak_rss_mb, lsh: dict, largest_clusters=None, examples=None,
                 kept=None) -> dict:
    """``lsh``: the similarity family's section (:meth:`gpu_dedup.stages.families.Family.report_section`):
    layout, P(candidate) at the threshold, FP/FN areas, S-curve points.  ``kept``: the kept flag per
    input row (in shard order): each input then records its ``kept`` and ``removed`` rows."""
    below = int(np.count_nonzero(np.asarray(removed_similarity) < threshold))
    near = max(int(np.asarray(removed_similarity).shape[0]), 1)
    edges = np.round(np.linspace(0.0, 1.0, 21), 2)
    sim_hist = np.histogram(np.asarray(removed_similarity, np.float64), bins=edges)[0]
    report = {
        "gpu_dedup_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": cfg.fingerprint,
        "backend": backend.mode,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": _cpus()},
        "config": cfg.to_dict(),
        "inputs": _inputs(shards, kept),
        "lsh": lsh,
        "counts": {**counts, "accounted": counts["kept"] + counts["removed"] == counts["documents_read"]},
        "stages": stages,
        "histograms": {
            "bucket_sizes": log2_histogram(bucket_sizes),
            "cluster_sizes": log2_histogram(cluster_sizes),
            "bucket_size_counts": size_counts(bucket_sizes),
            "cluster_size_counts": size_counts(cluster_sizes),
        },
        "chaining": {
            "near_duplicates_removed": int(np.asarray(removed_similarity).shape[0]),
            "below_threshold_to_survivor": below,
            "fraction_below_threshold": round(below / near, 6),
            "similarity_to_survivor": _quantiles(removed_similarity),
            "similarity_to_survivor_histogram": {"edges": edges.tolist(), "counts": sim_hist.tolist()},
            "note": "clusters are connected components, so a member can join through an intermediate "
                    "document and be less similar to the survivor than the threshold",
        },
        "wall_seconds": round(wall_seconds, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
    }
    if largest_clusters is not None:
        report["largest_clusters"] = largest_clusters
    if examples is not None:  # see :func:`examples`
        report.update(examples)
    return report


def _inputs(shards, kept) -> list[dict]:
    """One record per input shard; with ``kept`` (per row, shards in order) its kept and removed rows."""
    out = [{"path": s.path, "name": s.name, "format": s.format, "rows": s.rows, "bytes": s.size} for s in shards]
    if kept is not None:
        kept = np.asarray(kept, bool)
        starts = np.cumsum([0] + [max(s.rows, 0) for s in shards])
        if starts[-1] == kept.shape[0]:
            total = np.concatenate(([0], np.cumsum(kept, dtype=np.int64)))
            for rec, a, b in zip(out, starts[:-1], starts[1:]):
                k = int(total[b] - total[a])
                rec.update(kept=k, removed=int(b - a) - k)
    return out


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def write_report(path, report: dict) -> None:

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
        f"LSH ({lsh.get('similarity', 'jaccard')}): {lsh['bands']} bands x {lsh['rows']} rows of "
        + (f"{lsh['num_perm']} permutations, " if "num_perm" in lsh else f"{lsh.get('bits')} bits, ") +
        f"threshold {lsh['threshold']}; {c['candidate_edges']:,} candidate edges, "
        f"{c['verified_edges']:,} verified ({report['config']['verify']['method']})",
        "seconds: " + ", ".join(f"{k} {v['seconds']:.2f}" for k, v in report["stages"].items())
        + f"; total {report['wall_seconds']:.2f}s, peak RSS {report['peak_rss_mb']:.0f} MiB",
        f"backend: {report['backend']}",
    ]
    chain = chaining_line(report)
    if chain:
        lines.insert(2, chain)
    return "\n".join(lines)


def chaining_line(report: dict) -> str | None:
    """How many removed documents are below the threshold to the document kept in their place."""
    ch = report.get("chaining")
    if not ch:
        return None
    c = report["counts"]
    t = report["lsh"].get("verify_threshold", report["lsh"]["threshold"])
    below, near = ch["below_threshold_to_survivor"], ch["near_duplicates_removed"]
    split = report.get("config", {}).get("select", {}).get("split_chains")
    if below:
        low = ch.get("similarity_to_survivor", {}).get("p0")
        return (f"below the threshold: {below:,} of {near:,} removed near duplicates are less similar than {t} to "
                f"the document kept in their place" + (f" (down to {low})" if low is not None else "")
                + ("; select.split_chains: true keeps them" if not split else ""))
    moved = f"; select.split_chains moved {c['chain_split_ejected']:,} out of chains" if c.get("chain_split_ejected") \
        else ""
    return (f"below the threshold: none of the {near:,} removed near duplicates is less similar than {t} to its "
            f"survivor{moved}")


def largest_clusters(survivor, kept, rep, similarity, text, ids, shard, shard_row, shard_names, k: int = 8,
                     members: int = 3, chars: int = 1000) -> list[dict]:
    """The ``k`` largest clusters (ties: lower survivor row), each with its survivor and up to
    ``members`` removed members (near duplicates first, least similar first, then exact copies),
    texts cut to ``chars`` characters.  Arrays are per input row; ``text``/``ids`` are Arrow columns
    (``ids`` None: the input has no id column, documents are named by ``row``).
    """
    return examples(survivor, kept, rep, similarity, text, ids, shard, shard_row, shard_names, k=k, near_k=0,
                    closest=0, members=members, chars=chars)["largest_clusters"]


def examples(survivor, kept, rep, similarity, text, ids, shard, shard_row, shard_names, threshold: float = 1.0,
             k: int = 8, near_k: int = 4, closest: int = 6, members: int = 3, chars: int = 1000) -> dict:
    """Sample documents for the report page, three views of the clusters:

    - ``largest_clusters``: the ``k`` largest clusters (see :func:`largest_clusters`); on real
      corpora these are mostly exact copies (boilerplate);
    - ``largest_near_duplicate_clusters``: the ``near_k`` clusters with the most near duplicates
      (removed members whose text differs from the survivor's; ties: larger, then lower survivor
      row) among those not in ``largest_clusters``, each with up to ``members`` of them, least
      similar first;
    - ``closest_to_threshold``: the ``closest`` removed near duplicates whose similarity to their
      survivor is nearest ``threshold`` (ties: lower row), each with its survivor: the decisions
      another threshold would change first.

    Arrays are per input row; ``text``/``ids`` are Arrow columns (``ids`` None: no id column).
    """
    out = {"largest_clusters": [], "largest_near_duplicate_clusters": [], "closest_to_threshold": []}
    n = survivor.shape[0]
    if n == 0:
        return out
    size = np.bincount(survivor, minlength=n)
    copies = np.bincount(survivor[~kept & (rep == survivor)], minlength=n)  # exact copies of each survivor
    near = ~kept & (rep != survivor)
    nears = np.bincount(survivor[near], minlength=n)  # near duplicates of each survivor
    multi = np.flatnonzero(size > 1)  # survivor rows of clusters with two or more documents
    top = multi[np.lexsort((multi, -size[multi]))][:k]
    with_near = np.flatnonzero(nears > 0)
    with_near = with_near[~np.isin(with_near, top)]  # not the largest clusters again: other clusters, or none
    near_top = with_near[np.lexsort((with_near, -size[with_near], -nears[with_near]))][:near_k]
    close = np.flatnonzero(near)
    close = close[np.lexsort((close, np.abs(similarity[close] - threshold)))][:closest]
    shown = _members(top, survivor, ~kept, rep, similarity, members, n)
    near_shown = _members(near_top, survivor, near, rep, similarity, members, n)  # ``near`` as "removed"
    rows = np.unique(np.concatenate([top, shown, near_top, near_shown, close, survivor[close]]))
    doc = _documents(rows, survivor, kept, rep, similarity, text, ids, shard, shard_row, shard_names, chars)

    def cluster(s: int, mine) -> dict:
        return {"cluster_id": s, "size": int(size[s]), "exact_copies": int(copies[s]),
                "near_duplicates": int(nears[s]), "survivor": doc[s], "members": [doc[m] for m in mine.tolist()]}

    out["largest_clusters"] = [cluster(s, shown[survivor[shown] == s]) for s in top.tolist()]
    out["largest_near_duplicate_clusters"] = [cluster(s, near_shown[survivor[near_shown] == s])
                                              for s in near_top.tolist()]
    out["closest_to_threshold"] = [{"survivor": doc[int(survivor[r])], "member": doc[r]} for r in close.tolist()]
    return out


def _members(top, survivor, removed, rep, similarity, members: int, n: int) -> np.ndarray:
    """Up to ``members`` rows marked ``removed`` in each cluster whose survivor is in ``top``:
    near duplicates first, least similar first, then exact copies (ties: lower row)."""
    if top.shape[0] == 0:
        return np.zeros(0, np.int64)
    rank = np.full(n, -1, np.int64)
    rank[top] = np.arange(top.shape[0])
    cand = np.flatnonzero((rank[survivor] >= 0) & removed)
    exact = rep[cand] == survivor[cand]
    cand = cand[np.lexsort((cand, similarity[cand], exact, rank[survivor[cand]]))]
    group = rank[survivor[cand]]
    first = np.r_[True, group[1:] != group[:-1]]
    pos = np.arange(cand.shape[0]) - np.maximum.accumulate(np.where(first, np.arange(cand.shape[0]), 0))
    return cand[pos < members]


def _documents(rows, survivor, kept, rep, similarity, text, ids, shard, shard_row, shard_names, chars) -> dict:
    """Display data of a few dozen documents, by row."""
    take = pa.array(rows, pa.int64())
    texts = _display_texts(text.take(take), chars)
    id_values = [_json_safe(v) for v in _pylist(ids.take(take))] if ids is not None else None
    names = np.array(shard_names or [""], dtype=object)
    doc = {}
    for j, row in enumerate(rows.tolist()):  # a few dozen documents at most
        body, truncated, length = texts[j]
        doc[row] = {"row": row, **({"id": id_values[j]} if id_values is not None else {}),
                    "shard": names[shard[row]], "shard_row": int(shard_row[row]),
                    "match": "kept" if kept[row] else ("exact" if rep[row] == survivor[row] else "near"),
                    "similarity": round(float(similarity[row]), 4), "characters": length,
                    "text": body, "truncated": truncated}
    return doc


def _pylist(values) -> list:
    """Python values of an Arrow array; strings that hold ill-formed UTF-8 (Arrow does not validate what
    it reads) are decoded with U+FFFD replacement characters for display instead of failing."""
    t = values.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return [None if v is None else v.decode("utf-8", errors="replace")
                for v in values.cast(pa.large_binary()).to_pylist()]
    return values.to_pylist()


def _display_texts(texts, chars: int) -> list[tuple]:
    """(text cut to ``chars`` characters or None, cut?, length in characters) of a few documents."""
    out = []
    for v in _pylist(texts):  # a few dozen documents at most
        if isinstance(v, bytes):
            v = v.decode("utf-8", errors="replace")
        if v is None:
            out.append((None, False, 0))
        else:
            out.append((v[:chars], len(v) > chars, len(v)))
    return out


def _json_safe(v):
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
