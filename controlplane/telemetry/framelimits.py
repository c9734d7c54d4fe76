"""Rate limits of agent frames: token buckets per node and frame kind, shared by every
connection of this process so reconnecting does not refill a flooding node's bucket.
Reports use the configured rate; the other kinds (each costs a database call) use
:data:`FRAME_RATES` (issue 20, defect 8)."""

from __future__ import annotations

import os
import time

from django.conf import settings

from workers_agent import protocol as proto

_buckets: dict[tuple[int, str], proto.TokenBucket] = {}
FRAME_RATES = {  # kind: (frames per second, burst)
    "hello": (2.0, 30.0),  # reconnects of one node
    "inventory": (0.2, 5.0),  # each one reconciles the node's rows
    "command_result": (20.0, 100.0),
}


def max_reports_per_s() -> float:
    return float(getattr(settings, "TELEMETRY_MAX_REPORTS_PER_S", None) or os.environ.get(
        "PDPLANE_AGENT_MAX_REPORTS_PER_S", proto.DEFAULT_MAX_REPORTS_PER_S))


def report_burst() -> float:
    return float(getattr(settings, "TELEMETRY_REPORT_BURST", None) or os.environ.get(
        "PDPLANE_AGENT_REPORT_BURST", proto.DEFAULT_REPORT_BURST))


def take_token(node_id: int, kind: str) -> proto.TokenBucket | None:
    """None when a frame of ``kind`` from the node may proceed; else the empty bucket."""
    key = (node_id, kind)
    bucket = _buckets.get(key)
    now = time.monotonic()
    if bucket is None:
        rate, burst = (max_reports_per_s(), report_burst()) if kind == "report" \
            else FRAME_RATES[kind]
        bucket = _buckets[key] = proto.TokenBucket(rate, burst, now)
    return None if bucket.take(now) else bucket
