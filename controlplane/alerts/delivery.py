"""The webhook outbox: queue, claim, send, retry. Glue around the pure modules.

At-least-once, Healthchecks-style: the database is the queue. A delivery is claimed with
a conditional ``UPDATE … WHERE status = 'pending'`` (works the same on PostgreSQL and
SQLite), so several sweepers can run without locks and without sending a message twice
at once. One delivery is claimed at a time, so a slow receiver cannot make a claimed-but-
waiting batch outlive its lease. A claim older than the lease belongs to a worker that
died mid-send: :func:`reclaim_expired` puts it back, and it is sent again under the same
``webhook-id`` (receivers dedupe on it).
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import replace
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.observability import metrics as obs

from . import backoff, payloads, signing, ssrf, transport
from .conf import AlertsConf, load
from .lifecycle import FIRING, RESOLVED, Notification
from .models import Delivery, DeliveryAttempt, DeliveryStatus, WebhookEndpoint, WebhookFormat

log = logging.getLogger(__name__)

EVENT_NOTIFICATION = "alerts.notification"
EVENT_TEST = "webhook.test"
RETRYABLE_OUTCOME = "retry"


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


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
        next_attempt_at=None,  # never picked up by the sweeper: sent once, by the caller
    )


def claim(pk: int, worker: str, *, now: datetime, statuses=(DeliveryStatus.PENDING,)) -> bool:
    """Take one delivery; False when someone else got it first."""
    return bool(
        Delivery.objects.filter(pk=pk, status__in=statuses).update(
            status=DeliveryStatus.SENDING,
            claimed_by=worker,
            claimed_at=now,
            attempts=F("attempts") + 1,
        )
    )


def claim_next_due(worker: str, *, now: datetime) -> int | None:
    for _ in range(5):  # lost races: try the next candidate
        pk = (
            Delivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
            .order_by("next_attempt_at", "pk")
            .values_list("pk", flat=True)
            .first()
        )
        if pk is None:
            return None
        if (
            Delivery.objects.filter(
                pk=pk, status=DeliveryStatus.PENDING, next_attempt_at__lte=now
            ).update(
                status=DeliveryStatus.SENDING,
                claimed_by=worker,
                claimed_at=now,
                attempts=F("attempts") + 1,
            )
            == 1
        ):
            return pk
    return None


def reclaim_expired(*, now: datetime, lease_s: float, max_attempts: int | None = None) -> int:
    """Claims older than the lease: their worker died mid-send. Put them back — unless the
    attempts are used up (a message that kills every worker must not loop forever)."""
    cutoff = now - timedelta(seconds=lease_s)
    stale = list(
        Delivery.objects.filter(
            status=DeliveryStatus.SENDING, claimed_at__lt=cutoff, is_test=False
        ).values_list("pk", "claimed_by", "claimed_at", "attempts")
    )
    count = 0
    for pk, claimed_by, claimed_at, attempts in stale:
        exhausted = max_attempts is not None and attempts >= max_attempts
        after = (
            {"status": DeliveryStatus.FAILED, "next_attempt_at": None}
            if exhausted
            else {"status": DeliveryStatus.PENDING, "next_attempt_at": now}
        )
        mine = Delivery.objects.filter(pk=pk, status=DeliveryStatus.SENDING, claimed_by=claimed_by)
        if mine.update(claimed_by="", claimed_at=None, **after):
            count += 1
            DeliveryAttempt.objects.create(
                delivery_id=pk,
                number=attempts,
                started_at=claimed_at,
                worker=claimed_by,
                latency_ms=(now - claimed_at).total_seconds() * 1000,
                error=f"claim by {claimed_by} expired after {lease_s:.0f} s "
                "(worker stopped mid-delivery); "
                + ("attempts used up" if exhausted else "sending again"),
                outcome="failed" if exhausted else "lost",
            )
            log.warning("webhook delivery %s: reclaimed from %s", pk, claimed_by)
    return count


def _classify(status: int | None) -> str:
    if status is not None and 200 <= status < 300:
        return "delivered"
    if status == 410:
        return "disabled"
    return RETRYABLE_OUTCOME


def send_claimed(pk: int, worker: str, conf: AlertsConf | None = None) -> str:
    """Send a delivery this worker has claimed; record the attempt; decide what's next.

    Returns the outcome: delivered | retry | failed | disabled | cancelled.
    """
    conf = conf or load()
    d = Delivery.objects.select_related("endpoint").get(pk=pk)
    endpoint = d.endpoint
    if not endpoint.enabled:
        Delivery.objects.filter(pk=pk, claimed_by=worker).update(
            status=DeliveryStatus.CANCELLED, claimed_by="", claimed_at=None, next_attempt_at=None
        )
        return "cancelled"

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
    updates: dict = {
        "claimed_by": "",
        "claimed_at": None,
        "last_status_code": response.status,
        "last_error": response.error or ("" if outcome == "delivered" else response.excerpt[:500]),
    }
    if outcome == "delivered":
        updates.update(
            status=DeliveryStatus.DELIVERED, delivered_at=timezone.now(), next_attempt_at=None
        )
    elif outcome == "disabled":
        updates.update(status=DeliveryStatus.FAILED, next_attempt_at=None)
    else:
        delay = None
        if not d.is_test:
            retry_after = backoff.parse_retry_after(response.retry_after, time.time())
            delay = backoff.next_delay(d.attempts, conf.retry_schedule_s, retry_after)
        if delay is None:
            outcome = "failed"
            updates.update(status=DeliveryStatus.FAILED, next_attempt_at=None)
        else:
            updates.update(
                status=DeliveryStatus.PENDING,
                next_attempt_at=timezone.now() + timedelta(seconds=delay),
            )

    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=d,
            number=d.attempts,
            started_at=started,
            worker=worker,
            status_code=response.status,
            latency_ms=response.latency_ms,
            response_excerpt=response.excerpt[:1000],
            error=response.error,
            outcome=outcome,
        )
        mine = Delivery.objects.filter(pk=pk, status=DeliveryStatus.SENDING, claimed_by=worker)
        if not mine.update(**updates) and outcome == "delivered":
            # Our claim expired and someone else took it; the receiver has it anyway.
            Delivery.objects.filter(pk=pk).exclude(status=DeliveryStatus.DELIVERED).update(
                **updates
            )
        if outcome == "disabled":
            disable_endpoint(
                endpoint, f"Receiver answered 410 Gone at {started:%Y-%m-%d %H:%M:%S} UTC"
            )
    obs.WEBHOOK_DELIVERIES.labels(outcome).inc()
    obs.WEBHOOK_LATENCY.observe(response.latency_ms / 1000)
    log.info(
        "webhook delivery %s (%s) attempt %s → %s %s",
        d.webhook_id,
        endpoint.name,
        d.attempts,
        response.status,
        outcome,
    )
    return outcome


def disable_endpoint(endpoint: WebhookEndpoint, reason: str) -> None:
    """Stop sending to an endpoint; its queued deliveries are cancelled. The evaluator
    raises a WebhookEndpointDisabled alert for it (sent through the other endpoints)."""
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        enabled=False, disabled_reason=reason[:300], disabled_at=timezone.now()
    )
    Delivery.objects.filter(endpoint=endpoint, status=DeliveryStatus.PENDING).update(
        status=DeliveryStatus.CANCELLED, next_attempt_at=None
    )
    log.warning("webhook endpoint %s disabled: %s", endpoint.name, reason)


def sweep(
    *, worker: str | None = None, conf: AlertsConf | None = None, time_budget_s: float = 50.0
) -> dict[str, int]:
    """Reclaim dead claims, then send due deliveries one by one until none is due, the
    batch is done or the time budget is spent (the next beat tick carries on)."""
    conf = conf or load()
    worker = worker or worker_identity()
    counts: dict[str, int] = {
        "reclaimed": reclaim_expired(
            now=timezone.now(), lease_s=conf.lease_s, max_attempts=len(conf.retry_schedule_s)
        )
    }
    deadline = time.monotonic() + time_budget_s
    for _ in range(conf.sweep_batch):
        if time.monotonic() > deadline:
            break
        pk = claim_next_due(worker, now=timezone.now())
        if pk is None:
            break
        outcome = send_claimed(pk, worker, conf)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def redeliver(delivery: Delivery) -> bool:
    """Manual redelivery: same webhook-id and body, a fresh retry schedule, due now."""
    if (
        delivery.endpoint_id
        and not WebhookEndpoint.objects.filter(pk=delivery.endpoint_id, enabled=True).exists()
    ):
        return False
    return bool(
        Delivery.objects.filter(pk=delivery.pk)
        .exclude(status=DeliveryStatus.SENDING)
        .update(
            status=DeliveryStatus.PENDING,
            attempts=0,
            next_attempt_at=timezone.now(),
        )
    )


def send_test(endpoint: WebhookEndpoint, conf: AlertsConf | None = None) -> Delivery:
    """Send one test message now and return its record. Test sends never retry."""
    d = enqueue_test(endpoint)
    worker = worker_identity()
    if claim(d.pk, worker, now=timezone.now()):
        send_claimed(d.pk, worker, conf)
    d.refresh_from_db()
    return d
