"""Plain-language explanations with the numbers behind each decision.

Pure: formats the planner's predictions; decides nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .costmodel import Prediction
    from .plantypes import ModelDecision


def secs(s: float | None) -> str:
    """0.053 → '53 ms', 2.5 → '2.5 s', inf → 'unbounded'."""
    if s is None or (isinstance(s, float) and (math.isinf(s) or math.isnan(s))):
        return "unbounded"
    if s < 1.0:
        return f"{s * 1000:,.0f} ms" if s >= 0.0095 else f"{s * 1000:,.1f} ms"
    return f"{s:,.2f} s"


def gbytes(n: float) -> str:
    return f"{n / 1e9:,.2f} GB"


def rate(r: float) -> str:
    return f"{r:,.2f} req/s"


def describe_prediction(p: Prediction) -> str:
    if not p.fits:
        return f"{p.layout}: the weights do not fit one worker"
    if p.overloaded:
        return (
            f"{p.layout}: overloaded at {rate(p.rate_rps)} — {p.bottleneck} at "
            f"{_util(p.utilisation)} of capacity (saturates near {rate(p.capacity_rps)})"
        )
    return (
        f"{p.layout}: TTFT p95 {secs(p.ttft_p95_s)}, ITL p95 {secs(p.itl_p95_s)}, "
        f"goodput {rate(p.goodput_rps)} of {rate(p.rate_rps)} "
        f"({p.attainment:.0%} within targets), busiest stage {p.bottleneck} at "
        f"{_util(p.utilisation)}"
    )


def _util(u: float) -> str:
    return "∞" if math.isinf(u) else f"{u:.0%}"


def _arithmetic(p: Prediction, isl_mean: float, ttft_budget: float) -> list[str]:
    """The figures that usually decide: interference when aggregated, transfer when split."""
    out = []
    if p.n_prefill == 0 and p.chunk_s > 0:
        out.append(
            f"aggregated, prefill chunks add {secs(p.chunk_s)} to "
            f"{p.mixed_step_share:.0%} of decode steps"
        )
    if p.n_prefill > 0 and p.transfer_bytes > 0:
        link = p.network_link if p.network_share > 0.05 else "local links (NVLink/PCIe)"
        out.append(
            f"transfer of a {isl_mean:,.0f}-token prompt ({gbytes(p.transfer_bytes)}) "
            f"over {link} takes {secs(p.transfer_s)} of a {secs(ttft_budget)} TTFT budget"
            + (
                f" ({p.network_share:.0%} of transfers cross nodes)"
                if p.network_share > 0
                else ""
            )
        )
    return out


_HOLDS = {
    "no-workers": "no workers to plan",
    "rebalancing-off": "rebalancing is off for this model",
    "change-in-progress": "a role change is still draining; planning resumes after it",
}


def _score(t: tuple) -> str:
    if not t:
        return "?"
    now, plan = t[0], t[1]
    return f"{now:.0%} now / {'n/a' if plan < 0 else f'{plan:.0%}'} planned"


def explain_decision(d: ModelDecision) -> str:
    """Render the decision record (``d.record``) as text; every clause comes from a verdict
    the planner returned, so the text cannot claim what the code did not do."""
    rec = d.record
    obs = rec.observation if rec else None
    if rec is None or obs is None:
        return f"{d.model}: no change ({d.reason})."
    head = (
        f"{d.model} on {obs.workers} worker(s) ({obs.gpu}, TP{obs.tp}), {rec.label}: "
        f"{rate(obs.rate_rps)} now, planning for {rate(obs.plan_rate_rps)}; "
        f"prompts {obs.isl_mean:,.0f} tokens"
        + (f" (p95 {obs.isl_p95:,.0f})" if obs.isl_p95 else "")
        + f" ({obs.prefix_hit:.0%} cached)"
        + (f", {obs.affinity_share:.0%} routed by prefix affinity ({obs.affinity_source})"
           if obs.affinity_share is not None else "")
        + (f", {obs.local_prefill_share:.0%} short enough to prefill where they decode "
           f"({obs.local_prefill_source})" if obs.local_prefill_share is not None else "")
        + f", answers {obs.osl_mean:,.0f}; targets TTFT p95 "
        f"{secs(obs.ttft_target_ms / 1000)}, ITL p95 {secs(obs.itl_target_ms / 1000)}."
    )
    if obs.gpu_estimate:  # the figures below rest on a guessed GPU profile: say so first
        head += f" Estimated GPU profile: {obs.gpu_estimate}."
    if d.reason == "fail-static":
        return f"{head} No change: fail-static — " + "; ".join(d.notes) + "."
    if d.reason in _HOLDS:
        return f"{head} No change: {_HOLDS[d.reason]}."
    lines = [head]
    cv, ch, gv, sv = rec.candidates, rec.choice, rec.gate, rec.step
    cur, tgt = d.current, d.target
    if cur is not None:
        lines.append("Now " + describe_prediction(cur) + ".")
    if tgt is not None and cur is not None and tgt.layout != cur.layout:
        lines.append("Best " + describe_prediction(tgt) + ".")
    budget = obs.ttft_target_ms / 1000
    facts = []
    for p in (cur, tgt):
        if p is not None:
            facts.extend(_arithmetic(p, obs.isl_mean, budget))
    cands = cv.candidates if cv else []
    agg = next((c for c in cands if c.n_prefill == 0), None)
    split = tgt if tgt is not None and tgt.n_prefill > 0 and tgt.n_both == 0 else None
    if split is None:
        split = max(
            (c for c in cands if c.n_prefill > 0),
            key=lambda c: (c.goodput_rps, -c.n_prefill),
            default=None,
        )
    if split is not None and agg is not None:
        facts.append(
            f"decode KV would hold {split.kv_capacity_seqs:,} sequences split "
            f"({split.layout}) vs {agg.kv_capacity_seqs:,} aggregated; in-flight peak "
            f"{obs.inflight_peak:,}"
        )
        if split is not tgt and split.transfer_bytes > 0:
            facts.extend(_arithmetic(split, obs.isl_mean, budget))
    seen = set()
    facts = [f for f in facts if not (f in seen or seen.add(f))]
    if facts:
        lines.append("; ".join(facts) + ".")
    for layout, why in sorted(d.rejected.items())[:3]:
        lines.append(f"Ruled out {layout}: {why}.")
    if ch is not None and tgt is not None:
        lines.append(f"Binding constraint of {tgt.layout}: {tgt.bottleneck}.")
    lines.append(_verdict(d, obs, gv, sv, ch))
    if rec.alert == "all-layouts-miss" and gv is not None and (
            gv.reason != "all-layouts-miss" and "no layout is predicted" not in gv.detail):
        # The alert fires whichever rule decided (finishing a move under way, a policy
        # bound, the KV check on a step); the all-miss hold and a move past it
        # (gate.py's miss note) say why themselves.
        best = (f" (the best, {ch.best_layout}, keeps {ch.best_attainment:.0%} within "
                f"targets, limited by {ch.binding})" if ch is not None else "")
        lines.append(f"Every layout is predicted to miss the targets{best}; an alert is "
                     "raised.")
    lines.extend(note.rstrip(".") + "." for note in d.notes)
    return " ".join(x for x in lines if x)


def _verdict(d, obs, gv, sv, ch) -> str:
    cur, tgt = d.current, d.target
    here = obs.layout.label()
    h = gv.hysteresis if gv else 0.0
    if d.action == "change":
        moves = ", ".join(f"{c.worker} {c.from_role}→{c.to_role}" for c in d.changes)
        if d.reason == "complete-layout":
            return f"→ finish the {tgt.layout if tgt else ''} layout: {moves}."
        if d.reason == "policy-bound":
            why = "policy bounds require it"
        elif d.reason == "continue-move":
            what = "extend the move" if gv.move_verdict == "extend" else "finish the move"
            why = (f"{what}: {gv.detail}; score {_score(gv.target_score)} vs "
                   f"{_score(gv.hold_score)} holding")
        else:
            # Both figures are predictions at the planned load (the target's and the
            # hold option's), and the gate compared them on one score: say both, so the
            # text never pits a prediction against a "now" it did not use.
            why = (f"predicted goodput {rate(tgt.goodput_rps)} vs {rate(cur.goodput_rps)} "
                   f"holding, both at the planned {rate(d.plan_rate_rps)}"
                   + (f"; within targets {_score(gv.target_score)} vs "
                      f"{_score(gv.hold_score)} holding" if gv and gv.target_score else "")
                   if tgt and cur else "")
            if d.reason == "roll-back":
                why = f"roll back: the load moved {gv.load_shift:.0%} since the move; " + why
            elif gv is not None and gv.detail:
                why += f"; {gv.detail}"
        if gv is not None and gv.breach_note:
            why += "; " + gv.breach_note
        if gv is not None and gv.price is not None:
            why += "; " + explain_price(gv.price)
        out = f"→ move toward {tgt.layout if tgt else '?'} ({why}): {moves}."
        if sv is not None and sv.overload:
            out += " " + explain_overload(sv.overload, sv.overload.get("share", 0.0))
        return out
    verdict = {
        "no-traffic": "no traffic: nothing to gain, keeping the current layout",
        "no-feasible-layout": "no layout fits the policy and the sequences in flight; keeping",
        "current-is-best": f"→ stay {here}",
        "within-hysteresis": (
            f"→ stay {here}: the gain of {tgt.layout if tgt else '?'} "
            f"({rate(tgt.goodput_rps if tgt else 0)} vs {rate(cur.goodput_rps if cur else 0)})"
            f" does not clear the {h:.0%} hysteresis" + (
                f" or {tgt.layout if tgt else '?'} scores no better than staying "
                f"({_score(gv.target_score)} vs {_score(gv.hold_score)})"
                if gv and gv.target_score and gv.target_score < gv.hold_score else "")
        ),
        "workers-not-eligible": "→ change wanted, but no worker may change yet",
        "step-breaks-kv": "→ hold: the next step would leave too little decode KV",
        "all-layouts-miss": (
            f"→ hold {here}: every layout is predicted to miss the targets"
            + (f" ({gv.detail}; the best, {ch.best_layout}, keeps "
               f"{ch.best_attainment:.0%} within targets, limited by {ch.binding})"
               if gv and ch else "")
            + "; moving would only shuffle workers, so the planner holds and raises an alert"
        ),
        "dwell": f"→ stay {here}: no return within the dwell window — " + (
            gv.detail if gv else ""),
        "move-held": f"→ hold {here} mid-move: " + (gv.detail if gv else ""),
        "serves-measured-load": f"→ stay {here}: " + (gv.detail if gv else ""),
        "move-does-not-pay": f"→ hold {here}: " + (
            explain_price(gv.price, tgt.layout if tgt else "the move")
            if gv and gv.price else "the move does not pay"),
    }
    text = verdict.get(d.reason, f"→ {d.action} ({d.reason})")
    if gv is not None and gv.breach_note:
        text += f" ({gv.breach_note})"
    return text + "."


def explain_price(p, target: str = "") -> str:
    """A move priced against the load regime's expected dwell (record.MovePrice)."""
    gain = (f"the gain{f' of {target}' if target else ''} ({rate(p.gain_rps)} for "
            f"~{p.dwell_s:,.0f} s expected: {p.dwell_basis})")
    after = (f"; after it, {p.after_gain_rps:+,.2f} req/s against holding for ~"
             f"{p.after_s:,.0f} s over {p.after_basis}: {p.after_req:+,.1f}"
             if p.regimes else "")
    cost = (f"the move's cost ({p.changes} worker(s) into or out of prefill in {p.steps} "
            f"step(s), {p.drain_s:,.0f} s to drain: {p.cost_req:,.1f} requests' worth of "
            f"capacity; {p.earned_req:,.1f} gained once in place{after})")
    if p.pays and p.waived:
        return (f"not priced against the expected dwell (~{p.dwell_s:,.0f} s): the layout as "
                "it is measures far past a target, so its predicted goodput, and the gain, "
                "is contradicted by what it does")
    if p.pays:
        return f"it pays: {gain} exceeds {cost}"
    return f"{gain} does not pay {cost}"


def explain_overload(o: dict, share: float) -> str:
    """Why this cycle moved more workers than ``max_changes_per_cycle``."""

    def cap(x: float | None) -> str:
        return "unbounded" if x is None else rate(x)

    if o["current_overloaded"]:
        now = (
            f"{o['current_layout']} is overloaded at {rate(o['rate_rps'])} "
            f"({o['current_bottleneck']}, saturates near {cap(o['current_capacity_rps'])})"
        )
    else:
        half = " (less than half of" if o["far_behind"] else " (against"
        now = (
            f"{o['current_layout']} keeps {rate(o['current_goodput_rps'])} of "
            f"{rate(o['rate_rps'])} within targets{half} the "
            f"{rate(o['target_goodput_rps'])} {o['target_layout']} would)"
        )
    why = []
    if o["queueing"] and o["far_behind"]:
        why.append(f"{o['waiting']:,} requests wait across {o['workers']} workers")
    for x in o["latency_over"]:
        why.append(
            f"measured {x['metric']} p95 is {x['p95_ms']:,.0f} ms, "
            f"{x['p95_ms'] / x['target_ms']:.1f}× its {x['target_ms']:,.0f} ms target "
            f"(escalates from {o['latency_factor']:g}×)"
        )
    return (
        f"Larger step: {now} and {' and '.join(why)}, while {o['target_layout']} is "
        f"predicted to keep up (saturates near "
        f"{cap(o['target_capacity_rps'])}); each cycle in the old layout adds to a backlog "
        f"the new one must work off first, so up to {o['limit']} workers move into or out "
        f"of prefill this cycle instead of {o['normal_limit']} "
        f"(overload_change_share {share:.0%})."
    )
