"""Sending routing tables to gateways: claim due deliveries, PUT signed, record the answer.

The database is the queue (as in Healthchecks): a delivery is claimed with a conditional
``UPDATE … WHERE status = 'pending'``, so several Celery workers can sweep without double
sends. Answers follow xDS semantics (reference/RELIABILITY.md): 200 = ACK with the applied
version; 409 = stale (the gateway has this version or newer); 400/422 = NACK (invalid
table, the gateway keeps its last good one); anything else = transient, retried with
exponential backoff and full jitter.
"""

from __future__ import annotations

import json
import logging
import random
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import timedelta
from urllib.parse import urlsplit

from django.db import transaction
from django.utils import timezone

from controlplane.observability import metrics as obs

from . import signing
from .builder import canonical_json
from .models import DeliveryAttempt, DeliveryStatus, GatewayDelivery, RoutingTableVersion
from .service import latest_table, queue_deliveries

log = logging.getLogger(__name__)

TABLE_PATH = "/admin/routing-table"
HTTP_TIMEOUT_S = 10.0
CLAIM_S = 60
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 300.0
MAX_ATTEMPTS = 25


def backoff_delay(attempt: int, rng: random.Random | None = None) -> float:
    """Seconds before attempt ``attempt + 1``: exponential, capped, with jitter in [½, 1]."""
    rng = rng or random
    ceiling = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** max(attempt - 1, 0))
    return ceiling * (0.5 + 0.5 * rng.random())


@dataclass
class PushResult:
    outcome: str  # ack | stale | nack | unauthorized | error
    status_code: int | None
    applied_version: int | None
    error: str = ""


def put_table(url: str, secret: str, body: bytes, expected_version: int, delivery_id: str):
    """PUT a table to a gateway; returns a :class:`PushResult`. Never raises on I/O."""
    path = urlsplit(url).path.rstrip("/") + TABLE_PATH
    headers = {
        "Content-Type": "application/json",
        signing.EXPECTED_VERSION_HEADER: str(expected_version),
        signing.DELIVERY_ID_HEADER: delivery_id,
        **signing.signed_headers(secret, "PUT", path, body, now=time.time()),
    }
    request = urllib.request.Request(  # noqa: S310 - the URL is an operator-set gateway
        url.rstrip("/") + TABLE_PATH, data=body, headers=headers, method="PUT"
    )
    try:
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as response:  # noqa: S310
            return _interpret(response.status, response.read())
    except urllib.error.HTTPError as exc:
        return _interpret(exc.code, exc.read())
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return PushResult("error", None, None, f"unreachable: {exc}")


def _interpret(status: int, raw: bytes) -> PushResult:
    try:
        answer = json.loads(raw or b"{}")
        if not isinstance(answer, dict):
            answer = {}
    except ValueError:
        answer = {}
    applied = answer.get("applied_version")
    applied = applied if isinstance(applied, int) and applied >= 0 else None
    error = str(answer.get("error") or answer.get("detail") or "")[:2000]
    if 200 <= status < 300:
        return PushResult("ack", status, applied)
    if status == 409:
        return PushResult("stale", status, applied, error or "stale version refused")
    if status in (400, 422):
        return PushResult("nack", status, applied, error or f"refused with HTTP {status}")
    if status in (401, 403):
        return PushResult("unauthorized", status, applied, error or f"HTTP {status}")
    return PushResult("error", status, applied, error or f"HTTP {status}")


def claim_due(cluster_id: int | None = None, limit: int = 50) -> list[int]:
    now = timezone.now()
    # Deliveries whose claimer died are put back first.
    GatewayDelivery.objects.filter(
        status=DeliveryStatus.SENDING, claimed_until__lt=now
    ).update(status=DeliveryStatus.PENDING)
    due = GatewayDelivery.objects.filter(status=DeliveryStatus.PENDING, next_attempt_at__lte=now)
    if cluster_id is not None:
        due = due.filter(gateway__cluster_id=cluster_id)
    claimed = []
    for pk in due.order_by("next_attempt_at").values_list("pk", flat=True)[:limit]:
        won = GatewayDelivery.objects.filter(pk=pk, status=DeliveryStatus.PENDING).update(
            status=DeliveryStatus.SENDING, claimed_until=now + timedelta(seconds=CLAIM_S)
        )
        if won:
            claimed.append(pk)
    return claimed


def send(delivery_id: int, put=put_table) -> str:
    """Attempt one claimed delivery; returns its new status."""
    delivery = GatewayDelivery.objects.select_related("gateway", "table").get(pk=delivery_id)
    gateway, table = delivery.gateway, delivery.table
    latest = latest_table(gateway.cluster_id)
    if latest is not None and latest.version > table.version:
        # Never send an old table: bring the gateway straight to the newest one.
        _finish(delivery, DeliveryStatus.SUPERSEDED)
        in_flight = [DeliveryStatus.PENDING, DeliveryStatus.SENDING]
        if not GatewayDelivery.objects.filter(
            gateway=gateway, table=latest, status__in=in_flight
        ).exists():
            queue_deliveries(latest, [gateway])
        return DeliveryStatus.SUPERSEDED
    started = timezone.now()
    t0 = time.perf_counter()
    result = put(
        gateway.url,
        gateway.secret,
        canonical_json(table.body),
        gateway.applied_table_version,
        f"{delivery.pk}-{uuid.uuid4().hex[:8]}",
    )
    duration_ms = (time.perf_counter() - t0) * 1000
    obs.ROUTING_PUSHES.labels(result.outcome).inc()
    obs.ROUTING_PUSH_LATENCY.observe(duration_ms / 1000)
    return _record(delivery, table, result, started, duration_ms)


def _record(delivery, table: RoutingTableVersion, result: PushResult, started, duration_ms):
    gateway = delivery.gateway
    now = timezone.now()
    with transaction.atomic():
        DeliveryAttempt.objects.create(
            delivery=delivery,
            started_at=started,
            duration_ms=duration_ms,
            status_code=result.status_code,
            outcome=result.outcome,
            error=result.error,
            applied_version=result.applied_version,
        )
        delivery.attempts += 1
        delivery.last_status_code = result.status_code
        delivery.last_error = result.error
        gateway_fields = {}
        if result.applied_version is not None:
            gateway_fields["applied_table_version"] = result.applied_version
        if result.outcome == "ack":
            status = DeliveryStatus.ACKED
            gateway_fields.update(last_ack_at=now, last_error="")
            gateway_fields.setdefault("applied_table_version", table.version)
        elif result.outcome == "stale":
            status = DeliveryStatus.STALE
            applied = result.applied_version or 0
            if applied >= table.version:  # alive and at least as new: in sync
                gateway_fields.update(last_ack_at=now, last_error="")
            else:
                gateway_fields["last_error"] = f"v{table.version}: {result.error}"
        elif result.outcome == "nack":
            status = DeliveryStatus.NACKED
            gateway_fields["last_error"] = f"v{table.version} refused: {result.error}"
        else:
            gateway_fields["last_error"] = f"v{table.version}: {result.error}"
            if delivery.attempts >= MAX_ATTEMPTS:
                status = DeliveryStatus.FAILED
            else:
                status = DeliveryStatus.PENDING
                delivery.next_attempt_at = now + timedelta(
                    seconds=backoff_delay(delivery.attempts)
                )
        delivery.status = status
        delivery.claimed_until = None
        if status != DeliveryStatus.PENDING:
            delivery.finished_at = now
        delivery.save()
        if gateway_fields:
            type(gateway).objects.filter(pk=gateway.pk).update(**gateway_fields, updated=now)
    log.info(
        "push %s v%d → %s (%s) %s",
        gateway, table.version, result.outcome, result.status_code, result.error,
    )
    return status


def _finish(delivery, status):
    delivery.status = status
    delivery.finished_at = timezone.now()
    delivery.claimed_until = None
    delivery.save(update_fields=["status", "finished_at", "claimed_until", "updated"])


def next_due_in(cluster_id: int | None = None) -> float | None:
    """Seconds until the earliest pending delivery is due (None when none is pending)."""
    pending = GatewayDelivery.objects.filter(status=DeliveryStatus.PENDING)
    if cluster_id is not None:
        pending = pending.filter(gateway__cluster_id=cluster_id)
    first = pending.order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first()
    if first is None:
        return None
    return max((first - timezone.now()).total_seconds(), 0.0)
