"""Celery tasks for alerts. Beat runs ``alerts.evaluate`` every 15 s (settings.
CELERY_BEAT_SCHEDULE); deliveries are sent by the outbox's worker loop
(``outbox.deliver_due``), not by a task of this app.
"""

from __future__ import annotations

import contextlib
import logging

from celery import shared_task

log = logging.getLogger(__name__)


def _actor(name: str):
    try:
        from controlplane.audit.context import actor
    except ImportError:
        return contextlib.nullcontext()
    return actor(name)


@shared_task(name="alerts.evaluate", ignore_result=True)
def evaluate() -> dict:
    from .evaluation import run_cycle

    with _actor("alerts"):
        summary = run_cycle()
    return summary.__dict__


@shared_task(name="alerts.redeliver", ignore_result=True)
def redeliver(delivery_id: int) -> bool:
    from controlplane.outbox.tasks import kick

    from .delivery import redeliver as do_redeliver
    from .models import WEBHOOK_KIND, Delivery

    delivery = Delivery.objects.filter(pk=delivery_id).first()
    if delivery is None:
        return False
    with _actor("alerts"):
        ok = do_redeliver(delivery)
    if ok:
        kick(WEBHOOK_KIND)
    return ok


@shared_task(name="alerts.send_test", ignore_result=True)
def send_test(endpoint_id: int) -> str:
    from .delivery import send_test as do_send_test
    from .models import WebhookEndpoint

    endpoint = WebhookEndpoint.objects.filter(pk=endpoint_id).first()
    if endpoint is None:
        return "missing"
    with _actor("alerts"):
        return do_send_test(endpoint).status


@shared_task(name="alerts.prune", ignore_result=True)
def prune() -> dict:
    """Forget finished deliveries (with their attempts) and closed alerts older than
    ``ALERTS_RETENTION_DAYS`` (default 30)."""
    import os
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.core import envconfig as ec

    from .models import Alert, Delivery, DeliveryStatus

    days = ec.env_int(os.environ, "ALERTS_RETENTION_DAYS", 30, minimum=1)
    cutoff = timezone.now() - timedelta(days=days)
    _, deleted = Delivery.objects.filter(
        created__lt=cutoff,
        status__in=[DeliveryStatus.DELIVERED, DeliveryStatus.FAILED, DeliveryStatus.CANCELLED],
    ).delete()
    _, deleted_alerts = Alert.objects.filter(is_open=False, ends_at__lt=cutoff).delete()
    return {
        "deliveries": deleted.get("alerts.Delivery", 0),
        "alerts": deleted_alerts.get("alerts.Alert", 0),
    }
