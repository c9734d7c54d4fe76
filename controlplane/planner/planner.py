"""The planner's decision core: per served model, which layout, which workers, and why.

Pure and deterministic: plain dataclasses in, plain dataclasses out, no Django, no clock
(``now`` is an input). :mod:`controlplane.planner.inputs` builds the inputs from the
database and hot state; :mod:`controlplane.planner.tasks` persists and applies the result.

Per model: evaluate aggregated and every feasible P:D split (concrete placement from
:mod:`.placement`, predictions from :mod:`.costmodel`) at the near-term load, pick the one
with the highest predicted goodput, then decide whether to move: only when the gain clears
the hysteresis margin, the decode pool still holds the sequences in flight, min/max per role
hold, the workers are past their cooldown, and at most ``max_changes_per_cycle`` change now
(more, up to ``overload_change_share`` of the workers, when the current layout is predicted
overloaded, the target is not, and requests are queueing on the workers or the measured
p95 latency is far over its target).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from controlplane.policies.effective import DEFAULT_POLICY, EffectivePolicy

from . import explain
from .costmodel import (
    DEFAULT_PARAMS,
    CostParams,
    ModelSpec,
    Prediction,
    WorkerShape,
    Workload,
    predict_aggregated,
    predict_split,
)
from .placement import NodeLinks, Topology, WorkerInput


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


@dataclass(frozen=True)
class PlannerSettings:
    growth_margin: float = 0.2  # plan for the recent peak × (1 + margin)
    stale_share_limit: float = 0.5  # fail-static when at least this share of nodes is stale
    exhaustive_limit: int = 48  # above this many workers, search P:D coarse-to-fine
    # Overload's measured half also holds when a measured p95 (TTFT or ITL) is at least
    # this many times its target: far past what windowed-p95 noise or a calibration error
    # explains (see docs/planner.md, step 7).
    overload_latency_factor: float = 1.5


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
    current: Prediction | None
    target: Prediction | None
    step: Prediction | None  # the layout after this cycle's changes
    current_now: Prediction | None  # current layout at the load measured now
    candidates: list[Prediction]
    changes: list[RoleChange]
    plan_rate_rps: float
    workload: Workload | None
    explanation: str = ""
    notes: list[str] = field(default_factory=list)
    rejected: dict[str, str] = field(default_factory=dict)  # layout → why infeasible
    overload: dict | None = None  # set when this cycle's step was raised for overload

    @property
    def changed(self) -> bool:
        return bool(self.changes)

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


# --- Helpers ------------------------------------------------------------------------------


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


def predict(
    inp: ModelInput, n_prefill: int, w: Workload, topo: Topology | None = None
) -> Prediction:
    """Prediction for ``n_prefill`` prefill workers (0 = aggregated)."""
    n = len(inp.workers)
    if n_prefill <= 0:
        return predict_aggregated(inp.model, inp.shape, n, w, inp.params)
    topo = topo or Topology(list(inp.workers), inp.node_links)
    return predict_split(
        inp.model, inp.shape, n_prefill, n - n_prefill, w, topo.paths(n_prefill), inp.params
    )


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


def _score(p: Prediction) -> tuple:
    # Goodput first, as a share of the load to 0.1 % (noise must not decide), then
    # capacity to 1 %, then fewer prefill workers (no transfer, no fragmentation).
    share = round(p.goodput_rps / p.rate_rps, 3) if p.rate_rps > 0 else 0.0
    cap = p.capacity_rps if not math.isinf(p.capacity_rps) else 1e18
    cap = float(f"{cap:.2g}") if cap > 0 else 0.0
    return (share, cap, -p.n_prefill)


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


def _search(
    inp: ModelInput, w: Workload, settings: PlannerSettings, cur_p: int, topo: Topology
):
    options = _prefill_range(inp)
    if not options:
        return [], {}
    evaluated: dict[int, Prediction] = {}

    def run(ps):
        for p in ps:
            if p in options and p not in evaluated:
                evaluated[p] = predict(inp, p, w, topo)

    if len(options) <= settings.exhaustive_limit:
        run(options)
    else:
        # Coarse grid, then every count around the best few: goodput in P is unimodal
        # in practice (prefill capacity rises with P, decode capacity falls).
        stride = max(1, math.ceil(len(options) / 24))
        run([options[0], *options[::stride], options[-1], cur_p])
        top = sorted(evaluated.values(), key=_score, reverse=True)[:2]
        for best in top:
            run(range(best.n_prefill - stride, best.n_prefill + stride + 1))
    return [evaluated[p] for p in sorted(evaluated)], evaluated


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
      times its target. An aggregated engine admits every request into its batch, so a
      layout that misses ITL shows no queue, only slow tokens, and the model can be
      optimistic about it (prefill interference); a p95 that far over target is not noise.
      Unknown latencies count as not over.

    Waiting then costs twice: every cycle spent in the old layout adds to a backlog that
    the new one must work off before anyone behind it meets the TTFT target."""
    share = inp.policy.overload_change_share
    rate = inp.load.rate_rps
    if share <= 0 or rate <= 0 or best_now.overloaded or best_now.goodput_rps <= 0:
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
        "limit": max(inp.policy.max_changes_per_cycle, math.ceil(share * n_workers)),
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


def _eligible(w: WorkerInput, now: float, cooldown_s: float) -> str:
    if w.stale:
        return "stale"
    if w.state != "active":
        return w.state
    if w.changed_at is not None and now - w.changed_at < cooldown_s:
        return "cooldown"
    return ""


def _target_role(placed: str, aggregated: bool) -> str:
    """Aggregated: everyone 'both'. Split: prefill, and pure decode on the other side (a
    'both' worker serves whole requests in place and would leave the prefill pool idle)."""
    if aggregated:
        return "both"
    return "prefill" if placed == "prefill" else "decode"


# --- Entry points -------------------------------------------------------------------------


def plan_model(
    inp: ModelInput, now: float, settings: PlannerSettings = DEFAULT_SETTINGS
) -> ModelDecision:
    pol = inp.policy
    name = inp.model.name
    workers = list(inp.workers)
    cur_p = current_prefill(workers)
    load = inp.load
    plan_rate = max(load.rate_rps, load.peak_rps, 0.0) * (1.0 + settings.growth_margin)
    w_plan = workload_for(load, pol, plan_rate)
    w_now = workload_for(load, pol, load.rate_rps)

    def decision(action, reason, **kw) -> ModelDecision:
        d = ModelDecision(
            served_model_id=inp.served_model_id,
            model=name,
            action=action,
            reason=reason,
            current=kw.pop("current", None),
            target=kw.pop("target", None),
            step=kw.pop("step", None),
            current_now=kw.pop("current_now", None),
            candidates=kw.pop("candidates", []),
            changes=kw.pop("changes", []),
            plan_rate_rps=plan_rate,
            workload=w_plan,
            notes=kw.pop("notes", []),
            rejected=kw.pop("rejected", {}),
            overload=kw.pop("overload", None),
        )
        d.explanation = explain.explain_decision(d, inp)
        return d

    if not workers:
        return decision("hold", "no-workers")
    if not pol.rebalancing_enabled or pol.rebalancing_mode == "off":
        return decision("hold", "rebalancing-off")
    stale = sum(1 for x in workers if x.stale)
    if stale * 2 > len(workers):
        return decision("hold", "fail-static", notes=[f"{stale} of {len(workers)} workers stale"])
    # An open plan (approved, still draining) holds the model: one plan at a time keeps the
    # record readable. Workers draining outside a plan count with the role they are
    # heading to and are simply not eligible to change again.
    if inp.change_in_progress:
        return decision("hold", "change-in-progress")

    topo = Topology(workers, inp.node_links)
    # Candidates are ranked at the load now; the best few (and the current layout) are
    # also predicted at the near-term load, which breaks ties and justifies a move made
    # ahead of growth.
    current_now = predict(inp, cur_p, w_now, topo)
    candidates, by_p = _search(inp, w_now if load.rate_rps > 0 else w_plan, settings, cur_p,
                               topo)
    at_plan: dict[int, Prediction] = {cur_p: predict(inp, cur_p, w_plan, topo)}
    for c in sorted(candidates, key=_score, reverse=True)[:3]:
        at_plan.setdefault(c.n_prefill, predict(inp, c.n_prefill, w_plan, topo))
    current = at_plan[cur_p]
    rejected: dict[str, str] = {}
    feasible = []
    for c in candidates:
        why = "weights do not fit" if not c.fits else _kv_fits(c, inp)
        if why and c.n_prefill != cur_p:
            rejected[c.layout] = why
        else:
            feasible.append(c)
    common = {
        "current": current,
        "current_now": current_now,
        "candidates": candidates,
        "rejected": rejected,
    }
    # A policy bound the current layout breaks (min/max per role, forced mode) must be met
    # whatever the load, so it is checked before "no traffic".
    forced = cur_p not in set(_prefill_range(inp))
    if plan_rate <= 0 and not forced:
        return decision("keep", "no-traffic", target=current, **common)
    if not feasible:
        return decision("keep", "no-feasible-layout", target=current, **common)
    def combined(c: Prediction) -> tuple:
        now_share = _score(c)[0] if load.rate_rps > 0 else 0.0
        plan = at_plan.get(c.n_prefill)
        plan_key = _score(plan) if plan is not None else (-1.0, 0.0, 0)
        return (round(now_share, 2), round(plan_key[0], 2), plan_key[1], -c.n_prefill)

    best_now = max(feasible, key=combined)
    best = at_plan.get(best_now.n_prefill) or predict(inp, best_now.n_prefill, w_plan, topo)
    # A transition may have left workers on the wrong side label ('both' in a split
    # serves whole requests in place and starves the prefill pool; 'decode' when
    # aggregated never prefills). Whenever the planner would keep the prefill count, it
    # finishes the current layout instead.
    side = "both" if cur_p == 0 else "decode"
    relabel = [
        RoleChange(x.id, x.name, x.node, x.role, side)
        for x in workers
        if x.role not in ("prefill", side) and not _eligible(x, now, pol.cooldown_s)
    ]

    def keep(reason: str, target: Prediction) -> ModelDecision:
        if relabel:
            return decision("change", "complete-layout", target=current, step=current,
                            changes=relabel, **common)
        return decision("keep", reason, target=target, **common)

    if best.n_prefill == cur_p:
        return keep("current-is-best", current)
    h = pol.hysteresis

    def gains(new: Prediction, old: Prediction, rate: float) -> bool:
        return new.goodput_rps > old.goodput_rps * (1.0 + h) + 1e-9 and (
            new.goodput_rps - old.goodput_rps > 0.005 * rate
        )

    gain_now = load.rate_rps > 0 and gains(best_now, current_now, load.rate_rps)
    gain_plan = best_now.goodput_rps >= current_now.goodput_rps * 0.99 and gains(
        best, current, plan_rate
    )
    gain_ok = gain_now or gain_plan
    both_zero = best.goodput_rps <= 1e-9 and current.goodput_rps <= 1e-9 and (
        best_now.goodput_rps <= 1e-9 and current_now.goodput_rps <= 1e-9
    )
    cap_ok = both_zero and best.capacity_rps > current.capacity_rps * (1.0 + h)
    if not (gain_ok or cap_ok or forced):
        return keep("within-hysteresis", best)

    # Move toward the target: concrete roles, then the changes allowed this cycle.
    aggregated = best.n_prefill == 0
    placement = topo.placement(best.n_prefill) if not aggregated else None
    n_workers = len(workers)

    def placed_of(x: WorkerInput) -> str:
        return placement.roles[x.id] if placement else "both"

    wanted = []
    for x in workers:
        role = _target_role(placed_of(x), aggregated)
        if role != x.role:
            wanted.append((x, role))
    blocked: dict[str, int] = {}
    movable = []
    for x, role in wanted:
        why = _eligible(x, now, pol.cooldown_s)
        if why:
            blocked[why] = blocked.get(why, 0) + 1
        else:
            movable.append((x, role))
    # Changes into or out of prefill move capacity between the pools and drain decodes:
    # they count against the per-cycle limit, idlest first. Relabels between both and
    # decode keep every sequence where it is (the worker only stops or starts prefilling
    # locally); they ride along in proportion, so that after each step the pure decode
    # workers (the only ones that send prompts to the prefill pool) match the prefill
    # workers in the target ratio, and the rest keep serving whole requests in place.
    heavy = [(x, r) for x, r in movable if "prefill" in (x.role, r)]
    light = [(x, r) for x, r in movable if "prefill" not in (x.role, r)]
    heavy.sort(key=lambda t: (t[0].running + t[0].waiting, t[0].name, t[0].id))
    d_now = sum(1 for x in workers if x.role == "decode")

    def take_up_to(limit: int) -> list[tuple[WorkerInput, str]]:
        take = heavy[:limit]
        p_after = cur_p + sum(1 for _x, r in take if r == "prefill") - sum(
            1 for x, _r in take if x.role == "prefill"
        )
        d_after_heavy = d_now - sum(1 for x, _r in take if x.role == "decode")
        if best.n_prefill > 0:
            d_goal = min(
                math.ceil(p_after * best.n_decode / best.n_prefill), n_workers - p_after
            )
        else:
            d_goal = math.ceil(d_now * p_after / cur_p) if cur_p else 0
        if len(heavy) <= len(take):  # last step: everything goes
            d_goal = sum(
                1 for x in workers if _target_role(placed_of(x), aggregated) == "decode"
            )
        nodes_moving = {x.node for x, _r in take}
        rest = sorted(
            light, key=lambda t: (t[0].node not in nodes_moving, t[0].running, t[0].name,
                                  t[0].id)
        )
        if best.n_prefill > 0:
            return take + rest[: max(d_goal - d_after_heavy, 0)]
        return take + rest[: max(d_after_heavy - d_goal, 0)]

    def step_of(take) -> tuple[Prediction, str]:
        step_p = cur_p + sum(1 for x, r in take if r == "prefill") - sum(
            1 for x, r in take if x.role == "prefill"
        )
        step = by_p.get(step_p) or predict(inp, step_p, w_plan, topo)
        return step, (_kv_fits(step, inp) if step_p != cur_p else "")

    notes = []
    if blocked:
        notes.append(
            "waiting: " + ", ".join(f"{n} worker(s) {why}" for why, n in sorted(blocked.items()))
        )
    limit = pol.max_changes_per_cycle
    overload = _overload(inp, current_now, best_now, n_workers,
                         settings.overload_latency_factor)
    if overload is not None and overload["limit"] > limit and len(heavy) > limit:
        take = take_up_to(overload["limit"])
        step, why = step_of(take)
        if why:
            # The larger step would leave too little decode KV: the normal step instead.
            overload = None
        else:
            limit = overload["limit"]
    else:
        overload = None
    if overload is None:
        take = take_up_to(limit)
        step, why = step_of(take)
    if not take:
        return decision("hold", "workers-not-eligible", target=best, notes=notes, **common)
    if why:
        rejected[step.layout] = why
        return decision("hold", "step-breaks-kv", target=best, notes=notes, **common)
    if len(take) < len(wanted):
        notes.append(
            f"{len(take)} of {len(wanted)} role changes this cycle "
            f"(max {limit} into or out of prefill per cycle"
            + (", raised for overload" if overload else "")
            + ")"
        )
    changes = [RoleChange(x.id, x.name, x.node, x.role, r) for x, r in take]
    reason = "policy-bound" if forced and not (gain_ok or cap_ok) else "better-layout"
    return decision(
        "change", reason, target=best, step=step, changes=changes, notes=notes,
        overload=overload, **common
    )


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
            d = ModelDecision(
                served_model_id=inp.served_model_id,
                model=inp.model.name,
                action="hold",
                reason="fail-static",
                current=None,
                target=None,
                step=None,
                current_now=None,
                candidates=[],
                changes=[],
                plan_rate_rps=0.0,
                workload=None,
                notes=[reason],
            )
            d.explanation = f"{inp.model.name}: no change. Fail-static: {reason}."
            models.append(d)
        return ClusterDecision(models, True, reason, nodes_stale, nodes_total)
    decisions = [
        plan_model(inp, now, settings) for inp in sorted(inputs, key=lambda i: i.served_model_id)
    ]
    return ClusterDecision(decisions, False, "", nodes_stale, nodes_total)
