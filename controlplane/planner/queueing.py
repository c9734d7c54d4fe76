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
    p_wait = min(1.0, rho ** (math.sqrt(2.0 * (servers + 1)) - 1.0))
    variability = (max(arrival_cv2, 0.0) + max(service_cv2, 0.0)) / 2.0
    mean = p_wait / (servers * (1.0 - rho)) * variability * service_s
    p95 = 0.0
    if p_wait > 0.05 and mean > 0:
        p95 = (mean / p_wait) * math.log(p_wait / 0.05)
    return QueueWait(rho, p_wait, mean, p95)
