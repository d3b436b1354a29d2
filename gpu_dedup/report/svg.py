"""Small inline-SVG charts for ``report.html``: axes with linear or log scales, lines,
filled areas, histogram stairs, horizontal bars, markers and a legend.

The page's five figures are a few hundred shapes; writing them as SVG text takes
milliseconds, where drawing them with matplotlib (import, fonts, Agg, PNG)
took about a second of every run.  The output is SVG markup for inline use in
an HTML page (the HTML parser puts it in the SVG namespace, so it has no
xmlns and no external reference; no script), deterministic for a given input.
"""

from __future__ import annotations

import html
import math
import re

import numpy as np

FONT = 'font-family="Helvetica,Arial,sans-serif"'


def _f(v: float) -> str:
    """A coordinate with two decimals, without trailing zeros."""
    s = f"{v:.2f}".rstrip("0").rstrip(".")
    return "0" if s == "-0" else s


def _e(s) -> str:
    return html.escape(str(s))


def nice_ticks(lo: float, hi: float, target: int = 6) -> np.ndarray:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not hi > lo:
        return np.array([lo])
    raw = (hi - lo) / max(target - 1, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    ticks = np.arange(start, hi + step * 1e-6, step)
    return np.round(ticks, 10)


def _tick_label(v: float) -> str:
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:g}"


class Chart:
    """One chart: a plot area of ``width`` x ``height`` pixels with margins for labels and a title."""

    def __init__(self, width: int = 620, height: int = 340, *, xlim=(0.0, 1.0), ylim=(0.0, 1.0), xlog=False,
                 ylog=False, left: int = 66, right: int = 16, top: int = 30, bottom: int = 46):
        self.w, self.h = width, height
        self.x0, self.x1, self.y0, self.y1 = left, width - right, top, height - bottom
        self.xlog, self.ylog = xlog, ylog
        self.xlim = tuple(float(v) for v in xlim)
        self.ylim = tuple(float(v) for v in ylim)
        self.body: list[str] = []
        self.front: list[str] = []
        self.legend_items: list[tuple[str, str, str]] = []

    # coordinates
    def _scale(self, v, lim, log):
        v = np.asarray(v, np.float64)
        lo, hi = lim
        if log:
            v, lo, hi = np.log10(np.maximum(v, 1e-300)), math.log10(lo), math.log10(hi)
        return (v - lo) / ((hi - lo) or 1.0)

    def px(self, x):
        return self.x0 + self._scale(x, self.xlim, self.xlog) * (self.x1 - self.x0)

    def py(self, y):
        return self.y1 - self._scale(y, self.ylim, self.ylog) * (self.y1 - self.y0)

    def _points(self, xs, ys) -> str:
        px, py = np.atleast_1d(self.px(xs)), np.atleast_1d(self.py(ys))
        return " ".join(f"{_f(a)},{_f(b)}" for a, b in zip(px.tolist(), py.tolist()))

    # marks
    def line(self, xs, ys, color: str, width: float = 1.5, dash: str | None = None, label: str | None = None):
        d = f' stroke-dasharray="{dash}"' if dash else ""
        self.body.append(f'<polyline points="{self._points(xs, ys)}" fill="none" stroke="{color}" '
                         f'stroke-width="{width}"{d}/>')
        if label:
            self.legend_items.append((label, color, "line" + (f":{dash}" if dash else "")))

    def area(self, xs, lo, hi, color: str, opacity: float, label: str | None = None):
        """The region between the curves ``lo`` and ``hi`` over ``xs``."""
        xs = np.asarray(xs, np.float64)
        if xs.shape[0] == 0:
            return
        pts = self._points(np.r_[xs, xs[::-1]], np.r_[np.broadcast_to(hi, xs.shape), np.broadcast_to(lo, xs.shape)[::-1]])
        self.body.append(f'<polygon points="{pts}" fill="{color}" fill-opacity="{opacity}" stroke="none"/>')
        if label:
            self.legend_items.append((label, color, f"area:{opacity}"))

    def stairs(self, counts, edges, color: str, opacity: float = 0.85, base: float | None = None):
        """A filled step histogram: ``counts[i]`` over [edges[i], edges[i+1]); empty bins drop to ``base``."""
        counts, edges = np.asarray(counts, np.float64), np.asarray(edges, np.float64)
        base = self.ylim[0] if base is None else base
        top = np.where(counts > 0, counts, base) if self.ylog else counts
        xs = np.r_[edges[0], np.repeat(edges[1:-1], 2), edges[-1]]
        ys = np.repeat(np.maximum(top, base), 2)
        pts = self._points(np.r_[edges[0], xs, edges[-1]], np.r_[base, ys, base])
        self.body.append(f'<polygon points="{pts}" fill="{color}" fill-opacity="{opacity}" stroke="{color}" '
                         'stroke-width="0.6"/>')

    def vline(self, x, color: str, dash: str | None = "5,3", width: float = 1.2, label: str | None = None):
        self.line([x, x], list(self.ylim), color, width, dash, label)

    def point(self, x, y, color: str, r: float = 4):
        self.front.append(f'<circle cx="{_f(float(self.px(x)))}" cy="{_f(float(self.py(y)))}" r="{r}" '
                          f'fill="{color}"/>')

    def text(self, x, y, s: str, size: int = 11, anchor: str = "start", color: str = "#1d2430", dy: float = 0,
             front: bool = True):
        t = (f'<text x="{_f(float(x))}" y="{_f(float(y) + dy)}" font-size="{size}" text-anchor="{anchor}" '
             f'fill="{color}" {FONT}>{_e(s)}</text>')
        (self.front if front else self.body).append(t)

    # frame
    def axes(self, *, xticks=None, yticks=None, xlabels=None, ylabels=None, xlabel="", ylabel="", title="",
             grid: bool = True, tick_size: int = 10):
        if xticks is None:
            xticks = self._log_ticks(self.xlim) if self.xlog else nice_ticks(*self.xlim)
        if yticks is None:
            yticks = self._log_ticks(self.ylim) if self.ylog else nice_ticks(*self.ylim)
        xlabels = xlabels or [_tick_label(v) for v in xticks]
        ylabels = ylabels or [_tick_label(v) for v in yticks]
        grid_lines, frame = [], []
        for v, s in zip(xticks, xlabels):
            x = float(self.px(v))
            if not self.x0 - 0.5 <= x <= self.x1 + 0.5:
                continue
            if grid:
                grid_lines.append(f'<line x1="{_f(x)}" y1="{self.y0}" x2="{_f(x)}" y2="{self.y1}" stroke="#d5d9e0"/>')
            frame.append(f'<line x1="{_f(x)}" y1="{self.y1}" x2="{_f(x)}" y2="{self.y1 + 4}" stroke="#333"/>')
            frame.append(f'<text x="{_f(x)}" y="{self.y1 + 16}" font-size="{tick_size}" text-anchor="middle" '
                         f'fill="#333" {FONT}>{_e(s)}</text>')
        for v, s in zip(yticks, ylabels):
            y = float(self.py(v))
            if not self.y0 - 0.5 <= y <= self.y1 + 0.5:
                continue
            if grid:
                grid_lines.append(f'<line x1="{self.x0}" y1="{_f(y)}" x2="{self.x1}" y2="{_f(y)}" stroke="#d5d9e0"/>')
            frame.append(f'<line x1="{self.x0 - 4}" y1="{_f(y)}" x2="{self.x0}" y2="{_f(y)}" stroke="#333"/>')
            frame.append(f'<text x="{self.x0 - 7}" y="{_f(y + 3.5)}" font-size="{tick_size}" text-anchor="end" '
                         f'fill="#333" {FONT}>{_e(s)}</text>')
        self.body[:0] = grid_lines  # the grid under the marks, ticks and labels outside the clipped plot area
        self.front += frame
        self.front.append(f'<rect x="{self.x0}" y="{self.y0}" width="{self.x1 - self.x0}" '
                          f'height="{self.y1 - self.y0}" fill="none" stroke="#333"/>')
        if xlabel:
            self.text((self.x0 + self.x1) / 2, self.h - 8, xlabel, 11, "middle")
        if ylabel:
            cy = (self.y0 + self.y1) / 2
            self.front.append(f'<text x="14" y="{_f(cy)}" font-size="11" text-anchor="middle" fill="#1d2430" '
                              f'transform="rotate(-90 14 {_f(cy)})" {FONT}>{_e(ylabel)}</text>')
        if title:
            self.text(self.w / 2, 19, title, 12.5, "middle")

    @staticmethod
    def _log_ticks(lim) -> np.ndarray:
        lo, hi = math.floor(math.log10(lim[0])), math.ceil(math.log10(lim[1]))
        return 10.0 ** np.arange(lo, hi + 1)

    def legend(self, x: float | None = None, y: float | None = None, size: int = 10):
        if not self.legend_items:
            return
        x = self.x0 + 8 if x is None else x
        y = self.y0 + 8 if y is None else y
        width = 34 + max(len(s) for s, _, _ in self.legend_items) * size * 0.55
        rows = len(self.legend_items)
        self.front.append(f'<rect x="{_f(x)}" y="{_f(y)}" width="{_f(width)}" height="{_f(rows * (size + 6) + 6)}" '
                          'fill="#fff" fill-opacity="0.85" stroke="#ccc"/>')
        for i, (label, color, kind) in enumerate(self.legend_items):
            cy = y + 6 + i * (size + 6) + (size + 6) / 2
            if kind.startswith("area"):
                op = kind.split(":", 1)[1]
                self.front.append(f'<rect x="{_f(x + 6)}" y="{_f(cy - 5)}" width="20" height="10" fill="{color}" '
                                  f'fill-opacity="{op}"/>')
            else:
                dash = kind.split(":", 1)[1] if ":" in kind else None
                d = f' stroke-dasharray="{dash}"' if dash else ""
                self.front.append(f'<line x1="{_f(x + 6)}" y1="{_f(cy)}" x2="{_f(x + 26)}" y2="{_f(cy)}" '
                                  f'stroke="{color}" stroke-width="2"{d}/>')
            self.text(x + 32, cy + size * 0.35, label, size)

    def svg(self, alt: str) -> str:
        ident = "clip-" + re.sub(r"[^A-Za-z0-9]+", "-", alt)  # ids are page-wide: one per figure
        clip = (f'<clipPath id="{ident}"><rect x="{self.x0}" y="{self.y0}" width="{self.x1 - self.x0}" '
                f'height="{self.y1 - self.y0}"/></clipPath>')
        return (f'<svg viewBox="0 0 {self.w} {self.h}" width="{self.w}" '
                f'height="{self.h}" role="img" aria-label="{_e(alt)}"><title>{_e(alt)}</title>'
                f'<rect width="{self.w}" height="{self.h}" fill="#fff"/>{clip}<g clip-path="url(#{ident})">'
                + "".join(self.body) + "</g>" + "".join(self.front) + "</svg>")


def hbars(names: list[str], values: list[float], colors: list[str], title: str, xlabel: str, alt: str,
          width: int = 620) -> str:
    """Horizontal bars, one per name (top to bottom), each labelled with its value in seconds."""
    n = max(len(names), 1)
    height = 22 * max(n, 3) + 78
    left = 12 + 7 * max((len(s) for s in names), default=4)
    top = max(values + [1e-3]) * 1.18
    c = Chart(width, height, xlim=(0, top), ylim=(n - 0.5, -0.5), left=left, top=30, bottom=44)
    for i, (name, v, color) in enumerate(zip(names, values, colors)):
        y0, y1 = float(c.py(i - 0.4)), float(c.py(i + 0.4))
        c.body.append(f'<rect x="{c.x0}" y="{_f(y0)}" width="{_f(float(c.px(v)) - c.x0)}" height="{_f(y1 - y0)}" '
                      f'fill="{color}"/>')
        c.text(float(c.px(v)) + 3, (y0 + y1) / 2 + 3.5, f"{v:.2f}s", 10)
    c.axes(yticks=list(range(len(names))), ylabels=names, xlabel=xlabel, title=title, grid=False)
    return c.svg(alt)
