"""Periodic telemetry work (scheduled in settings.CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from celery import shared_task
from django.utils import timezone

from . import hotstate
from .commands import expire_commands
from .liveness import check_liveness
from .models import NodeSample, WorkerSample

SAMPLE_RETENTION = timedelta(days=14)


@shared_task(name="telemetry.check_liveness", ignore_result=True)
def check_liveness_task() -> dict:
    return check_liveness()


@shared_task(name="telemetry.expire_commands", ignore_result=True)
def expire_commands_task() -> int:
    return expire_commands()


def persist_rollups(now: float | None = None) -> tuple[int, int]:
    """Copy the latest hot state of every fresh node/worker into the database.

    Bounded rate: one row per node and per worker per run (the beat runs it each minute),
    whatever the report rate. Returns (node rows, worker rows).
    """
    from controlplane.topology.models import Cluster

    from .ingest import node_history_point, worker_history_point

    now = now or time.time()
    at = datetime.fromtimestamp(now, tz=UTC)
    node_rows, worker_rows = [], []
    for cluster_id in Cluster.objects.values_list("pk", flat=True):
        snap = hotstate.cluster_snapshot(cluster_id)
        for node_id, state in snap["nodes"].items():
            if state["stale"]:
                continue
            point = node_history_point(state, now)
            node_rows.append(NodeSample(node_id=node_id, at=at, **{
                k: point[k] for k in hotstate.NODE_METRICS}))
        for worker_id, state in snap["workers"].items():
            if state["stale"]:
                continue
            point = worker_history_point(state, now)
            worker_rows.append(WorkerSample(worker_id=worker_id, at=at, **{
                k: point[k] for k in hotstate.WORKER_METRICS}))
    from controlplane.topology.models import Node, Worker

    live_nodes = set(Node.objects.filter(pk__in=[r.node_id for r in node_rows])
                     .values_list("pk", flat=True))
    live_workers = set(Worker.objects.filter(pk__in=[r.worker_id for r in worker_rows])
                       .values_list("pk", flat=True))
    NodeSample.objects.bulk_create([r for r in node_rows if r.node_id in live_nodes])
    WorkerSample.objects.bulk_create([r for r in worker_rows if r.worker_id in live_workers])
    return len(live_nodes), len(live_workers)


@shared_task(name="telemetry.persist_rollups", ignore_result=True)
def persist_rollups_task() -> tuple[int, int]:
    cutoff = timezone.now() - SAMPLE_RETENTION
    NodeSample.objects.filter(at__lt=cutoff).delete()
    WorkerSample.objects.filter(at__lt=cutoff).delete()
    return persist_rollups()
