"""A finite horizon: the load a run (or a burst) puts on an idle fleet for a limited time.

The cost model's queues are stationary unless the workload names a horizon
(``Workload.horizon_s``): then the arrivals judged are those of [start, start + horizon]
seconds after the load began on an idle pool, and a queue near or past ρ = 1 is the
transient it is over that span (:func:`.queueing.horizon_wait`): finite, growing by ρ − 1
seconds per second above ρ = 1, and the stationary law below it as the horizon grows.
Pure arithmetic; no dependency on the simulator.
"""

from __future__ import annotations

from .costmodel import Workload
from .queueing import HorizonWait, horizon_wait


def horizon_of(w: Workload, rate: float, service_s: float, servers: int,
               service_cv2: float) -> HorizonWait | None:
    """The queue in front of ``servers`` workers over ``w``'s horizon; None without one."""
    if w.horizon_s is None or w.horizon_s <= 0:
        return None
    start = max(w.horizon_start_s, 0.0)
    return horizon_wait(rate, service_s, servers, service_cv2, w.arrival_cv2, start,
                        start + w.horizon_s)
