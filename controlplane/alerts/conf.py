"""Alert and webhook knobs: Django settings win, else the environment, else defaults.

Environment variables (all optional):

- ``ALERTS_WEBHOOK_ALLOW`` — CIDRs/host names exempt from the SSRF guard (in settings.py).
- ``ALERTS_RETRY_SCHEDULE`` — comma-separated seconds before each retry (default: the
  Standard Webhooks schedule, ~3 days over 10 attempts).
- ``ALERTS_DELIVERY_TIMEOUT_S`` — HTTP timeout per attempt (default 15).
- ``ALERTS_CLAIM_LEASE_S`` — a claim older than this is presumed dead (its worker was
  killed) and the delivery is retried (default 120; must exceed the timeout).
- ``ALERTS_GROUP_WAIT_S`` / ``ALERTS_GROUP_INTERVAL_S`` / ``ALERTS_REPEAT_INTERVAL_S`` —
  Alertmanager's timers (defaults 30 s, 300 s, 4 h).
- ``ALERTS_EXTERNAL_URL`` — base URL put in payload links (default: none).
- ``ALERTS_KICK_SWEEPER`` — queue a sweep as soon as deliveries are created (default
  true; the beat sweep every 5 s catches up otherwise).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from controlplane.core import envconfig as ec

from . import ssrf
from .lifecycle import LifecycleConfig

# Standard Webhooks' example schedule: the delay before attempt n+1 (attempt 1 is
# immediate). Ten attempts over a little more than 3 days in all. The outbox adds ±20 %
# jitter (delivery.JITTER).
DEFAULT_RETRY_SCHEDULE_S: tuple[float, ...] = (
    0,
    5,
    300,
    1800,
    7200,
    18000,
    36000,
    50400,
    72000,
    86400,
)


@dataclass(frozen=True)
class AlertsConf:
    allow: ssrf.AllowList
    retry_schedule_s: tuple[float, ...]
    timeout_s: float
    lease_s: float
    lifecycle: LifecycleConfig
    external_url: str
    kick_sweeper: bool = True


def _schedule(env) -> tuple[float, ...]:
    raw = ec.env_list(env, "ALERTS_RETRY_SCHEDULE", [])
    if not raw:
        return DEFAULT_RETRY_SCHEDULE_S
    try:
        values = tuple(float(x) for x in raw)
    except ValueError:
        raise ec.ConfigError(f"ALERTS_RETRY_SCHEDULE={raw!r}: numbers of seconds") from None
    if any(v < 0 for v in values):
        raise ec.ConfigError("ALERTS_RETRY_SCHEDULE must not hold negative delays")
    return values


def load() -> AlertsConf:
    """Read fresh each call (cheap), so tests can override settings and the environment."""
    env = os.environ
    try:
        allow_items = getattr(settings, "ALERTS_WEBHOOK_ALLOW", None)
        if allow_items is None:
            allow_items = ec.env_list(env, "ALERTS_WEBHOOK_ALLOW", [])
        allow = ssrf.parse_allow_list(allow_items)
        schedule = getattr(settings, "ALERTS_RETRY_SCHEDULE", None) or _schedule(env)
        timeout = getattr(settings, "ALERTS_DELIVERY_TIMEOUT_S", None) or ec.env_float(
            env, "ALERTS_DELIVERY_TIMEOUT_S", 15.0, minimum=0.1, maximum=60
        )
        lease = getattr(settings, "ALERTS_CLAIM_LEASE_S", None) or ec.env_float(
            env, "ALERTS_CLAIM_LEASE_S", 120.0, minimum=1
        )
        lifecycle = getattr(settings, "ALERTS_LIFECYCLE", None) or LifecycleConfig(
            group_wait_s=ec.env_float(env, "ALERTS_GROUP_WAIT_S", 30.0, minimum=0),
            group_interval_s=ec.env_float(env, "ALERTS_GROUP_INTERVAL_S", 300.0, minimum=0),
            repeat_interval_s=ec.env_float(env, "ALERTS_REPEAT_INTERVAL_S", 14400.0, minimum=1),
        )
        external_url = getattr(settings, "ALERTS_EXTERNAL_URL", None) or (
            ec.env_url(env, "ALERTS_EXTERNAL_URL", {"http", "https"}) or ""
        )
        kick = getattr(settings, "ALERTS_KICK_SWEEPER", None)
        if kick is None:
            kick = ec.env_bool(env, "ALERTS_KICK_SWEEPER", True)
    except (ec.ConfigError, ValueError) as exc:
        raise ImproperlyConfigured(f"pdplane alerts configuration error: {exc}") from None
    if lease <= timeout:
        raise ImproperlyConfigured(
            f"ALERTS_CLAIM_LEASE_S ({lease}) must exceed ALERTS_DELIVERY_TIMEOUT_S ({timeout}):"
            " a live send would otherwise be reclaimed and sent twice"
        )
    return AlertsConf(
        allow,
        tuple(schedule),
        float(timeout),
        float(lease),
        lifecycle,
        external_url,
        bool(kick),
    )
