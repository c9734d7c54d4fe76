"""Distributions the cost model works on: prompt lengths as eight equal-probability
quantiles of a lognormal, the normal tail, weighted quantiles and the p95 of a sum of a fixed
part and a queue's wait. Pure numbers, no dependency on the rest of the planner.
"""

from __future__ import annotations

import math
from functools import lru_cache


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


Z95 = 1.6448536269514722
POINTS = 8


def normal_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _inv_normal(p: float) -> float:
    """Standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9)."""
    a = (-39.69683028665376, 220.9460984245205, -275.9285104469687, 138.3577518672690,
         -30.66479806614716, 2.506628277459239)
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972,
         -13.28068155288572)
    c = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838, -2.549732539343734,
         4.374664141464968, 2.938163982698783)
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    p = _clamp(p, 1e-12, 1 - 1e-12)
    if p < 0.02425:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / (
            (((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - 0.02425:
        return -_inv_normal(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / (
        ((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


_MID = tuple(_inv_normal((i + 0.5) / POINTS) for i in range(POINTS))


@lru_cache(maxsize=4096)
def length_points(mean: float, p95: float | None, p50: float | None = None) -> tuple[float, ...]:
    """Eight equal-probability lengths of a lognormal with this mean and p95 (and p50),
    rescaled so their average is the mean; a point mass when the spread is unknown."""
    mean = max(mean, 0.0)
    if mean <= 0 or not p95 or p95 <= mean * 1.0001:
        return (mean,) * POINTS
    if p50 and 0 < p50 < p95:
        sigma = math.log(p95 / p50) / Z95
    else:
        # p95 / mean = exp(Z σ − σ²/2): increasing in σ up to σ = Z; solve by bisection.
        target = math.log(p95 / mean)
        lo, hi = 0.0, Z95
        if target >= Z95 * Z95 / 2:
            lo = hi
        for _ in range(40):
            if lo >= hi:
                break
            mid = (lo + hi) / 2
            if Z95 * mid - mid * mid / 2 < target:
                lo = mid
            else:
                hi = mid
        sigma = lo
    pts = [math.exp(sigma * z) for z in _MID]
    scale = mean / (sum(pts) / POINTS)
    return tuple(x * scale for x in pts)


def weighted_quantile(pairs: list[tuple[float, float]], q: float) -> float:
    pairs = sorted(pairs)
    total = sum(w for _v, w in pairs)
    if total <= 0:
        return pairs[-1][0] if pairs else 0.0
    acc = 0.0
    for v, w in pairs:
        acc += w
        if acc >= q * total - 1e-12:
            return v
    return pairs[-1][0]


def wait_over(p_wait: float, mean_w: float):
    """P(W > t) = p_wait × exp(−t p_wait / mean_w): the queue model's waiting tail."""
    def over(t: float) -> float:
        if t < 0:
            return 1.0
        if p_wait <= 0 or mean_w <= 0:
            return 0.0
        if t == 0:
            return p_wait
        return p_wait * math.exp(-t * p_wait / mean_w)
    return over


def mixture_p95(fixed: list[float], wait_over, wait_p95: float = 0.0) -> float:
    """x with mean_i P(W + fixed_i > x) = 0.05 (bisection). The answer lies between the
    largest fixed part alone and that plus the wait's own p95 (P(W > W95) = 5 %)."""
    if math.isinf(wait_p95):
        return math.inf
    lo, hi = min(fixed), max(fixed) + wait_p95 + 1e-9
    if sum(wait_over(hi - f) for f in fixed) / len(fixed) > 0.05:  # numerical safety
        return hi
    for _ in range(18):
        mid = (lo + hi) / 2
        if sum(wait_over(mid - f) for f in fixed) / len(fixed) > 0.05:
            lo = mid
        else:
            hi = mid
    return hi
