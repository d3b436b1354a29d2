"""``report.html``: the human-readable page of a run, built from ``report.json`` alone.

One self-contained file: CSS inline, figures as inline SVG (``report/svg.py``:
a few milliseconds, no plotting library), no external URL, no script.  It shows the parameters, counts
and seconds per stage, the S-curve of the chosen (bands, rows) with the
threshold marked, bucket- and cluster-size histograms on log scales, chaining
statistics, and sample texts side by side, the words that differ from the
survivor highlighted: the largest clusters, the clusters with the most near
duplicates, and the removed documents closest to the threshold.
"""

from __future__ import annotations

import difflib
import html
import logging
import re
from pathlib import Path

import numpy as np

from gpu_dedup.curves import curve_axis, curve_formula, family_curve
from gpu_dedup.report.svg import Chart, hbars
from gpu_dedup.storage import as_path, atomic_write_bytes

log = logging.getLogger("gpu_dedup")

_CSS = """
body{font:14px/1.45 -apple-system,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif;margin:0;color:#1d2430;
background:#f5f6f8}
main{max-width:1240px;margin:0 auto;padding:20px 24px 48px}
h1{font-size:22px;margin:8px 0 2px}h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #d5d9e0;
padding-bottom:4px}h3{font-size:14px;margin:16px 0 6px}
.sub{color:#5a6472;font-size:12.5px}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:14px 0}
.card{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 14px;min-width:120px}
.card b{display:block;font-size:19px}.card span{color:#5a6472;font-size:12px}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:16px;align-items:start}
.panel{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 12px}
svg{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:12.5px;background:#fff}
td,th{border:1px solid #dde1e7;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 12px;font-size:12px;overflow:auto}
.note{color:#5a6472;font-size:12.5px;margin:4px 0 8px}
.warn{background:#fff4d6;border:1px solid #e8c766;border-radius:6px;padding:8px 12px}
.cluster{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:8px 12px;margin:12px 0}
.docs{display:grid;gap:10px;grid-template-columns:repeat(var(--cols),minmax(0,1fr))}
.doc{border:1px solid #e3e6eb;border-radius:4px;padding:6px 8px;font-size:12.5px;background:#fbfbfc}
.doc .meta{color:#5a6472;font-size:11.5px;margin-bottom:4px;word-break:break-all}
.doc p{margin:0;white-space:pre-wrap;word-break:break-word;max-height:300px;overflow:auto}
ins{background:#c9f2c9;text-decoration:none}del{background:#f8caca;color:#8a1f1f}
.tag{display:inline-block;border-radius:3px;padding:0 5px;font-size:11px;background:#e4e7ec}
.tag.kept{background:#d3ecd6}.tag.near{background:#fde2b8}.tag.exact{background:#dbe4f7}
"""


# --------------------------------------------------------------------------- figures


def _log_bins(max_size: int) -> np.ndarray:
    """Histogram edges for integer sizes >= 2: one bin per size up to 16, then 4 per octave."""
    if max_size <= 16:
        return np.arange(1.5, max_size + 1.0)
    geo = np.geomspace(16.5, max_size + 0.5, max(int(np.ceil(4 * np.log2((max_size + 0.5) / 16.5))), 1) + 1)
    edges = np.unique(np.r_[np.arange(1.5, 17.0), np.floor(geo[1:]) + 0.5])
    return edges


def _size_figure(counts: dict, what: str, unit: str) -> str:
    sizes = np.asarray(counts.get("sizes", []), np.float64)
    n = np.asarray(counts.get("counts", []), np.float64)
    two = sizes >= 2  # a run against an index also groups lone documents (size 1) to meet the index
    sizes, n = sizes[two], n[two]
    alt = f"{what[:-1]} sizes"
    if sizes.shape[0] == 0:
        c = Chart(620, 300)
        c.text(310, 150, f"no {what} with two or more documents", 12, "middle")
        return c.svg(alt)
    edges = _log_bins(int(sizes.max()))
    hist = np.histogram(sizes, bins=edges, weights=n)[0]
    c = Chart(620, 340, xlim=(edges[0], edges[-1]), ylim=(0.7, max(hist.max(), 1) * 1.6), xlog=True, ylog=True)
    c.stairs(hist, edges, "#4c72b0")
    ticks = 2 ** np.arange(1, int(np.log2(max(sizes.max(), 2))) + 2)  # 2, 4, 8, ... as plain numbers
    ticks = ticks[ticks <= edges[-1] * 1.01]
    c.axes(xticks=ticks, xlabel=f"{what[:-1]} size (documents, log)", ylabel=f"{unit} (log)",
           title=f"{int(n.sum()):,} {what}, largest {int(sizes.max()):,}", tick_size=8 if ticks.shape[0] > 10 else 10)
    return c.svg(alt)


def figures(report: dict) -> dict[str, str]:
    """The page's figures as inline SVG markup, by name."""
    out = {}
    # seconds per stage
    stages = report.get("stages", {})
    fixed = report.get("fixed_seconds", {})  # named fixed costs: the rest of the wall time (orange)
    unbooked = float(report.get("unbooked_seconds", 0.0))
    names = list(stages) + list(fixed) + (["unbooked"] if unbooked >= 0.005 else [])
    secs = [float(stages[k].get("seconds", 0.0)) for k in stages] + [float(v) for v in fixed.values()] + \
        ([unbooked] if unbooked >= 0.005 else [])
    colors = ["#b0b7c3" if stages[k].get("resumed") else "#4c72b0" for k in stages] + \
        ["#dd8452"] * (len(names) - len(stages))
    out["stages"] = hbars(names, secs, colors, f"seconds per stage (wall {report.get('wall_seconds', 0):.2f}s"
                          + (", orange: fixed costs" if fixed else "")
                          + (", grey: resumed" if any(stages[k].get("resumed") for k in stages) else "") + ")",
                          "seconds", "seconds per stage and fixed cost")
    # S-curve
    lsh = report["lsh"]
    b, r, t = lsh["bands"], lsh["rows"], lsh["threshold"]
    fam = lsh.get("similarity", "jaccard")
    curve = family_curve(fam)
    s = np.linspace(0, 1, 401)
    p = curve(s, b, r)
    c = Chart(620, 370, xlim=(0, 1), ylim=(-0.01, 1.01))
    lo, hi = s <= t, s >= t
    c.area(s[lo], 0, p[lo], "#ff7f0e", 0.3, f"false-positive area {lsh['false_positive_area']:.4f}")
    c.area(s[hi], p[hi], 1, "#1f77b4", 0.25, f"false-negative area {lsh['false_negative_area']:.4f}")
    c.line(s, p, "black", 2, label=f"P(candidate) = {curve_formula(fam, b, r)}")
    pt = float(curve(t, b, r))
    c.vline(t, "#d62728", label=f"threshold {t}: P = {pt:.3f}")
    c.point(t, pt, "#d62728")
    vt = lsh.get("verify_threshold", t)
    if vt != t:
        c.vline(vt, "#9467bd", dash="2,3", label=f"verify threshold {vt}")
    size = f"{lsh['num_perm']} permutations" if "num_perm" in lsh else f"{lsh.get('bits')} bits"
    c.axes(yticks=np.linspace(0, 1, 6), xlabel=curve_axis(fam), ylabel="probability of sharing a bucket",
           title=f"S-curve: {b} bands x {r} rows ({size})")
    c.legend()
    out["s_curve"] = c.svg("S-curve with the threshold")
    # bucket and cluster sizes
    hist = report.get("histograms", {})
    if "bucket_size_counts" in hist:
        out["buckets"] = _size_figure(hist["bucket_size_counts"], "buckets", "buckets")
    if "cluster_size_counts" in hist:
        out["clusters"] = _size_figure(hist["cluster_size_counts"], "clusters", "clusters")
    # similarity of removed near duplicates to their survivor (chaining)
    h = report.get("chaining", {}).get("similarity_to_survivor_histogram")
    if h and sum(h["counts"]):
        edges, counts = np.asarray(h["edges"], np.float64), np.asarray(h["counts"], np.float64)
        c = Chart(620, 340, xlim=(edges[0], edges[-1]), ylim=(0, counts.max() * 1.08))
        c.stairs(counts, edges, "#55a868")
        c.vline(lsh.get("verify_threshold", t), "#d62728", label="threshold")
        ch = report["chaining"]
        c.axes(xlabel="similarity to the cluster's survivor", ylabel="removed near duplicates",
               title=f"chaining: {ch['below_threshold_to_survivor']:,} of {ch['near_duplicates_removed']:,} "
                     "below the threshold")
        c.legend()
        out["chaining"] = c.svg("similarity to survivor")
    return out


# --------------------------------------------------------------------------- differences

_TOKEN = re.compile(r"\S+|\s+")
_KEY = re.compile(r"[\W_]+", re.UNICODE)


_NONCHARACTERS = "".join(chr(p | 0xFFFE) + chr(p | 0xFFFF) for p in range(0, 0x110000, 0x10000))
_UNSHOWABLE = re.compile(f"[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f\ufdd0-\ufdef{_NONCHARACTERS}]")


def _shown(m: re.Match) -> str:
    c = ord(m.group())
    return chr(0x2400 + c) if c < 0x20 else "\u2421" if c == 0x7F else "\ufffd"


def _esc(s: str) -> str:
    """``s`` escaped for HTML text or an attribute, and its characters HTML forbids in a page (C0 and C1
    controls but tab, newlines and form feed; noncharacters) shown: C0 controls and DEL as their control
    pictures (U+2400..), the others as U+FFFD."""
    return html.escape(_UNSHOWABLE.sub(_shown, s))


def diff_words(base: str | None, other: str | None) -> str:
    """``other`` as HTML with the words it adds to ``base`` in <ins> and the words of
    ``base`` it lacks in <del>.  Words compare ignoring case and punctuation, as the
    default normalization does, so an exact copy after normalization shows no mark."""
    if other is None:
        return "<em>(null text)</em>"
    if base is None:
        return _esc(other)
    a = [w for w in _TOKEN.findall(base) if not w.isspace()]
    btok = _TOKEN.findall(other)
    bwords = [i for i, w in enumerate(btok) if not w.isspace()]
    ka = [_KEY.sub("", w.lower()) for w in a]
    kb = [_KEY.sub("", btok[i].lower()) for i in bwords]
    out = []
    pos = 0  # next token of ``other`` to emit

    def emit_until(word_index: int, tag: str | None):
        nonlocal pos
        stop = bwords[word_index] + 1 if word_index < len(bwords) else len(btok)
        chunk = btok[pos:stop]
        pos = stop
        if not chunk:
            return
        if tag is None:
            out.append(_esc("".join(chunk)))
        else:  # whitespace before the first word stays outside the mark
            lead = chunk[0] if chunk[0].isspace() else ""
            out.append(_esc(lead) + f"<{tag}>" + _esc("".join(chunk[1 if lead else 0:])) + f"</{tag}>")

    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, ka, kb, autojunk=False).get_opcodes():
        if op in ("replace", "delete"):
            if pos < len(btok) and btok[pos].isspace():  # the space before the gap goes first
                out.append(_esc(btok[pos]))
                pos += 1
            out.append("<del>" + _esc(" ".join(a[i1:i2])) + "</del> ")
        if op == "equal":
            emit_until(j2 - 1, None)
        elif op in ("replace", "insert"):
            emit_until(j2 - 1, "ins")
    out.append(_esc("".join(btok[pos:])))
    return "".join(out)


# --------------------------------------------------------------------------- page


def _e(v) -> str:
    return _esc(str(v))


def _num(v) -> str:
    if isinstance(v, bool):
        return _e(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.4g}"
    return _e(v)


def _detail(v) -> str:
    """A stage detail as HTML: a number as :func:`_num` writes it, lists and objects as compact JSON."""
    if isinstance(v, (list, dict)):
        import json

        return _e(json.dumps(v, separators=(", ", ": "), default=str))
    return _num(v)


def _count(n: int, one: str, many: str | None = None) -> str:
    """``1 exact copy``, ``2 exact copies``: the count with the word in the number it needs."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _table(header: list[str], rows: list[list], numeric=()) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = []
        for j, v in enumerate(row):
            cls = ' class="n"' if j in numeric else ""
            cells.append(f"<td{cls}>{v if isinstance(v, _Raw) else _num(v)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class _Raw(str):
    """Already-escaped HTML for a table cell."""


def _img(figs, name: str, alt: str) -> str:
    """The figure ``name`` (inline SVG), or nothing when the report has no data for it."""
    return figs.get(name, "") if figs else ""


def _doc_html(d: dict, body: str, label: str) -> str:
    sim = "" if d["match"] == "kept" else f" · similarity {d['similarity']:.3f}"
    cut = f" · first {len(d['text'] or ''):,} of {d['characters']:,} characters" if d.get("truncated") else ""
    return (f'<div class="doc"><div class="meta"><span class="tag {_e(d["match"])}">{_e(label)}</span> '
            f'{"id <bdi>" + _e(d["id"]) + "</bdi> · " if "id" in d else ""}row {d["row"]} · '
            f'<bdi>{_e(d["shard"])}</bdi>:{d["shard_row"]}{sim}{cut}</div>'
            f"<p>{body}</p></div>")


def clusters_html(clusters: list | None, style: bool = False) -> str:
    """The clusters of report.json's ``largest_clusters`` side by side, differences highlighted.
    ``style=True`` prepends the CSS it needs (for a notebook cell)."""
    wanted = (".cluster", ".docs", ".doc", "ins", ".tag", ".note")
    css = "<style>" + "\n".join(x for x in _CSS.splitlines() if x.startswith(wanted)) + "</style>" if style else ""
    return css + _clusters_body(clusters)


NOT_COLLECTED = ('<p class="note">Sample texts are not collected for this kind of run (distributed, or against an '
                 "index); duplicates.parquet lists every cluster.</p>")
LEGEND = ("In a member, <ins>green</ins> words are not in the survivor and <del>red</del> words of the survivor "
          "are missing (words compared ignoring case and punctuation).")


def _survivor_html(surv: dict) -> str:
    return _doc_html(surv, _e(surv["text"]) if surv["text"] is not None else "<em>(null text)</em>", "survivor")


def _clusters_body(clusters, near: bool = False, shown_above: bool = False) -> str:
    if clusters is None:
        return NOT_COLLECTED
    if not clusters:
        if near and shown_above:
            return '<p class="note">Every cluster with near duplicates is among the largest clusters above.</p>'
        return ('<p class="note">No near duplicate was removed.</p>' if near
                else '<p class="note">No cluster has two or more documents.</p>')
    what = "near duplicates" if near else "removed members"
    parts = [f'<p class="note">Each cluster shows its survivor and up to three {what}, least similar '
             f"first. {LEGEND}</p>"]
    for c in clusters:  # a handful of clusters
        surv = c["survivor"]
        docs = [_survivor_html(surv)]
        for m in c["members"]:
            docs.append(_doc_html(m, diff_words(surv["text"], m["text"]), m["match"]))
        shown = len(c["members"])
        more = c["size"] - 1 - shown
        nears = f", {_count(c['near_duplicates'], 'near duplicate')}" if "near_duplicates" in c else ""
        hidden = f", {_count(more, 'more member')} not shown" if more > 0 else ""
        # the id as duplicates.parquet holds it (no thousands separators: search for it there)
        parts.append(
            f'<div class="cluster"><h3>cluster_id {_e(c["cluster_id"])}: {_count(c["size"], "document")} '
            f'({_count(c["exact_copies"], "exact copy", "exact copies")}{nears}){hidden}'
            f'</h3><div class="docs" style="--cols:{min(len(docs), 4)}">{"".join(docs)}</div></div>')
    return "".join(parts)


def closest_html(pairs: list | None, threshold: float) -> str:
    """report.json's ``closest_to_threshold``: each removed document beside its survivor, differences marked."""
    if pairs is None:
        return NOT_COLLECTED
    if not pairs:
        return '<p class="note">No near duplicate was removed.</p>'
    parts = [f'<p class="note">The removed near duplicates whose similarity to their survivor is closest to the '
             f"threshold {_e(threshold)}: the decisions a different threshold would change first. {LEGEND}</p>"]
    for p in pairs:  # a handful of pairs
        surv, m = p["survivor"], p["member"]
        side = "at or above" if m["similarity"] >= threshold else "below"
        docs = [_survivor_html(surv), _doc_html(m, diff_words(surv["text"], m["text"]), m["match"])]
        parts.append(f'<div class="cluster"><h3>similarity {m["similarity"]:.3f} ({side} the threshold) to the '
                     f'survivor of cluster_id {surv["row"]}</h3><div class="docs" style="--cols:2">{"".join(docs)}'
                     "</div></div>")
    return "".join(parts)


def render(report: dict, figs: dict | None | bool = True) -> str:
    """The HTML page of ``report`` (a report.json dict).  ``figs``: True draws the figures, or pass
    :func:`figures`' result, or None for none."""
    if figs is True:
        figs = figures(report)
    c = report["counts"]
    lsh = report["lsh"]
    cfg = report.get("config", {})
    cards = [
        ("documents read", c["documents_read"]), ("kept", c["kept"]), ("removed", c["removed"]),
        ("exact copies", c.get("exact_duplicates", 0)), ("near duplicates", c.get("near_duplicates", 0)),
        ("clusters", c.get("clusters", 0)), ("candidate edges", c.get("candidate_edges", 0)),
        ("verified edges", c.get("verified_edges", 0)), ("wall seconds", report.get("wall_seconds", 0.0)),
    ]
    removed_pct = 100.0 * c["removed"] / c["documents_read"] if c["documents_read"] else 0.0
    stage_rows = []
    # shares of this run's stage seconds: a resumed stage's seconds are the earlier run's, not in wall_seconds
    total = sum(float(v.get("seconds", 0)) for v in report.get("stages", {}).values() if not v.get("resumed")) or 1.0
    for name, v in report.get("stages", {}).items():
        details = _Raw(", ".join(f"{_e(k)}={_detail(x)}" for k, x in v.items()
                                 if k not in ("seconds", "rss_mb", "resumed")))  # escaped once, here
        share = "" if v.get("resumed") else f"{100 * float(v.get('seconds', 0)) / total:.1f}%"
        stage_rows.append([name, float(v.get("seconds", 0)), share,
                           v.get("rss_mb", ""), "yes" if v.get("resumed") else "", details])
    items = list(c.items())
    half = (len(items) + 1) // 2  # two count/value pairs per table row
    count_rows = [[*items[i], *(items[i + half] if i + half < len(items) else ("", ""))] for i in range(half)]
    hist = report.get("histograms", {})
    ch = report.get("chaining", {})
    inputs = report.get("inputs", [])
    per_shard = bool(inputs) and all("kept" in i for i in inputs)  # reports before 0.x have no per-shard counts
    input_header = ["shard", "format", "rows"] + (["kept", "removed"] if per_shard else []) + ["bytes"]
    input_rows = [[i["name"], i["format"], i["rows"]] + ([i["kept"], i["removed"]] if per_shard else []) + [i["bytes"]]
                  for i in inputs[:50]]
    if len(inputs) > 50:
        input_rows.append([f"... and {len(inputs) - 50:,} more"] + [""] * (len(input_header) - 1))
    lsh_rows = [[k, v] for k, v in lsh.items() if k not in ("s_curve", "note")]
    chain_rows = [[k, v] for k, v in ch.items() if not isinstance(v, dict) and k != "note"]
    chain_rows += [[f"similarity to survivor {k}", v] for k, v in ch.get("similarity_to_survivor", {}).items()]
    out = [
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">",
        f"<title>gpu_dedup report: {c['documents_read']:,} documents, {c['removed']:,} removed</title>",
        f"<style>{_CSS}</style></head><body><main>",
        "<h1>gpu_dedup run report</h1>",
        f'<div class="sub">created {_e(report.get("created", ""))} · '
        f'gpu_dedup {_e(report.get("gpu_dedup_version", ""))}'
        f' · backend {_e(report.get("backend", ""))} · config fingerprint {_e(report.get("fingerprint", ""))}'
        f' · peak RSS {_num(report.get("peak_rss_mb", 0.0))} MiB</div>',
        '<div class="cards">' + "".join(f"<div class=\"card\"><b>{_num(v)}</b><span>{_e(k)}</span></div>"
                                        for k, v in cards) + "</div>",
        f'<p>Removed {removed_pct:.2f}% of the documents. Every input row is accounted for: '
        f'kept + removed = read is <b>{_e(c.get("accounted"))}</b>. Verification: '
        f'{_e(cfg.get("verify", {}).get("method", ""))}; LSH {lsh["bands"]} bands x {lsh["rows"]} rows, '
        f'threshold {lsh["threshold"]}.</p>',
        _copies_note(report),
    ]
    out += [
        "<h2>Stages</h2>",
        '<div class="grid"><div class="panel">' + _img(figs, "stages", "seconds per stage") + "</div>",
        '<div>' + _table(["stage", "seconds", "share", "RSS MiB", "resumed", "details"], stage_rows, (1, 2, 3))
        + "</div></div>",
        "<h2>Counts</h2>", _table(["count", "value", "count", "value"], count_rows, (1, 3)),
        "<h2>LSH layout and S-curve</h2>",
        '<div class="grid"><div class="panel">' + _img(figs, "s_curve", "S-curve with the threshold") + "</div>",
        "<div>" + _table(["parameter", "value"], lsh_rows, (1,))
        + f'<p class="note">{_e(lsh.get("note", ""))}</p></div>'
        "</div>",
        "<h2>Buckets and clusters</h2>",
        '<div class="grid"><div class="panel">' + _img(figs, "buckets", "bucket sizes") + "</div>"
        '<div class="panel">' + _img(figs, "clusters", "cluster sizes") + "</div>",
        "<div>" + _table(["bucket size", "buckets"], [[k, v] for k, v in hist.get("bucket_sizes", {}).items()], (1,))
        + "</div><div>"
        + _table(["cluster size", "clusters"], [[k, v] for k, v in hist.get("cluster_sizes", {}).items()], (1,))
        + "</div></div>",
        "<h2>Chaining</h2>",
        f'<p class="note">{_e(ch.get("note", ""))}</p>',
        '<div class="grid"><div class="panel">' + (_img(figs, "chaining", "similarity to survivor")
                                                   or '<p class="note">No near duplicate was removed.</p>')
        + "</div><div>" + _table(["statistic", "value"], chain_rows, (1,)) + "</div></div>",
        "<h2>Largest clusters</h2>", clusters_html(report.get("largest_clusters")),
        "<h2>Other clusters with the most near duplicates</h2>",
        '<p class="note">The clusters with the most near duplicates (members whose text differs from the '
        "survivor's), leaving out the largest clusters shown above: the largest clusters of real corpora are "
        "mostly exact copies.</p>"
        + _clusters_body(report.get("largest_near_duplicate_clusters"), near=True,
                         shown_above=bool(report.get("largest_clusters"))),
        "<h2>Removed documents closest to the threshold</h2>",
        closest_html(report.get("closest_to_threshold"), lsh.get("verify_threshold", lsh["threshold"])),
        "<h2>Inputs</h2>", _table(input_header, input_rows, tuple(range(2, len(input_header)))),
        "<h2>Parameters</h2>", f"<pre>{_e(_yaml(cfg))}</pre>",
        f'<p class="note">Machine: {_e(_machine(report.get("machine")))}. report.json beside this page holds the '
        "same data.</p>",
        "</main></body></html>\n",
    ]
    return "\n".join(out)


def _copies_note(report: dict) -> str:
    """Why the exact stage's ``copies_collapsed`` can exceed the *exact copies* count."""
    collapsed = report.get("stages", {}).get("exact", {}).get("copies_collapsed")
    exact = report["counts"].get("exact_duplicates", 0)
    if collapsed is None or collapsed == exact:
        return ""
    return (f'<p class="note"><i>Exact copies</i> ({exact:,}) are removed documents whose normalized text equals '
            f"their survivor's. The exact stage's <code>copies_collapsed</code> ({collapsed:,}) counts every document "
            "whose normalized text equals that of another document ranked before it, whatever its survivor: a copy "
            "of a document that is itself a near duplicate of the survivor differs from the survivor's text, so it "
            "is counted among the near duplicates.</p>")


def _machine(m) -> str:
    """report.json's ``machine`` in words: ``Python 3.11.7 on Linux-6.1-x86_64, 2 CPUs``."""
    if not isinstance(m, dict):
        return str(m or "not recorded")
    parts = [f"Python {m['python']}" if m.get("python") else "", f"on {m['platform']}" if m.get("platform") else "",
             ]
    text = " ".join(p for p in parts if p)
    if m.get("cpus"):
        text += f"{', ' if text else ''}{_count(int(m['cpus']), 'CPU')}"
    rest = ", ".join(f"{k} {v}" for k, v in m.items() if k not in ("python", "platform", "cpus"))
    return ", ".join(p for p in (text, rest) if p) or "not recorded"


def _yaml(cfg: dict) -> str:
    import yaml

    return yaml.safe_dump(cfg, sort_keys=False)


def write_html(path, report: dict) -> Path:
    """Render ``report`` and write it to ``path`` atomically."""

    path = as_path(path)  # a local path, or a URL (uploaded)
    atomic_write_bytes(path, render(report).encode("utf-8"))
    return path
