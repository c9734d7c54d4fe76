"""One truth for a node's status, shared by every page (topology, node, models) and the
reason the NodeOffline alert stays quiet for nodes that never had an agent.

The database's ``Node.status`` is set by the liveness sweeper (controlplane.telemetry
.liveness); the hot state can know sooner that reports stopped. A node that never
reported is not "unknown" or "offline": nothing watches it, so it is *not monitored*.
"""

from __future__ import annotations

ONLINE, STALE, OFFLINE, NOT_MONITORED, MAINTENANCE = (
    "online", "stale", "offline", "not-monitored", "maintenance")

LABELS = {ONLINE: "online", STALE: "stale", OFFLINE: "offline",
          NOT_MONITORED: "not monitored", MAINTENANCE: "maintenance"}

# Statuses whose numbers are old (or absent): engines show "no report", tiles grey out.
NOT_REPORTING = frozenset({STALE, OFFLINE, NOT_MONITORED})


def node_status(db_status: str, last_report_at: float | None, hot_stale: bool = False) -> str:
    """The status every page shows for a node: the database's word, except that a node
    with no report ever is "not monitored", and an online node whose hot state went stale
    is stale already (the sweeper catches up within seconds)."""
    if db_status == MAINTENANCE:
        return MAINTENANCE
    if last_report_at is None and db_status in ("unknown", "", None):
        return NOT_MONITORED
    if db_status == ONLINE and hot_stale:
        return STALE
    if db_status in (ONLINE, STALE, OFFLINE):
        return db_status
    return STALE if last_report_at is not None else NOT_MONITORED


def engine_state_label(worker_state: str, status: str) -> str:
    """An engine on a node that is not reporting is not "active": we do not know."""
    if status in NOT_REPORTING and worker_state == "active":
        return "no report" if status != NOT_MONITORED else "not monitored"
    return worker_state
