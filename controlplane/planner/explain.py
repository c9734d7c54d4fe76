"""Plain-language explanations with the numbers behind each decision.

Pure: formats the planner's predictions; decides nothing.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from .costmodel import Prediction
    from .planner import ModelDecision, ModelInput


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


def _arithmetic(p: Prediction, inp: ModelInput, ttft_budget: float) -> list[str]:
    """The figures that usually decide: interference when aggregated, transfer when split."""
    out = []
    if p.n_prefill == 0 and p.chunk_s > 0:
        out.append(
            f"aggregated, prefill chunks of {inp.params.chunk_tokens:,} tokens add "
            f"{secs(p.chunk_s)} to {p.mixed_step_share:.0%} of decode steps"
        )
    if p.n_prefill > 0 and p.transfer_bytes > 0:
        link = p.network_link if p.network_share > 0.05 else "local links (NVLink/PCIe)"
        out.append(
            f"transfer of a {inp.load.isl_mean:,.0f}-token prompt ({gbytes(p.transfer_bytes)}) "
            f"over {link} takes {secs(p.transfer_s)} of a {secs(ttft_budget)} TTFT budget"
            + (
                f" ({p.network_share:.0%} of transfers cross nodes)"
                if p.network_share > 0
                else ""
            )
        )
    return out


def explain_decision(d: ModelDecision, inp: ModelInput) -> str:
    pol = inp.policy
    load = inp.load
    n = len(inp.workers)
    head = (
        f"{d.model} on {n} worker(s) ({inp.shape.gpu.name}, TP{inp.shape.tp}): "
        f"{rate(load.rate_rps)} now, planning for {rate(d.plan_rate_rps)}; "
        f"prompts {load.isl_mean:,.0f} tokens ({load.prefix_hit:.0%} cached), answers "
        f"{load.osl_mean:,.0f}; targets TTFT p95 {secs(pol.ttft_p95_ms / 1000)}, "
        f"ITL p95 {secs(pol.itl_p95_ms / 1000)}."
    )
    holds = {
        "no-workers": "no workers to plan",
        "rebalancing-off": "rebalancing is off for this model",
        "fail-static": "fail-static — " + "; ".join(d.notes),
        "change-in-progress": "a role change is still draining; planning resumes after it",
    }
    if d.reason in holds:
        return f"{head} No change: {holds[d.reason]}."
    lines = [head]
    cur, tgt = d.current, d.target
    if cur is not None:
        lines.append("Now " + describe_prediction(cur) + ".")
    if tgt is not None and cur is not None and tgt.layout != cur.layout:
        lines.append("Best " + describe_prediction(tgt) + ".")
    budget = pol.ttft_p95_ms / 1000
    facts = []
    for p in (cur, tgt):
        if p is not None:
            facts.extend(_arithmetic(p, inp, budget))
    agg = next((c for c in d.candidates if c.n_prefill == 0), None)
    split = tgt if tgt is not None and tgt.n_prefill > 0 else None
    if split is None:
        split = max(
            (c for c in d.candidates if c.n_prefill > 0),
            key=lambda c: (c.goodput_rps, -c.n_prefill),
            default=None,
        )
    if split is not None and agg is not None:
        peak = max(load.inflight_peak, load.inflight)
        facts.append(
            f"decode KV would hold {split.kv_capacity_seqs:,} sequences split "
            f"({split.layout}) vs {agg.kv_capacity_seqs:,} aggregated; in-flight peak {peak:,}"
        )
        if split is not tgt and split.transfer_bytes > 0:
            facts.extend(_arithmetic(split, inp, budget))
    seen = set()
    facts = [f for f in facts if not (f in seen or seen.add(f))]
    if facts:
        lines.append("; ".join(facts) + ".")
    for layout, why in sorted(d.rejected.items())[:3]:
        lines.append(f"Ruled out {layout}: {why}.")
    verdict = {
        "no-traffic": "no traffic: nothing to gain, keeping the current layout",
        "no-feasible-layout": "no layout fits the policy and the sequences in flight; keeping",
        "current-is-best": f"→ stay {cur.layout if cur else 'as is'}",
        "within-hysteresis": (
            f"→ stay {cur.layout if cur else 'as is'}: the gain of "
            f"{tgt.layout if tgt else '?'} ({rate(tgt.goodput_rps if tgt else 0)} vs "
            f"{rate(cur.goodput_rps if cur else 0)}) does not clear the "
            f"{pol.hysteresis:.0%} hysteresis"
        ),
        "workers-not-eligible": "→ change wanted, but no worker may change yet",
        "step-breaks-kv": "→ hold: the next step would leave too little decode KV",
    }
    if d.action == "change":
        moves = ", ".join(f"{c.worker} {c.from_role}→{c.to_role}" for c in d.changes)
        if d.reason == "complete-layout":
            moves = ", ".join(f"{c.worker} {c.from_role}→{c.to_role}" for c in d.changes)
            lines.append(f"→ finish the {cur.layout if cur else ''} layout: {moves}.")
            lines.extend(note.rstrip(".") + "." for note in d.notes)
            return " ".join(lines)
        why = "policy bounds require it" if d.reason == "policy-bound" else (
            f"predicted goodput {rate(tgt.goodput_rps)} vs {rate(cur.goodput_rps)} now"
            if tgt and cur
            else ""
        )
        lines.append(f"→ move toward {tgt.layout if tgt else '?'} ({why}): {moves}.")
        if d.overload:
            lines.append(explain_overload(d.overload, pol.overload_change_share))
    elif d.reason in verdict:
        lines.append(verdict[d.reason] + ".")
    lines.extend(note.rstrip(".") + "." for note in d.notes)
    return " ".join(lines)


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
