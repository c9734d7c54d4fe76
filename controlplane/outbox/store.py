"""Claim, lease, record, retry: the outbox's state changes, on the database alone.

The database is the queue (as in Healthchecks): a message is claimed with a conditional
``UPDATE … WHERE status = 'pending'``, so several workers sweep without locks and without
sending one message twice at once. One message is claimed at a time, so a slow receiver
cannot make a claimed-but-waiting batch outlive its lease. A claim whose lease ran out
belongs to a worker that died mid-send: :func:`reclaim_expired` puts it back (the
receiver gets it again under the same id and dedupes), unless its attempts are used up.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.db.models.signals import post_save
from django.utils import timezone

from . import registry
from .models import Attempt, Message, Status
from .registry import Result

log = logging.getLogger(__name__)

GAVE_UP = "failed"  # the outcome recorded when a transient failure used the last attempt


def _of_kinds(qs, kinds: Iterable[str] | None):
    return qs.filter(kind__in=list(kinds)) if kinds is not None else qs


def claim(pk: int, worker: str, *, now: datetime, lease_s: float, due_only: bool = False
          ) -> bool:
    """Take one pending message (with ``due_only``, only if it is due); False when someone
    else got it first. The attempt counts from here, so a worker killed mid-send has
    used one."""
    candidate = Message.objects.filter(pk=pk, status=Status.PENDING)
    if due_only:
        candidate = candidate.filter(next_attempt_at__lte=now)
    return bool(
        candidate.update(
            status=Status.SENDING,
            claimed_by=worker,
            claimed_at=now,
            lease_until=now + timedelta(seconds=lease_s),
            attempts=F("attempts") + 1,
        )
    )


def claim_next_due(kinds: Iterable[str], worker: str, *, now: datetime
                   ) -> tuple[int, str] | None:
    """Claim the message that has been due longest: (pk, kind), None when nothing is due."""
    due = _of_kinds(Message.objects.filter(status=Status.PENDING, next_attempt_at__lte=now),
                    kinds)
    for _ in range(5):  # lost races: try the next candidate
        row = due.order_by("next_attempt_at", "pk").values_list("pk", "kind").first()
        if row is None:
            return None
        pk, kind = row
        if claim(pk, worker, now=now, lease_s=registry.get(kind).lease_s(), due_only=True):
            return pk, kind
    return None


def reclaim_expired(*, now: datetime, kinds: Iterable[str] | None = None) -> int:
    """Claims whose lease ran out: their worker died mid-send. Put them back, unless the
    attempts are used up (a message that kills every worker must not loop forever) or
    the message was never the worker loop's to send (``next_attempt_at`` empty)."""
    stale = _of_kinds(Message.objects.filter(status=Status.SENDING, lease_until__lt=now), kinds)
    count = 0
    for pk, kind, claimed_by, claimed_at, lease_until, attempts, due in stale.values_list(
        "pk", "kind", "claimed_by", "claimed_at", "lease_until", "attempts", "next_attempt_at"
    ):
        exhausted = due is None or attempts >= registry.get(kind).backoff().max_attempts
        after = (
            {"status": Status.FAILED, "outcome": GAVE_UP, "next_attempt_at": None,
             "finished_at": now}
            if exhausted
            else {"status": Status.PENDING, "outcome": "lost", "next_attempt_at": now}
        )
        lease_s = (lease_until - claimed_at).total_seconds() if claimed_at else 0.0
        error = (
            f"claim by {claimed_by} expired after {lease_s:.0f} s (worker stopped "
            "mid-delivery); " + ("attempts used up" if exhausted else "sending again")
        )
        mine = Message.objects.filter(pk=pk, status=Status.SENDING, claimed_by=claimed_by)
        with transaction.atomic():
            if not mine.update(claimed_by="", claimed_at=None, lease_until=None,
                               last_error=error, **after):
                continue
            Attempt.objects.create(
                message_id=pk,
                number=attempts,
                started_at=claimed_at or now,
                worker=claimed_by,
                latency_ms=((now - claimed_at).total_seconds() * 1000) if claimed_at else 0.0,
                error=error,
                outcome=GAVE_UP if exhausted else "lost",
            )
        count += 1
        log.warning("outbox %s #%s: reclaimed from %s", kind, pk, claimed_by)
    return count


def record(message: Message, worker: str, result: Result, started: datetime) -> str:
    """Store one attempt of a message this worker claimed and decide what comes next.
    Returns the outcome recorded (the deliverer's, or ``failed`` when it gave up)."""
    now = timezone.now()
    outcome, status = result.outcome, result.status
    updates: dict = {}
    if status is None:
        delay = registry.get(message.kind).backoff().delay(
            message.attempts, retry_after=result.retry_after_s
        )
        if delay is None:
            outcome, status = GAVE_UP, Status.FAILED
        else:
            status = Status.PENDING
            updates["next_attempt_at"] = now + timedelta(seconds=delay)
    if status != Status.PENDING:
        updates.update(next_attempt_at=None, finished_at=now)
    updates.update(
        status=status,
        outcome=outcome,
        claimed_by="",
        claimed_at=None,
        lease_until=None,
        last_status_code=result.status_code,
        last_error=result.error
        or ("" if status == Status.DELIVERED else result.response_excerpt[:500]),
        updated=now,
    )
    with transaction.atomic():
        Attempt.objects.create(
            message_id=message.pk,
            number=message.attempts,
            started_at=started,
            worker=worker,
            status_code=result.status_code,
            latency_ms=result.latency_ms,
            response_excerpt=result.response_excerpt[:1000],
            error=result.error,
            outcome=outcome,
            detail=result.detail,
        )
        mine = Message.objects.filter(pk=message.pk, status=Status.SENDING, claimed_by=worker)
        if not mine.update(**updates) and status == Status.DELIVERED:
            # Our lease ran out and someone else took it; the receiver has it anyway.
            Message.objects.filter(pk=message.pk).exclude(status=Status.DELIVERED).update(
                **updates
            )
        if result.then is not None:
            result.then()
        # Conditional UPDATEs send no signals; listeners of the row's own model (live
        # page hints) hear of the answer as if it had been saved.
        for name, value in updates.items():
            setattr(message, name, value)
        post_save.send(sender=type(message), instance=message, created=False,
                       update_fields=frozenset(updates), raw=False, using=message._state.db)
    return outcome


def cancel(messages, outcome: str = "cancelled") -> int:
    """Cancel the pending ones among ``messages`` (a queryset of Message or a child)."""
    pks = list(messages.filter(status=Status.PENDING).values_list("pk", flat=True))
    return Message.objects.filter(pk__in=pks, status=Status.PENDING).update(
        status=Status.CANCELLED, outcome=outcome, next_attempt_at=None,
        finished_at=timezone.now(),
    )


def redeliver(pk: int) -> bool:
    """Queue a message again (same id, same body) with a fresh retry schedule, due now;
    False while it is being sent."""
    return bool(
        Message.objects.filter(pk=pk)
        .exclude(status=Status.SENDING)
        .update(status=Status.PENDING, attempts=0, next_attempt_at=timezone.now(),
                finished_at=None)
    )


def next_due_in(kinds: Iterable[str] | None = None) -> float | None:
    """Seconds until the earliest pending message is due (None when none is pending)."""
    pending = _of_kinds(Message.objects.filter(status=Status.PENDING,
                                               next_attempt_at__isnull=False), kinds)
    first = pending.order_by("next_attempt_at").values_list("next_attempt_at", flat=True).first()
    if first is None:
        return None
    return max((first - timezone.now()).total_seconds(), 0.0)
