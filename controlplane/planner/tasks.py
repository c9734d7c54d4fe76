"""Celery tasks: periodic planning per cluster (interval from policy) and drain tracking."""

from __future__ import annotations

import logging

from celery import shared_task
from django.utils import timezone

from controlplane.policies.effective import merge_policy
from controlplane.policies.models import Policy
from controlplane.topology.models import Cluster

from . import apply, service
from .models import ModelPlannerState, Plan, PlanStatus

log = logging.getLogger(__name__)


def _cluster_policy(cluster: Cluster):
    row = Policy.objects.filter(cluster=cluster, served_model=None).first()
    return merge_policy(row.layer() if row else None)[0]


@shared_task(name="planner.plan_due_clusters", ignore_result=True)
def plan_due_clusters() -> int:
    """Beat entry (every few seconds): queue a planning run for every cluster whose
    ``rebalance_interval_s`` has passed since its last run."""
    now = timezone.now()
    queued = 0
    for cluster in Cluster.objects.all():
        policy = _cluster_policy(cluster)
        if not policy.rebalancing_enabled or policy.rebalancing_mode == "off":
            continue
        last = (
            ModelPlannerState.objects.filter(served_model__cluster=cluster)
            .order_by("-last_run_at").values_list("last_run_at", flat=True).first()
        )
        if last is None or (now - last).total_seconds() >= policy.rebalance_interval_s:
            plan_cluster.delay(cluster.pk)
            queued += 1
    return queued


@shared_task(name="planner.plan_cluster", ignore_result=True)
def plan_cluster(cluster_id: int) -> int:
    cluster = Cluster.objects.filter(pk=cluster_id).first()
    if cluster is None:
        return 0
    return len(service.run_planning(cluster))


@shared_task(name="planner.track_drains", ignore_result=True)
def track_drains() -> int:
    """Beat entry: move every applying plan forward (switch drained workers, time out)."""
    done = 0
    for plan_id in Plan.objects.filter(status=PlanStatus.APPLYING).values_list("pk", flat=True):
        plan = apply.advance(plan_id)
        done += plan.status != PlanStatus.APPLYING
    return done


@shared_task(name="planner.approve_plan", ignore_result=True)
def approve_plan_task(plan_id: int) -> str:
    try:
        return service.approve_plan(plan_id, None).status
    except service.PlanError as exc:
        log.warning("plan %s not approved: %s", plan_id, exc.reason)
        return "refused"
