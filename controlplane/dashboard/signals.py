"""Tell live pages that a plan, routing table, gateway or alert changed.

The hint is a ``page.changed`` message to the cluster's live group (alerts, which carry no
cluster, go to every viewer). It is sent after the transaction commits, and a failure to
send is logged, never raised: the pages look again every few seconds anyway.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.db.models.signals import post_save

log = logging.getLogger(__name__)


def _send(group: str) -> None:
    from asgiref.sync import async_to_sync
    from channels.layers import get_channel_layer

    try:
        layer = get_channel_layer()
        if layer is not None:
            async_to_sync(layer.group_send)(group, {"type": "page.changed"})
    except Exception:
        log.warning("live page hint to %s not sent", group, exc_info=True)


def _hint(group: str) -> None:
    transaction.on_commit(lambda: _send(group))


def _cluster_saved(sender, instance, **kwargs):
    from .consumers import cluster_group

    cluster_id = getattr(instance, "cluster_id", None)
    if cluster_id is None and getattr(instance, "gateway_id", None):
        cluster_id = instance.gateway.cluster_id
    if cluster_id is not None:
        _hint(cluster_group(cluster_id))


def _alert_saved(sender, instance, **kwargs):
    from .consumers import GLOBAL_GROUP

    _hint(GLOBAL_GROUP)


def connect() -> None:
    from controlplane.alerts.models import Alert
    from controlplane.planner.models import Plan
    from controlplane.routing.models import GatewayDelivery, RoutingTableVersion
    from controlplane.topology.models import Gateway

    for model in (Plan, RoutingTableVersion, Gateway, GatewayDelivery):
        post_save.connect(_cluster_saved, sender=model, dispatch_uid=f"live-{model.__name__}")
    post_save.connect(_alert_saved, sender=Alert, dispatch_uid="live-Alert")
