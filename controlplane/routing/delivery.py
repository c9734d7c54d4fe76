"""Sending routing tables to gateways: the outbox's deliverer for ``routing.push`` rows.

The outbox (``controlplane.outbox``) claims due deliveries and retries them; this module
PUTs a table signed and reads the answer. Answers follow xDS semantics
(reference/RELIABILITY.md): 200 = ACK with the applied version; 409 = stale (the gateway
has this version or newer); 400/422 = NACK (invalid table, the gateway keeps its last
good one); anything else = transient, retried with exponential backoff and jitter.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from urllib.parse import urlsplit

from django.utils import timezone

from controlplane.observability import metrics as obs
from controlplane.outbox.backoff import Backoff
from controlplane.outbox.models import IN_FLIGHT, Status
from controlplane.outbox.registry import Deliverer, Result

from . import signing
from .builder import canonical_json
from .models import ACK, NACK, ROUTING_PUSH_KIND, STALE, SUPERSEDED, GatewayDelivery
from .service import latest_table, queue_deliveries

log = logging.getLogger(__name__)

TABLE_PATH = "/admin/routing-table"
HTTP_TIMEOUT_S = 10.0
CLAIM_S = 60  # the lease: far above HTTP_TIMEOUT_S
# 1 s doubling to a 300 s cap, × U[0.5, 1]; 25 attempts in all.
BACKOFF = Backoff.exponential(base_s=1.0, cap_s=300.0, attempts=25, jitter=(0.5, 1.0))
# Answers that end a delivery; the others (unauthorized, error) are retried.
FINAL = {ACK: Status.DELIVERED, STALE: Status.DELIVERED, NACK: Status.FAILED}


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


class RoutingPushDeliverer(Deliverer):
    """PUT the delivery's table to its gateway, unless a newer table exists by now."""

    kind = ROUTING_PUSH_KIND
    # ROUTING_PUSH_QUEUE (optional setting) lets tests give their worker a private queue.
    queue_setting = "ROUTING_PUSH_QUEUE"

    def __init__(self, put=put_table):
        self.put = put

    def lease_s(self) -> float:
        return CLAIM_S

    def backoff(self) -> Backoff:
        return BACKOFF

    def load(self, pk: int) -> GatewayDelivery:
        return GatewayDelivery.objects.select_related("gateway", "table").get(pk=pk)

    def deliver(self, delivery: GatewayDelivery, worker_name: str) -> Result:
        gateway, table = delivery.gateway, delivery.table
        latest = latest_table(gateway.cluster_id)
        if latest is not None and latest.version > table.version:
            # Never send an old table: bring the gateway straight to the newest one.
            return Result(SUPERSEDED, Status.CANCELLED, then=lambda: _queue_latest(gateway, latest))
        t0 = time.perf_counter()
        pushed = self.put(
            gateway.url,
            gateway.secret,
            canonical_json(table.body),
            gateway.applied_table_version,
            f"{delivery.pk}-{uuid.uuid4().hex[:8]}",
        )
        latency_ms = (time.perf_counter() - t0) * 1000
        obs.ROUTING_PUSHES.labels(pushed.outcome).inc()
        obs.ROUTING_PUSH_LATENCY.observe(latency_ms / 1000)
        log.info(
            "push %s v%d → %s (%s) %s",
            gateway, table.version, pushed.outcome, pushed.status_code, pushed.error,
        )
        return Result(
            pushed.outcome,
            FINAL.get(pushed.outcome),
            status_code=pushed.status_code,
            latency_ms=latency_ms,
            error=pushed.error,
            detail={"applied_version": pushed.applied_version},
            then=lambda: _note_on_gateway(gateway, table.version, pushed),
        )


def _queue_latest(gateway, latest) -> None:
    if not GatewayDelivery.objects.filter(
        gateway=gateway, table=latest, status__in=IN_FLIGHT
    ).exists():
        queue_deliveries(latest, [gateway])


def _note_on_gateway(gateway, version: int, pushed: PushResult) -> None:
    """What the gateway's answer says about it: the version it runs, when it last
    acknowledged, the error an operator should see."""
    now = timezone.now()
    fields = {}
    if pushed.applied_version is not None:
        fields["applied_table_version"] = pushed.applied_version
    if pushed.outcome == ACK:
        fields.update(last_ack_at=now, last_error="")
        fields.setdefault("applied_table_version", version)
    elif pushed.outcome == STALE and (pushed.applied_version or 0) >= version:
        fields.update(last_ack_at=now, last_error="")  # alive and at least as new: in sync
    elif pushed.outcome == NACK:
        fields["last_error"] = f"v{version} refused: {pushed.error}"
    else:
        fields["last_error"] = f"v{version}: {pushed.error}"
    type(gateway).objects.filter(pk=gateway.pk).update(**fields, updated=now)
