"""pdplane's own Prometheus metrics.

Counters and histograms are incremented where the work happens (ingest, planner, routing
push, webhook delivery, Celery tasks). When ``PROMETHEUS_MULTIPROC_DIR`` is set (the
launcher and the Docker image set it) every process writes its samples there and
:func:`exposition` merges them, so several ASGI or Celery processes report one total.
Figures that live in the database or Redis (gateway lag, agents connected) are read at
scrape time by :class:`StateCollector` instead of being pushed.
"""

from __future__ import annotations

import logging
import os
import time

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily

log = logging.getLogger(__name__)

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

REPORTS_INGESTED = Counter(
    "pdplane_agent_reports_ingested_total", "Agent reports accepted and written to hot state"
)
REPORT_LAG = Histogram(
    "pdplane_agent_report_lag_seconds",
    "Agent clock at report creation to hot-state write",
    buckets=LATENCY_BUCKETS,
)
MESSAGES_REJECTED = Counter(
    "pdplane_agent_messages_rejected_total", "Agent messages refused, by reason", ["reason"]
)
PLANNING_DURATION = Histogram(
    "pdplane_planning_duration_seconds", "One planning cycle of one cluster",
    buckets=LATENCY_BUCKETS,
)
PLANS = Counter("pdplane_plans_total", "Plans produced, by outcome", ["outcome"])
ROUTING_PUSHES = Counter(
    "pdplane_routing_pushes_total", "Routing table pushes to gateways, by result", ["result"]
)
ROUTING_PUSH_LATENCY = Histogram(
    "pdplane_routing_push_seconds", "Time for a gateway to ACK or NACK a push",
    buckets=LATENCY_BUCKETS,
)
WEBHOOK_DELIVERIES = Counter(
    "pdplane_webhook_deliveries_total", "Webhook delivery attempts, by result", ["result"]
)
WEBHOOK_LATENCY = Histogram(
    "pdplane_webhook_delivery_seconds", "Webhook delivery attempt duration",
    buckets=LATENCY_BUCKETS,
)
CELERY_TASK_DURATION = Histogram(
    "pdplane_celery_task_seconds", "Celery task run time, by task", ["task"],
    buckets=LATENCY_BUCKETS,
)


class StateCollector:
    """Gauges computed at scrape time from the database and hot state; only of
    ``cluster_ids`` when given (a scraper whose role covers some clusters only)."""

    def __init__(self, cluster_ids: set[int] | None = None):
        self.cluster_ids = cluster_ids

    def collect(self):
        from controlplane.routing.models import RoutingTableVersion
        from controlplane.topology.models import Gateway, Node

        node_rows, gateway_rows = Node.objects.all(), Gateway.objects.select_related("cluster")
        if self.cluster_ids is not None:
            node_rows = node_rows.filter(cluster_id__in=self.cluster_ids)
            gateway_rows = gateway_rows.filter(cluster_id__in=self.cluster_ids)
        nodes = GaugeMetricFamily("pdplane_nodes", "Nodes by liveness status", labels=["status"])
        counts: dict[str, int] = {}
        for status in node_rows.values_list("status", flat=True):
            counts[status] = counts.get(status, 0) + 1
        for status, count in sorted(counts.items()):
            nodes.add_metric([status], count)
        yield nodes

        lag = GaugeMetricFamily(
            "pdplane_gateway_version_lag",
            "Routing table versions the gateway is behind the latest",
            labels=["cluster", "gateway"],
        )
        latest = RoutingTableVersion.latest_per_cluster()
        for gw in gateway_rows:
            behind = max(latest.get(gw.cluster_id, 0) - gw.applied_table_version, 0)
            lag.add_metric([gw.cluster.name, gw.name], behind)
        yield lag

        agents = _agents_reporting() if self.cluster_ids is None else None  # fleet-wide
        if agents is not None:
            yield agents


def _agents_reporting() -> GaugeMetricFamily | None:
    """Agents whose last report is fresh (hot state's ``seen`` index, one Redis read).

    Read at scrape time rather than kept as a per-process gauge: any ASGI process may hold
    the connection, and Redis already knows when every node last reported.
    """
    from controlplane.telemetry import hotstate

    try:
        seen = hotstate.last_seen_all()
    except Exception:  # Redis down: leave the series out rather than report zero
        return None
    fresh_s = hotstate.STALE_AFTER_REPORTS * hotstate.report_interval_s()
    now = time.time()
    family = GaugeMetricFamily(
        "pdplane_agents_connected",
        "Agents that reported within the staleness window (3 report intervals)",
    )
    family.add_metric([], sum(1 for t in seen.values() if now - t <= fresh_s))
    return family



def exposition(cluster_ids: set[int] | None = None) -> tuple[bytes, str]:
    """Render every metric of this deployment (all processes when multiprocess is on).

    With ``cluster_ids``: only the per-cluster state gauges of those clusters; the process
    counters are fleet-wide totals and are left out."""
    if cluster_ids is not None:
        state = CollectorRegistry()
        state.register(StateCollector(cluster_ids))
        return generate_latest(state), CONTENT_TYPE_LATEST
    registry = CollectorRegistry()
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        multiprocess.MultiProcessCollector(registry)
    else:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    output = generate_latest(registry)
    state = CollectorRegistry()
    state.register(StateCollector())
    try:
        output += generate_latest(state)
    except Exception as exc:  # database down: still serve the process metrics
        log.warning("state metrics unavailable: %s", exc)
    return output, CONTENT_TYPE_LATEST


def install_celery_hooks() -> None:
    """Time every Celery task (connected once, from controlplane.celery)."""
    from celery.signals import task_postrun, task_prerun

    started: dict[str, float] = {}

    @task_prerun.connect(weak=False)
    def _start(task_id=None, **_):
        started[task_id] = time.perf_counter()

    @task_postrun.connect(weak=False)
    def _stop(task_id=None, task=None, **_):
        begun = started.pop(task_id, None)
        if begun is not None and task is not None:
            CELERY_TASK_DURATION.labels(task.name).observe(time.perf_counter() - begun)
