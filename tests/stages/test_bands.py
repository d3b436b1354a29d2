import numpy as np
import pytest

from gpu_dedup.curves import error_areas, optimal_layout, s_curve, s_curve_points


def test_s_curve_formula_and_shape():
    s = np.linspace(0, 1, 11)
    p = s_curve(s, 20, 5)
    assert np.allclose(p, 1 - (1 - s**5) ** 20)
    assert p[0] == 0 and p[-1] == 1 and np.all(np.diff(p) >= 0)


def test_optimal_layout_is_the_brute_force_minimum():
    t, n, wfp, wfn = 0.7, 40, 0.3, 0.7
    best = None
    for b in range(1, n + 1):
        for r in range(1, n // b + 1):
            fp, fn = error_areas(t, [b], [r])
            cost = wfp * fp[0] + wfn * fn[0]
            if best is None or cost < best[0] - 1e-15:
                best = (cost, b, r)
    assert optimal_layout(t, n, wfp, wfn) == (best[1], best[2])


def test_areas_against_closed_form_for_one_band():
    # b = 1: P(s) = s**r, FP = t**(r+1)/(r+1), FN = (1-t) - (1 - t**(r+1))/(r+1)
    t, r = 0.6, 3
    fp, fn = error_areas(t, [1], [r])
    assert fp[0] == pytest.approx(t ** (r + 1) / (r + 1), abs=1e-6)
    assert fn[0] == pytest.approx((1 - t) - (1 - t ** (r + 1)) / (r + 1), abs=1e-6)


@pytest.mark.parametrize("threshold", [0.5, 0.7, 0.8, 0.9])
def test_default_weights_favour_recall(threshold):
    b, r = optimal_layout(threshold, 128)
    assert b * r <= 128
    assert s_curve(min(threshold + 0.1, 1.0), b, r) > 0.98


def test_s_curve_points():
    pts = s_curve_points(16, 8)
    assert pts[0] == [0.0, 0.0] and pts[-1][0] == 1.0 and len(pts) == 21
