"""A model's layout and measured p95 TTFT/ITL against their targets over the last hours.

The points are the planner's own observations (the observe step of each decision record:
the layout running then, and the fleet p95s it measured), from the plans stored in the
window plus the model's latest planner record. Plans are stored only when the planner wants
a change, so the line is as dense as the decisions were: a quiet model has few points, and
the latest record always adds "now".

:func:`history_chart` is pure (points in, coordinates out, like controlplane.dashboard.svg);
:func:`model_histories` is the one query per model that feeds it. Bounded: the window is
``HISTORY_HOURS`` and at most ``MAX_POINTS`` points per model (the newest).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

HISTORY_HOURS = 6
MAX_POINTS = 300

PAD = 4


@dataclass(frozen=True)
class Point:
    at: float  # unix time
    layout: str
    ttft_p95_s: float | None
    itl_p95_s: float | None


@dataclass(frozen=True)
class Band:
    """One stretch of time on one layout: from x0 until the next change (or the end)."""

    x0: float
    x1: float
    label: str

    @property
    def w(self) -> float:
        return round(self.x1 - self.x0, 1)

    @property
    def cx(self) -> float:
        return round((self.x0 + self.x1) / 2, 1)

    @property
    def wide(self) -> bool:  # room for the label inside the band
        return self.w >= 7 * len(self.label)


@dataclass(frozen=True)
class Series:
    title: str
    paths: list[str]  # one path per unbroken run of measured points
    dots: list[tuple[float, float]]  # every measured point (a lone point has no line)
    target: float | None
    target_y: float | None
    top: float
    last: float | None
    over: int  # measured points above the target


@dataclass(frozen=True)
class HistoryChart:
    width: int
    height: int  # of each series' plot
    bands: list[Band]
    ttft: Series
    itl: Series
    points: int
    start: float
    end: float

    @property
    def series(self) -> list[Series]:
        return [self.ttft, self.itl]


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _series(title, points: Sequence[Point], attr: str, target, x_of, height) -> Series:
    values = [getattr(p, attr) for p in points]
    known = [float(v) for v in values if _finite(v)]
    top = max([*known, float(target) if _finite(target) else 0.0, 0.0]) * 1.1 or 1.0

    def y_of(v: float) -> float:
        return round(height - PAD - (height - 2 * PAD) * min(max(v, 0.0), top) / top, 1)

    paths, run, dots = [], [], []
    for p, v in zip(points, values, strict=True):
        if _finite(v):
            xy = (x_of(p.at), y_of(float(v)))
            dots.append(xy)
            run.append(f"{xy[0]},{xy[1]}")
        elif run:
            paths.append("M" + " L".join(run))
            run = []
    if run:
        paths.append("M" + " L".join(run))
    target_y = y_of(float(target)) if _finite(target) else None
    over = sum(1 for v in known if _finite(target) and v > target)
    return Series(title, paths, dots, target if _finite(target) else None, target_y, top,
                  known[-1] if known else None, over)


def history_chart(points: Sequence[Point], *, start: float, end: float,
                  ttft_target_s: float | None, itl_target_s: float | None,
                  width: int = 600, height: int = 56) -> HistoryChart:
    """Place ``points`` (any order) on a time axis from ``start`` to ``end``: layout bands
    (a new band where the layout label changes) and the two p95 lines with their targets.
    Points outside the window are dropped; at most ``MAX_POINTS`` (the newest) are kept."""
    inside = sorted((p for p in points if start <= p.at <= end), key=lambda p: p.at)
    inside = inside[-MAX_POINTS:]
    span = max(end - start, 1e-9)

    def x_of(t: float) -> float:
        return round(PAD + (width - 2 * PAD) * (t - start) / span, 1)

    bands: list[Band] = []
    for p in inside:
        if p.layout and (not bands or bands[-1].label != p.layout):
            x = x_of(p.at)
            if bands:
                bands[-1] = Band(bands[-1].x0, x, bands[-1].label)
            bands.append(Band(x, x, p.layout))
    if bands:  # the last layout holds until now
        bands[-1] = Band(bands[-1].x0, float(width - PAD), bands[-1].label)
    return HistoryChart(
        width=width, height=height, bands=bands,
        ttft=_series("TTFT p95", inside, "ttft_p95_s", ttft_target_s, x_of, height),
        itl=_series("ITL p95", inside, "itl_p95_s", itl_target_s, x_of, height),
        points=len(inside), start=start, end=end,
    )


def point_from_record(record, at: float, fallback_layout: str = "") -> Point | None:
    """The observe step of a stored decision record as a point (p95s in seconds)."""
    obs = record.get("observe") if isinstance(record, dict) else None
    if not isinstance(obs, dict):
        return Point(at, fallback_layout, None, None) if fallback_layout else None
    ttft, itl = obs.get("measured_ttft_p95_ms"), obs.get("measured_itl_p95_ms")
    return Point(at, str(obs.get("layout_label") or fallback_layout),
                 ttft / 1000 if _finite(ttft) else None, itl / 1000 if _finite(itl) else None)


def model_histories(models, policies: dict, end: float) -> dict[int, HistoryChart]:
    """Per model id: its history chart over the ``HISTORY_HOURS`` before ``end``.
    ``policies``: model id → effective policy (for the targets)."""
    from datetime import UTC, datetime

    from controlplane.planner.models import ModelPlannerState, Plan

    start = end - HISTORY_HOURS * 3600
    since = datetime.fromtimestamp(start, tz=UTC)
    latest = {s.served_model_id: s for s in ModelPlannerState.objects.filter(
        served_model__in=models, last_run_at__gte=since)}
    out = {}
    for model in models:
        rows = (Plan.objects.filter(served_model=model, created__gte=since)
                .order_by("-created").values_list("created", "record", "current_layout")
                [:MAX_POINTS])
        points = [point_from_record(rec, created.timestamp(), layout)
                  for created, rec, layout in rows]
        state = latest.get(model.pk)
        if state is not None and state.last_run_at is not None:
            points.append(point_from_record(state.last_record, state.last_run_at.timestamp()))
        policy = policies.get(model.pk)
        out[model.pk] = history_chart(
            [p for p in points if p is not None], start=start, end=end,
            ttft_target_s=_target(policy, "ttft_p95_ms"),
            itl_target_s=_target(policy, "itl_p95_ms"))
    return out


def _target(policy, field: str) -> float | None:
    value = getattr(policy, field, None)
    return value / 1000 if _finite(value) else None
