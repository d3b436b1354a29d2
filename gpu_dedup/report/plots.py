"""PNG figures for ``evaluate`` and ``tune`` (matplotlib, optional).

matplotlib is a dependency of gpu_dedup (report.html of every run has
figures); should it be missing all the same, every function here logs why and
returns None, and the JSON outputs are written all the same.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from gpu_dedup.curves import curve_axis, curve_formula, family_curve

log = logging.getLogger("gpu_dedup")

MISSING = "matplotlib is not installed, so no PNG was written (the JSON is complete); install it with " \
          "pip install -e \".[eval]\" (or pip install matplotlib)"


def pyplot():
    """matplotlib.pyplot with the file-only Agg backend, or None (with a logged reason) when missing."""
    try:
        import matplotlib
    except ImportError:
        log.warning(MISSING)
        return None
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def plot_evaluation(report: dict, path) -> Path | None:
    """Four panels: candidate rate vs the S-curve, recall per bin, pairs per bin, similarity to survivor."""
    plt = pyplot()
    if plt is None:
        return None
    lsh = report["lsh"]
    b, r, t = lsh["bands"], lsh["rows"], lsh["verify_threshold"]
    fam = lsh.get("similarity", "jaccard")
    s_curve = family_curve(fam)
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    s = np.linspace(0, 1, 201)
    ax = axes[0, 0]
    ax.plot(s, s_curve(s, b, r), color="black", lw=1.5, label=f"theory {curve_formula(fam, b, r)}")
    styles = ["o", "s", "^", "D"]
    drawn = set()
    for k, (name, run) in enumerate(report["runs"].items()):
        bins = [x for x in run["bins"] if x["pairs"]]
        x = np.array([(x["lo"] + x["hi"]) / 2 if x["hi"] > x["lo"] else x["lo"] for x in bins])
        y = np.array([x["candidate_rate"] for x in bins])
        yd = np.array([x["distinct_candidate_rate"] for x in bins])  # each pair of distinct texts once
        err = np.array([x["distinct_candidate_rate_stderr"] for x in bins])
        layout = (run["run"]["bands"], run["run"]["rows"])
        if layout != (b, r) and layout not in drawn:
            ax.plot(s, s_curve(s, *layout), lw=1, ls=":", label=f"theory {layout[0]} x {layout[1]}")
        if layout not in drawn:  # the candidate rate depends on the layout only
            ax.errorbar(x, yd, yerr=err, fmt=styles[k % 4], ms=4, capsize=2,
                        label=f"empirical, {layout[0]} x {layout[1]}, distinct texts (+- 1 s.e.)")
            if not np.allclose(y, yd):
                ax.plot(x, y, "x", ms=5, color="tab:gray", label="empirical, all pairs (exact copies repeat)")
            drawn.add(layout)
        if k == 0:
            ax2 = axes[0, 1]
            ax2.plot(x, [v["coclustered_rate"] for v in bins], "o-", ms=4, label="in one cluster (recall)")
            ax2.plot(x, y, "s--", ms=3, label="share a band bucket (candidate)")
            ax3 = axes[1, 0]
            ax3.bar(x, [v["pairs"] for v in bins], width=0.045, color="tab:gray")
            ax3.set_yscale("log")
    over = report.get("candidate_rate_over_seeds")
    if over:
        lo = np.array(over["bin_lo"])
        xs = np.append((lo[:-1] + lo[1:]) / 2, lo[-1:])
        has = np.array([m is not None for m in over["mean"]])
        mean = np.array([m for m in over["mean"] if m is not None])
        spread = np.array([[m - a, b - m] for m, a, b in zip(over["mean"], over["min"], over["max"]) if m is not None]).T
        ax.errorbar(xs[has] + 0.008, mean, yerr=spread, fmt="D", ms=4, capsize=2, color="tab:green",
                    label=f"mean of {len(over['seeds'])} MinHash seeds (min-max)")
    ax.axvline(t, color="tab:red", ls="--", lw=1, label=f"threshold {t}")
    name = "cosine" if fam == "cosine" else "Jaccard"  # the similarity's name in every label below
    ax.set(xlabel=f"exact {name} similarity of the pair", ylabel="fraction of pairs that are LSH candidates",
           title=f"candidate rate vs S-curve ({b} bands x {r} rows)", xlim=(0, 1.01), ylim=(-0.02, 1.02))
    ax.legend(fontsize=8, loc="upper left")
    ax2 = axes[0, 1]
    ax2.axvline(t, color="tab:red", ls="--", lw=1)
    ax2.set(xlabel=f"exact {name} similarity (bin)", ylabel="fraction of pairs", ylim=(-0.02, 1.02),
            title="pairs put in one cluster, per similarity bin")
    ax2.legend(fontsize=8, loc="upper left")
    ax3 = axes[1, 0]
    ax3.axvline(t, color="tab:red", ls="--", lw=1)
    ax3.set(xlabel=f"exact {name} similarity (bin)", ylabel="pairs (log)", title="exact pairs per similarity bin")
    ax4 = axes[1, 1]
    for run_name, run in report["runs"].items():  # (not ``name``: the similarity's name is used below)
        h = run["chaining"]["similarity_to_survivor_histogram"]
        ax4.stairs(h["counts"], h["edges"], lw=1.5, alpha=0.8,
                   label=f"{run_name} ({run['chaining']['below_threshold_to_survivor']:,} of "
                         f"{run['chaining']['near_duplicates_removed']:,} below threshold)")
    ax4.axvline(t, color="tab:red", ls="--", lw=1)
    ax4.set(xlabel=f"exact {name} similarity to the cluster's survivor", ylabel="removed near duplicates",
            title="chaining: similarity of removed documents to their survivor")
    ax4.legend(fontsize=8, loc="upper left")
    c = report["corpus"]
    fig.suptitle(f"gpu_dedup evaluate: {c['sample']:,} of {c['documents']:,} documents, "
                 f"{c['exact_pairs_at_or_above_floor']:,} exact pairs with {name} >= {c['floor']}", fontsize=11)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_layouts(rows: list[dict], threshold: float, path, similarity: str = "jaccard") -> Path | None:
    """S-curves of candidate (bands, rows) layouts; the pick drawn bold."""
    s_curve = family_curve(similarity)
    plt = pyplot()
    if plt is None:
        return None
    s = np.linspace(0, 1, 401)
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for row in rows:
        b, r = row["bands"], row["rows"]
        ax.plot(s, s_curve(s, b, r), lw=2.5 if row["pick"] else 1, color="black" if row["pick"] else None,
                label=f"{b} x {r}{' (pick)' if row['pick'] else ''}: cost {row['cost']:.4f}")
    ax.axvline(threshold, color="tab:red", ls="--", lw=1, label=f"threshold {threshold}")
    ax.set(xlabel=curve_axis(similarity), ylabel=f"P(candidate) = {curve_formula(similarity, 'b', 'r')}",
           xlim=(0, 1), ylim=(-0.01, 1.01),
           title="LSH layouts (bands x rows)")
    ax.legend(fontsize=8, loc="upper left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
