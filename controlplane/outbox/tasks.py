"""The worker loop as a Celery task, and the kick that runs it as soon as rows commit.

Beat runs ``outbox.deliver_due`` every 5 s (settings.CELERY_BEAT_SCHEDULE); domain code
calls :func:`kick` after writing rows so they go out at once.
"""

from __future__ import annotations

import contextlib
import logging

from celery import shared_task
from django.conf import settings
from django.db import transaction

from . import registry, store, worker

log = logging.getLogger(__name__)

# A retry sooner than this is scheduled as a short countdown, always far below the Redis
# visibility timeout (1 h); longer waits are only rows in the database.
MAX_COUNTDOWN_S = 30


def _actor(name: str):
    try:
        from controlplane.audit.context import actor
    except ImportError:
        return contextlib.nullcontext()
    return actor(name)


@shared_task(name="outbox.deliver_due", ignore_result=True, bind=True)
def deliver_due(self, kinds: list[str] | None = None) -> dict:
    """Deliver every due message (of ``kinds``, or all), then schedule a near retry."""
    with _actor("outbox"):
        counts = worker.drain(kinds)
    sent = sum(n for outcome, n in counts.items() if outcome != "reclaimed")
    wait = store.next_due_in(kinds)
    if sent and wait is not None and wait <= MAX_COUNTDOWN_S:
        queue = (getattr(self.request, "delivery_info", None) or {}).get("routing_key")
        deliver_due.apply_async((kinds,), countdown=max(wait, 0.5), queue=queue)
    return counts


def kick(kind: str) -> None:
    """Deliver this kind's messages as soon as the current transaction commits, rather
    than at the next beat tick (best effort: beat catches up)."""
    transaction.on_commit(lambda: _send(kind), robust=True)


def _send(kind: str) -> None:
    setting = registry.get(kind).queue_setting
    queue = getattr(settings, setting, None) if setting else None
    try:
        deliver_due.apply_async(([kind],), queue=queue, expires=30)
    except Exception:
        log.warning("outbox: could not kick the worker loop for %s", kind, exc_info=True)
