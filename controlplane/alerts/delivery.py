"""Webhook deliveries: write outbox rows for notifications, and send one when the outbox's
worker loop hands it over (:class:`WebhookDeliverer`). Glue around the pure modules.

At-least-once: claiming, the lease, retries with backoff and the attempt log are the
outbox's (``controlplane.outbox``). A message whose worker died mid-send is sent again
after the lease under the same ``webhook-id`` (receivers dedupe on it).
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import datetime

from django.utils import timezone

from controlplane.observability import metrics as obs
from controlplane.outbox import store, worker
from controlplane.outbox.backoff import Backoff, parse_retry_after
from controlplane.outbox.registry import Deliverer, Result

from . import payloads, signing, ssrf, transport
from .conf import AlertsConf, load
from .lifecycle import FIRING, RESOLVED, Notification
from .models import WEBHOOK_KIND, Delivery, DeliveryStatus, WebhookEndpoint, WebhookFormat

log = logging.getLogger(__name__)

EVENT_NOTIFICATION = "alerts.notification"
EVENT_TEST = "webhook.test"
JITTER = (0.8, 1.2)  # ±20 % around the schedule


def build_body(endpoint: WebhookEndpoint, n: Notification, conf: AlertsConf, now: float) -> dict:
    if endpoint.format == WebhookFormat.ALERTMANAGER:
        return payloads.alertmanager_v4(n, receiver=endpoint.name, external_url=conf.external_url)
    return payloads.native(n, external_url=conf.external_url, sent_at=now)


def enqueue_notification(n: Notification, *, now: datetime, conf: AlertsConf) -> list[Delivery]:
    """One delivery per enabled endpoint whose filters accept at least one of the alerts.

    Resolved alerts go only to endpoints that were sent this group firing: an endpoint
    added (or re-filtered) since must not hear "resolved" about something it never saw.
    """
    created = []
    for endpoint in WebhookEndpoint.objects.filter(enabled=True):
        told_firing = Delivery.objects.filter(
            endpoint=endpoint, group_key=n.group_key, notification_status=FIRING
        ).exists()
        alerts = [
            a
            for a in n.alerts
            if endpoint.accepts(a.labels) and (a.status == FIRING or told_firing)
        ]
        if not alerts:
            continue
        status = FIRING if any(a.status == FIRING for a in alerts) else RESOLVED
        narrowed = replace(n, alerts=alerts, status=status)
        created.append(
            Delivery.objects.create(
                endpoint=endpoint,
                event_type=EVENT_NOTIFICATION,
                group_key=n.group_key,
                notification_status=status,
                payload=build_body(endpoint, narrowed, conf, now.timestamp()),
                next_attempt_at=now,
            )
        )
    return created


def enqueue_test(endpoint: WebhookEndpoint) -> Delivery:
    now = timezone.now()
    return Delivery.objects.create(
        endpoint=endpoint,
        event_type=EVENT_TEST,
        is_test=True,
        payload=payloads.test_body(endpoint=endpoint.name, sent_at=now.timestamp()),
        next_attempt_at=None,  # never picked up by the worker loop: sent once, by the caller
    )


def _classify(status: int | None) -> str:
    if status is not None and 200 <= status < 300:
        return "delivered"
    if status == 410:
        return "disabled"
    return "retry"


class WebhookDeliverer(Deliverer):
    """POST one signed message (Standard Webhooks) to its endpoint's checked address."""

    kind = WEBHOOK_KIND

    def lease_s(self) -> float:
        return load().lease_s

    def backoff(self) -> Backoff:
        return Backoff(load().retry_schedule_s, JITTER)

    def load(self, pk: int) -> Delivery:
        return Delivery.objects.select_related("endpoint").get(pk=pk)

    def deliver(self, d: Delivery, worker_name: str) -> Result:
        conf = load()
        endpoint = d.endpoint
        if not endpoint.enabled:
            return Result("cancelled", DeliveryStatus.CANCELLED)

        started = timezone.now()
        body = payloads.encode(d.payload)
        try:
            target = ssrf.check_url(endpoint.url, conf.allow)
        except ssrf.UnsafeTarget as exc:
            response = transport.Response(None, 0.0, error=f"refused: {exc}")
        else:
            hdrs = signing.headers(
                endpoint.signing_secrets(started), d.webhook_id, int(time.time()), body
            )
            response = transport.post(target, hdrs, body, conf.timeout_s)

        outcome = _classify(response.status)
        result = Result(
            outcome,
            status_code=response.status,
            latency_ms=response.latency_ms,
            error=response.error,
            response_excerpt=response.excerpt,
        )
        if outcome == "delivered":
            result.status = DeliveryStatus.DELIVERED
        elif outcome == "disabled":
            result.status = DeliveryStatus.FAILED
            reason = f"Receiver answered 410 Gone at {started:%Y-%m-%d %H:%M:%S} UTC"
            result.then = lambda: disable_endpoint(endpoint, reason)
        elif d.is_test:  # test sends never retry
            result.outcome, result.status = "failed", DeliveryStatus.FAILED
        else:
            result.retry_after_s = parse_retry_after(response.retry_after, time.time())
        obs.WEBHOOK_DELIVERIES.labels(result.outcome).inc()
        obs.WEBHOOK_LATENCY.observe(response.latency_ms / 1000)
        log.info(
            "webhook delivery %s (%s) attempt %s → %s %s",
            d.webhook_id, endpoint.name, d.attempts, response.status, result.outcome,
        )
        return result


def disable_endpoint(endpoint: WebhookEndpoint, reason: str) -> None:
    """Stop sending to an endpoint; its queued deliveries are cancelled. The evaluator
    raises a WebhookEndpointDisabled alert for it (sent through the other endpoints)."""
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        enabled=False, disabled_reason=reason[:300], disabled_at=timezone.now()
    )
    store.cancel(Delivery.objects.filter(endpoint=endpoint))
    log.warning("webhook endpoint %s disabled: %s", endpoint.name, reason)


def redeliver(delivery: Delivery) -> bool:
    """Manual redelivery: same webhook-id and body, a fresh retry schedule, due now."""
    if (
        delivery.endpoint_id
        and not WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, enabled=True).exists()
    ):
        return False
    return store.redeliver(delivery.pk)


def send_test(endpoint: WebhookEndpoint) -> Delivery:
    """Send one test message now and return its record. Test sends never retry."""
    d = enqueue_test(endpoint)
    worker.send_now(d)
    d.refresh_from_db()
    return d
