"""Celery task: reconcile periodically. Pushes themselves are rows of the one outbox,
sent by its worker loop (``outbox.deliver_due``)."""

from __future__ import annotations

import logging
from datetime import timedelta

from celery import shared_task
from django.db.models import Q
from django.utils import timezone

from controlplane.outbox.models import IN_FLIGHT
from controlplane.outbox.worker import drain
from controlplane.topology.models import Cluster, Gateway

from .models import NACK, ROUTING_PUSH_KIND, GatewayDelivery
from .service import PUSH_KINDS, latest_table, publish, queue_deliveries

log = logging.getLogger(__name__)

# A gateway that has not acknowledged anything for this long gets the latest table again.
RESYNC_S = 300


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
            if recent.filter(Q(status__in=IN_FLIGHT) | Q(outcome=NACK)).exists():
                continue
            queue_deliveries(latest, [gateway])
            queued += 1
    sent = drain([ROUTING_PUSH_KIND])
    return {"queued": queued, "sent": sent}
