"""The planner's decision core: per served model, which layout, which workers, and why.

Pure and deterministic: plain dataclasses in, plain dataclasses out, no Django, no clock
(``now`` is an input). :mod:`controlplane.planner.inputs` builds the inputs from the
database and hot state; :mod:`controlplane.planner.tasks` persists and applies the result.

Per model, five named steps, each returning a typed verdict (:mod:`.record`):

1. **observe** — the load now and planned for, the layout as it is ('both' workers as both,
   draining ones as draining) and a move under way ("aggregated → 10P:2D, step 2 of 5");
2. **predict candidates** — aggregated and every feasible P:D split at the load now, the
   layout as it is (the *hold* option) and the best few at the planned load;
3. **choose** — the best on one decision score (goodput share now, then at the planned
   load); when every layout is predicted to miss the targets the choice is to hold, and the
   record carries an alert;
4. **gate** — may it move: never toward a target predicted worse than holding; the gain
   must clear the hysteresis; no A → B → A within the dwell window unless the load moved by
   more than the hysteresis since A → B; a move under way is re-decided as finish, hold or
   roll back;
5. **step** — the role changes this cycle (at most ``max_changes_per_cycle`` into or out of
   prefill, more when the current layout is drowning, see ``_overload``).
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

from . import explain
from .costmodel import (
    Prediction,
)
from .dwell import cooldown_waiver, track_regime, turn_back_margin
from .gate import _origin, gate
from .placement import Topology, WorkerInput
from .plantypes import (  # noqa: F401 - re-exported: callers import them from here
    DEFAULT_SETTINGS,
    ClusterDecision,
    LoadInput,
    ModelDecision,
    ModelInput,
    PlannerSettings,
    RoleChange,
)
from .record import (
    RECORD_VERSION,
    DecisionRecord,
    LayoutState,
    MoveMemory,
    Observation,
    StepVerdict,
)
from .stepping import eligible, in_cooldown, roles_after, take_up_to, wanted_changes
from .steps import (  # noqa: F401 - re-exported: the planner's public helpers
    _kv_fits,
    _prefill_range,
    choose,
    current_prefill,
    decision_score,
    layout_state,
    observe,
    predict,
    predict_candidates,
    predict_layout,
    share,
    workload_for,
)

# --- Step 5: step -------------------------------------------------------------------------


def _overload(
    inp: ModelInput,
    current_now: Prediction,
    best_now: Prediction,
    n_workers: int,
    latency_factor: float = DEFAULT_SETTINGS.overload_latency_factor,
) -> dict | None:
    """The facts behind a larger step, or None. The target must be predicted to keep up
    (not overloaded), and the current layout must be failing badly, by either evidence:

    * the model and the queues agree: at the load now the current layout is predicted
      overloaded (its queues grow without bound) or to keep less than half the goodput the
      target would, and requests are queueing, at least one waiting per worker on average;
    * or the measurement alone: the measured p95 TTFT or ITL is at least ``latency_factor``
      times its target (an aggregated engine admits every request into its batch, so a
      layout that misses ITL shows no queue, only slow tokens). Unknown latencies count as
      not over.

    Waiting then costs twice: every cycle spent in the old layout adds to a backlog that
    the new one must work off before anyone behind it meets the TTFT target."""
    share_ = inp.policy.overload_change_share
    rate = inp.load.rate_rps
    if share_ <= 0 or rate <= 0 or best_now.overloaded or best_now.goodput_rps <= 0:
        return None
    if current_now.goodput_rps >= best_now.goodput_rps:
        return None
    far_behind = current_now.overloaded or (
        current_now.goodput_rps < 0.5 * best_now.goodput_rps
    )
    waiting = sum(x.waiting for x in inp.workers)
    queueing = waiting >= n_workers
    over = []  # (metric, measured ms, target ms), the ones far over target
    if latency_factor > 0:
        for metric, measured, target in (
            ("TTFT", inp.load.measured_ttft_p95_ms, inp.policy.ttft_p95_ms),
            ("ITL", inp.load.measured_itl_p95_ms, inp.policy.itl_p95_ms),
        ):
            if (measured is not None and math.isfinite(measured) and target
                    and target > 0 and measured >= latency_factor * target):
                over.append((metric, measured, target))
    if not ((far_behind and queueing) or over):
        return None

    def cap(p: Prediction) -> float | None:
        return None if math.isinf(p.capacity_rps) else round(p.capacity_rps, 6)

    return {
        "limit": max(inp.policy.max_changes_per_cycle, math.ceil(share_ * n_workers)),
        "share": share_,
        "normal_limit": inp.policy.max_changes_per_cycle,
        "rate_rps": round(rate, 6),
        "current_layout": current_now.layout,
        "current_overloaded": current_now.overloaded,
        "current_goodput_rps": round(current_now.goodput_rps, 6),
        "current_capacity_rps": cap(current_now),
        "current_bottleneck": current_now.bottleneck,
        "target_layout": best_now.layout,
        "target_goodput_rps": round(best_now.goodput_rps, 6),
        "target_capacity_rps": cap(best_now),
        "waiting": waiting,
        "workers": n_workers,
        "queueing": queueing,
        "far_behind": far_behind,
        "latency_factor": latency_factor,
        "latency_over": [
            {"metric": m, "p95_ms": round(v, 3), "target_ms": round(t, 3)} for m, v, t in over
        ],
    }


# --- Entry points -------------------------------------------------------------------------


def plan_model(
    inp: ModelInput, now: float, settings: PlannerSettings = DEFAULT_SETTINGS
) -> ModelDecision:
    pol = inp.policy
    name = inp.model.name
    workers = list(inp.workers)
    obs = observe(inp, now, settings)
    w_plan = workload_for(inp.load, pol, obs.plan_rate_rps)
    # The load regime after this cycle's load (dwell.track_regime): how long the load has
    # been as it is, which prices a move (gate) and is remembered for the next cycle.
    regime = track_regime(inp.regime, inp.load, now, turn_back_margin(pol, settings))
    rec = DecisionRecord(RECORD_VERSION, name, "", "", obs, memory=inp.memory, regime=regime)
    notes: list[str] = list(inp.notes)

    def decision(action, reason, **kw) -> ModelDecision:
        rec.action, rec.reason = action, reason
        cv = rec.candidates
        d = ModelDecision(
            served_model_id=inp.served_model_id, model=name, action=action, reason=reason,
            current=cv.hold_plan if cv else None, target=kw.pop("target", None),
            step=kw.pop("step", None), current_now=cv.hold_now if cv else None,
            candidates=cv.candidates if cv else [], changes=kw.pop("changes", []),
            plan_rate_rps=obs.plan_rate_rps, workload=w_plan, notes=notes,
            rejected=cv.rejected if cv else {}, overload=kw.pop("overload", None), record=rec,
        )
        d.explanation = explain.explain_decision(d)
        return d

    if not workers:
        return decision("hold", "no-workers")
    if not pol.rebalancing_enabled or pol.rebalancing_mode == "off":
        return decision("hold", "rebalancing-off")
    stale = obs.stale_workers
    if stale * 2 > len(workers):
        notes.append(f"{stale} of {len(workers)} workers stale")
        return decision("hold", "fail-static")
    # An open plan (approved, still draining) holds the model: one plan at a time keeps the
    # record readable. Workers draining outside a plan count with the role they are
    # heading to and are simply not eligible to change again.
    if inp.change_in_progress:
        return decision("hold", "change-in-progress")

    topo = Topology(workers, inp.node_links)
    cv = rec.candidates = predict_candidates(inp, obs, topo, settings)
    ch = rec.choice = choose(inp, obs, cv)
    gv, target_p = gate(inp, obs, cv, ch, now, settings, topo, regime)
    if obs.move is not None and not gv.move_verdict:
        # A move under way is re-decided every cycle: finish, hold or roll back (or, when
        # the load moved past the margin, head somewhere new).
        mv = "hold"
        if gv.verdict == "go":
            mv = "finish" if target_p == obs.move.target_prefill else (
                "roll-back" if target_p == _origin(inp.memory) else "retarget")
        gv = replace(gv, move_verdict=mv)
    rec.gate = gv
    # Every layout predicted to miss is worth an alert even when the policy's bounds or an
    # incomplete layout force a step anyway (a layout outside the bounds is not held).
    if gv.reason == "all-layouts-miss" or (ch is not None and ch.all_miss):
        rec.alert = "all-layouts-miss"
    cur_p = obs.layout.prefill
    target = cv.at_plan.get(target_p) or (
        cv.hold_plan if target_p == cur_p else predict(inp, target_p, w_plan, topo))
    if gv.reason == "complete-layout" and gv.verdict == "go":
        relabel = _relabels(inp, obs, now)
        clean = cv.at_plan.get(cur_p) or predict(inp, cur_p, w_plan, topo)
        rec.step = StepVerdict(len(relabel), len(relabel), len(relabel),
                               _state_after(workers, relabel))
        if relabel:
            return decision("change", "complete-layout", target=clean, step=clean,
                            changes=relabel)
        return decision("hold", "workers-not-eligible", target=clean)
    if gv.verdict != "go":
        # Holding still finishes the labels of the layout as it is (a 'both' left beside a
        # split starves the prefill pool; a 'decode' when aggregated never prefills) when
        # the clean layout is predicted at least as good as the one as it is.
        if gv.reason in ("current-is-best", "within-hysteresis", "dwell", "move-held",
                         "move-does-not-pay", "serves-measured-load"):
            relabel = _relabels(inp, obs, now)
            clean = cv.at_plan.get(cur_p)
            clean_now = next((c for c in cv.candidates if c.n_prefill == cur_p), None)
            if relabel and clean is not None and decision_score(
                    clean_now, clean, obs.rate_rps) >= ch.hold_score:
                rec.step = StepVerdict(len(relabel), len(relabel), len(relabel),
                                       _state_after(workers, relabel))
                mem = inp.memory
                if obs.move is not None and mem is not None:
                    # The move stops here: it was A → B, it is now A → (this layout), so
                    # the dwell rule guards the way back from here.
                    mem = replace(mem, target_prefill=cur_p, target_layout=clean.layout)
                rec.memory = mem
                return decision("change", "complete-layout", target=clean, step=clean,
                                changes=relabel)
        action = "hold" if gv.verdict == "hold" else "keep"
        return decision(action, gv.reason, target=target)

    # Move toward the target: concrete roles, then the changes allowed this cycle.
    placement = topo.placement(target_p) if target_p > 0 else None
    waiver = cooldown_waiver(inp, settings)
    want = wanted_changes(workers, placement, now, pol.cooldown_s,
                          waiver[0] if waiver else None)
    if want.blocked:
        notes.append("waiting: " + ", ".join(
            f"{n} worker(s) {why}" for why, n in sorted(want.blocked.items())))
    n_workers = len(workers)
    target_now = next((c for c in cv.candidates if c.n_prefill == target_p), None) or predict(
        inp, target_p, workload_for(inp.load, pol, obs.rate_rps), topo)
    limit = pol.max_changes_per_cycle
    overload = _overload(inp, cv.hold_now, target_now, n_workers,
                         settings.overload_latency_factor)

    def step_of(take) -> tuple[Prediction, str, LayoutState]:
        after = _state_after(workers, take)
        step = predict_layout(inp, after, w_plan, topo)
        return step, (_kv_fits(step, inp) if after.prefill != cur_p else ""), after

    td = n_workers - target_p
    if overload is not None and overload["limit"] > limit and len(want.heavy) > limit:
        take = take_up_to(want, overload["limit"], workers, placement, target_p, td)
        step, why, after = step_of(take)
        if why:
            overload = None  # the larger step would leave too little decode KV
        else:
            limit = overload["limit"]
    else:
        overload = None
    if overload is None:
        take = take_up_to(want, limit, workers, placement, target_p, td)
        step, why, after = step_of(take)
    rec.step = StepVerdict(len(take), limit, len(want.wanted), after if take else None,
                           dict(want.blocked), overload is not None, overload)
    if not take:
        return decision("hold", "workers-not-eligible", target=target)
    if why:
        cv.rejected[step.layout] = why
        rec.step = replace(rec.step, changes=0, after=None)
        return decision("hold", "step-breaks-kv", target=target)
    waived = sum(1 for x, _r in take if in_cooldown(x, now, pol.cooldown_s))
    if waived and waiver:
        notes.append(_waiver_note(waiver, waived, now, inp, settings))
    if len(take) < len(want.wanted):
        notes.append(
            f"{len(take)} of {len(want.wanted)} role changes this cycle "
            f"(max {limit} into or out of prefill per cycle"
            + (", raised for overload" if overload else "") + ")"
        )
    if gv.move_verdict == "extend" and inp.memory is not None:
        # The same move taken further: its origin, decision time and load stay.
        mem = inp.memory
        rec.memory = replace(mem, target_prefill=target_p, target_layout=target.layout,
                             steps_total=max(math.ceil(abs(target_p - mem.origin_prefill)
                                                       / max(mem.step_limit, 1)), 1))
    elif gv.reason != "continue-move" or inp.memory is None:
        rec.memory = _memory_for(inp, obs, target_p, target.layout, now, reason=gv.reason)
    changes = [RoleChange(x.id, x.name, x.node, x.role, r) for x, r in take]
    return decision("change", gv.reason, target=target, step=step, changes=changes,
                    overload=overload)


def _relabels(inp: ModelInput, obs: Observation, now: float) -> list[RoleChange]:
    side = "both" if obs.layout.prefill == 0 else "decode"
    return [
        RoleChange(x.id, x.name, x.node, x.role, side)
        for x in inp.workers
        if x.role not in ("prefill", side) and not eligible(x, now, inp.policy.cooldown_s)
    ]


def _waiver_note(waiver: tuple[float, float], n: int, now: float, inp: ModelInput,
                 settings: PlannerSettings) -> str:
    since, shift = waiver
    margin = turn_back_margin(inp.policy, settings)
    # Epoch seconds in the product, virtual seconds in the benchmark's loop.
    at = time.strftime("%H:%M:%S UTC", time.gmtime(since)) if since > 1e8 else f"{since:,.0f} s"
    return (f"cooldown waived for {n} worker(s): load moved {shift:.0%} since the move at "
            f"{at} ({now - since:,.0f} s ago), more than the {margin:.0%} margin for "
            "turning back")


def _state_after(workers: list[WorkerInput], take) -> LayoutState:
    if take and isinstance(take[0], RoleChange):
        new = {c.worker_id: c.to_role for c in take}
        roles = {x.id: new.get(x.id, x.role) for x in workers}
    else:
        roles = roles_after(workers, take)
    fake = [replace(x, role=roles[x.id]) for x in workers]
    return layout_state(fake)


def _memory_for(inp: ModelInput, obs: Observation, target_p: int, target_layout: str,
                now: float, keep: bool = False, reason: str = "") -> MoveMemory | None:
    if keep and inp.memory is not None:
        return inp.memory
    limit = max(inp.policy.max_changes_per_cycle, 1)
    total = max(math.ceil(abs(target_p - obs.layout.prefill) / limit), 1)
    return MoveMemory(obs.layout.prefill, target_p, obs.layout.label(), target_layout, now,
                      obs.rate_rps, obs.isl_mean, obs.osl_mean, limit, total, reason)


def plan_cluster(
    inputs: list[ModelInput],
    now: float,
    nodes_total: int = 0,
    nodes_stale: int = 0,
    settings: PlannerSettings = DEFAULT_SETTINGS,
) -> ClusterDecision:
    """Plan every model; fail-static (no change anywhere) when too many nodes are stale."""
    if nodes_total > 0 and nodes_stale / nodes_total >= settings.stale_share_limit:
        reason = (
            f"{nodes_stale} of {nodes_total} nodes are stale at once "
            f"(limit {settings.stale_share_limit:.0%}): more likely the control plane lost "
            "sight of them than that they failed together, so no role changes this cycle"
        )
        models = []
        for inp in inputs:
            rec = DecisionRecord(RECORD_VERSION, inp.model.name, "hold", "fail-static", None,
                                 memory=inp.memory, regime=inp.regime)
            d = ModelDecision(
                served_model_id=inp.served_model_id, model=inp.model.name, action="hold",
                reason="fail-static", current=None, target=None, step=None, current_now=None,
                candidates=[], changes=[], plan_rate_rps=0.0, workload=None, notes=[reason],
                record=rec,
            )
            d.explanation = f"{inp.model.name}: no change. Fail-static: {reason}."
            models.append(d)
        return ClusterDecision(models, True, reason, nodes_stale, nodes_total)
    decisions = [
        plan_model(inp, now, settings) for inp in sorted(inputs, key=lambda i: i.served_model_id)
    ]
    return ClusterDecision(decisions, False, "", nodes_stale, nodes_total)
