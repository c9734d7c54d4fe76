"""Node liveness from report arrival times.

- online: a report arrived within 3 report intervals;
- stale: no report for more than 3 intervals (or its current connection closed);
- offline: no report for 3 intervals + OFFLINE_GRACE_S.

Connection generations (hotstate ``gen:<node>``) make a late disconnect of an old socket
harmless: only the connection holding the current generation may mark its node stale.
Maintenance is an operator's state and is never overwritten.
"""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime

from django.conf import settings
from django.db.models import Q

from controlplane.topology.choices import NodeStatus
from controlplane.topology.models import Node

from . import hotstate

STALE_AFTER_REPORTS = hotstate.STALE_AFTER_REPORTS


def offline_grace_s() -> float:
    return float(getattr(settings, "TELEMETRY_OFFLINE_GRACE_S", None) or os.environ.get(
        "PDPLANE_OFFLINE_GRACE_S", 20.0))


def classify(last_report_at: float | None, now: float, interval_s: float,
             grace_s: float) -> str:
    """Pure: the status a node should have given when it last reported."""
    if last_report_at is None:
        return NodeStatus.UNKNOWN
    age = now - last_report_at
    if age <= STALE_AFTER_REPORTS * interval_s:
        return NodeStatus.ONLINE
    if age <= STALE_AFTER_REPORTS * interval_s + grace_s:
        return NodeStatus.STALE
    return NodeStatus.OFFLINE


def mark_disconnected(node_id: int) -> None:
    """The node's current connection closed: stale now, offline later if it stays away."""
    Node.objects.filter(pk=node_id, status=NodeStatus.ONLINE).update(status=NodeStatus.STALE)


def check_liveness(now: float | None = None) -> dict[str, int]:
    """Bring Node.status and last_seen in line with the hot state; returns counts changed."""
    now = now or time.time()
    seen = hotstate.last_seen_all()
    interval, grace = hotstate.report_interval_s(), offline_grace_s()
    changed = {NodeStatus.ONLINE: 0, NodeStatus.STALE: 0, NodeStatus.OFFLINE: 0}
    nodes = Node.objects.exclude(status=NodeStatus.MAINTENANCE).filter(
        Q(pk__in=list(seen)) | Q(status__in=[NodeStatus.ONLINE, NodeStatus.STALE]))
    for node in nodes.only("pk", "status", "last_seen"):
        last = seen.get(node.pk)
        status = classify(last, now, interval, grace)
        if status == NodeStatus.UNKNOWN:
            status = NodeStatus.OFFLINE  # was online/stale but its hot state is gone
        # Marked stale by a disconnect: online again only once a connection is back.
        if (
            status == NodeStatus.ONLINE
            and node.status == NodeStatus.STALE
            and not hotstate.live_connection(node.pk).get("channel")
        ):
            status = NodeStatus.STALE
        updates = {}
        if status != node.status:
            updates["status"] = status
            changed[status] += 1
        if last is not None:
            stamp = datetime.fromtimestamp(last, tz=UTC)
            if node.last_seen is None or abs((node.last_seen - stamp).total_seconds()) > 1:
                updates["last_seen"] = stamp
        if updates:
            # Conditional on the status we read, so a concurrent change is not undone.
            Node.objects.filter(pk=node.pk, status=node.status).update(**updates)
    return {str(k): v for k, v in changed.items()}
