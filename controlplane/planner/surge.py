"""Preparing for a surge while the load is low: the one move the planner makes for headroom.

Pure. :func:`.gate.gate` asks :func:`surge_move` when it would otherwise keep the layout.

Why. A planner that reacts to measured load is one window late on every surge: the window
that first reads the new load ends after the surge began, and the move then drains workers
under that load (RTX, Azure conversation at 0.5× → 3×: the first 3× window runs aggregated
at a third of 5P:3D's goodput, and the whole run scores 0.81 of the best static layout,
which every layout ties at 0.5×). While the load is low a move is cheap: few requests are in
flight to drain and none wait. So when the layout as it is serves the load now and at the
planned load, keeping the targets with room to spare, and another layout that also serves
it would keep the targets at a clearly larger load *of the same mix*, the planner moves
there now instead of during the surge.

What counts as "clearly": the other layout keeps the policy's attainment at
``surge_factor`` × the rate up to which the layout as it is keeps it (its SLO capacity at this
mix). And "room to spare": the load now is at most ``surge_load_share`` of that capacity. Both
are :class:`~.plantypes.PlannerSettings`. Near-ties in capacity (the demo's chat: aggregated
22 req/s, 3P:5D 26 by the model) never move; a layout that takes twice the load does.

SLO capacity is found by bisection on the rate (the model's share within targets falls as
the rate rises); it is a prediction, with the cost model's errors, and it is named in the
record so an operator can check it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .placement import Topology
from .record import CandidateVerdict, MoveMemory, Observation
from .steps import _meets, planned_rate, predict, share, workload_for

if TYPE_CHECKING:  # pragma: no cover
    from .plantypes import LoadInput, ModelInput, PlannerSettings

# Bisection on log(rate): 8 halvings of at most a 64× bracket leave ±1.6 % on the
# capacity, well inside the 1.5× a surge move needs.
_BRACKET = 64.0
_STEPS = 8
_BISECTED = 3  # candidates whose capacity is bisected (surge_move)


def _meets_at(inp: ModelInput, n_prefill: int, rate: float, topo: Topology) -> bool:
    pol = inp.policy
    return _meets(predict(inp, n_prefill, workload_for(inp.load, pol, rate), topo), pol)


def slo_capacity(inp: ModelInput, n_prefill: int, rate: float, topo: Topology,
                 known: float = 0.0) -> float:
    """The highest rate (req/s) at the load's mix at which the clean layout with
    ``n_prefill`` prefill workers is predicted to keep the policy's attainment; 0 when it
    misses at ``rate`` already, infinite when it keeps it at 64 × ``rate`` (the bracket).
    ``rate`` > 0 is the load now; ``known`` (≥ ``rate``), a rate at which the layout was
    already found to keep it (the bisection starts there)."""
    lo = max(rate, known)
    if rate <= 0 or (lo == rate and not _meets_at(inp, n_prefill, rate, topo)):
        return 0.0
    hi = rate * _BRACKET
    if lo >= hi or _meets_at(inp, n_prefill, hi, topo):
        return math.inf  # room for a 64× surge: more than any surge move is for
    lo_l, hi_l = math.log(lo), math.log(hi)
    for _ in range(_STEPS):
        mid = (lo_l + hi_l) / 2
        if _meets_at(inp, n_prefill, math.exp(mid), topo):
            lo_l = mid
        else:
            hi_l = mid
    return math.exp(lo_l)


def _serves_seen(inp: ModelInput, p: int, cur_p: int, seen: list[LoadInput],
                 topo: Topology, growth: float) -> bool:
    """Whether the layout with ``p`` prefill workers keeps as many requests within targets
    (to the score's 1 %) as the one with ``cur_p`` at every load in ``seen``, each at its
    rate and as the planner would plan for it (its peak × (1 + ``growth``)). The demo's chat
    → RAG cycle: at chat, 2P:10D takes more chat than 6P:6D, but the RAG phase seen before
    needs 6P:6D, and a surge move there would be undone by the next RAG phase. At the rate
    alone, the live demo's chat2 moved 9P:3D → 7P:5D (as good at RAG1's regime load, 4.15
    req/s) and RAG2 moved back (at 5.4 req/s 7P:5D is past its prefill capacity); with the
    margin, the replayed cycle keeps 9P:3D."""
    pol = inp.policy
    for ld in seen:
        for rate in (ld.rate_rps, planned_rate(ld, growth)):
            w = workload_for(ld, pol, rate)
            there, here = predict(inp, p, w, topo), predict(inp, cur_p, w, topo)
            if round(share(there), 2) < round(share(here), 2):
                return False
    return True


def _spare_rate(obs: Observation, settings: PlannerSettings) -> float:
    """The rate a layout must keep the targets at for the planned load to be at most
    ``surge_load_share`` of its SLO capacity."""
    return obs.plan_rate_rps / max(settings.surge_load_share, 1e-9)


def surge_continues(inp: ModelInput, obs: Observation, cv: CandidateVerdict,
                    settings: PlannerSettings, topo: Topology) -> str:
    """Why a surge move under way still stands, or "": its target still keeps the targets
    now and at the planned load, and still takes more than the move's origin could (by the
    hysteresis), with the planned load at most ``surge_load_share`` of the origin's. A low
    load's windows hold few requests, so the mix read one window later has often moved past
    the turn-back margin (Azure at 0.5×: answers 104 → 194 tokens), which re-decides an
    ordinary move but is no reason to stop this one halfway."""
    mem: MoveMemory | None = inp.memory
    if (settings.surge_factor <= 0 or obs.rate_rps <= 0 or mem is None or obs.move is None
            or mem.reason != "surge-headroom"):
        return ""
    pol, target = inp.policy, mem.target_prefill
    now_p = next((c for c in cv.feasible if c.n_prefill == target), None)
    plan_p = cv.at_plan.get(target)
    if now_p is None or not _meets(now_p, pol) or (plan_p is not None
                                                    and not _meets(plan_p, pol)):
        return ""
    spare = _spare_rate(obs, settings)
    if not _meets_at(inp, mem.origin_prefill, spare, topo):
        return ""
    origin = slo_capacity(inp, mem.origin_prefill, obs.rate_rps, topo, known=spare)
    if math.isinf(origin):
        return ""
    # Started, it needs only to remain the better layout for a surge (by more than the
    # hysteresis), not to clear the starting bar again on one window's mix.
    more = 1.0 + pol.hysteresis
    if not _meets_at(inp, target, more * origin, topo):
        return ""
    return (f"{mem.target_layout} still takes more than {mem.origin_layout}'s ~{origin:,.2f} "
            f"req/s at this mix (≥ {more:g}×), and the load is still low")


def surge_move(inp: ModelInput, obs: Observation, cv: CandidateVerdict,
               settings: PlannerSettings, topo: Topology, now: float,
               moved: bool, seen: list[LoadInput] | None = None) -> tuple[int, str] | None:
    """(prefill count to move to, why) when the layout as it is should be left now for one
    that takes a surge of the same mix; None to keep it. ``moved``: the load moved past the
    turn-back margin since the last move (the dwell rule's way back is open). ``seen``: the
    loads of past regimes (dwell.past_loads); the target must serve each of them as well as
    the layout as it is — a surge of this mix is a guess, a load already seen is not."""
    if settings.surge_factor <= 0 or obs.rate_rps <= 0 or obs.move is not None:
        return None
    st, pol = obs.layout, inp.policy
    if not st.pure or st.draining:
        return None
    if not (_meets(cv.hold_now, pol) and _meets(cv.hold_plan, pol)):
        return None  # missing now is the ordinary gate's business
    cur_p = st.prefill
    spare = _spare_rate(obs, settings)
    if not _meets_at(inp, cur_p, spare, topo):
        return None  # no room to spare: a move now would be paid for by the load now
    here = slo_capacity(inp, cur_p, obs.rate_rps, topo, known=spare)
    if math.isinf(here):
        return None  # room for any surge already
    mem: MoveMemory | None = inp.memory
    surge = settings.surge_factor * here
    w_surge = workload_for(inp.load, pol, surge)
    able = []
    for c in cv.feasible:
        p = c.n_prefill
        back = (mem is not None and p == mem.origin_prefill and not moved
                and now - mem.decided_at < settings.dwell_s)
        if p == cur_p or back or not _meets(c, pol):
            continue
        plan = cv.at_plan.get(p)
        if plan is not None and not _meets(plan, pol):
            continue
        at = predict(inp, p, w_surge, topo)
        if _meets(at, pol):
            able.append((at.attainment, at.capacity_rps, p))
    if able and seen:
        able = [a for a in able
                if _serves_seen(inp, a[2], cur_p, seen, topo, settings.growth_margin)]
    if not able:
        return None
    # Bisect the few most promising only (share at the surge, then the saturation rate):
    # a large fleet has a few dozen candidate counts.
    able = [p for *_k, p in sorted(able, reverse=True)[:_BISECTED]]
    caps = {p: slo_capacity(inp, p, obs.rate_rps, topo, known=surge) for p in able}
    # The most load taken; among near-equals (within 2 %: the bisection's resolution) the
    # fewest prefill moves.
    best_cap = max(caps.values())
    target = min((p for p in able if caps[p] >= best_cap * 0.98),
                 key=lambda p: (abs(p - cur_p), p))
    name = next(c.layout for c in cv.feasible if c.n_prefill == target)
    there = (f"~{caps[target]:,.2f} req/s" if not math.isinf(caps[target])
             else f"over {_BRACKET:g}× the load now")
    why = (f"prepare for a surge while the load is low: {st.label()} keeps the targets up to "
           f"~{here:,.2f} req/s of this mix (the planned {obs.plan_rate_rps:,.2f} req/s is "
           f"{obs.plan_rate_rps / here:.0%} of it), {name} up to {there} "
           f"(≥ {settings.surge_factor:g}× as much); both keep the targets now, and moving "
           "at low load drains little")
    return target, why

