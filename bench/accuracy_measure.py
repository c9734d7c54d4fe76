"""What the prediction benchmark measures on a simulated run, beyond the simulator's own
summary: the token gaps inside the measured window, the share of requests within both
targets, and the arrivals' burstiness (:mod:`prediction_accuracy` uses these).
"""

from __future__ import annotations

import itertools
import math
import statistics


def window_gaps(r, t0: float, t_end: float) -> list[float]:
    """The token gaps of ``r`` that end inside [t0, t_end]: the steady state when ``t_end``
    is the last arrival (the benchmark's, that of the cool-down tail after the measured
    arrivals). After the last arrival no prompt is prefilled any more, so gaps in the
    drain are all pure decode steps (a run of long answers has most of its gaps there)."""
    if r.first_token_time is None:
        return []
    out, t = [], r.first_token_time
    for g in r.itls:
        t += g
        if t > t_end:
            break
        if t >= t0:
            out.append(g)
    return out


def steady_share(late, gaps: dict, ttft_s: float, itl_s: float) -> float:
    """Share of the measured requests within both targets: TTFT, and the mean of the token
    gaps each had inside the window (all its gaps when none fell inside). With the window
    running to the cool-down tail's last arrival, that is all the gaps of a request that
    finished under load, and the part under load of one that outlived the tail."""
    if not late:
        return 0.0
    ok = 0
    for r in late:
        if r.error is not None or r.ttft is None or r.ttft > ttft_s:
            continue
        mine = gaps[id(r)] or list(r.itls)
        if not mine or statistics.fmean(mine) <= itl_s:
            ok += 1
    return ok / len(late)


def arrival_cv2(arrivals: list[float]) -> float:
    """Burstiness of a trace's arrivals: the squared coefficient of variation of the gaps
    between them (1 for Poisson). The scenario workloads are generated Poisson, so they get
    1 exactly rather than a noisy estimate from a few dozen gaps."""
    return _scv([b - a for a, b in itertools.pairwise(sorted(arrivals))])


def _scv(gaps: list[float]) -> float:
    """Squared coefficient of variation of ``gaps``; 1 (Poisson's) with fewer than two."""
    mean = statistics.fmean(gaps) if len(gaps) > 1 else 0.0
    return statistics.pvariance(gaps) / mean ** 2 if mean > 0 else 1.0


def burst_rate(arrivals: list[float], window_s: float) -> tuple[float | None, float]:
    """(The arrival rate a request sees around itself, the gap SCV within a window):
    Σ n(n − 1) ÷ (Δ Σ n) over windows of Δ = ``window_s`` (the TTFT target: arrivals that
    close compete for the same prefill within the target), n the arrivals in each window
    (the mean rate for Poisson arrivals), and the squared coefficient of variation of the
    gaps between arrivals in the same window (the burstiness left at the burst rate). What a
    gateway counting arrivals per window could report. Scenario workloads (generated
    Poisson) get (None, 1): the mean rate, as for ``arrival_cv2``."""
    if len(arrivals) < 2 or window_s <= 0:
        return None, 1.0
    t0 = min(arrivals)
    inside = []
    for a, b in itertools.pairwise(sorted(arrivals)):
        if int((a - t0) / window_s) == int((b - t0) / window_s):
            inside.append(b - a)
    return _rate_around(arrivals, t0, window_s), _scv(inside)


def _rate_around(arrivals: list[float], t0: float, width: float) -> float:
    """Σ n(n − 1) ÷ (width Σ n), n the arrivals in each window of ``width`` from ``t0``."""
    counts: dict[int, int] = {}
    for a in arrivals:
        k = int((a - t0) / width)
        counts[k] = counts.get(k, 0) + 1
    return sum(n * (n - 1) for n in counts.values()) / (width * len(arrivals))


def burst_span(arrivals: list[float], window_s: float) -> float | None:
    """How long a burst lasts: the time scale L over which the rate a request sees around
    itself (Σ n(n − 1) ÷ (L Σ n) over windows of L, doubling from ``window_s``) falls to half
    its value at ``window_s`` (log-linear between the doublings; the whole span when it
    never does, as for Poisson arrivals). None with fewer than two arrivals."""
    if len(arrivals) < 2 or window_s <= 0:
        return None
    t0 = min(arrivals)
    span = max(arrivals) - t0

    def seen(width: float) -> float:
        return _rate_around(arrivals, t0, width)

    first = seen(window_s)
    if first <= 0:
        return window_s
    width, last = window_s, first
    while width * 2 <= span:
        now = seen(width * 2)
        if now <= first / 2:
            # log-linear between (width, last) and (2 width, now)
            f = (math.log(last / (first / 2)) / math.log(last / now)
                 if now > 0 and last > now else 1.0)
            return width * 2 ** f
        width, last = width * 2, now
    return span


def ttft_growth(results) -> tuple[float, float]:
    """(TTFT growth across the measured window in seconds, its rate in seconds per second):
    the mean TTFT of the last quarter of the measured arrivals minus that of the first,
    and that over the time between the two quarters' mean arrivals. A stable queue's TTFT
    does not trend; an unstable one's grows at about ρ − 1 seconds per second."""
    got = sorted((r.arrival, r.ttft) for r in results if r.ttft is not None)
    q = len(got) // 4
    if q < 2:
        return 0.0, 0.0
    head, tail = got[:q], got[-q:]
    growth = statistics.fmean(t for _a, t in tail) - statistics.fmean(t for _a, t in head)
    elapsed = statistics.fmean(a for a, _t in tail) - statistics.fmean(a for a, _t in head)
    return growth, growth / elapsed if elapsed > 0 else 0.0
