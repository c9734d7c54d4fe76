"""The worker loop: reclaim dead claims, then claim and deliver due messages one by one."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from collections.abc import Iterable

from django.utils import timezone

from . import registry, store
from .models import Message
from .registry import Result

log = logging.getLogger(__name__)

BATCH = 50


def worker_identity() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


def deliver_claimed(pk: int, kind: str, worker: str) -> str:
    """Send one message this worker has claimed and record the attempt; returns the
    outcome recorded."""
    deliverer = registry.get(kind)
    message = deliverer.load(pk)
    started = timezone.now()
    t0 = time.perf_counter()
    try:
        result = deliverer.deliver(message, worker)
    except Exception as exc:  # one bad message must not stop the others
        log.exception("outbox %s #%s: the deliverer failed", kind, pk)
        result = Result("crashed", error=f"{type(exc).__name__}: {exc}"[:2000],
                        latency_ms=(time.perf_counter() - t0) * 1000)
    return store.record(message, worker, result, started)


def drain(
    kinds: Iterable[str] | None = None,
    *,
    worker: str | None = None,
    batch: int = BATCH,
    time_budget_s: float = 50.0,
) -> dict[str, int]:
    """Reclaim dead claims, then deliver due messages (of ``kinds``, default all
    registered) until none is due, the batch is done or the time budget is spent (the
    next run carries on). Returns how many ended with each outcome, and ``reclaimed``."""
    kinds = tuple(kinds) if kinds is not None else registry.kinds()
    worker = worker or worker_identity()
    counts: dict[str, int] = {"reclaimed": store.reclaim_expired(now=timezone.now(), kinds=kinds)}
    deadline = time.monotonic() + time_budget_s
    for _ in range(batch):
        if time.monotonic() > deadline:
            break
        claimed = store.claim_next_due(kinds, worker, now=timezone.now())
        if claimed is None:
            break
        pk, kind = claimed
        outcome = deliver_claimed(pk, kind, worker)
        counts[outcome] = counts.get(outcome, 0) + 1
    return counts


def send_now(message: Message, worker: str | None = None) -> str | None:
    """Claim and send one message at once, outside the loop (a test send); None when it
    was not pending."""
    worker = worker or worker_identity()
    lease = registry.get(message.kind).lease_s()
    if not store.claim(message.pk, worker, now=timezone.now(), lease_s=lease):
        return None
    return deliver_claimed(message.pk, message.kind, worker)
