"""What the gateways say about the data plane: the health of their prefill→decode pairs.

The control plane hears from a gateway when it answers a table push (its applied version);
pair health changes between pushes (a pair fails, cools down, is re-probed within seconds),
so the alerts evaluation (every 15 s) asks each pdplane gateway for it: a signed
``GET /admin/health`` with the gateway's push secret and a short timeout. The answer is kept
in Redis for the pages (:func:`cached`); an unreachable gateway is not asked again for
:data:`RETRY_AFTER_S`, so a dead one does not slow every evaluation (its pushes fail and
alert on their own).
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

from gateway.signing import signed_headers

from .rules import PdPairFacts

log = logging.getLogger(__name__)

HEALTH_PATH = "/admin/health"
TIMEOUT_S = 2.0
KEEP_S = 120  # a cached answer older than this is not shown
RETRY_AFTER_S = 60.0
MAX_PAIRS = 500  # a gateway's answer is trusted only this far
_failed_at: dict[int, float] = {}


def _key(gateway_pk: int) -> str:
    from controlplane.telemetry.hotstate import prefix

    return f"{prefix()}gwh:{gateway_pk}"


def fetch(url: str, secret: str, timeout_s: float = TIMEOUT_S) -> dict | None:
    """The gateway's health answer, or None when it cannot be had. Never raises on I/O."""
    path = urlsplit(url).path.rstrip("/") + HEALTH_PATH
    request = urllib.request.Request(  # noqa: S310 - the URL is an operator-set gateway
        url.rstrip("/") + HEALTH_PATH,
        headers=signed_headers(secret, "GET", path, b"", now=time.time()),
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:  # noqa: S310
            answer = json.loads(response.read(1 << 20))
    except (urllib.error.URLError, OSError, TimeoutError, ValueError) as exc:
        log.info("gateway health %s unreadable: %s", url, exc)
        return None
    return answer if isinstance(answer, dict) else None


def pair_facts(health: dict | None) -> tuple[PdPairFacts, ...]:
    """The answer's ``pd_pairs``, defensively: a malformed entry is skipped, not trusted."""
    pairs = (health or {}).get("pd_pairs")
    if not isinstance(pairs, list):
        return ()
    out = []
    for item in pairs[:MAX_PAIRS]:
        if not isinstance(item, dict):
            continue
        prefill, decode, state = item.get("prefill"), item.get("decode"), item.get("state")
        if not all(isinstance(v, str) and v for v in (prefill, decode, state)):
            continue
        failures = item.get("failures")
        last = item.get("last_failure")
        out.append(PdPairFacts(
            prefill=prefill[:200], decode=decode[:200], state=state[:20],
            failures=failures if isinstance(failures, int) and failures >= 0 else 0,
            last_failure=last[:200] if isinstance(last, str) else "",
        ))
    return tuple(sorted(out, key=lambda p: (p.prefill, p.decode)))


def refresh(gateway, now: float | None = None) -> dict | None:
    """Ask one gateway (unless it failed within the last minute) and keep its answer."""
    now = time.time() if now is None else now
    if now - _failed_at.get(gateway.pk, -RETRY_AFTER_S) < RETRY_AFTER_S:
        return None
    health = fetch(gateway.url, gateway.secret)
    if health is None:
        _failed_at[gateway.pk] = now
        return None
    _failed_at.pop(gateway.pk, None)
    kept = {"at": now, "pd_pairs": [p.__dict__ for p in pair_facts(health)],
            "kv_streams": _stalled_streams(health)}
    try:
        from controlplane.telemetry.hotstate import sync_redis

        sync_redis().set(_key(gateway.pk), json.dumps(kept), ex=KEEP_S)
    except Exception:  # Redis down: the alert still sees this evaluation's answer
        log.warning("gateway health of %s not kept", gateway, exc_info=True)
    return kept


def stalled_streams(health: dict | None) -> tuple[tuple[str, str], ...]:
    """(worker id, reason) of the KV-event streams a kept answer (:func:`refresh`) lists
    as stalled."""
    streams = (health or {}).get("kv_streams")
    if not isinstance(streams, dict):
        return ()
    return tuple(sorted((str(w)[:200], str(r)[:200]) for w, r in streams.items()
                        if isinstance(r, str)))


def _stalled_streams(health: dict) -> dict[str, str]:
    """worker id → stall reason, for the gateway's stalled KV-event streams."""
    streams = health.get("kv_streams")
    if not isinstance(streams, dict):
        return {}
    return {str(w)[:200]: str(s.get("stall_reason") or "stalled")[:200]
            for w, s in list(streams.items())[:MAX_PAIRS]
            if isinstance(s, dict) and s.get("stalled") is True}


def cached(gateway_pk: int) -> dict | None:
    """The last answer kept for this gateway (≤ 2 minutes old), for pages; None if none."""
    try:
        from controlplane.telemetry.hotstate import sync_redis

        raw = sync_redis().get(_key(gateway_pk))
    except Exception:
        return None
    try:
        value = json.loads(raw) if raw else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
