"""Server-side inline SVG for sparklines and small time charts.

Pure: numbers in, a few strings out for the template to place inside an ``<svg>``
(coordinates only; no markup is built here, so autoescaping in templates is untouched).
Gaps (``None``) break the line instead of drawing a false zero: "no data" must look
different from 0.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


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
