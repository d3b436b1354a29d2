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


def band_hashes(signatures, bands: int, rows: int, params, backend="cpu"):
    """One 61-bit hash per band: an (n, bands) uint64 array (see kernels/scalar.py, step 5)."""
    from .backend import get_backend

    if signatures.shape[1] < bands * rows:
        raise ValueError(
            f"signatures have {signatures.shape[1]} columns but bands * rows = {bands} * {rows} = {bands * rows}"
        )
    return get_backend(backend).band_hashes(signatures, bands, rows, params.band_base)
