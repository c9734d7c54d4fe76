"""A finite horizon: the load a run (or a burst) puts on an idle fleet for a limited time.

The cost model's queues are stationary unless the workload names a horizon
(``Workload.horizon_s``): then the arrivals judged are those of [start, start + horizon]
seconds after the load began on an idle pool, and a queue near or past ρ = 1 is the
transient it is over that span (:func:`.queueing.horizon_wait`): finite, growing by ρ − 1
seconds per second above ρ = 1, and the stationary law below it as the horizon grows.
Pure arithmetic; no dependency on the simulator.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .costmodel import Prediction, Workload
from .dispatch import _SEEN
from .dispatch import with_bursts as _fluid_bursts
from .queueing import HorizonWait, horizon_wait


def horizon_of(w: Workload, rate: float, service_s: float, servers: int,
               service_cv2: float) -> HorizonWait | None:
    """The queue in front of ``servers`` workers over ``w``'s horizon; None without one."""
    if w.horizon_s is None or w.horizon_s <= 0:
        return None
    start = max(w.horizon_start_s, 0.0)
    return horizon_wait(rate, service_s, servers, service_cv2, w.arrival_cv2, start,
                        start + w.horizon_s)


def with_bursts(w: Workload, predict) -> Prediction:
    """:func:`.dispatch.with_bursts`, with a burst's queue priced as what it is when its
    span is known (``w.burst_span_s``): a transient over [0, span] at the burst rate, from
    an idle pool (the quiet between bursts drains it), for any utilisation the burst
    reaches. That replaces the cap of one window's work on the TTFT tail (bursts last
    several windows) and the fluid bound past capacity, which scaled every request's share
    by capacity ÷ burst rate, the prompts a split's decode pool prefills itself (never in
    the prefill queue) included. The mean load still sets utilisation, capacity and
    goodput's rate. Where the burst's prediction has no transient (an aggregated pool past
    its capacity) the fluid bound stands."""
    burst, span = w.burst_rate_rps, w.burst_span_s
    if not burst or burst <= w.rate_rps or not span or span <= 0:
        return _fluid_bursts(w, predict)
    base = replace(w, burst_rate_rps=None, burst_span_s=None)
    mean = predict(base)
    if mean.overloaded or not mean.fits:  # the mean load alone is past capacity (a pool
        return mean  # that never drains starts no burst idle): its own transient stands
    seen = predict(replace(base, rate_rps=burst, horizon_s=span, horizon_start_s=0.0))
    if math.isinf(seen.ttft_p95_s):
        return _fluid_bursts(w, predict)
    return replace(mean, attainment=seen.attainment, goodput_rps=w.rate_rps * seen.attainment,
                   **{k: getattr(seen, k) for k in _SEEN})
