"""Webhook bodies: pdplane's native JSON and an Alertmanager v4-compatible body. Pure.

Both are built from a :class:`lifecycle.Notification`. The body is serialised once, when
the delivery is queued, by :func:`encode`; retries send the very same bytes under the same
``webhook-id`` so receivers can dedupe.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .lifecycle import FIRING, AlertState, Notification

NATIVE_TYPE = "pdplane.alerts.notification"
TEST_TYPE = "pdplane.webhook.test"
# Alertmanager writes this for an alert that has not ended.
ZERO_TIME = "0001-01-01T00:00:00Z"


def rfc3339(ts: float | None) -> str:
    if ts is None:
        return ZERO_TIME
    return datetime.fromtimestamp(ts, tz=UTC).isoformat().replace("+00:00", "Z")


def _common(maps: list[Mapping[str, str]]) -> dict[str, str]:
    if not maps:
        return {}
    first = maps[0]
    return {k: v for k, v in first.items() if all(m.get(k) == v for m in maps[1:])}


def alert_url(external_url: str, fp: str) -> str:
    return f"{external_url.rstrip('/')}/alerts/?fingerprint={fp}" if external_url else ""


def _alert_status(a: AlertState) -> str:
    return "firing" if a.status == FIRING else "resolved"


def native(n: Notification, *, external_url: str, sent_at: float) -> dict[str, Any]:
    return {
        "type": NATIVE_TYPE,
        "version": 1,
        "status": n.status,
        "group_key": n.group_key,
        "group_labels": dict(n.group_labels),
        "reason": n.reason,
        "created_at": rfc3339(sent_at),
        "external_url": external_url,
        "alerts": [
            {
                "fingerprint": a.fingerprint,
                "status": _alert_status(a),
                "rule": a.rule,
                "severity": a.severity,
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "starts_at": rfc3339(a.starts_at),
                "ends_at": rfc3339(a.ends_at) if a.ends_at is not None else None,
                "acknowledged": a.acknowledged,
                "url": alert_url(external_url, a.fingerprint),
            }
            for a in n.alerts
        ],
    }


def alertmanager_v4(
    n: Notification, *, receiver: str, external_url: str, max_alerts: int = 0
) -> dict[str, Any]:
    """The body Alertmanager's webhook receiver sends (version "4"), field for field."""
    alerts = list(n.alerts)
    truncated = 0
    if max_alerts and len(alerts) > max_alerts:
        truncated = len(alerts) - max_alerts
        alerts = alerts[:max_alerts]
    labels = [dict(a.labels) for a in n.alerts]
    annotations = [dict(a.annotations) for a in n.alerts]
    return {
        "version": "4",
        "groupKey": n.group_key,
        "truncatedAlerts": truncated,
        "status": n.status,
        "receiver": receiver,
        "groupLabels": dict(n.group_labels),
        "commonLabels": _common(labels),
        "commonAnnotations": _common(annotations),
        "externalURL": external_url,
        "alerts": [
            {
                "status": _alert_status(a),
                "labels": dict(a.labels),
                "annotations": dict(a.annotations),
                "startsAt": rfc3339(a.starts_at),
                "endsAt": rfc3339(a.ends_at),
                "generatorURL": alert_url(external_url, a.fingerprint),
                "fingerprint": a.fingerprint,
            }
            for a in alerts
        ],
    }


def test_body(*, endpoint: str, sent_at: float) -> dict[str, Any]:
    return {
        "type": TEST_TYPE,
        "version": 1,
        "endpoint": endpoint,
        "created_at": rfc3339(sent_at),
        "message": "Test notification from pdplane. No action needed.",
    }


def encode(body: Mapping[str, Any]) -> bytes:
    """Deterministic bytes: the same body always signs to the same signature."""
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
