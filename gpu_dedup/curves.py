"""LSH banding: the S-curve, the (bands, rows) layout, band hashes.

A pair with Jaccard similarity ``s`` becomes a candidate with probability
``P(s) = 1 - (1 - s**r)**b``.  Given a threshold ``t`` the layout minimises
``fp_weight * FP + fn_weight * FN`` where ``FP`` is the area under ``P`` on
``[0, t]`` (dissimilar pairs that become candidates) and ``FN`` the area over
``P`` on ``[t, 1]`` (similar pairs that never do), over all ``b * r <=
num_perm``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

_GRID = 2001


def s_curve(s, bands: int, rows: int):
    """Probability that a pair of similarity ``s`` shares at least one band."""
    s = np.asarray(s, dtype=np.float64)
    return 1.0 - (1.0 - s**rows) ** bands


def _integrate(y, x):
    return np.sum((y[..., 1:] + y[..., :-1]) * 0.5 * np.diff(x), axis=-1)


def error_areas(threshold: float, bands, rows):
    """(false-positive area, false-negative area) of one or many layouts."""
    b = np.atleast_1d(np.asarray(bands, dtype=np.float64))[:, None]
    r = np.atleast_1d(np.asarray(rows, dtype=np.float64))[:, None]
    lo = np.linspace(0.0, threshold, _GRID)
    hi = np.linspace(threshold, 1.0, _GRID)
    fp = _integrate(1.0 - (1.0 - lo[None, :] ** r) ** b, lo)
    fn = _integrate((1.0 - hi[None, :] ** r) ** b, hi)
    return fp, fn


@lru_cache(maxsize=256)
def optimal_layout(threshold: float, num_perm: int, fp_weight: float = 0.05, fn_weight: float = 0.95):
    """(bands, rows) with b * r <= num_perm minimising the weighted error areas.

    Ties go to the first layout in (bands, rows) order, so the result is
    deterministic.
    """
    pairs = np.array([(b, r) for b in range(1, num_perm + 1) for r in range(1, num_perm // b + 1)])
    fp, fn = error_areas(threshold, pairs[:, 0], pairs[:, 1])
    cost = fp_weight * fp + fn_weight * fn
    best = int(np.argmin(cost))
    return int(pairs[best, 0]), int(pairs[best, 1])


def s_curve_points(bands: int, rows: int, step: float = 0.05) -> list[list[float]]:
    s = np.round(np.arange(0.0, 1.0 + step / 2, step), 6)
    return [[float(a), float(p)] for a, p in zip(s, s_curve(s, bands, rows))]


# ---------------------------------------------------------------- cosine (random hyperplanes)
#
# One hyperplane bit agrees for two vectors at angle theta with probability
# p = 1 - theta / pi (Goemans-Williamson), so a band of k bits agrees with
# probability p**k and a pair becomes a candidate with
# P(s) = 1 - (1 - (1 - arccos(s) / pi)**k)**m.  As a function of p this is
# the MinHash S-curve with J replaced by p, and the layout is derived exactly
# as for Jaccard: the weighted FP/FN areas integrate uniformly over p, i.e.
# over the angle theta = pi * (1 - p) from 0 to pi.  The angle, not the
# cosine, is the axis because (1) p is the LSH family's own similarity, on
# which the MinHash rule integrates too, so the same weights mean the same
# trade-off; (2) theta is a metric on the sphere, where distances between
# near duplicates live; on the cosine axis d(cos) = sin(theta) d(theta)
# squeezes the whole near-duplicate region [t, 1] (theta in [0, arccos t])
# into a short interval, under-weighting false negatives: at t = 0.9,
# bits = 256 the cosine axis picks 18 x 14 (P(0.92) = 0.942), the angle axis
# 19 x 13 (P(0.92) = 0.970).


def cosine_collision(s):
    """Probability ``1 - arccos(s) / pi`` that one random-hyperplane bit agrees at cosine ``s``."""
    s = np.clip(np.asarray(s, dtype=np.float64), -1.0, 1.0)
    return 1.0 - np.arccos(s) / np.pi


def cosine_s_curve(s, bands: int, rows: int):
    """Probability that a pair of cosine ``s`` shares at least one band of ``rows`` bits."""
    return 1.0 - (1.0 - cosine_collision(s) ** rows) ** bands


def cosine_error_areas(threshold: float, bands, rows):
    """(false-positive area, false-negative area) over the angle axis (p = 1 - theta / pi uniform)."""
    return error_areas(float(cosine_collision(threshold)), bands, rows)


@lru_cache(maxsize=256)
def cosine_layout(threshold: float, bits: int, fp_weight: float = 0.05, fn_weight: float = 0.95,
                  max_rows: int = 64, min_rows: int = 1):
    """(bands, rows) with bands * rows <= bits and ``min_rows <= rows <= max_rows`` minimising
    ``fp_weight * FP + fn_weight * FN`` on the angle axis; ties go to the first
    layout in (bands, rows) order, as in :func:`optimal_layout`.

    ``min_rows`` keeps buckets clean of unrelated rows (see
    :func:`cosine_min_rows`): the areas weigh every angle alike, but unrelated
    pairs outnumber near duplicates by orders of magnitude and sit at
    p = 1/2, where a band of ``rows`` bits still collides with probability
    2**-rows.
    """
    if not -1.0 < threshold < 1.0:
        raise ValueError(f"cosine threshold = {threshold} must be in (-1, 1); e.g. 0.9")
    if bits < 1:
        raise ValueError(f"bits = {bits} must be >= 1; e.g. 256")
    if not 1 <= min_rows <= min(max_rows, bits):
        raise ValueError(f"min_rows = {min_rows} must be in [1, {min(max_rows, bits)}]")
    pairs = np.array([(b, r) for b in range(1, bits // min_rows + 1)
                      for r in range(min_rows, min(max_rows, bits // b) + 1)])
    fp, fn = cosine_error_areas(threshold, pairs[:, 0], pairs[:, 1])
    cost = fp_weight * fp + fn_weight * fn
    best = int(np.argmin(cost))
    return int(pairs[best, 0]), int(pairs[best, 1])


def cosine_min_rows(rows_in_corpus: int, load: float = 0.05, background: float = 0.0) -> int:
    """Smallest band width ``k`` whose buckets hold, per band, about ``load`` unrelated rows
    next to a row: ``rows_in_corpus * p0**k <= load`` with ``p0 = cosine_collision(background)``
    the bit agreement of unrelated rows (cosine ``background``: 0 for isotropic
    vectors, higher for embeddings sharing a mean direction)."""
    p0 = float(cosine_collision(background))
    if rows_in_corpus <= 1:
        return 1
    return int(min(64, max(1, np.ceil(np.log(load / rows_in_corpus) / np.log(p0)))))


def cosine_s_curve_points(bands: int, rows: int, step: float = 0.05, lo: float = 0.0) -> list[list[float]]:
    """[[cosine, P(candidate)], ...] from ``lo`` to 1 (report.json / report.html / tune)."""
    s = np.round(np.arange(lo, 1.0 + step / 2, step), 6)
    return [[float(a), float(p)] for a, p in zip(s, cosine_s_curve(s, bands, rows))]


# ---------------------------------------------------------------- per similarity family (report, tune, plots)

CURVES = {
    "jaccard": {"curve": s_curve, "axis": "Jaccard similarity s of a pair", "formula": "1-(1-s^{r})^{b}",
                "areas": error_areas},
    "cosine": {"curve": cosine_s_curve, "axis": "cosine similarity s of a pair",
               "formula": "1-(1-(1-arccos(s)/pi)^{r})^{b}", "areas": cosine_error_areas},
}


def family_curve(similarity: str = "jaccard"):
    """``P(candidate)`` as a function ``(s, bands, rows)`` for a similarity family."""
    return CURVES[similarity or "jaccard"]["curve"]


def curve_formula(similarity: str, bands: int, rows: int) -> str:
    return CURVES[similarity or "jaccard"]["formula"].format(b=bands, r=rows)


def curve_axis(similarity: str) -> str:
    return CURVES[similarity or "jaccard"]["axis"]


def curve_section(similarity: str, threshold: float, bands: int, rows: int) -> dict:
    """The report's LSH numbers for a layout: P(candidate) at the threshold, the FP/FN areas, the S-curve."""
    c = CURVES[similarity]
    fp, fn = c["areas"](threshold, [bands], [rows])
    if similarity == "cosine":
        points = cosine_s_curve_points(bands, rows)
    else:
        points = s_curve_points(bands, rows)
    return {"threshold": threshold, "bands": bands, "rows": rows,
            "candidate_probability_at_threshold": round(float(c["curve"](threshold, bands, rows)), 6),
            "false_positive_area": round(float(fp[0]), 6), "false_negative_area": round(float(fn[0]), 6),
            "s_curve_formula": curve_formula(similarity, bands, rows), "s_curve": points}
