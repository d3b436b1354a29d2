"""Bands stage: one 64-bit hash per band of ``rows`` 32-bit signature values (see kernels/hash_scalar.py, step 5).

The S-curve and the (bands, rows) layout live in :mod:`gpu_dedup.curves`.
"""

from __future__ import annotations

from gpu_dedup.backends import get_backend
from gpu_dedup.curves import error_areas, optimal_layout, s_curve, s_curve_points  # noqa: F401  (re-exported)


def band_hashes(signatures, bands: int, rows: int, params, backend="cpu"):
    """One 64-bit hash per band: an (n, bands) uint64 array (see kernels/hash_scalar.py, step 5)."""

    if signatures.shape[1] < bands * rows:
        raise ValueError(
            f"signatures have {signatures.shape[1]} columns but bands * rows = {bands} * {rows} = {bands * rows}"
        )
    return get_backend(backend).band_hashes(signatures, bands, rows, params.band_base)
