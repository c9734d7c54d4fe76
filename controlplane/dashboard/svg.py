"""Server-side inline SVG for sparklines and small time charts.

Pure: numbers in, a few strings out for the template to place inside an ``<svg>``
(coordinates only; no markup is built here, so autoescaping in templates is untouched).
Gaps (``None``) break the line instead of drawing a false zero: "no data" must look
different from 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Chart:
    paths: list[str]  # one "M x,y L x,y ..." path per unbroken run of samples
    width: int
    height: int
    y_max: float
    last: float | None
    target_y: float | None = None  # y pixel of an SLO line, if any and in range


def _finite(value) -> bool:
    return value is not None and isinstance(value, int | float) and math.isfinite(value)


def line_chart(
    values: Sequence[float | None],
    *,
    width: int = 180,
    height: int = 32,
    y_max: float | None = None,
    target: float | None = None,
) -> Chart:
    """Scale ``values`` (oldest first, evenly spaced) into SVG path strings."""
    finite = [v for v in values if _finite(v)]
    top = y_max if y_max is not None else max([*finite, target or 0.0, 0.0])
    if top <= 0:
        top = 1.0
    pad = 1.0
    span = max(len(values) - 1, 1)

    def xy(i: int, v: float) -> str:
        x = pad + (width - 2 * pad) * i / span
        y = height - pad - (height - 2 * pad) * min(max(v, 0.0), top) / top
        return f"{x:.1f},{y:.1f}"

    paths: list[str] = []
    run: list[str] = []
    for i, v in enumerate(values):
        if _finite(v):
            run.append(xy(i, float(v)))
        elif run:
            paths.append("M" + " L".join(run))
            run = []
    if run:
        paths.append("M" + " L".join(run))
    target_y = None
    if _finite(target) and 0 <= target <= top:
        target_y = round(height - pad - (height - 2 * pad) * target / top, 1)
    last = next((float(v) for v in reversed(values) if _finite(v)), None)
    return Chart(paths=paths, width=width, height=height, y_max=top, last=last,
                 target_y=target_y)


@dataclass(frozen=True)
class Mark:
    x: float
    label: str
    kind: str


def timeline(
    events: Sequence[tuple[float, str, str]], *, start: float, end: float, width: int = 600
) -> list[Mark]:
    """Place ``(unix time, label, kind)`` events on an axis from ``start`` to ``end``."""
    span = max(end - start, 1e-9)
    marks = []
    for when, label, kind in events:
        if start <= when <= end:
            marks.append(Mark(round(4 + (width - 8) * (when - start) / span, 1), label, kind))
    return marks


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    w: float
    h: float
    label: str
    value: float | None
    text: str  # the value as shown, "∞"/"n/a" when unbounded or unknown
    kind: str  # "chosen", "current", "over" (above the target) or ""

    @property
    def cx(self) -> float:
        return round(self.x + self.w / 2, 1)


@dataclass(frozen=True)
class Marker:
    """A measured value drawn over its layout's bar: a diamond centred on (x, y)."""

    x: float
    y: float
    label: str
    value: float
    text: str
    kind: str = "applied"  # "applied": measured since applied; "then": when decided

    @property
    def path(self) -> str:
        return f"M{self.x},{self.y - 5} l5,5 l-5,5 l-5,-5 z"


@dataclass(frozen=True)
class BarChart:
    bars: list[Bar]
    width: int
    height: int
    target_y: float | None
    top: float
    measured: list[Marker] = field(default_factory=list)


def short_number(v: float) -> str:
    """Three significant digits, without an exponent at or above 1,000 (2,750 not 2.75e+03)."""
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def bar_chart(labels: Sequence[str], values: Sequence[float | None], *,
              target: float | None = None, marks: dict | None = None,
              measured: dict[str, float | None] | None = None,
              observed: dict[str, float | None] | None = None,
              width: int = 320, height: int = 110) -> BarChart:
    """One bar per label; ``None`` (unbounded or unknown) is drawn as a full hatched bar
    labelled "∞" rather than as zero. Values above ``target`` are marked "over".
    ``measured``: label → a measured value, drawn as a marker over that label's bar (the
    scale includes it, so a measurement far above the prediction stays on the chart).
    ``observed``: the same for what was measured when the decision was made (kind "then")."""
    marks = marks or {}

    def keep(given):
        return {k: float(v) for k, v in (given or {}).items() if _finite(v) and k in labels}

    measured, observed = keep(measured), keep(observed)
    finite = [float(v) for v in values if _finite(v)] + [*measured.values(), *observed.values()]
    top = max([*finite, target if _finite(target) else 0.0, 0.0]) * 1.1 or 1.0
    plot_h = height - 30  # room for labels under the bars and the value text above
    n = max(len(labels), 1)
    slot = (width - 8) / n
    bars = []
    for i, (label, v) in enumerate(zip(labels, values, strict=True)):
        known = _finite(v)
        h = plot_h * (min(float(v), top) / top if known else 1.0)
        kind = ("chosen" if label == marks.get("chosen") else
                "current" if label == marks.get("current") else "")
        if known and _finite(target) and float(v) > target:
            kind = (kind + " over").strip()
        if not known:
            kind = (kind + " unbounded").strip()
        text = ("∞" if not known else short_number(float(v)))
        bars.append(Bar(round(4 + i * slot + slot * 0.15, 1), round(12 + plot_h - h, 1),
                        round(slot * 0.7, 1), round(h, 1), label,
                        float(v) if known else None, text, kind))
    target_y = None
    if _finite(target) and 0 <= target <= top:
        target_y = round(12 + plot_h - plot_h * target / top, 1)
    markers = [Marker(b.cx, round(12 + plot_h - plot_h * min(given[b.label], top) / top, 1),
                      b.label, given[b.label], short_number(given[b.label]), kind)
               for given, kind in ((observed, "then"), (measured, "applied"))
               for b in bars if b.label in given]
    return BarChart(bars=bars, width=width, height=height, target_y=target_y, top=top,
                    measured=markers)
