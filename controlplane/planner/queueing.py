"""Waiting in the queue in front of a pool of workers: G/G/c approximations, pure numbers.

No Django, no dependency on the rest of the cost model: rates in requests per second,
times in seconds. ``math.inf`` where the queue is unstable (ρ ≥ 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

# --- Queueing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueWait:
    """Waiting time in an M/G/c queue (Sakasegawa's approximation, exponential tail)."""

    utilisation: float
    p_wait: float
    mean_s: float
    p95_s: float

    def p_wait_over(self, seconds: float) -> float:
        """Share of arrivals that wait longer than ``seconds``."""
        if self.utilisation >= 1:
            return 1.0
        if self.p_wait <= 0 or self.mean_s <= 0:
            return 0.0
        if seconds <= 0:
            return self.p_wait
        return self.p_wait * math.exp(-seconds * self.p_wait / self.mean_s)


def _p_wait(rho: float, servers: int) -> float:
    """The chance an arrival waits (ρ < 1): Sakasegawa's ρ^(√(2(c+1))−1)."""
    return min(1.0, rho ** (math.sqrt(2.0 * (servers + 1)) - 1.0))


def mgc_wait(
    rate: float, service_s: float, servers: int, service_cv2: float = 1.0,
    arrival_cv2: float = 1.0,
) -> QueueWait:
    """G/G/c waiting time (Sakasegawa, Allen–Cunneen):
    Wq ≈ ρ^(√(2(c+1))−1) / (c(1−ρ)) × (ca²+cs²)/2 × S.

    ``arrival_cv2`` (ca²) is the squared coefficient of variation of the gaps between
    arrivals: 1 for Poisson, more for bursty traffic (requests that arrive together queue
    together however idle the fleet is on average). The probability of waiting is the
    Erlang-C term of the same approximation; given a wait, it is taken as exponential,
    which yields the p95."""
    if rate <= 0 or service_s <= 0 or servers <= 0:
        return QueueWait(0.0, 0.0, 0.0, 0.0)
    rho = rate * service_s / servers
    if rho >= 1:
        return QueueWait(rho, 1.0, math.inf, math.inf)
    p_wait = _p_wait(rho, servers)
    variability = (max(arrival_cv2, 0.0) + max(service_cv2, 0.0)) / 2.0
    mean = p_wait / (servers * (1.0 - rho)) * variability * service_s
    p95 = 0.0
    if p_wait > 0.05 and mean > 0:
        p95 = (mean / p_wait) * math.log(p_wait / 0.05)
    return QueueWait(rho, p_wait, mean, p95)


def jsq_wait(
    rate: float, service_s: float, choices: float, service_cv2: float = 1.0,
    arrival_cv2: float = 1.0,
) -> QueueWait:
    """The wait of a request that joins the shortest of ``choices`` queues, each a single
    server fed at ``rate`` (the supermarket model; Vvedenskaya, Dobrushin and Karpelevich
    1996, Mitzenmacher 2001): in the mean-field limit a share s_i = ρ^((d^i − 1)/(d − 1)) of
    the queues hold at least i requests, so the shortest of d holds at least i with
    probability s_i^d = s_(i+1) ÷ ρ. The probability of waiting is ρ^d, and the mean number
    ahead Σ_(i≥2) s_i ÷ ρ, against ρ ÷ (1 − ρ) for one queue: the one queue's G/G/1 mean
    wait (:func:`mgc_wait`, c = 1) is scaled by that ratio, so one choice is that queue
    exactly and a fractional ``choices`` (a mean over requests) lies between. Exponential
    tail given a wait, as in :func:`mgc_wait`."""
    alone = mgc_wait(rate, service_s, 1, service_cv2, arrival_cv2)
    d = choices if math.isfinite(choices) else 1.0
    rho = alone.utilisation
    if d <= 1.0 + 1e-9 or rho <= 0 or rho >= 1 or alone.mean_s <= 0:
        return alone
    log_rho = math.log(rho)
    ahead, i = 0.0, 2
    while i < 100_000:  # s_i falls at least as fast as ρ^i
        power = d ** i
        term = math.exp(log_rho * (power - 1.0) / (d - 1.0) - log_rho) if power < 1e300 else 0.0
        ahead += term
        if term < 1e-12 * max(ahead, 1e-300):
            break
        i += 1
    p_wait = rho ** d
    mean = alone.mean_s * ahead / (rho / (1.0 - rho))
    p95 = (mean / p_wait) * math.log(p_wait / 0.05) if p_wait > 0.05 and mean > 0 else 0.0
    return QueueWait(rho, p_wait, mean, p95)


# --- A queue over a finite horizon --------------------------------------------------------


def _erfcx(z: float) -> float:
    """exp(z²) erfc(z), without overflow for large z (asymptotic series from z = 5 on:
    relative error below 2e-5 there)."""
    if z < 5.0:
        return math.exp(z * z) * math.erfc(z)
    iz2 = 1.0 / (z * z)
    return (1.0 - iz2 / 2 + 3 * iz2 ** 2 / 4 - 15 * iz2 ** 3 / 8) / (z * math.sqrt(math.pi))


def rbm_over(x: float, t: float, drift: float, var: float) -> float:
    """P(R(t) > x) for a reflected Brownian motion R started at 0, with ``drift`` and
    variance ``var`` per second (the heavy-traffic law of a queue's wait): the classical
    closed form P(R(t) ≤ x) = Φ((x − μt) ÷ σ√t) − e^(2μx/σ²) Φ((−x − μt) ÷ σ√t), for any
    sign of the drift (stable, critical or overloaded). The second term is computed as
    ½ erfcx(z) e^(−(x − μt)² ÷ 2σ²t), z = (x + μt) ÷ σ√(2t), which does not overflow."""
    if x < 0:
        return 1.0
    s = math.sqrt(2.0 * var * t) if t > 0 and var > 0 else 0.0
    if s <= 0:  # no time or no spread, or var × t below the smallest float (it underflows)
        return 1.0 if drift * max(t, 0.0) > x else 0.0
    first = 0.5 * math.erfc((x - drift * t) / s)
    z = (x + drift * t) / s
    if z <= -26:  # erfc(z) = 2 there: e^(2μx/σ²) ≤ 1 for the drift this needs (μ < 0)
        second = math.exp(2.0 * drift * x / var)
    elif z < 5.0:
        second = 0.5 * math.exp(2.0 * drift * x / var) * math.erfc(z)
    else:
        second = 0.5 * _erfcx(z) * math.exp(-((x - drift * t) ** 2) / (s * s))
    return min(max(1.0 - (1.0 - first - second), 0.0), 1.0)


HORIZON_NODES = 12  # arrival times the horizon's wait is averaged over (midpoints)


@dataclass(frozen=True)
class HorizonWait:
    """The wait of arrivals spread evenly over [``start``, ``end``] seconds after arrivals
    began on an empty pool (a finite run; a burst): P(W > x) = p_wait × P(R(t) > x) with
    R a reflected Brownian motion from 0 (:func:`rbm_over`), drift ρ − 1 and variance
    (ca² + cs²) S max(ρ, 1) ÷ c per second. Below ρ = 1 and as the horizon grows this is
    exactly :func:`mgc_wait`'s law (the drift and variance give the exponential tail of
    mean Wq ÷ p_wait); at ρ = 1 it is continuous (p_wait → 1, the variance is the
    heavy-traffic λ E[S²]-type term); above, the wait grows by ρ − 1 seconds per second and
    a finite horizon still has a finite wait. The atom at 0 (1 − p_wait) is taken at its
    stationary value."""

    utilisation: float
    p_wait: float
    drift: float
    var: float
    start: float
    end: float

    def over(self, x: float) -> float:
        if x < 0:
            return 1.0
        if self.p_wait <= 0:
            return 0.0
        a, b = self.start, max(self.end, self.start)
        ts = [a + (b - a) * (i + 0.5) / HORIZON_NODES for i in range(HORIZON_NODES)]
        return self.p_wait * sum([rbm_over(x, t, self.drift, self.var) for t in ts]) / len(ts)

    @property
    def p95_s(self) -> float:
        """The wait's p95 over the horizon (0 when fewer than 5 % wait)."""
        if self.p_wait <= 0.05:
            return 0.0
        lo, hi = 0.0, self.p95_bound()
        for _ in range(40):
            mid = (lo + hi) / 2
            if self.over(mid) > 0.05:
                lo = mid
            else:
                hi = mid
        return hi

    def p95_bound(self) -> float:
        """An x with P(W > x) ≤ 5 % (the latest arrival waits longest: its p95 bounds all)."""
        t = max(self.end, self.start)
        x = max(self.drift * t, 0.0) + 2.0 * math.sqrt(max(self.var * t, 0.0)) + 1e-9
        if self.drift < 0:  # no more than the stationary law's p95 (its tail is the limit)
            x = min(x, self.var / (-2.0 * self.drift) * math.log(20.0) + 1e-9)
        while rbm_over(x, t, self.drift, self.var) * self.p_wait > 0.05:
            x *= 2.0
        return x


def horizon_wait(
    rate: float, service_s: float, servers: int, service_cv2: float, arrival_cv2: float,
    start: float, end: float,
) -> HorizonWait:
    """The G/G/c wait of :func:`mgc_wait`, for arrivals over [``start``, ``end``] seconds
    after the load began on an empty pool (see :class:`HorizonWait`)."""
    if rate <= 0 or service_s <= 0 or servers <= 0:
        return HorizonWait(0.0, 0.0, 0.0, 0.0, start, end)
    rho = rate * service_s / servers
    p_wait = 1.0 if rho >= 1 else _p_wait(rho, servers)
    two_v = max(arrival_cv2, 0.0) + max(service_cv2, 0.0)
    var = two_v * service_s * max(rho, 1.0) / servers
    return HorizonWait(rho, p_wait, rho - 1.0, var, max(start, 0.0), max(end, start, 0.0))
