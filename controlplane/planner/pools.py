"""Fleets whose pools do not share work: a split whose decode pool prefills every prompt
itself (conditional P/D), and a fleet mid-move ('both' workers beside a split). Pure; the
per-pool predictions come from :mod:`.layouts`."""

from __future__ import annotations

import math

from .costmodel import Prediction, _clamp


def decode_local(local: Prediction, name: str, n_prefill: int, n_decode: int, gpus: int,
                  share: float) -> Prediction:
    """A split whose decode pool prefills every prompt itself (all short enough), or is
    overloaded doing its share: the aggregated pool of its decode workers, the prefill
    pool idle."""
    out = dict(local.__dict__)
    out.update(layout=name, n_prefill=n_prefill, n_decode=n_decode, gpus=gpus,
               local_prefill_share=share)
    if local.overloaded:
        out["bottleneck"] = f"decode pool ({local.bottleneck}, prefilling short prompts)"
    return Prediction(**out)


def combine_pools(
    layout: str, n_prefill: int, n_decode: int, n_both: int, rate_rps: float,
    parts: list[tuple[float, Prediction]],
) -> Prediction:
    """One prediction for a fleet whose traffic splits over pools that do not share work,
    e.g. mid-move: 'both' workers serving whole requests in place (an aggregated pool) beside
    a P:D split. ``parts`` are (share of the traffic, the pool's prediction at that share).
    Goodput adds up; the tails are the worst tail of any pool carrying ≥ 5 % of requests
    (a p95 of a mixture is at most the largest p95 of its parts); the fleet saturates when
    its first pool does."""
    live = [(s, p) for s, p in parts if s > 0]
    tails = [p for s, p in live if s >= 0.05] or [p for _s, p in live]
    goodput = sum(p.goodput_rps for _s, p in live)
    caps = [p.capacity_rps / s for s, p in live if s > 0]
    busiest = max(live, key=lambda sp: sp[1].utilisation)[1] if live else None

    def worst(attr: str) -> float:
        return max((getattr(p, attr) for p in tails), default=0.0)

    def mean(attr: str) -> float:
        return sum(s * getattr(p, attr) for s, p in live)

    return Prediction(
        layout=layout, n_prefill=n_prefill, n_decode=n_decode, n_both=n_both,
        rate_rps=rate_rps,
        ttft_p95_s=worst("ttft_p95_s"), itl_p95_s=worst("itl_p95_s"),
        itl_mean_s=mean("itl_mean_s"), prefill_s=worst("prefill_s"),
        queue_p95_s=worst("queue_p95_s"), transfer_s=worst("transfer_s"),
        transfer_mean_s=mean("transfer_mean_s"), decode_batch=mean("decode_batch"),
        kv_capacity_seqs=sum(p.kv_capacity_seqs for _s, p in live),
        kv_used=max((p.kv_used for _s, p in live), default=0.0),
        utilisation=busiest.utilisation if busiest else 0.0,
        bottleneck=busiest.bottleneck if busiest else "",
        attainment=_clamp(goodput / rate_rps, 0.0, 1.0) if rate_rps > 0 else 0.0,
        goodput_rps=goodput, gpus=sum(p.gpus for _s, p in parts),
        mixed_step_share=max((p.mixed_step_share for _s, p in live), default=0.0),
        chunk_s=max((p.chunk_s for _s, p in live), default=0.0),
        network_share=max((p.network_share for _s, p in live), default=0.0),
        network_link=next((p.network_link for _s, p in live if p.network_link), ""),
        transfer_bytes=max((p.transfer_bytes for _s, p in live), default=0.0),
        capacity_rps=min(caps) if caps else math.inf,
        overloaded=any(p.overloaded for _s, p in live),
        fits=all(p.fits for _s, p in parts),
        preempt_risk=max((p.preempt_risk for _s, p in live), default=0.0),
    )
