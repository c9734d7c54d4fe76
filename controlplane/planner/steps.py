"""The planner's first three steps: observe, predict candidates, choose.

Pure. Each returns a typed verdict (:mod:`.record`); :func:`.planner.plan_model` strings
them together with the fourth, the gate (:mod:`.gate`), and the fifth, the step. Split out
of :mod:`.planner` to keep each module readable; the types they read (``ModelInput``,
``LoadInput``) live there.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from controlplane.policies.effective import EffectivePolicy

from .costmodel import Prediction, Workload
from .dwell import load_shift
from .layouts import predict_aggregated, predict_split
from .placement import Topology, WorkerInput
from .pools import combine_pools
from .record import (
    CandidateVerdict,
    ChoiceVerdict,
    LayoutState,
    MoveProgress,
    Observation,
)

if TYPE_CHECKING:  # pragma: no cover
    from .plantypes import LoadInput, ModelInput, PlannerSettings


# --- Predictions --------------------------------------------------------------------------


def workload_for(load: LoadInput, policy: EffectivePolicy, rate: float) -> Workload:
    return Workload(
        rate_rps=max(rate, 0.0),
        isl_mean=max(load.isl_mean, 0.0),
        osl_mean=max(load.osl_mean, 0.0),
        prefix_hit=min(max(load.prefix_hit, 0.0), 1.0),
        isl_p95=load.isl_p95,
        isl_p50=load.isl_p50,
        # None (unknown, or not a number) keeps the cost model's bound from the hit rate.
        affinity_share=(min(max(load.affinity_share, 0.0), 1.0)
                        if load.affinity_share is not None
                        and load.affinity_share == load.affinity_share else None),
        ttft_slo_s=policy.ttft_p95_ms / 1000.0,
        itl_slo_s=policy.itl_p95_ms / 1000.0,
        # The router's conditional P/D (policy auto): short uncached prompts prefill on
        # their decode worker (gateway.router, "pd_local_prefill").
        local_prefill_max_tokens=(max(policy.local_prefill_max_tokens, 0)
                                  if policy.disaggregation_mode == "auto" else 0),
        # Measured share of requests those are (the gateway's decisions, or the prompt
        # histogram × (1 − hit): inputs._with_local_prefill); None (unknown, or not a
        # number) keeps the count on the fitted prompts.
        local_prefill_share=(min(max(load.local_prefill_share, 0.0), 1.0)
                             if load.local_prefill_share is not None
                             and load.local_prefill_share == load.local_prefill_share
                             else None),
    )


def current_prefill(workers: tuple[WorkerInput, ...] | list[WorkerInput]) -> int:
    return sum(1 for w in workers if w.role == "prefill")


def layout_state(workers, exclude_draining: bool = False) -> LayoutState:
    n = {"prefill": 0, "decode": 0, "both": 0}
    draining = 0
    for w in workers:
        if w.state == "draining":
            draining += 1
            if exclude_draining:
                continue
        n[w.role if w.role in n else "both"] += 1
    return LayoutState(n["prefill"], n["decode"], n["both"], draining)


def predict(
    inp: ModelInput, n_prefill: int, w: Workload, topo: Topology | None = None
) -> Prediction:
    """Prediction for the clean layout with ``n_prefill`` prefill workers (0 = aggregated)."""
    n = len(inp.workers)
    if n_prefill <= 0:
        return predict_aggregated(inp.model, inp.shape, n, w, inp.params)
    topo = topo or Topology(list(inp.workers), inp.node_links)
    return predict_split(
        inp.model, inp.shape, n_prefill, n - n_prefill, w, topo.paths(n_prefill), inp.params
    )


def predict_layout(
    inp: ModelInput, st: LayoutState, w: Workload, topo: Topology | None = None
) -> Prediction:
    """Prediction for roles as they are. 'both' workers serve whole requests in place: the
    router sends each request to a decode-capable worker (decode or both) and a 'both' one
    prefills it locally, so they form an aggregated pool carrying both ÷ (decode + both) of
    the traffic beside the P:D split; with no pure decode worker the prefill pool idles."""
    p, d, b = st.prefill, st.decode, st.both
    if p == 0 or d + b == 0:
        pred = predict_aggregated(inp.model, inp.shape, max(p + d + b, 1), w, inp.params)
        return pred if p + d + b else replace(pred, goodput_rps=0.0, attainment=0.0)
    topo = topo or Topology(list(inp.workers), inp.node_links)
    if b == 0:
        return predict_split(inp.model, inp.shape, p, d, w, topo.paths(p), inp.params)
    label = st.label()
    share_b = b / (b + d)
    agg = predict_aggregated(inp.model, inp.shape, b, replace(w, rate_rps=w.rate_rps * share_b),
                             inp.params)
    parts = [(share_b, agg)]
    if d > 0:
        split = predict_split(inp.model, inp.shape, p, d,
                              replace(w, rate_rps=w.rate_rps * (1 - share_b)),
                              topo.paths(p), inp.params)
        parts.append((1 - share_b, split))
    else:
        idle = replace(agg, gpus=p * inp.shape.tp, goodput_rps=0.0, kv_capacity_seqs=0)
        parts.append((0.0, idle))
    return combine_pools(label, p, d, b, w.rate_rps, parts)


def _prefill_range(inp: ModelInput) -> list[int]:
    """Feasible prefill counts by policy: 0 means aggregated."""
    n = len(inp.workers)
    p = inp.policy
    options = []
    if (
        p.disaggregation_mode != "disaggregated"
        and p.min_prefill_workers == 0
        and p.min_decode_workers <= n
    ):
        options.append(0)
    if p.disaggregation_mode != "aggregated":
        lo = max(1, p.min_prefill_workers, n - p.max_decode_workers)
        hi = min(p.max_prefill_workers, n - max(p.min_decode_workers, 1))
        options.extend(range(lo, hi + 1))
    return options


def share(p: Prediction | None) -> float:
    if p is None or p.rate_rps <= 0:
        return 0.0
    return p.goodput_rps / p.rate_rps


def decision_score(now: Prediction | None, plan: Prediction | None, rate_now: float) -> tuple:
    """The one score both choose and gate use: share within targets at the load now (to
    1 %), then at the planned load (to 1 %). Noise below 1 % must not decide."""
    return (round(share(now), 2) if rate_now > 0 else 0.0,
            round(share(plan), 2) if plan is not None else -1.0)


def rank_prediction(p: Prediction) -> tuple:
    # Search order: goodput share to 0.1 %, then capacity to 1 %, then fewer prefill.
    cap = p.capacity_rps if not math.isinf(p.capacity_rps) else 1e18
    cap = float(f"{cap:.2g}") if cap > 0 else 0.0
    return (round(share(p), 3), cap, -p.n_prefill)


def _kv_fits(p: Prediction, inp: ModelInput) -> str:
    """'' when the decode pool holds the sequences in flight (with the policy's headroom)."""
    peak = max(inp.load.inflight_peak, inp.load.inflight)
    if peak <= 0:
        return ""
    room = p.kv_capacity_seqs * (1.0 - inp.policy.kv_headroom)
    if peak > room:
        return (
            f"decode KV would hold {p.kv_capacity_seqs:,} sequences "
            f"({room:,.0f} after {inp.policy.kv_headroom:.0%} headroom) but {peak:,} are in flight"
        )
    return ""


def _meets(p: Prediction, pol: EffectivePolicy) -> bool:
    return p.fits and not p.overloaded and p.attainment >= pol.attainment - 1e-9


def _search(inp: ModelInput, w: Workload, settings: PlannerSettings, cur_p: int,
            topo: Topology) -> dict[int, Prediction]:
    options = _prefill_range(inp)
    evaluated: dict[int, Prediction] = {}

    def run(ps):
        for p in ps:
            if p in options and p not in evaluated:
                evaluated[p] = predict(inp, p, w, topo)

    if len(options) <= settings.exhaustive_limit:
        run(options)
    elif options:
        # Coarse grid, then every count around the best few: goodput in P is unimodal
        # in practice (prefill capacity rises with P, decode capacity falls).
        stride = max(1, math.ceil(len(options) / 24))
        run([options[0], *options[::stride], options[-1], cur_p])
        for best in sorted(evaluated.values(), key=rank_prediction, reverse=True)[:2]:
            run(range(best.n_prefill - stride, best.n_prefill + stride + 1))
    return dict(sorted(evaluated.items()))


# --- Step 1: observe ----------------------------------------------------------------------


def planned_rate(load: LoadInput, growth_margin: float) -> float:
    """The rate the planner plans for: the recent peak (or the rate, if higher) × (1 +
    ``growth_margin``)."""
    return max(load.rate_rps, load.peak_rps, 0.0) * (1.0 + growth_margin)


def observe(inp: ModelInput, now: float, settings: PlannerSettings) -> Observation:
    load, pol = inp.load, inp.policy
    st = layout_state(inp.workers)
    plan_rate = planned_rate(load, settings.growth_margin)
    mem = inp.memory
    move = None
    if mem is not None:
        lo, hi = sorted((mem.origin_prefill, mem.target_prefill))
        done = st.prefill == mem.target_prefill and (
            st.pure and (st.both == 0) == (mem.target_prefill > 0)) and not st.draining
        if not done and lo <= st.prefill <= hi and mem.origin_prefill != mem.target_prefill:
            moved = abs(st.prefill - mem.origin_prefill)
            step = min(moved // max(mem.step_limit, 1) + 1, mem.steps_total)
            move = MoveProgress(mem.origin_layout, mem.target_layout, mem.target_prefill,
                                step, mem.steps_total, max(now - mem.decided_at, 0.0),
                                load_shift(mem, load))
    return Observation(
        layout=st, workers=len(inp.workers), stale_workers=sum(1 for x in inp.workers if x.stale),
        rate_rps=load.rate_rps, plan_rate_rps=plan_rate, isl_mean=load.isl_mean,
        isl_p95=load.isl_p95, osl_mean=load.osl_mean, prefix_hit=load.prefix_hit,
        inflight_peak=max(load.inflight_peak, load.inflight),
        measured_ttft_p95_ms=load.measured_ttft_p95_ms,
        measured_itl_p95_ms=load.measured_itl_p95_ms,
        ttft_target_ms=pol.ttft_p95_ms, itl_target_ms=pol.itl_p95_ms,
        gpu=inp.shape.gpu.name, tp=inp.shape.tp, move=move,
        gpu_estimate=getattr(inp.shape.gpu, "estimate_reason", "") or "",
        affinity_share=load.affinity_share, affinity_source=load.affinity_source,
        local_prefill_share=load.local_prefill_share,
        local_prefill_source=load.local_prefill_source,
    )


# --- Step 2: predict candidates -----------------------------------------------------------


def predict_candidates(inp: ModelInput, obs: Observation, topo: Topology,
                       settings: PlannerSettings) -> CandidateVerdict:
    w_now = workload_for(inp.load, inp.policy, obs.rate_rps)
    w_plan = workload_for(inp.load, inp.policy, obs.plan_rate_rps)
    # The hold option counts draining workers under the role they drain to, at the load now
    # as at the planned one. A drain lasts as long as the worker's requests in flight, and
    # every candidate is a clean layout that needs those same workers: scored without them,
    # holding mid-move looks like a layout short of workers (near zero goodput), any other
    # layout clears the hysteresis against it, and each cycle of a move re-targets to
    # whichever split is best by a point (RTX reasoning-4k-800: 4P + 2D + 2 both with the
    # 4 prefill workers draining scored 0.00 req/s against 3.85 for 4P:4D, so the planner
    # turned to 5P:3D at 1.00 vs 0.98 share and lost 60 % of the goodput to cooldowns).
    hold_now = predict_layout(inp, obs.layout, w_now, topo)
    hold_plan = predict_layout(inp, obs.layout, w_plan, topo)
    by_p = _search(inp, w_now if obs.rate_rps > 0 else w_plan, settings, obs.layout.prefill,
                   topo)
    candidates = list(by_p.values())
    at_plan: dict[int, Prediction] = {}
    keep = sorted(candidates, key=rank_prediction, reverse=True)[:3]
    if obs.move is not None and obs.move.target_prefill in by_p:
        keep.append(by_p[obs.move.target_prefill])
    if inp.memory is not None and inp.memory.origin_prefill in by_p:
        keep.append(by_p[inp.memory.origin_prefill])
    if obs.layout.prefill in by_p:
        keep.append(by_p[obs.layout.prefill])
    for c in keep:
        if c.n_prefill not in at_plan:
            at_plan[c.n_prefill] = predict(inp, c.n_prefill, w_plan, topo)
    rejected: dict[str, str] = {}
    feasible = []
    for c in candidates:
        why = "weights do not fit" if not c.fits else _kv_fits(c, inp)
        if why and c.n_prefill != obs.layout.prefill:
            rejected[c.layout] = why
        else:
            feasible.append(c)
    return CandidateVerdict(hold_now, hold_plan, candidates, at_plan, rejected, feasible)


# --- Step 3: choose -----------------------------------------------------------------------


def choose(inp: ModelInput, obs: Observation, cv: CandidateVerdict) -> ChoiceVerdict | None:
    if not cv.feasible:
        return None
    rate = obs.rate_rps

    cur_p = obs.layout.prefill

    def key(c: Prediction) -> tuple:
        # Among layouts that score alike, the one fewest prefill moves away: every move
        # drains workers and locks them for the cooldown, so a larger move for no predicted
        # gain only costs (the demo's chat on 5P:3D went to aggregated, eight moves, where
        # 4P:4D, one move, scored the same — and the next RAG phase found every worker in
        # its cooldown). Then capacity, then fewer prefill workers.
        plan = cv.at_plan.get(c.n_prefill)
        cap = rank_prediction(plan)[1] if plan is not None else 0.0
        return (*decision_score(c, plan, rate), -abs(c.n_prefill - cur_p), cap, -c.n_prefill)

    best = max(cv.feasible, key=key)
    pol = inp.policy
    ref_now = rate > 0
    options = [*cv.feasible, cv.hold_now if ref_now else cv.hold_plan]
    if not ref_now:
        options = [cv.at_plan.get(c.n_prefill, c) for c in cv.feasible] + [cv.hold_plan]
    all_miss = not any(_meets(c, pol) for c in options)
    plan_best = cv.at_plan.get(best.n_prefill)
    return ChoiceVerdict(
        best_layout=best.layout, best_prefill=best.n_prefill,
        best_score=decision_score(best, plan_best, rate),
        hold_score=decision_score(cv.hold_now, cv.hold_plan, rate),
        all_miss=all_miss, binding=best.bottleneck,
        best_attainment=best.attainment, hold_attainment=cv.hold_now.attainment,
    )
