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

from gpu_dedup.backends import array_module, dense_ranks, flags_fit, sorted_in, to_host, to_module
from gpu_dedup.pending import Ready
from gpu_dedup.version import __version__
from gpu_dedup.storage import atomic_write_bytes


def log2_histogram(counts: dict) -> dict[str, int]:
    """Counts of sizes in power-of-two bins: '2', '3-4', '5-8', ... (keys are bin ranges), from exact size
    counts ({size: how many})."""
    out: dict[int, int] = {}
    for size, c in counts.items():
        size = int(size)  # a resumed run's counts come back from JSON with string keys
        if size > 0 and c:
            e = int(np.ceil(np.log2(size)))
            out[e] = out.get(e, 0) + int(c)
    named = {}
    for e in sorted(out):
        lo, hi = (1 if e == 0 else 2 ** (e - 1) + 1), 2**e
        named[str(lo) if lo == hi else f"{lo}-{hi}"] = out[e]
    return named


def size_counts(counts: dict) -> dict[str, list[int]]:
    """Exact distribution of sizes: distinct sizes and how many times each occurs
    (at most ~sqrt(2 * total) distinct values, so it stays small)."""
    items = sorted((int(k), int(v)) for k, v in counts.items() if int(k) > 0 and v)
    return {"sizes": [k for k, _ in items], "counts": [v for _, v in items]}


QUANTILES = (0.0, 0.01, 0.05, 0.25, 0.5, 0.75, 1.0)
SIMILARITY_BINS = np.round(np.linspace(0.0, 1.0, 21), 2)
# every value is counted over -1..1 (cosine similarity to a survivor reached through a chain can be below 0):
# the report shows the 0..1 half (SIMILARITY_BINS) where nothing is below 0, else the whole range
WIDE_BINS = np.round(np.linspace(-1.0, 1.0, 41), 2)


def similarity_summary(ex, parts, fn, threshold: float) -> dict:
    """Count, how many are below ``threshold``, the 20-bin histogram and the exact quantiles (as
    ``np.quantile`` gives them) of the values ``fn(part)`` of every part, without bringing the values
    together: order statistics are found by narrowing a histogram (see :func:`_order_statistics`); where every
    value is in 0..1 (similarities), the first pass over the values also counts them in the first narrowing
    bins of that range.  One part (one process) holds every value: it gives its order statistics in that pass."""
    one = len(parts) == 1  # the part's own values are all of them: it finds the order statistics itself
    stats = ex.collect(_value_stats, parts, values=fn, threshold=threshold, order=one)
    n = sum(st["n"] for st in stats)
    hist = np.sum([st["hist"] for st in stats], axis=0) if stats else np.zeros(40, np.int64)
    edges = SIMILARITY_BINS if not hist[:20].any() else WIDE_BINS
    hist = hist[-(edges.shape[0] - 1):]
    out = {"n": n, "below": sum(st["below"] for st in stats), "hist": [int(h) for h in hist],
           "edges": edges.tolist(), "quantiles": {}}
    if n == 0:
        return out
    lo = min(st["min"] for st in stats if st["n"])
    hi = max(st["max"] for st in stats if st["n"])
    ranks = _ranks(n)
    ks = sorted({r for _, a, b in ranks.values() for r in (a, b)})
    if one:
        found = stats[0]["order"]
    elif all(st["first"] is not None for st in stats):
        found = _order_statistics(ex, parts, fn, ks, 0.0, 1.0, first=[st["first"] for st in stats])
    else:
        found = _order_statistics(ex, parts, fn, ks, lo, hi)
    for q, (vi, k, k1) in ranks.items():
        a, b = found[k], found[k1]
        # numpy's linear interpolation, through numpy itself: quantile gamma of the pair (a, b)
        value = float(np.quantile(np.array([a, b], np.float64), vi - k)) if b != a else a
        out["quantiles"][f"p{int(q * 100)}"] = round(value, 4)
    return out


def _ranks(n: int) -> dict:
    """For each of QUANTILES: (its fractional rank, the ranks below and above it) among ``n`` values."""
    ranks = {}
    for q in QUANTILES:
        vi = q * (n - 1)
        k = int(np.floor(vi))
        ranks[q] = (vi, k, min(k + 1, n - 1))
    return ranks


def _value_stats(part, values, threshold: float, order: bool = False) -> dict:
    """Count, how many are below ``threshold``, 20-bin histogram, min and max of one part's values; and
    ``first``, where they are all in 0..1: what :func:`_narrow` answers for the range 0..1 (else None).
    ``order``: the part holds every value, and gives the order statistics of the quantiles' ranks (``order``:
    rank -> value, by one partial sort) instead of ``first``."""
    v = np.asarray(values(part), np.float64)
    if v.shape[0] == 0:
        return {"n": 0, "below": 0, "hist": np.zeros(40, np.int64), "min": 0.0, "max": 0.0,
                "first": _narrow_one(v, 0.0, 1.0), "order": {}}
    lo, hi = float(v.min()), float(v.max())
    out = {"n": int(v.shape[0]), "below": int(np.count_nonzero(v < threshold)),
           "hist": _histogram(np.clip(v, -1.0, 1.0), WIDE_BINS), "min": lo, "max": hi}
    if order:
        ks = sorted({r for _, a, b in _ranks(v.shape[0]).values() for r in (a, b)})
        out["order"] = {k: float(x) for k, x in zip(ks, np.partition(v, ks)[ks])}
    else:
        out["first"] = _narrow_one(v, 0.0, 1.0) if 0.0 <= lo and hi <= 1.0 else None
    return out


def _histogram(v, edges) -> np.ndarray:
    """``np.histogram(v, bins=edges)[0]`` (each bin holds its left edge, the last one its right edge too;
    values outside the edges and NaN in none) by one binary search each instead of a sort."""
    above = np.bincount(np.searchsorted(edges, v, side="right"), minlength=edges.shape[0] + 1)  # edges at or below
    counts = above[1:-1].copy()  # 0: below the first edge; len(edges): at or past the last one, NaN too
    counts[-1] += int(np.count_nonzero(v == edges[-1]))
    return counts


NARROW_BINS = 4096  # bins of one narrowing pass
GATHER_AT_MOST = 4096  # values brought to the client once a range holds no more


def _order_statistics(ex, parts, fn, ks: list, lo: float, hi: float, first: list | None = None) -> dict:
    """The ``k``-th smallest (0-based) value of ``fn(part)`` over all parts, for every ``k`` of ``ks``, all
    narrowed together (one pass over the parts serves every rank).  For each rank, a pass bins the values of
    its current range into NARROW_BINS bins (per part, summed) and keeps the bin holding the rank; a value
    belongs to a range by the chain of bin formulas, so every value is in exactly one bin of each pass.  Once
    a range holds few values (or all of them are equal) they are brought together and sorted.  ``first``: the
    parts' answers to the first pass (the histogram over ``lo..hi``), where they were counted already."""
    state = {k: {"chain": [], "below": 0, "lo": lo, "hi": hi, "gather": False} for k in ks}  # below: values
    found: dict[int, float] = {}  # before the range; chain: (lo, hi, bin) of each pass
    for _ in range(66):
        active = [k for k in ks if k not in found]
        if not active:
            return found
        asked = {k: (tuple(state[k]["chain"]), state[k]["lo"], state[k]["hi"], state[k]["gather"]) for k in active}
        index = {q: i for i, q in enumerate(dict.fromkeys(asked.values()))}  # ranks in one range share a query
        if first is not None:  # every rank asks the first pass's one query
            got, first = [[r] for r in first], None
        else:
            got = ex.collect(_narrow, parts, values=fn, queries=list(index))
        for k in active:
            s, res = state[k], [g[index[asked[k]]] for g in got]
            if s["gather"]:
                found[k] = float(np.sort(np.concatenate([r["values"] for r in res]))[k - s["below"]])
                continue
            hist = np.zeros(NARROW_BINS, np.int64)
            for r in res:
                hist[r["bins"]] += r["counts"]
            present = [r for r in res if r["n"]]
            if present and min(r["min"] for r in present) == max(r["max"] for r in present):
                found[k] = float(present[0]["min"])  # every value left is the same one
            elif int(hist.sum()) <= GATHER_AT_MOST or s["lo"] == s["hi"] or not np.isfinite(s["hi"] - s["lo"]):
                s["gather"] = True
            else:
                cum = np.cumsum(hist)
                j = int(np.searchsorted(cum, k - s["below"], side="right"))
                s["below"] += int(cum[j - 1]) if j else 0
                s["chain"] = [*s["chain"], (s["lo"], s["hi"], j)]
                w = (s["hi"] - s["lo"]) / NARROW_BINS
                s["lo"], s["hi"] = s["lo"] + j * w, s["lo"] + (j + 1) * w
    raise RuntimeError("quantile narrowing did not converge")  # pragma: no cover


def _bins(v, lo: float, hi: float) -> np.ndarray:
    if hi <= lo:
        return np.zeros(v.shape[0], np.int64)
    x = v - lo  # ((v - lo) / (hi - lo) * NARROW_BINS) computed in place
    x /= hi - lo
    x *= NARROW_BINS
    b = x.astype(np.int64)
    return np.clip(b, 0, NARROW_BINS - 1, out=b)


def _narrow(part, values, queries: list) -> list:
    """For each query (chain, lo, hi, gather) of :func:`_order_statistics`: the values of the part in the
    query's range (gather), or their histogram over ``lo..hi`` (its non-empty bins and their counts) with
    their count, min and max.  Queries share the steps of their chains: each step bins the values its
    prefix left once, and keeps the values of every bin asked for at once before each bin's own."""
    v_all = np.asarray(values(part), np.float64)
    asked: dict = {}  # (prefix, lo, hi): the bins the chains keep of it
    for chain, _, _, _ in queries:
        for i, (c_lo, c_hi, j) in enumerate(chain):
            asked.setdefault((tuple(chain[:i]), c_lo, c_hi), set()).add(j)
    kept = {(): v_all}  # chain prefix: the values it leaves
    binned: dict = {}  # (prefix, lo, hi): the bins of those values

    def bins_of(prefix, lo, hi):
        if (prefix, lo, hi) not in binned:
            binned[(prefix, lo, hi)] = _bins(left(prefix), lo, hi)
        return binned[(prefix, lo, hi)]

    def left(chain):
        if chain not in kept:
            prefix, (c_lo, c_hi, _) = chain[:-1], chain[-1]
            v, b = left(prefix), bins_of(prefix, c_lo, c_hi)
            js = sorted(asked[(prefix, c_lo, c_hi)])
            if len(js) > 1:  # the values of the bins asked for, then each bin's of those
                flag = np.zeros(NARROW_BINS, bool)
                flag[js] = True
                m = flag[b]
                v, b = v[m], b[m]
            for j in js:
                kept[prefix + ((c_lo, c_hi, j),)] = v[b == j]
        return kept[chain]

    out = []
    for chain, lo, hi, gather in queries:
        v = left(tuple(chain))
        if gather:
            out.append({"values": v})
            continue
        out.append(_narrow_one(v, lo, hi, bins_of(tuple(chain), lo, hi)))
    return out


def _narrow_one(v, lo: float, hi: float, bins=None) -> dict:
    """The histogram of ``v`` over ``lo..hi`` (its non-empty bins and their counts; ``bins``: the values' bins,
    where known) with the values' count, min and max."""
    hist = np.bincount(_bins(v, lo, hi) if bins is None else bins, minlength=NARROW_BINS)
    at = np.flatnonzero(hist)  # sparse: a narrowed range holds few of the bins
    return {"bins": at, "counts": hist[at], "n": int(v.shape[0]),
            "min": float(v.min()) if v.shape[0] else 0.0, "max": float(v.max()) if v.shape[0] else 0.0}


def build_report(*, cfg, backend, shards, counts, stages, bucket_sizes: dict, cluster_sizes: dict,
                 removed_similarity: dict, threshold, wall_seconds, peak_rss_mb, lsh: dict, examples=None,
                 removed_per_shard=None) -> dict:
    """``lsh``: the similarity family's section (:meth:`gpu_dedup.stages.families.Family.report_section`):
    layout, P(candidate) at the threshold, FP/FN areas, S-curve points.  ``bucket_sizes`` /
    ``cluster_sizes``: exact size counts ({size: how many}); ``removed_similarity``: the
    :func:`similarity_summary` of removed near duplicates' similarity to their survivors;
    ``removed_per_shard``: rows removed from each input (each input then records its kept and removed rows)."""
    sim = removed_similarity
    below, near = sim["below"], max(sim["n"], 1)
    report = {
        "gpu_dedup_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": cfg.fingerprint,
        "backend": backend.mode,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": _cpus(),
                    "arrow_memory_pool": pa.default_memory_pool().backend_name},
        "config": cfg.to_dict(),
        "inputs": _inputs(shards, removed_per_shard),
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
            "near_duplicates_removed": sim["n"],
            "below_threshold_to_survivor": below,
            "fraction_below_threshold": round(below / near, 6),
            "similarity_to_survivor": sim["quantiles"],
            "similarity_to_survivor_histogram": {"edges": sim.get("edges", SIMILARITY_BINS.tolist()),
                                                 "counts": sim["hist"]},
            "note": "clusters are connected components, so a member can join through an intermediate "
                    "document and be less similar to the survivor than the threshold",
        },
        "wall_seconds": round(wall_seconds, 3),
        "peak_rss_mb": round(peak_rss_mb, 1),
    }
    if examples is not None:  # see :func:`examples_from_parts`
        report.update(examples)
    return report


def _inputs(shards, removed) -> list[dict]:
    """One record per input shard; with ``removed`` (rows removed from each) its kept and removed rows."""
    out = [{"path": s.path, "name": s.name, "format": s.format, "rows": s.rows, "bytes": s.size} for s in shards]
    if removed is not None:
        for rec, s, r in zip(out, shards, removed):
            rec.update(kept=max(s.rows, 0) - int(r), removed=int(r))
    return out


def _cpus() -> int:
    import os

    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def report_bytes(report: dict) -> bytes:
    """report.json's bytes."""
    return (json.dumps(report, indent=2, sort_keys=False) + "\n").encode()


def write_report(path, report: dict) -> None:

    atomic_write_bytes(path, report_bytes(report))


def summary(report: dict) -> str:
    """A few human-readable lines about a run."""
    c = report["counts"]
    lsh = report["lsh"]
    costs = report.get("fixed_seconds") or {}
    fixed = "; fixed costs: " + ", ".join(f"{k} {v:.2f}" for k, v in costs.items()) if costs else ""
    lines = [
        f"read {c['documents_read']:,} documents from {len(report['inputs'])} shard(s); "
        f"kept {c['kept']:,}, removed {c['removed']:,} "
        f"({c['exact_duplicates']:,} exact copies, {c['near_duplicates']:,} near duplicates) "
        f"in {c['clusters']:,} clusters",
        f"LSH ({lsh.get('similarity', 'jaccard')}): {lsh['bands']} bands x {lsh['rows']} rows of "
        + (f"{lsh['num_perm']} permutations, " if "num_perm" in lsh else f"{lsh.get('bits')} bits, ") +
        f"threshold {lsh['threshold']}; {c['candidate_edges']:,} candidate edges, "
        f"{c['verified_edges']:,} verified ({report['config']['verify']['method']})",
        "seconds: " + ", ".join(f"{k} resumed" if v.get("resumed") else f"{k} {v['seconds']:.2f}"
                                for k, v in report["stages"].items())  # a resumed stage's are an earlier run's
        + fixed + f"; total {report['wall_seconds']:.2f}s, peak RSS {report['peak_rss_mb']:.0f} MiB",
        f"backend: {report['backend']}",
    ]
    chain = chaining_line(report)
    if chain:
        lines.insert(2, chain)
    return "\n".join(wrap(line) for line in lines)


SUMMARY_WIDTH = 120  # characters a line of the summary may take; longer ones go on, indented, on the next


def wrap(line: str, width: int = SUMMARY_WIDTH) -> str:
    """``line`` in lines of at most ``width`` characters, the later ones indented by two: cut after its
    ``;`` where it has them (each clause whole), else at spaces."""
    import textwrap

    if len(line) <= width:
        return line
    lead = line[:len(line) - len(line.lstrip(" "))]
    more = lead + "  "  # a line that was indented goes on two further in
    out, current = [], ""
    for clause in line[len(lead):].split("; "):
        joined = f"{current}; {clause}" if current else clause
        if current and len(joined) + len(more if out else lead) > width:
            out.append(current + ";")
            current = clause
        else:
            current = joined
    out.append(current)
    lines = []
    for i, part in enumerate(out):
        lines += textwrap.wrap(part, width, initial_indent=more if i else lead, subsequent_indent=more,
                               break_long_words=False, break_on_hyphens=False)
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


def examples_from_parts(ex, parts, first_doc: int, corpus, threshold: float = 1.0, k: int = 8, near_k: int = 4,
                        closest: int = 6, members: int = 3, chars: int = 1000) -> dict:
    """:func:`examples_soon`, waited for."""
    return examples_soon(ex, parts, first_doc, corpus, threshold, k, near_k, closest, members, chars).result()


class _Examples:
    """What :func:`examples_soon` hands back: ``result()`` waits for the texts and builds the report's samples."""

    def __init__(self, build, *pending):
        self._build, self._pending = build, pending

    def result(self) -> dict:
        return self._build(*(p.result() for p in self._pending))


def examples_soon(ex, parts, first_doc: int, corpus, threshold: float = 1.0, k: int = 8, near_k: int = 4,
                  closest: int = 6, members: int = 3, chars: int = 1000):
    """:func:`examples_from_parts` with its texts (and ids) asked for now and waited for by ``result()``: the
    clusters and rows are chosen here; an executor that reads the texts again from the shards
    (``ex.take_soon``) does it beside what the caller does next.

    Sample documents for the report page, three views of the clusters:

    - ``largest_clusters``: the ``k`` largest clusters (ties: lower survivor row), each with its survivor
      and up to ``members`` removed members (near duplicates first, least similar first, then exact
      copies); on real corpora these are mostly exact copies (boilerplate);
    - ``largest_near_duplicate_clusters``: the ``near_k`` clusters with the most near duplicates
      (removed members whose text differs from the survivor's; ties: larger, then lower survivor
      row) among those not in ``largest_clusters``, each with up to ``members`` of them, least
      similar first;
    - ``closest_to_threshold``: the ``closest`` removed near duplicates whose similarity to their
      survivor is nearest ``threshold`` (ties: lower row), each with its survivor: the decisions
      another threshold would change first.

    ``parts``: the select stage's rows, one partition of whole clusters each (``node``, ``survivor``,
    ``kept``, ``exact``, ``similarity``).  Each partition names its own candidates, the client keeps the
    best of them (a cluster lives in one partition, so these are the overall best), the partitions give
    the chosen clusters' members, and only those few dozen documents' texts are read.
    """
    out = {"largest_clusters": [], "largest_near_duplicate_clusters": [], "closest_to_threshold": []}
    cands = ex.collect(_example_candidates, parts, first_doc=first_doc, k=k, near_k=near_k + k, closest=closest,
                       threshold=threshold)
    top = sorted((c for p in cands for c in p["top"]), key=lambda c: (-c[1], c[0]))[:k]
    largest = {c[0] for c in top}  # not the largest clusters again: other clusters, or none
    near_top = sorted((c for p in cands for c in p["near"] if c[0] not in largest),
                      key=lambda c: (-c[1], -c[2], c[0]))[:near_k]
    close = sorted((c for p in cands for c in p["close"]), key=lambda c: (c[1], c[0]))[:closest]
    if not top and not near_top and not close:
        return _Examples(lambda: out)
    chosen = ex.collect(_example_members, parts, first_doc=first_doc, top=[c[0] for c in top],
                        near_top=[c[0] for c in near_top], close=[(c[0], c[2]) for c in close], members=members)
    info: dict = {}
    shown: dict = {}
    for p in chosen:  # a few dozen documents
        info.update(p["rows"])
        shown.update(p["shown"])
    rows = np.array(sorted(info), np.int64)
    take_soon = getattr(ex, "take_soon", None)  # (an executor without it: taken at once)
    pending = take_soon(rows, "text") if take_soon is not None else Ready(ex.take(rows, "text"))
    ids = Ready(None if corpus.id_generated else ex.take(rows, "id"))
    stats = {c[0]: c for p in cands for c in p["stats"]}
    return _Examples(lambda got_texts, got_ids: _examples_out(out, corpus, rows, info, shown, stats, top, near_top,
                                                              close, got_texts, got_ids, chars), pending, ids)


def _examples_out(out: dict, corpus, rows: np.ndarray, info: dict, shown: dict, stats: dict, top: list,
                  near_top: list, close: list, got_texts, got_ids, chars: int) -> dict:
    """The samples of :func:`examples_soon` from the rows it chose and their texts (and ids) taken."""
    starts = np.cumsum([0] + [s.rows for s in corpus.shards])
    shard = np.searchsorted(starts, rows, side="right") - 1
    texts = _display_texts(got_texts, chars)
    ids = None if got_ids is None else [_json_safe(v) for v in _pylist(got_ids)]
    names = [s.name for s in corpus.shards] or [""]
    doc = {}
    for j, row in enumerate(rows.tolist()):  # a few dozen documents at most
        surv, kept, exact, sim = info[row]
        body, truncated, length = texts[j]
        doc[row] = {"row": row, **({"id": ids[j]} if ids is not None else {}), "shard": names[shard[j]],
                    "shard_row": int(row - starts[shard[j]]),
                    "match": "kept" if kept else ("exact" if exact else "near"),
                    "similarity": round(float(sim), 4), "characters": length, "text": body, "truncated": truncated}

    def cluster(s: int, key: str) -> dict:
        size, copies, nears = stats[s][1:]
        return {"cluster_id": s, "size": size, "exact_copies": copies, "near_duplicates": nears,
                "survivor": doc[s], "members": [doc[m] for m in shown[(key, s)]]}

    out["largest_clusters"] = [cluster(c[0], "top") for c in top]
    out["largest_near_duplicate_clusters"] = [cluster(c[0], "near") for c in near_top]
    out["closest_to_threshold"] = [{"survivor": doc[info[r][0]], "member": doc[r]} for r, _, _ in close]
    return out


def _example_candidates(part, first_doc: int, k: int, near_k: int, closest: int, threshold: float) -> dict:
    """One partition's best clusters by size and by near duplicates, and its removed near duplicates
    closest to the threshold (with their survivors), with the numbers the client ranks them by.  Array
    operations on the partition's own module; only the few dozen picked come to the host."""
    node, surv = part["node"], part["survivor"]
    xp = array_module(node)
    if node.shape[0] == 0:
        return {"top": [], "near": [], "close": [], "stats": []}
    removed = ~part["kept"]
    exact = removed & part["exact"]
    near = removed & ~part["exact"]
    ids, pos, c = _clusters(surv)
    size = xp.bincount(pos, minlength=c)
    copies = xp.bincount(pos[exact], minlength=c)
    nears = xp.bincount(pos[near], minlength=c)
    top = _largest((size,), k, xp.flatnonzero(size > 1))  # ties: lower survivor
    near_top = _largest((nears, size), near_k, xp.flatnonzero(nears > 0))
    chosen = xp.concatenate((top, near_top))
    got = {name: to_host(a[chosen]).tolist() for name, a in (("size", size), ("copies", copies), ("nears", nears))}
    got["id"] = (to_host(chosen if ids is None else ids[chosen]) - first_doc).tolist()
    stats = {i: (i, s, cp, nr) for i, s, cp, nr in zip(got["id"], got["size"], got["copies"], got["nears"])}
    t = top.shape[0]
    out = {"top": sorted(((i, s) for i, s in zip(got["id"][:t], got["size"][:t])), key=lambda c: (-c[1], c[0])),
           "near": sorted(((i, nr, s) for i, nr, s in zip(got["id"][t:], got["nears"][t:], got["size"][t:])),
                          key=lambda c: (-c[1], -c[2], c[0])),
           "stats": [stats[i] for i in sorted(stats)]}
    pick = _closest(xp.asarray(part["similarity"], dtype=xp.float64), threshold, near, node, closest)
    row = to_host(node[pick]) - first_doc
    gaps = np.abs(to_host(part["similarity"][pick]).astype(np.float64) - threshold)
    owner = to_host(surv[pick]) - first_doc
    order = np.lexsort((row, gaps))[:closest]
    out["close"] = [(int(row[i]), float(gaps[i]), int(owner[i])) for i in order]
    return out


def _largest(keys: tuple, k: int, cand):
    """Positions (of ``cand``, ascending) of the ``k`` largest by ``keys`` (arrays of non-negative integers,
    compared in turn; ties: lower position), in no order: a count of each key's values finds the one that
    the ``k``-th holds, those above it are in, and the ties go on to the next key."""
    xp = array_module(cand)
    out, need = [], k
    for key in keys:
        if cand.shape[0] <= need:
            break
        v = key[cand]
        cum = xp.cumsum(xp.bincount(v)[::-1])  # how many hold each value or more, from the largest down
        t = int(cum.shape[0]) - 1 - int(xp.count_nonzero(cum < need))  # the value of the need-th largest
        out.append(cand[v > t])
        need -= int(out[-1].shape[0])
        cand = cand[v == t]
    out.append(cand[:need])
    return xp.concatenate(out)


def _clusters(surv):
    """(ids, pos, c): the clusters of a partition's rows by their survivor nodes, ``ids`` ascending, each row's
    position among them and how many positions there are; ``ids`` None where the positions are the survivor
    nodes themselves (no larger than a few times the rows: a run's document numbers), positions of no
    cluster then holding none."""
    top = int(surv.max()) + 1
    if flags_fit(top, surv.shape[0]):
        return None, surv, top
    ids, pos = dense_ranks(surv)
    return ids, pos, int(ids.shape[0])


SAMPLE = 1 << 16  # values a bound on the k-th smallest is taken from


def _closest(sim, threshold: float, among, row, k: int):
    """Positions of the ``k`` rows ``among`` (a mask) whose ``|sim - threshold|`` is smallest (ties: lower
    ``row``, distinct), and maybe a few more, in no order.  The ``k``-th smallest of an even sample of them
    bounds the one of all, so a comparison keeps few rows; of those: the ones below the ``k``-th smallest
    gap and the ties at it with the lowest rows."""
    xp = array_module(sim)
    if k <= 0:
        return xp.zeros(0, dtype=xp.int64)
    step = max(1, sim.shape[0] // SAMPLE)
    sample = xp.abs(sim[::step][among[::step]] - threshold)
    bound = float(xp.partition(sample, k - 1)[k - 1]) if sample.shape[0] >= k else float("nan")
    if bound == bound:  # not NaN: at least the k smallest are within it (and a margin for rounding)
        margin = 1e-9 * (1.0 + abs(threshold) + bound)
        cand = xp.flatnonzero(among & (sim >= threshold - bound - margin) & (sim <= threshold + bound + margin))
    else:
        cand = xp.flatnonzero(among)
    if cand.shape[0] <= k:
        return cand
    g = xp.abs(sim[cand] - threshold)
    t = xp.partition(g, k - 1)[k - 1]
    if not bool(t == t):  # NaN: fewer than k numbers, every one is picked
        return cand
    below, tied = cand[g < t], cand[g == t]
    need = k - int(below.shape[0])
    if tied.shape[0] > need:
        r = row[tied]
        tied = tied[r <= xp.partition(r, need - 1)[need - 1]]
    return xp.concatenate((below, tied))


def _among(a, keys):
    """Whether each value of the non-negative integer array ``a`` is one of the few ascending ``keys``: a flag
    per value up to the largest, where there are at most a few per value of ``a`` (a run's document numbers),
    else a binary search each (:func:`~gpu_dedup.backends.sorted_in`)."""
    xp = array_module(a)
    if a.shape[0] == 0 or keys.shape[0] == 0:
        return xp.zeros(a.shape[0], dtype=bool)
    top = int(a.max()) + 1
    if not flags_fit(top, a.shape[0]):
        return sorted_in(a, keys)
    flag = xp.zeros(top, dtype=bool)
    flag[keys[keys < top]] = True
    return flag[a]


def _example_members(part, first_doc: int, top, near_top, close, members: int) -> dict:
    """The rows to show from one partition: the chosen clusters' survivors and up to ``members`` removed
    members each (near duplicates first, least similar first, then exact copies; ties: lower row), and
    the close calls (row, survivor row) with their survivors; per row (survivor, kept, exact, similarity).
    A look-up per row finds those clusters' rows and the close calls'; only they come to the host."""
    xp = array_module(part["node"])
    node, surv = part["node"], part["survivor"]
    clusters = np.unique(np.asarray(list(top) + list(near_top), np.int64)) + first_doc
    wanted = np.unique(np.asarray([r for pair in close for r in pair], np.int64)) + first_doc
    hit = _among(surv, to_module(clusters, xp)) | _among(node, to_module(wanted, xp))
    at = xp.flatnonzero(hit)  # the chosen clusters' rows and the close calls': this partition's
    row = to_host(node[at]) - first_doc
    sv = to_host(surv[at]) - first_doc
    kept = to_host(part["kept"][at]).astype(bool)
    exact = to_host(part["exact"][at]).astype(bool)
    sim = to_host(part["similarity"][at]).astype(np.float64)
    where = {r: i for i, r in enumerate(row.tolist())}
    shown = {}
    rows = set()

    def pick(survivors, removed, key):
        for s in survivors:  # a few dozen clusters
            if s not in where:
                continue  # another partition's
            cand = np.flatnonzero((sv == s) & removed)  # the members of one chosen cluster
            cand = cand[np.lexsort((row[cand], sim[cand], exact[cand]))][:members]
            shown[(key, s)] = row[cand].tolist()
            rows.update(shown[(key, s)])
            rows.add(s)

    pick(top, ~kept, "top")
    pick(near_top, ~kept & ~exact, "near")
    for r, _ in close:
        if r in where:
            rows.add(r)
            rows.add(int(sv[where[r]]))
    info = {r: (int(sv[where[r]]), bool(kept[where[r]]), bool(exact[where[r]]), float(sim[where[r]]))
            for r in sorted(rows)}
    return {"rows": info, "shown": shown}


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
    """An id as report.json can hold it: NaN and infinite floats (not JSON) and other types in words."""
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)
