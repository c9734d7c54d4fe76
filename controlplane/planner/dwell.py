"""How long the load stays, and whether a move pays for itself in that time.

Pure. A move costs before it earns: the workers that change role drain first (no new work
while their requests finish), and a move of more workers than ``max_changes_per_cycle``
arrives one step per planning cycle. Its predicted gain is a rate (req/s); it only pays if
the load it was chosen for lasts long enough for the gain to exceed that cost. How long
the load will last is estimated from what the planner has seen, never from a workload's
known schedule:

* a **regime** is a stretch of load within the turn-back margin of where it started (the
  same margin that licenses turning back and waiving a cooldown: a shift past it is a
  change of phase, not noise). The planner remembers when the current one started and how
  long the past ones lasted (:class:`.record.Regime`);
* the **expected remaining dwell** of a regime that has lasted ``a`` seconds is the median
  of what the past regimes that lasted longer than ``a`` had left at ``a`` (their residual
  life); when none did (no history yet, or this one is the longest seen), it is ``a``
  itself — Lindy's rule: under a scale-free prior, a phase is as likely as not to last as
  long again as it has lasted —, or what the first regime seen (its start unseen, so a
  lower bound) had at least left at that age, when that is more. That bound shrinks with
  the age and gives way to Lindy's, which grows with it, so a move that pays at all is
  never blocked forever at a load that stays.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING

from .record import MoveMemory, MovePrice, Regime
from .stepping import target_role

if TYPE_CHECKING:  # pragma: no cover
    from controlplane.policies.effective import EffectivePolicy

    from .costmodel import Prediction
    from .placement import Topology
    from .plantypes import LoadInput, ModelInput, PlannerSettings

HISTORY = 16  # past regime durations remembered


def _rel(now: float, then: float) -> float:
    base = max(abs(then), 1e-9)
    return abs(now - then) / base if then > 0 or now > 0 else 0.0


def shift_from(rate: float, isl: float, osl: float, load: LoadInput) -> float:
    """Largest relative change of request rate, prompt or answer length from a reference."""
    return max(_rel(load.rate_rps, rate), _rel(load.isl_mean, isl), _rel(load.osl_mean, osl))


def load_shift(memory: MoveMemory | None, load: LoadInput) -> float:
    """Largest relative change of request rate, prompt or answer length since ``memory``."""
    if memory is None:
        return 0.0
    return shift_from(memory.rate_rps, memory.isl_mean, memory.osl_mean, load)


def turn_back_margin(pol: EffectivePolicy, settings: PlannerSettings) -> float:
    """How far the load must move since the last move before the planner may turn back
    (or waive a cooldown): the hysteresis, and at least settings.reverse_margin (a load
    derived from windows of finished requests wanders by more than 10 % inside one phase)."""
    return max(pol.hysteresis, settings.reverse_margin)


def cooldown_waiver(inp: ModelInput, settings: PlannerSettings) -> tuple[float, float] | None:
    """(the last move's decision time, the load shift since) when the load has moved past
    the turn-back margin since that move, else None. The cooldown exists to keep noise from
    reversing a move; a shift past the margin that already licenses turning back is a
    change of phase, and a worker moved for the old load should not sit it out."""
    mem = inp.memory
    if mem is None or not settings.waive_cooldown_on_shift:
        return None
    shift = load_shift(mem, inp.load)
    if shift > turn_back_margin(inp.policy, settings):
        return mem.decided_at, shift
    return None


def measured_breach(inp: ModelInput, settings: PlannerSettings) -> str:
    """'' unless a measured p95 (TTFT or ITL) is at least ``overload_latency_factor`` × its
    target; then what was measured, for the record."""
    k = settings.overload_latency_factor
    if k <= 0:
        return ""
    load, pol = inp.load, inp.policy
    for metric, measured, target in (
        ("TTFT", load.measured_ttft_p95_ms, pol.ttft_p95_ms),
        ("ITL", load.measured_itl_p95_ms, pol.itl_p95_ms),
    ):
        if (
            measured is not None
            and math.isfinite(measured)
            and target
            and target > 0
            and measured >= k * target
        ):
            return (
                f"the layout as it is measures {metric} p95 {measured:,.0f} ms against "
                f"{target:,.0f} ms ({measured / target:.1f}×), so the hysteresis does "
                "not hold it"
            )
    return ""


def explained_breach(inp: ModelInput, settings: PlannerSettings, hold: Prediction,
                     regime: Regime | None) -> str:
    """'' unless the measured breach (:func:`measured_breach`) is one the model predicts for
    the layout as it is at the load now; then, for the record, why it is no evidence.

    A p95 that far over target moves a layout the model keeps within targets only because
    the measurement contradicts the prediction. Where the model predicts that p95 itself
    (measured below ``overload_latency_factor`` × its predicted p95) it contradicts nothing:
    the targets count a request's TTFT and mean ITL, and a token-gap p95 over the ITL target
    is what a decode batch shared with prefill chunks shows while most requests' means stay
    within it (RTX demo, chat on 4P:4D: gap p95 104 ms measured, 105 ms predicted, 99 %
    predicted within targets, and a static 4P:4D serves that chat as well as any layout).
    Except in the first window of a load regime (``regime.cycles`` 1, or no regime known): a
    window of finished requests then reads a mix of the old load and the new, the
    prediction is for a load the fleet is not serving, and the breach is the only sign of
    the new one (Azure's 3x step: 10.3 req/s read while 17 arrived)."""
    k = settings.overload_latency_factor
    if k <= 0 or regime is None or regime.cycles <= 1:
        return ""
    load, pol = inp.load, inp.policy
    seen = []
    for metric, measured, target, predicted in (
        ("TTFT", load.measured_ttft_p95_ms, pol.ttft_p95_ms, hold.ttft_p95_s * 1000.0),
        ("ITL", load.measured_itl_p95_ms, pol.itl_p95_ms, hold.itl_p95_s * 1000.0),
    ):
        if (measured is None or not math.isfinite(measured) or not target or target <= 0
                or measured < k * target):
            continue
        if not math.isfinite(predicted) or measured >= k * predicted:
            return ""
        seen.append(f"{metric} p95 {measured:,.0f} ms against {target:,.0f} ms, "
                    f"{predicted:,.0f} ms predicted")
    if not seen:
        return ""
    return (f"the layout as it is measures {' and '.join(seen)} at this load: the model "
            f"predicts it (measured under {k:g}× the prediction, in the load regime's "
            f"window {regime.cycles}), so it is no evidence the layout fails and the "
            "hysteresis holds")


# --- Regimes ------------------------------------------------------------------------------


def regime_load(load: LoadInput) -> tuple[float, ...]:
    """A load as the regime remembers it (record.REGIME_LOAD; 0 = unknown)."""
    return (
        max(load.rate_rps, 0.0),
        max(load.isl_mean, 0.0),
        max(load.osl_mean, 0.0),
        min(max(load.prefix_hit, 0.0), 1.0),
        load.isl_p50 or 0.0,
        load.isl_p95 or 0.0,
    )


def _shift(ref: tuple[float, ...], load: LoadInput) -> float:
    return shift_from(ref[0], ref[1], ref[2], load)


def track_regime(prev: Regime | None, load: LoadInput, now: float, margin: float) -> Regime:
    """The regime after this cycle's load. A shift past ``margin`` from the regime's
    reference load starts a new one, dated from the start of the window that first showed
    it (the previous cycle: the load is derived over the window since then). A regime seen
    for a single cycle that shifts again is the same change still arriving (a window of
    finished requests trails the arrivals by up to a window, so the first one after a
    change reads a mix of both): it keeps its start and takes the new reference load."""
    ref = regime_load(load)
    if prev is None or now < prev.last_seen:
        # The first regime began before the planner looked: its start is unknown.
        return Regime(now, now, ref, 1, prev.history if prev else (), censored=True)
    keep = {"history": prev.history, "censored": prev.censored}
    if _shift(prev.load, load) <= margin:
        return Regime(prev.started_at, now, prev.load, prev.cycles + 1, **keep)
    if prev.cycles <= 1:
        return Regime(prev.started_at, now, ref, prev.cycles + 1, **keep)
    # A regime whose start was not seen lasted longer than it shows: its length would bias
    # the dwell short, so only its load is kept (for the mix), at the length it showed.
    lasted = max(prev.last_seen - prev.started_at, 0.0)
    entry = (-lasted if prev.censored else lasted, *prev.load)
    history = (*prev.history, entry)[-HISTORY:] if lasted > 0 else prev.history
    return Regime(prev.last_seen, now, ref, 1, history)


def load_settled(prev: Regime | None, regime: Regime) -> bool:
    """Whether this cycle's load continued the regime before it (``prev``; ``regime`` is
    :func:`track_regime`'s answer): same start and the same reference load — not a new
    regime, nor one whose reference was re-keyed because the change was still arriving. Both
    of those read windows that mix the old load and the new. The planner's first look (no
    regime known) counts as settled: that load was there before it looked."""
    if prev is None:
        return True
    return regime.started_at == prev.started_at and regime.load == prev.load


def expected_dwell(regime: Regime, now: float, period: float) -> tuple[float, float, str]:
    """(age, expected remaining seconds, how it was estimated) — see the module docstring.
    A past regime that lasted d was last seen at age d and ended within the next cycle
    period, so at age a ≤ d it had d − a + period/2 left on average.

    A censored regime (the first one, which began before the planner looked) lasted *at
    least* the L it showed, so it is no sample of a length and stays out of the median. But
    where no past regime lasted as long as this one has and Lindy's rule would answer ``a``,
    a censored one that showed L > a says the load's phases here last longer than that: at
    age a it had at least L − a + period/2 left, and the estimate is the larger of the two.
    (In the median it would count a bound as a length and pull the estimate down: at
    L ≈ a it would say half a cycle.) Without it, the first change the planner sees was
    expected to end as soon as it was seen: a RAG phase 20 s old after a chat phase that
    had shown 70 s was priced on 20 s, and the move waited a cycle for its age."""
    age = max(now - regime.started_at, 0.0)
    past = [h[0] for h in regime.history if h[0] > 0]  # < 0: a censored length
    longer = sorted(d - age + period / 2 for d in past if d >= age)
    if longer:
        mid = len(longer) // 2
        rest = longer[mid] if len(longer) % 2 else (longer[mid - 1] + longer[mid]) / 2
        return (
            age,
            rest,
            (
                f"{len(longer)} of {len(past)} past load regimes lasted at least "
                f"this one's {age:,.0f} s so far, with a median {rest:,.0f} s "
                "left at that age"
            ),
        )
    shown = max((-h[0] for h in regime.history if h[0] < 0), default=0.0)
    bound = shown - age + period / 2
    if shown > 0 and age <= shown and bound > age:
        known = "lasted as long" if past else "seen"
        return age, bound, (
            f"no past regime of known length {known}; the first one seen (its start "
            f"unseen) lasted at least {shown:,.0f} s: at least {bound:,.0f} s left at "
            f"this one's {age:,.0f} s")
    basis = "no past regime lasted as long" if past or shown else "no past regime seen"
    return age, age, f"{basis}: as long again as its {age:,.0f} s so far (Lindy)"


def _group(entries, load: LoadInput, margin: float) -> list[tuple[float, LoadInput]]:
    """(weight, reference load) entries merged where within ``margin`` of each other (the
    same load), as (share of the weight, load)."""
    groups: list[list] = []  # [weight, load tuple]
    for wt, ref in entries:
        li = _as_load(load, ref)
        for g in groups:
            if _shift(g[1], li) <= margin:
                g[0] += wt
                break
        else:
            groups.append([wt, tuple(ref)])
    total = sum(g[0] for g in groups)
    return [(g[0] / total, _as_load(load, g[1])) for g in groups] if total > 0 else []


def past_loads(regime: Regime | None, load: LoadInput, margin: float) -> list[LoadInput]:
    """The loads of the past regimes the planner remembers (``regime.history``), merged
    where within ``margin`` of each other, as loads like ``load`` with their mix."""
    if regime is None or not regime.history:
        return []
    return [ld for _wt, ld in _group([(1.0, x[1:]) for x in regime.history], load, margin)]


def next_mix(
    regime: Regime | None, load: LoadInput, margin: float
) -> tuple[list[tuple[float, LoadInput]], str]:
    """What may come after the current regime, as (share, load) and how it was estimated:
    the regimes that followed past ones like it (within ``margin`` of its load), each such
    transition once; when none is known, every past regime's load weighted by how long it
    lasted (regimes within the margin of each other merged: they are the same load)."""
    if regime is None or not regime.history:
        return [], ""
    h = regime.history
    cur = _as_load(load, regime.load)
    after = [(1.0, h[i + 1][1:]) for i in range(len(h) - 1) if _shift(h[i][1:], cur) <= margin]
    if after:
        return _group(after, load, margin), f"what followed {len(after)} past regime(s) like this"
    mix = _group([(abs(x[0]), x[1:]) for x in h if x[0] != 0], load, margin)
    return mix, "the past regimes' mix"


def _as_load(load: LoadInput, ref) -> LoadInput:
    rate, isl, osl, hit, p50, p95 = ref
    return replace(
        load,
        rate_rps=rate,
        peak_rps=rate,
        isl_mean=isl,
        osl_mean=osl,
        prefix_hit=hit,
        isl_p50=p50 or None,
        isl_p95=p95 or None,
    )


# --- The price of a move ------------------------------------------------------------------


def prefill_moves(inp: ModelInput, topo: Topology, target_p: int) -> tuple[int, int]:
    """(workers into prefill, workers out of it) to reach the target's placement from the
    roles as they are (draining workers under the role they drain to)."""
    placement = topo.placement(target_p) if target_p > 0 else None
    into = out_of = 0
    for w in inp.workers:
        goes = target_role(placement.roles[w.id] if placement else "both", placement is None)
        into += w.role != "prefill" and goes == "prefill"
        out_of += w.role == "prefill" and goes != "prefill"
    return into, out_of


def extends_regime(mem: MoveMemory | None, regime: Regime | None) -> bool:
    """Whether the load regime now is the one the last move was decided in (no new regime
    began after the decision)."""
    return mem is not None and regime is not None and regime.started_at <= mem.decided_at


def extends_move(mem: MoveMemory | None, cur_p: int, best_p: int, moved: bool,
                 regime: Regime | None) -> bool:
    """Whether heading to ``best_p`` prefill workers continues the last move rather than
    starting another: the layout is on that move's way (between its origin and target,
    either end included), ``best_p`` lies past its target in the same direction, the load
    has not moved past the turn-back margin since it was decided, and no new load regime
    began after the decision. A move decided on a young regime is priced on a short
    expected dwell and may stop short of the best layout (a smaller move pays sooner);
    when the regime lasts, the rest pays, and it is the same decision carried on."""
    if moved or not extends_regime(mem, regime) or mem.origin_prefill == mem.target_prefill:
        return False
    lo, hi = sorted((mem.origin_prefill, mem.target_prefill))
    ahead = (best_p - mem.target_prefill) * (mem.target_prefill - mem.origin_prefill) > 0
    return ahead and lo <= cur_p <= hi



def _finite(x: float, fallback: float) -> float:
    return x if math.isfinite(x) and x >= 0 else fallback


def price_move(
    inp: ModelInput,
    regime: Regime | None,
    prev: Regime | None,
    now: float,
    cur_p: int,
    target_p: int,
    target_now: Prediction,
    target_plan: Prediction,
    ref_now: Prediction,
    ref_plan: Prediction,
    after: tuple[float, int, str] = (0.0, 0, ""),
    waived: str = "",
    moves: tuple[int, int] | None = None,
) -> MovePrice | None:
    """What moving from ``cur_p`` to ``target_p`` prefill workers costs and earns; None
    when there is no basis (no regime seen before this cycle, so neither an age nor a
    cycle period is known). ``after`` = (the target's goodput minus the reference's over
    the past regimes' mix, req/s; how many regimes that mix had).

    * gain (req/s): the target's predicted goodput over the reference's (holding, or the
      free completion of the layout as it is) at the load now; at the planned load instead
      when that is larger and the target loses nothing now (the gate's own two grounds);
    * the move: the workers into and out of prefill (``moves``: what the target's placement
      needs — where it balances prefill workers over nodes differently from the layout as
      it is, one more prefill worker can take a swap of three; else |target − current|),
      ``max_changes_per_cycle`` a cycle, so S steps one cycle period apart; step k's share
      k/S of the gain starts once its workers drained, so the gain earned is
      Σ_k gain/S × (dwell − drain − (k−1) × period), each term at least 0;
    * cost (requests): each changing worker takes no new work while it drains, a 1/n share
      of what the layout as it is serves; a worker leaving decode (or 'both') drains its
      requests in flight (an answer at the mean ITL), one leaving prefill its queued prompts
      (the TTFT p95, at most the TTFT target: a prompt waiting longer is lost anyway);
    * after the regime: the fleet serves what comes next in the target layout instead of
      the reference for one cycle period (the window that shows the change) plus the
      delay of moving away again (taken as this move's own): ``after`` × that.

    ``waived`` (the gate's measured breach: the layout as it is measures a p95 at least
    ``overload_latency_factor`` × its target): holding's predicted goodput, and so the gain,
    is contradicted by what the fleet does, and every cycle in the old layout adds to a
    backlog — the rule the gate's hysteresis and the overload step already follow. The time
    is then not priced: the move pays when its gain is positive (the figures are recorded).

    It pays when the gain now is positive and earned + after − cost > 0: a gain of 0 or
    less never pays; a positive one pays once the regime has lasted long enough (the
    Lindy dwell grows with its age while the cost and the after term stay bounded)."""
    if regime is None or prev is None:
        return None
    pol = inp.policy
    n = max(len(inp.workers), 1)
    period = max(now - prev.last_seen, 0.0)
    age, dwell, basis = expected_dwell(regime, now, period)
    gain = target_now.goodput_rps - ref_now.goodput_rps
    plan_gain = target_plan.goodput_rps - ref_plan.goodput_rps
    if plan_gain > gain and target_now.goodput_rps >= ref_now.goodput_rps * 0.99:
        gain = plan_gain
    into, out_of = moves or (max(target_p - cur_p, 0), max(cur_p - target_p, 0))
    changes = into + out_of
    steps = max(math.ceil(changes / max(pol.max_changes_per_cycle, 1)), 1)
    ttft_cap = pol.ttft_p95_ms / 1000.0
    answer_s = _finite(
        max(inp.load.osl_mean, 0.0) * ref_now.itl_mean_s,
        max(inp.load.osl_mean, 0.0) * pol.itl_p95_ms / 1000.0,
    )
    prompt_s = min(_finite(ref_now.ttft_p95_s, ttft_cap), ttft_cap)
    drain = max(answer_s if into else 0.0, prompt_s if out_of else 0.0)
    per_worker = max(ref_now.goodput_rps, 0.0) / n
    cost = per_worker * (into * answer_s + out_of * prompt_s)
    earned = sum(gain / steps * max(dwell - drain - k * period, 0.0) for k in range(steps))
    delay = drain + (steps - 1) * period
    after_gain, regimes, after_basis = after
    after_s = period + delay if regimes else 0.0
    after_req = after_gain * after_s
    pays = gain > 0 and (bool(waived) or earned + after_req - cost > 0)
    return MovePrice(
        gain_rps=gain,
        age_s=age,
        dwell_s=dwell,
        dwell_basis=basis,
        delay_s=delay,
        drain_s=drain,
        period_s=period,
        changes=changes,
        steps=steps,
        earned_req=earned,
        cost_req=cost,
        after_s=after_s,
        after_gain_rps=after_gain,
        after_req=after_req,
        regimes=regimes,
        after_basis=after_basis,
        pays=pays,
        waived=waived,
    )


def pick_paying(paying: list[tuple[MovePrice, int]], hysteresis: float) -> tuple[MovePrice, int]:
    """Of the moves that pay, (price, prefill count): within the hysteresis of the most
    valuable, the fewest changes (as in choose: a larger move for no predicted gain only
    costs), then the most valuable. When regimes are short, a layout that serves the past
    regimes' mix well is worth more than the best for the current window alone."""
    top = max(x.value_req for x, _q in paying)
    top -= abs(top) * hysteresis
    return min(
        (x for x in paying if x[0].value_req >= top), key=lambda x: (x[0].changes, -x[0].value_req)
    )
