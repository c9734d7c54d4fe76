"""The decision view of one plan: verdict in a line, the binding constraint, a chart of
predicted goodput / TTFT p95 / ITL p95 per candidate layout with the SLO lines, the move's
progress and the explanation as bullets.

Everything comes from what the planner stored with the plan: its decision record
(``Plan.record``, controlplane.planner.record) and the predictions (``Plan.predictions``).
Plans stored before the record existed fall back to the plan's own fields — that switch
lives here only (:func:`decision_view`).

Charts are server-side SVG (controlplane.dashboard.svg): no JavaScript to ship or vendor,
they render inside the live fragments the websocket sends like any other markup, and the
numbers → pixels step is a pure function with unit tests.
"""

from __future__ import annotations

import re

from .svg import bar_chart

_SENTENCE = re.compile(r"(?<=[.;])\s+(?=[A-Z→])")


def _candidates(plan) -> list[dict]:
    """Per candidate: layout, goodput, TTFT/ITL p95, meets, bottleneck (None = unknown)."""
    rows: dict[str, dict] = {}
    for c in (plan.predictions or {}).get("candidates") or []:
        if isinstance(c, dict) and c.get("layout"):
            rows[c["layout"]] = dict(c)
    predict = ((plan.record or {}).get("predict") or {}).get("candidates") or []
    for c in predict:
        if isinstance(c, dict) and c.get("layout"):
            rows.setdefault(c["layout"], {}).update({k: v for k, v in c.items() if v is not None})
    return list(rows.values())


def _verdict(plan, record: dict) -> str:
    """The planner's own verdict sentence (the "→ …" one its explanation renders from the
    record); else one built from the plan's fields."""
    for sentence in _SENTENCE.split(plan.explanation or ""):
        if sentence.startswith("→"):
            return sentence.lstrip("→ ").rstrip(".")
    action = record.get("action") or ""
    if plan.target_layout and plan.target_layout != plan.current_layout:
        return f"move {plan.current_layout or '?'} → {plan.target_layout}"
    return f"{action or 'hold'} {plan.current_layout or ''}".strip()


def _binding(record: dict, chosen: dict | None) -> str:
    choose = record.get("choose") or {}
    return choose.get("binding") or (chosen or {}).get("bottleneck") or ""


def _slo(record: dict, plan) -> tuple[float | None, float | None]:
    obs = record.get("observe") or {}
    ttft, itl = obs.get("ttft_target_ms"), obs.get("itl_target_ms")
    if ttft is None or itl is None:
        inputs = plan.inputs or {}
        ttft = ttft if ttft is not None else inputs.get("ttft_target_ms")
        itl = itl if itl is not None else inputs.get("itl_target_ms")
    return (ttft / 1000 if isinstance(ttft, int | float) else None,
            itl / 1000 if isinstance(itl, int | float) else None)


def _progress(plan, record: dict) -> dict | None:
    move = (record.get("observe") or {}).get("move")
    changes = [c for c in plan.diff or [] if isinstance(c, dict)]
    if not move and not changes:
        return None
    done = sum(1 for c in changes if c.get("done"))
    return {"step": (move or {}).get("step"), "steps_total": (move or {}).get("steps_total"),
            "target": (move or {}).get("target_layout") or plan.target_layout,
            "changes": changes, "done": done, "total": len(changes)}


def decision_view(plan) -> dict:
    record = plan.record if isinstance(plan.record, dict) else {}
    candidates = _candidates(plan)
    chosen = next((c for c in candidates if c.get("layout") == plan.target_layout), None)
    ttft_slo, itl_slo = _slo(record, plan)
    layouts = [c["layout"] for c in candidates]
    marks = {"chosen": plan.target_layout, "current": plan.current_layout}
    charts = []
    if candidates:
        charts = [
            {"title": "predicted goodput", "unit": "req/s",
             "chart": bar_chart(layouts, [c.get("goodput_rps") for c in candidates],
                                marks=marks)},
            {"title": "TTFT p95", "unit": "s", "target": ttft_slo,
             "chart": bar_chart(layouts, [c.get("ttft_p95_s") for c in candidates],
                                target=ttft_slo, marks=marks)},
            {"title": "ITL p95", "unit": "s", "target": itl_slo,
             "chart": bar_chart(layouts, [c.get("itl_p95_s") for c in candidates],
                                target=itl_slo, marks=marks)},
        ]
    bullets = [s.rstrip(".;") for s in _SENTENCE.split(plan.explanation or "") if s.strip()]
    return {
        "verdict": _verdict(plan, record),
        "binding": _binding(record, chosen),
        "from_record": bool(record),
        "charts": charts,
        "progress": _progress(plan, record),
        "bullets": bullets,
        "all_miss": bool((record.get("choose") or {}).get("all_miss")),
    }
