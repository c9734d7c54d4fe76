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
from dataclasses import dataclass, field, replace

from controlplane.policies.effective import DEFAULT_POLICY, EffectivePolicy

from . import explain
from .costmodel import (
    DEFAULT_PARAMS,
    CostParams,
    ModelSpec,
    Prediction,
    WorkerShape,
    Workload,
    combine_pools,
    predict_aggregated,
    predict_split,
)
from .placement import NodeLinks, Topology, WorkerInput
from .record import (
    RECORD_VERSION,
    CandidateVerdict,
    ChoiceVerdict,
    DecisionRecord,
    GateVerdict,
    LayoutState,
    MoveMemory,
    MoveProgress,
    Observation,
    StepVerdict,
)
from .stepping import eligible, roles_after, take_up_to, wanted_changes


@dataclass(frozen=True)
class LoadInput:
    """What the model's workers see now (from hot state), all optional-zero."""

    rate_rps: float = 0.0
    peak_rps: float = 0.0  # recent peak (e.g. max of the last few windows)
    isl_mean: float = 0.0
    isl_p95: float | None = None
    osl_mean: float = 0.0
    prefix_hit: float = 0.0
    inflight: int = 0  # sequences running now, all workers
    inflight_peak: int = 0
    # Measured p95 latencies now (Prometheus or the agents' windows), ms; None = unknown.
    measured_ttft_p95_ms: float | None = None
    measured_itl_p95_ms: float | None = None
    osl_p95: float | None = None


@dataclass(frozen=True)
class ModelInput:
    served_model_id: int
    model: ModelSpec
    shape: WorkerShape
    workers: tuple[WorkerInput, ...]
    load: LoadInput
    policy: EffectivePolicy = DEFAULT_POLICY
    node_links: dict[str, NodeLinks] = field(default_factory=dict)
    params: CostParams = DEFAULT_PARAMS
    change_in_progress: bool = False
    memory: MoveMemory | None = None  # the last move, from the previous cycles' records
    notes: tuple[str, ...] = ()  # facts the glue wants in the record (e.g. calibration)


@dataclass(frozen=True)
class PlannerSettings:
    growth_margin: float = 0.2  # plan for the recent peak × (1 + margin)
    stale_share_limit: float = 0.5  # fail-static when at least this share of nodes is stale
    exhaustive_limit: int = 48  # above this many workers, search P:D coarse-to-fine
    # Overload's measured half also holds when a measured p95 (TTFT or ITL) is at least
    # this many times its target: far past what windowed-p95 noise or a calibration error
    # explains (see docs/planner.md, step 7).
    overload_latency_factor: float = 1.5
    # No A → B → A within this many seconds of the A → B decision unless the load moved by
    # more than the hysteresis since then.
    dwell_s: float = 900.0


DEFAULT_SETTINGS = PlannerSettings()


@dataclass(frozen=True)
class RoleChange:
    worker_id: int
    worker: str
    node: str
    from_role: str
    to_role: str

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class ModelDecision:
    served_model_id: int
    model: str
    action: str  # keep | change | hold
    reason: str  # short code: no-traffic, within-hysteresis, better-layout, fail-static, …
    current: Prediction | None  # the layout as it is (the hold option), at the planned load
    target: Prediction | None
    step: Prediction | None  # the layout after this cycle's changes
    current_now: Prediction | None  # the layout as it is at the load measured now
    candidates: list[Prediction]
    changes: list[RoleChange]
    plan_rate_rps: float
    workload: Workload | None
    explanation: str = ""
    notes: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # layout → why infeasible
    overload: dict | None = None  # set when this cycle's step was raised for overload
    record: DecisionRecord | None = None

    @property
    def changed(self) -> bool:
        return bool(self.changes)

    @property
    def memory(self) -> MoveMemory | None:
        return self.record.memory if self.record else None

    def predictions_dict(self) -> dict:
        return {
            "plan_rate_rps": round(self.plan_rate_rps, 6),
            "current": self.current.as_dict() if self.current else None,
            "current_now": self.current_now.as_dict() if self.current_now else None,
            "target": self.target.as_dict() if self.target else None,
            "step": self.step.as_dict() if self.step else None,
            "candidates": [p.as_dict() for p in self.candidates],
            "rejected": dict(self.rejected),
            "overload": dict(self.overload) if self.overload else None,
        }


@dataclass
class ClusterDecision:
    models: list[ModelDecision]
    fail_static: bool = False
    reason: str = ""
    stale_nodes: int = 0
    nodes: int = 0


# --- Predictions --------------------------------------------------------------------------


def workload_for(load: LoadInput, policy: EffectivePolicy, rate: float) -> Workload:
    return Workload(
        rate_rps=max(rate, 0.0),
        isl_mean=max(load.isl_mean, 0.0),
        osl_mean=max(load.osl_mean, 0.0),
        prefix_hit=min(max(load.prefix_hit, 0.0), 1.0),
        isl_p95=load.isl_p95,
        ttft_slo_s=policy.ttft_p95_ms / 1000.0,
        itl_slo_s=policy.itl_p95_ms / 1000.0,
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


def _rank(p: Prediction) -> tuple:
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
        for best in sorted(evaluated.values(), key=_rank, reverse=True)[:2]:
            run(range(best.n_prefill - stride, best.n_prefill + stride + 1))
    return dict(sorted(evaluated.items()))


def load_shift(memory: MoveMemory | None, load: LoadInput) -> float:
    """Largest relative change of request rate, prompt or answer length since ``memory``."""
    if memory is None:
        return 0.0

    def rel(now: float, then: float) -> float:
        base = max(abs(then), 1e-9)
        return abs(now - then) / base if then > 0 or now > 0 else 0.0

    return max(rel(load.rate_rps, memory.rate_rps), rel(load.isl_mean, memory.isl_mean),
               rel(load.osl_mean, memory.osl_mean))


# --- Step 1: observe ----------------------------------------------------------------------


def observe(inp: ModelInput, now: float, settings: PlannerSettings) -> Observation:
    load, pol = inp.load, inp.policy
    st = layout_state(inp.workers)
    plan_rate = max(load.rate_rps, load.peak_rps, 0.0) * (1.0 + settings.growth_margin)
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
    )


# --- Step 2: predict candidates -----------------------------------------------------------


def predict_candidates(inp: ModelInput, obs: Observation, topo: Topology,
                       settings: PlannerSettings) -> CandidateVerdict:
    w_now = workload_for(inp.load, inp.policy, obs.rate_rps)
    w_plan = workload_for(inp.load, inp.policy, obs.plan_rate_rps)
    # Draining workers finish old work and take no new: the layout now runs without them;
    # holding lands them in the role they drain to.
    hold_now = predict_layout(inp, layout_state(inp.workers, exclude_draining=True), w_now, topo)
    hold_plan = predict_layout(inp, obs.layout, w_plan, topo)
    by_p = _search(inp, w_now if obs.rate_rps > 0 else w_plan, settings, obs.layout.prefill,
                   topo)
    candidates = list(by_p.values())
    at_plan: dict[int, Prediction] = {}
    keep = sorted(candidates, key=_rank, reverse=True)[:3]
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

    def key(c: Prediction) -> tuple:
        plan = cv.at_plan.get(c.n_prefill)
        cap = _rank(plan)[1] if plan is not None else 0.0
        return (*decision_score(c, plan, rate), cap, -c.n_prefill)

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


# --- Step 4: gate -------------------------------------------------------------------------


def _gains(new: Prediction, old: Prediction, rate: float, h: float) -> bool:
    return new.goodput_rps > old.goodput_rps * (1.0 + h) + 1e-9 and (
        new.goodput_rps - old.goodput_rps > 0.005 * rate
    )


def gate(inp: ModelInput, obs: Observation, cv: CandidateVerdict, ch: ChoiceVerdict | None,
         now: float, settings: PlannerSettings, topo: Topology) -> tuple[GateVerdict, int]:
    """(verdict, the prefill count to move toward)."""
    pol = inp.policy
    h = pol.hysteresis
    cur_p = obs.layout.prefill
    # A policy bound the layout as it is breaks (min/max per role, a forced mode, 'both'
    # workers under "disaggregated") must be met whatever the load.
    st = obs.layout
    forced = cur_p not in set(_prefill_range(inp)) or (
        pol.disaggregation_mode == "disaggregated" and st.both > 0) or (
        pol.disaggregation_mode == "aggregated" and st.prefill + st.decode > 0)
    if obs.plan_rate_rps <= 0 and not forced:
        return GateVerdict("keep", "no-traffic", forced=forced), cur_p
    if ch is None:
        return GateVerdict("keep", "no-feasible-layout", forced=forced), cur_p
    w_now = workload_for(inp.load, pol, obs.rate_rps)
    w_plan = workload_for(inp.load, pol, obs.plan_rate_rps)

    def preds(p: int) -> tuple[Prediction, Prediction]:
        now_p = next((c for c in cv.candidates if c.n_prefill == p), None)
        now_p = now_p or predict(inp, p, w_now, topo)
        plan_p = cv.at_plan.get(p) or predict(inp, p, w_plan, topo)
        return now_p, plan_p

    def score(p: int) -> tuple:
        a, b = preds(p)
        return decision_score(a, b, obs.rate_rps)

    hold = ch.hold_score
    base = {"hysteresis": h, "hold_score": hold, "forced": forced}
    if forced:
        target = ch.best_prefill
        reason = "complete-layout" if target == cur_p else "policy-bound"
        return GateVerdict("go", reason, target_score=score(target), **base), target
    if ch.all_miss:
        return GateVerdict(
            "hold", "all-layouts-miss",
            detail=f"no layout is predicted to keep {pol.attainment:.0%} of requests within "
                   "both targets at this load", target_score=ch.best_score, **base,
        ), cur_p
    mem, move = inp.memory, obs.move
    shift = load_shift(mem, inp.load)
    moved = shift > h
    base.update(load_shift=shift, dwell_s=settings.dwell_s)

    def worth(p: int) -> tuple[bool, bool, bool]:
        """(not worse than holding on the score, gain now, gain at the planned load)."""
        tn, tp = preds(p)
        not_worse = score(p) >= hold
        g_now = obs.rate_rps > 0 and _gains(tn, cv.hold_now, obs.rate_rps, h)
        g_plan = tn.goodput_rps >= cv.hold_now.goodput_rps * 0.99 and _gains(
            tp, cv.hold_plan, obs.plan_rate_rps, h)
        return not_worse, g_now, g_plan

    if move is not None and (ch.best_prefill == move.target_prefill or not moved):
        # A move under way, load as when it was decided: finish it unless its target is now
        # predicted worse than staying put; then hold (rolling back within the dwell window
        # would be A → B → A at constant load).
        target = move.target_prefill
        not_worse, g_now, g_plan = worth(target)
        if not_worse:
            return GateVerdict("go", "continue-move", move_verdict="finish",
                               detail=f"{move.target_layout} is still predicted at least as "
                                      "good as staying put", gain_now=g_now, gain_plan=g_plan,
                               target_score=score(target), **base), target
        return GateVerdict("hold", "move-held", move_verdict="hold",
                           detail=f"{move.target_layout} is now predicted worse than the "
                                  "layout as it is; the load has not moved enough to "
                                  "turn back", target_score=score(target), **base), cur_p
    target = ch.best_prefill
    if target == cur_p:
        return GateVerdict("keep", "current-is-best", target_score=ch.best_score,
                           **base), cur_p
    verdict = ""
    if move is not None:
        verdict = "roll-back" if target == _origin(mem) else "retarget"
    elif (mem is not None and target == mem.origin_prefill and cur_p == mem.target_prefill
          and now - mem.decided_at < settings.dwell_s and not moved):
        return GateVerdict(
            "keep", "dwell",
            detail=f"{ch.best_layout} is where the last move ({mem.origin_layout} → "
                   f"{mem.target_layout}) started {now - mem.decided_at:,.0f} s ago; within "
                   f"the {settings.dwell_s:,.0f} s dwell window the load moved only "
                   f"{shift:.0%} (margin {h:.0%})", target_score=score(target), **base,
        ), cur_p
    not_worse, g_now, g_plan = worth(target)
    t_score = score(target)
    if not not_worse or not (g_now or g_plan):
        return GateVerdict("keep", "within-hysteresis", gain_now=g_now, gain_plan=g_plan,
                           target_score=t_score, move_verdict="hold" if move else "",
                           **base), cur_p
    return GateVerdict("go", "roll-back" if verdict == "roll-back" else "better-layout",
                       gain_now=g_now, gain_plan=g_plan, target_score=t_score,
                       move_verdict=verdict, **base), target


def _origin(mem: MoveMemory | None) -> int:
    return mem.origin_prefill if mem is not None else -1


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
    rec = DecisionRecord(RECORD_VERSION, name, "", "", obs, memory=inp.memory)
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
    gv, target_p = gate(inp, obs, cv, ch, now, settings, topo)
    rec.gate = gv
    if gv.reason == "all-layouts-miss":
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
        if gv.reason in ("current-is-best", "within-hysteresis", "dwell", "move-held"):
            relabel = _relabels(inp, obs, now)
            clean = cv.at_plan.get(cur_p)
            clean_now = next((c for c in cv.candidates if c.n_prefill == cur_p), None)
            if relabel and clean is not None and decision_score(
                    clean_now, clean, obs.rate_rps) >= ch.hold_score:
                rec.step = StepVerdict(len(relabel), len(relabel), len(relabel),
                                       _state_after(workers, relabel))
                rec.memory = _memory_for(inp, obs, cur_p, clean.layout, now, keep=True)
                return decision("change", "complete-layout", target=clean, step=clean,
                                changes=relabel)
        action = "hold" if gv.verdict == "hold" else "keep"
        return decision(action, gv.reason, target=target)

    # Move toward the target: concrete roles, then the changes allowed this cycle.
    placement = topo.placement(target_p) if target_p > 0 else None
    want = wanted_changes(workers, placement, now, pol.cooldown_s)
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
    if len(take) < len(want.wanted):
        notes.append(
            f"{len(take)} of {len(want.wanted)} role changes this cycle "
            f"(max {limit} into or out of prefill per cycle"
            + (", raised for overload" if overload else "") + ")"
        )
    if gv.reason != "continue-move" or inp.memory is None:
        rec.memory = _memory_for(inp, obs, target_p, target.layout, now)
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


def _state_after(workers: list[WorkerInput], take) -> LayoutState:
    if take and isinstance(take[0], RoleChange):
        new = {c.worker_id: c.to_role for c in take}
        roles = {x.id: new.get(x.id, x.role) for x in workers}
    else:
        roles = roles_after(workers, take)
    fake = [replace(x, role=roles[x.id]) for x in workers]
    return layout_state(fake)


def _memory_for(inp: ModelInput, obs: Observation, target_p: int, target_layout: str,
                now: float, keep: bool = False) -> MoveMemory | None:
    if keep and inp.memory is not None:
        return inp.memory
    limit = max(inp.policy.max_changes_per_cycle, 1)
    total = max(math.ceil(abs(target_p - obs.layout.prefill) / limit), 1)
    return MoveMemory(obs.layout.prefill, target_p, obs.layout.label(), target_layout, now,
                      obs.rate_rps, obs.isl_mean, obs.osl_mean, limit, total)


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
                                 memory=inp.memory)
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
