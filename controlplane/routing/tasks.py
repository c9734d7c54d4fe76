"""Celery tasks: push after publish, sweep retries, reconcile periodically."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from controlplane.topology.models import Cluster, Gateway

from . import delivery
from .models import DeliveryStatus, GatewayDelivery
from .service import PUSH_KINDS, latest_table, publish, queue_deliveries

log = logging.getLogger(__name__)

# A retry sooner than the beat sweep is scheduled as a short countdown, always far below
# the Redis visibility timeout (1 h); longer waits are only rows in the database.
MAX_COUNTDOWN_S = 30
# A gateway that has not acknowledged anything for this long gets the latest table again.
RESYNC_S = 300


@shared_task(name="routing.push_routing_tables", ignore_result=True, bind=True)
def push_routing_tables(self, cluster_id: int | None = None) -> dict:
    """Send every due delivery (of one cluster, or all), then schedule a near retry."""
    outcomes: dict[str, int] = {}
    for pk in delivery.claim_due(cluster_id):
        try:
            status = delivery.send(pk)
        except Exception:  # one bad gateway row must not stop the others
            log.exception("delivery %s failed unexpectedly", pk)
            GatewayDelivery.objects.filter(pk=pk, status=DeliveryStatus.SENDING).update(
                status=DeliveryStatus.PENDING
            )
            status = "crashed"
        outcomes[status] = outcomes.get(status, 0) + 1
    wait = delivery.next_due_in(cluster_id)
    if outcomes and wait is not None and wait <= MAX_COUNTDOWN_S:
        queue = (getattr(self.request, "delivery_info", None) or {}).get("routing_key")
        push_routing_tables.apply_async((cluster_id,), countdown=max(wait, 0.5), queue=queue)
    return outcomes


@shared_task(name="routing.reconcile_routing", ignore_result=True)
def reconcile_routing() -> dict:
    """Rebuild every cluster's table (stored only if it changed) and re-queue a delivery to
    any push gateway that is behind and has nothing in flight, unless it refused (NACKed)
    that very version: resending an invalid table cannot help."""
    queued = 0
    for cluster in Cluster.objects.all():
        try:
            publish(cluster.pk, "periodic reconcile", "system")
        except Exception:
            log.exception("reconcile: building the table of %s failed", cluster)
            continue
        latest = latest_table(cluster.pk)
        if latest is None:
            continue
        # Behind, or not heard from for a while: a gateway that restarted without a state
        # file or pull runs nothing, yet the database still says it has the latest table.
        # The re-push is answered with an idempotent ACK when it does have it.
        quiet_since = timezone.now() - timedelta(seconds=RESYNC_S)
        behind = Gateway.objects.filter(cluster=cluster, kind__in=PUSH_KINDS).filter(
            Q(applied_table_version__lt=latest.version)
            | Q(last_ack_at__isnull=True)
            | Q(last_ack_at__lt=quiet_since)
        )
        for gateway in behind:
            recent = GatewayDelivery.objects.filter(gateway=gateway, table=latest)
            if recent.filter(
                status__in=[DeliveryStatus.PENDING, DeliveryStatus.SENDING, DeliveryStatus.NACKED]
            ).exists():
                continue
            queue_deliveries(latest, [gateway])
            queued += 1
    sent = push_routing_tables(None)
    return {"queued": queued, "sent": sent}
