"""The decision view of one plan: verdict in a line, the binding constraint, a chart of
predicted goodput / TTFT p95 / ITL p95 per candidate layout with the SLO lines (and, once
the plan is applied, the values measured on the layout it left running), the move's
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

import math
import re

from .svg import bar_chart

_SENTENCE = re.compile(r"(?<=[.;])\s+(?=[A-Z→])")
# "move toward 1P:11D (why): w0 both→prefill, w1 both→decode, …" — the list of moves, which
# the progress table below shows one row each; more than a few would make the verdict a
# paragraph (twelve workers in the demo's split).
_MOVES = re.compile(r"^(?P<head>.*\)): (?P<moves>[^()]+)$")
VERDICT_MAX_MOVES = 3


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
    # Mid-move the layout as it is ("2P + 1D + 29 both") is no candidate, but the planner
    # predicted it (the hold option): its bar goes first, beside what was measured on it.
    hold = ((plan.record or {}).get("predict") or {}).get("hold_now")
    if isinstance(hold, dict) and hold.get("layout") and hold["layout"] not in rows:
        return [dict(hold), *rows.values()]
    return list(rows.values())


def _verdict(plan, record: dict) -> str:
    """The planner's own verdict sentence (the "→ …" one its explanation renders from the
    record); else one built from the plan's fields."""
    for sentence in _SENTENCE.split(plan.explanation or ""):
        if sentence.startswith("→"):
            return _short_moves(sentence.lstrip("→ ").rstrip("."))
    action = record.get("action") or ""
    if plan.target_layout and plan.target_layout != plan.current_layout:
        return f"move {plan.current_layout or '?'} → {plan.target_layout}"
    return f"{action or 'hold'} {plan.current_layout or ''}".strip()


def _short_moves(verdict: str) -> str:
    m = _MOVES.match(verdict)
    if not m or m["moves"].count("→") <= VERDICT_MAX_MOVES:
        return verdict
    return f"{m['head']}: {m['moves'].count('→')} workers change role (each listed below)"


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
    changes = [{**c, "label": _worker_label(c)} for c in plan.diff or [] if isinstance(c, dict)]
    if not move and not changes:
        return None
    done = sum(1 for c in changes if c.get("done"))
    return {"step": (move or {}).get("step"), "steps_total": (move or {}).get("steps_total"),
            "target": (move or {}).get("target_layout") or plan.target_layout,
            "changes": changes, "done": done, "total": len(changes)}


def _worker_label(change: dict) -> str:
    """node/worker, once: the planner's worker names may already start with the node."""
    node, worker = str(change.get("node") or ""), str(change.get("worker") or "?")
    return worker if not node or worker.startswith(f"{node}/") else f"{node}/{worker}"


def measured_from_record(record: dict | None, at: float | None = None) -> dict | None:
    """What the planner measured when it made ``record`` (its observe step): the layout
    running then, fleet TTFT/ITL p95 (s) and the request rate served (req/s). None when the
    record holds no measurement at all."""
    obs = (record or {}).get("observe") if isinstance(record, dict) else None
    if not isinstance(obs, dict):
        return None
    ttft, itl = obs.get("measured_ttft_p95_ms"), obs.get("measured_itl_p95_ms")
    rate = obs.get("rate_rps")
    if ttft is None and itl is None and rate is None:
        return None
    label = str(obs.get("layout_label") or "")
    return {
        # "2P:6D (1 draining)" is still the 2P:6D bar.
        "layout": label.split(" (", 1)[0],
        "layout_label": label,
        "ttft_p95_s": ttft / 1000 if isinstance(ttft, int | float) else None,
        "itl_p95_s": itl / 1000 if isinstance(itl, int | float) else None,
        "rate_rps": rate if isinstance(rate, int | float) else None,
        "at": at,
    }


def measured_after_apply(plan) -> dict | None:
    """The measurement of the layout an applied plan left running: the planner's first
    observation after ``applied_at`` — the next stored plan's record, else the model's
    latest planner record if the planner ran since. None for plans not (yet) applied.

    At most two indexed queries, and only for applied plans."""
    if getattr(plan, "status", None) != "applied" or not getattr(plan, "applied_at", None):
        return None
    from controlplane.planner.models import ModelPlannerState, Plan

    later = (Plan.objects.filter(served_model_id=plan.served_model_id,
                                 created__gt=plan.applied_at)
             .order_by("created").values_list("record", "created").first())
    if later is not None:
        return measured_from_record(later[0], later[1].timestamp())
    state = (ModelPlannerState.objects.filter(served_model_id=plan.served_model_id,
                                              last_run_at__gt=plan.applied_at)
             .values_list("last_record", "last_run_at").first())
    if state is not None:
        return measured_from_record(state[0], state[1].timestamp())
    return None


CHART_MAX_BARS = 12
CHART_BAR_PX = 34  # room for a "24P:8D" label under each bar


def _focus(candidates: list[dict], keep: list[str], limit: int = CHART_MAX_BARS):
    """At most ``limit`` candidates for the chart, in the planner's order: the layouts in
    ``keep`` (chosen, current, running), the chosen one's neighbours, then the best by
    predicted goodput. 32 bars in a 320 px chart cannot be read; the rest are counted."""
    if len(candidates) <= limit:
        return candidates, 0
    index = {c["layout"]: i for i, c in enumerate(candidates)}
    picked = [index[k] for k in keep if k in index]
    centre = picked[0] if picked else 0
    for d in range(1, len(candidates)):
        for i in (centre - d, centre + d):
            if 0 <= i < len(candidates) and len(set(picked)) < limit - 2:
                picked.append(i)
    by_goodput = sorted(range(len(candidates)),
                        key=lambda i: -(candidates[i].get("goodput_rps") or 0.0))
    for i in by_goodput:
        if len(set(picked)) >= limit:
            break
        picked.append(i)
    shown = sorted(set(picked))[:limit]
    return [candidates[i] for i in shown], len(candidates) - len(shown)


def decision_view(plan, measured: dict | None = None) -> dict:
    """``measured``: :func:`measured_after_apply`'s answer for an applied plan; its values
    are drawn as filled markers on the running layout's bars. What the planner measured
    when it decided (its record's observe step) is drawn as hollow markers on the layout
    it was deciding from, beside that layout's prediction."""
    record = plan.record if isinstance(plan.record, dict) else {}
    everything = _candidates(plan)
    chosen = next((c for c in everything if c.get("layout") == plan.target_layout), None)
    ttft_slo, itl_slo = _slo(record, plan)
    then = measured_from_record(record)
    running = (measured or {}).get("layout")
    candidates, hidden = _focus(everything, [plan.target_layout, plan.current_layout,
                                             running or "", (then or {}).get("layout", "")])
    layouts = [c["layout"] for c in candidates]
    marks = {"chosen": plan.target_layout, "current": plan.current_layout}
    on_chart = bool(measured) and running in layouts
    then_on_chart = bool(then) and then["layout"] in layouts

    def at(m, ok, key):
        return {m["layout"]: m.get(key)} if ok else None

    def chart(key, measured_key, target=None, scale=1.0):
        # Latencies are stored in seconds and drawn in ms: "4.92" over a bar, not "0.00492".
        def times(v):
            return v * scale if isinstance(v, int | float) and math.isfinite(v) else v

        def scaled(given):
            return {k: times(v) for k, v in given.items()} if given else None

        return bar_chart(layouts, [times(c.get(key)) for c in candidates],
                         target=times(target), marks=marks,
                         measured=scaled(at(measured, on_chart, measured_key)),
                         observed=scaled(at(then, then_on_chart, measured_key)),
                         width=max(320, CHART_BAR_PX * len(layouts) + 8))

    charts = []
    if candidates:
        charts = [
            {"title": "predicted goodput", "unit": "req/s",
             "chart": chart("goodput_rps", "rate_rps")},
            {"title": "TTFT p95", "unit": "ms", "target": ttft_slo,
             "chart": chart("ttft_p95_s", "ttft_p95_s", ttft_slo, 1000.0)},
            {"title": "ITL p95", "unit": "ms", "target": itl_slo,
             "chart": chart("itl_p95_s", "itl_p95_s", itl_slo, 1000.0)},
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
        # Shown as text even when the running layout is not one of the candidates (a
        # mixed layout mid-move): the numbers are true, only the bar to put them on is not.
        "measured": measured,
        "measured_on_chart": on_chart,
        "then_on_chart": then_on_chart,
        "hidden_candidates": hidden,
    }
