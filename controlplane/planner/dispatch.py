"""How load reaches the workers of a pool: the prompts' work at the quantile points, and
the gateway's dispatch (least-loaded vs prefix affinity) as the queue and the decoding
requests see it. Pure arithmetic for :mod:`.layouts`; no dependency on the simulator.
"""

from __future__ import annotations

import math
from dataclasses import replace
from math import exp
from operator import is_

from .costmodel import (
    DEFAULT_PARAMS,
    CostParams,
    Prediction,
    Workload,
    _clamp,
    affinity_share,
    mgc_wait,
)
from .distributions import balanced_victims, length_points, local_share_points, miss_mixture
from .distributions import mixture_p95 as _mixture_p95
from .distributions import wait_over as _wait_cdf_inv
from .queueing import jsq_wait

__all__ = ["DEFAULT_PARAMS", "IdMemo", "dispatch_wait", "exposure", "p95_length", "points",
           "prompt_points", "prompt_work", "remote_service", "tail_work", "with_bursts"]


def points(w: Workload) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(prompt lengths, decode contexts) at the eight quantiles."""
    isl = length_points(w.isl_mean, w.isl_p95, w.isl_p50)
    osl = max(w.osl_mean, 0.0)
    return isl, tuple(x + osl / 2.0 for x in isl)


def prompt_work(w: Workload, isl_pts: tuple[float, ...]) -> list[tuple[float, float]]:
    """(uncached, cached) tokens of the eight quantile prompts. With the uncached p95 known
    the uncached lengths get their own fit (paired in order with the prompt lengths: a long
    prompt is not cached more); else each prompt hits the mean share."""
    hit = _clamp(w.prefix_hit, 0.0, 1.0)
    if not w.uncached_p95 or hit <= 0:
        return [(x * (1 - hit), x * hit) for x in isl_pts]
    mixed = miss_mixture(isl_pts, hit, w.uncached_p95, w.isl_p95 or max(isl_pts))
    if mixed is not None:
        return mixed
    unc = length_points(w.uncached_mean, min(w.uncached_p95, max(isl_pts)))
    return [(min(u, x), max(x - u, 0.0)) for u, x in zip(unc, isl_pts, strict=True)]


class IdMemo:
    """Values computed from frozen inputs, keyed on the inputs' identity: the same objects
    give the same value. An entry holds its inputs, so their ids are not reused while it
    lives; the memo empties itself past ``size`` entries. (Identity, not equality: 1 and
    1.0, 0.0 and -0.0 are equal keys but need not give the same repr.)"""

    def __init__(self, size: int = 256):
        self.size = size
        self.entries: dict[tuple, tuple] = {}

    def get(self, objs: tuple, compute):
        key = tuple(map(id, objs))
        hit = self.entries.get(key)
        if hit is not None and all(map(is_, hit[0], objs)):
            return hit[1]
        value = compute()
        if len(self.entries) >= self.size:
            self.entries.clear()
        self.entries[key] = (objs, value)
        return value


# prompt_points per Workload object: a layout search prices every candidate on the same
# Workload, and the points are a function of it alone (frozen).
_POINTS = IdMemo(256)


def prompt_points(w: Workload, split: bool = True) -> tuple[
        tuple[float, ...], tuple[float, ...], list[tuple[float, float]]]:
    """:func:`_prompt_points`, computed once per Workload object and ``split`` (the work
    list is a fresh copy each call)."""
    isl, ctx, work = _POINTS.get((w, bool(split)), lambda: _frozen_points(w, split))
    return isl, ctx, list(work)


def _frozen_points(w: Workload, split: bool):
    isl, ctx, work = _prompt_points(w, split)
    return isl, ctx, tuple(work)


def _prompt_points(w: Workload, split: bool = True) -> tuple[
        tuple[float, ...], tuple[float, ...], list[tuple[float, float]]]:
    """(prompt lengths, decode contexts, (uncached, cached) work) at the eight quantiles.
    In a split (``split``) with the share of prompts short enough for conditional P/D's
    local prefill measured, the points respect it (:func:`local_share_points`): the gateway
    decides per request on the part not cached, so which prompts the decode pool prefills
    is that share, not the fit's count of points under the threshold. An aggregated pool
    keeps the mean + p95 fit: there no routing turns on the threshold, and the reshaped
    tail (the mass of the short prompts moved onto the long ones) priced Mooncake ×2
    aggregated on 32 H200 workers at 61 % within targets against 81 % simulated (78 % with
    the fit; docs/benchmarks.md, prediction accuracy, H4)."""
    isl, ctx = points(w)
    work = prompt_work(w, isl)
    if not split or w.local_prefill_share is None or w.local_prefill_max_tokens <= 0:
        return isl, ctx, work
    shaped = local_share_points(work, float(w.local_prefill_max_tokens), w.local_prefill_share)
    if shaped is work:
        return isl, ctx, work
    isl = tuple(u + c for u, c in shaped)
    osl = max(w.osl_mean, 0.0)
    return isl, tuple(x + osl / 2.0 for x in isl), shaped


def remote_service(w: Workload, timing, params: CostParams, remote: list[int]):
    """(prefill time of each quantile prompt ``remote`` names — those a split's prefill pool
    takes —, their lengths, the times' mean and squared coefficient of variation)."""
    isl_pts, _ctx, work = prompt_points(w)
    services = [timing.prefill(*work[i], params.chunk_tokens) for i in remote]
    isl_pts_r = [isl_pts[i] for i in remote]
    mean_s = sum(services) / len(remote)
    var_s = sum([(s - mean_s) ** 2 for s in services]) / len(remote)
    cs2 = var_s / mean_s ** 2 if mean_s > 0 else 0.0
    return services, isl_pts_r, mean_s, cs2


def tail_work(w: Workload, p95_len: float) -> tuple[float, float]:
    """(uncached, cached) tokens of the p95 prompt (see :func:`prompt_work`)."""
    hit = _clamp(w.prefix_hit, 0.0, 1.0)
    if not w.uncached_p95 or hit <= 0:
        return p95_len * (1 - hit), p95_len * hit
    u = min(max(w.uncached_p95, p95_len * (1 - hit)), p95_len)
    return u, p95_len - u


def exposure(w: Workload, batch: float, workers: int, params: CostParams) -> float:
    """How often a decoding request is stalled, relative to a prompt landing on a random
    worker: the gateway sends a prompt routed by load to the worker whose prefill would
    stall fewest requests in flight (``gateway.router``'s cost), so it stalls the fewest
    decoders (:func:`balanced_victims`), not an average batch; one routed by prefix
    affinity goes to its holder, busy or not (share as in :func:`dispatch_wait`)."""
    if workers <= 1 or batch <= 0:
        return 1.0
    a = _affinity_routed(w, workers, params)
    return a + (1.0 - a) * balanced_victims(batch, workers) / batch


def _affinity_routed(w: Workload, workers: int, params: CostParams) -> float:
    """The share of requests the gateway routes by prefix affinity (to the worker holding
    their prefix) rather than by load: as measured when given, else from the hit rate; none
    with one worker or with affinity off."""
    if workers <= 1 or params.prefix_min_match <= 0:
        return 0.0
    a = w.affinity_share if w.affinity_share is not None else affinity_share(w.prefix_hit,
                                                                               params)
    return _clamp(a, 0.0, 1.0)


def dispatch_wait(w: Workload, mean_s: float, workers: int, cv2: float,
                   params: CostParams):
    """(P(wait > t), an upper bound of the wait's p95, the wait's p95) for the aggregated
    pool. The gateway dispatches each request on arrival, so every worker keeps its own
    queue: a request routed by load goes to the least-loaded worker, which behaves like one
    shared queue (M/G/c: least work left is FCFS over c servers); one routed by prefix
    affinity goes to the worker holding its prefix whether or not that worker is busy,
    i.e. a queue of its own at the per-worker rate (M/G/1 at rate ÷ c) — or, when the
    prefix is held on several workers (``w.affinity_holders``), the shortest of their
    queues (:func:`.queueing.jsq_wait`). The wait is the mixture of those parts."""
    pooled = mgc_wait(w.rate_rps, mean_s, workers, cv2, w.arrival_cv2)
    over_pooled = _wait_cdf_inv(pooled.p_wait, pooled.mean_s)
    a = _affinity_routed(w, workers, params)
    if a <= 0:
        return over_pooled, pooled.p95_s, pooled.p95_s
    # A followed request joins its prefix's cheapest admitted holder (gateway.router's
    # follow_prefix): the shortest of that many queues, each fed at the per-worker rate —
    # per count of holders, weighted by the share of followed requests that had it.
    parts = [(a * share, jsq_wait(w.rate_rps / workers, mean_s, k, cv2, w.arrival_cv2))
             for k, share in holder_shares(w, workers)]
    parts.append((1.0 - a, pooled))
    return _wait_mixture(parts)


def _wait_mixture(parts: list) -> tuple:
    """(P(wait > t), an upper bound of its p95, its p95) for a mixture of queues' waits,
    ``parts`` = [(weight, QueueWait)], each tail p × exp(−t p ÷ m) written inline: the
    planning cycle prices every candidate layout with it, many times over in each p95's
    bisection. Two parts (one holder each, and the pooled queue: the live planner's case)
    are unrolled, 1.8× faster than the general sum."""
    terms = [(wt, q.p_wait, q.mean_s, q.p_wait <= 0 or q.mean_s <= 0) for wt, q in parts]
    if len(terms) == 2:
        (a, pa, ma, dead_a), (b, pp, mp, dead_p) = terms

        def at(x: float, fixed: list[float]) -> list[float]:
            return [a * (1.0 if (t := x - f) < 0 else 0.0 if dead_a else pa if t == 0
                         else pa * exp(-t * pa / ma))
                    + b * (1.0 if t < 0 else 0.0 if dead_p else pp if t == 0
                           else pp * exp(-t * pp / mp))
                    for f in fixed]
    else:
        def at(x: float, fixed: list[float]) -> list[float]:
            return [1.0 if (t := x - f) < 0 else
                    sum([wt * (0.0 if dead else p if t == 0 else p * exp(-t * p / m))
                         for wt, p, m, dead in terms])
                    for f in fixed]

    def over(t: float) -> float:
        return at(t, [0.0])[0]

    over.at = at
    bound = max(q.p95_s for _wt, q in parts)
    return over, bound, _mixture_p95([0.0], over, bound) if bound > 0 else 0.0


def holder_shares(w: Workload, workers: int) -> list[tuple[float, float]]:
    """(holders, share of followed requests) from ``w.affinity_holders``, each count within
    [1, workers] and the shares summing to 1; one holder each when unknown or malformed."""
    pairs = []
    for item in w.affinity_holders or ():
        try:
            k, share = float(item[0]), float(item[1])
        except (TypeError, ValueError, IndexError):
            continue
        if math.isfinite(k) and math.isfinite(share) and share > 0:
            pairs.append((min(max(k, 1.0), float(max(workers, 1))), share))
    total = sum(x for _k, x in pairs)
    return [(k, x / total) for k, x in pairs] if total > 0 else [(1.0, 1.0)]


def p95_length(w: Workload, pts: tuple[float, ...]) -> float:
    """The p95 prompt length: as given, else the mean (a point mass)."""
    return max(w.isl_p95 or 0.0, w.isl_mean, 0.0) if w.isl_p95 else max(pts)


# What a request sees of a burst: its latencies; what the pool carries: the mean load.
_SEEN = ("ttft_p95_s", "itl_p95_s", "itl_mean_s", "prefill_s", "queue_p95_s", "transfer_s",
         "transfer_mean_s", "mixed_step_share", "chunk_s", "preempt_risk")


def with_bursts(w: Workload, predict) -> Prediction:
    """``predict(w)`` for bursty arrivals (``w.burst_rate_rps`` above the mean rate).

    Requests arrive in bursts, so each one meets the queue and the stalls of the rate around
    it, not of the mean: latencies and the share within targets are those at the burst rate,
    while utilisation, capacity and goodput (share × the mean rate) are the mean load's.
    Where the burst rate is past the layout's capacity but the mean is not, the pool serves
    at its capacity through a burst and the rest queue (fluid limit): at most capacity ÷
    burst rate of a burst's arrivals are served in time, with the mean load's share within
    targets. ``arrival_cv2`` is then the variability of the gaps *within* a burst (over all
    gaps it would count the same bursts twice)."""
    burst = w.burst_rate_rps
    if not burst or burst <= w.rate_rps:
        return predict(w)
    base = replace(w, burst_rate_rps=None)
    mean = predict(base)
    if mean.overloaded or not mean.fits:
        return mean
    seen = predict(replace(base, rate_rps=burst))
    if seen.overloaded:
        share = mean.attainment * min(1.0, mean.capacity_rps / burst)
        return replace(mean, attainment=share, goodput_rps=w.rate_rps * share)
    # A burst is counted over one window (Δ = the TTFT target): the work that arrived in it
    # is done within ρ × Δ at the burst's utilisation ρ < 1, so a burst adds at most that to
    # the queue's tail (steady state at the burst rate assumes bursts outlast the queue's
    # own relaxation, which a window's worth of arrivals near ρ = 1 does not).
    ttft = min(seen.ttft_p95_s, mean.ttft_p95_s + seen.utilisation * w.ttft_slo_s)
    return replace(mean, attainment=seen.attainment,
                   goodput_rps=w.rate_rps * seen.attainment,
                   **{k: getattr(seen, k) for k in _SEEN if k != "ttft_p95_s"}, ttft_p95_s=ttft)
