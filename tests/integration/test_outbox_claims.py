"""The outbox's claim, lease and retry on the real database (PostgreSQL), with a fake
deliverer registered for a kind of its own."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from controlplane.outbox import registry, store, worker
from controlplane.outbox.backoff import Backoff
from controlplane.outbox.models import Message, Status
from controlplane.outbox.registry import Result

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

KIND = "test.fake"


class FakeDeliverer(registry.Deliverer):
    kind = KIND

    def __init__(self):
        self.answers: list[Result] = []
        self.sent: list[tuple[int, str]] = []
        self.lock = threading.Lock()

    def lease_s(self) -> float:
        return 30.0

    def backoff(self) -> Backoff:
        return Backoff((0, 10, 20), jitter=(1.0, 1.0))

    def deliver(self, message, worker_name):
        with self.lock:
            self.sent.append((message.pk, worker_name))
            answer = self.answers.pop(0) if self.answers else Result("ok", Status.DELIVERED)
        if isinstance(answer, Exception):
            raise answer
        return answer


@pytest.fixture
def fake():
    deliverer = FakeDeliverer()
    registry.register(deliverer)
    yield deliverer
    registry._deliverers.pop(KIND, None)


def message(**fields) -> Message:
    return Message.objects.create(**{"kind": KIND, "next_attempt_at": timezone.now(), **fields})


def test_a_message_without_kind_is_refused():
    with pytest.raises(ValueError):
        Message.objects.create(next_attempt_at=timezone.now())


def test_claim_is_a_conditional_update_and_takes_a_lease(fake):
    m = message()
    now = timezone.now()
    assert store.claim(m.pk, "w1", now=now, lease_s=30)
    assert not store.claim(m.pk, "w2", now=now, lease_s=30)  # already sending
    m.refresh_from_db()
    assert (m.status, m.claimed_by, m.attempts) == (Status.SENDING, "w1", 1)
    assert m.lease_until == now + timedelta(seconds=30)


def test_not_yet_due_and_other_kinds_are_left_alone(fake):
    later = message(next_attempt_at=timezone.now() + timedelta(hours=1))
    assert store.claim_next_due([KIND], "w", now=timezone.now()) is None
    assert store.claim_next_due(["other.kind"], "w", now=later.next_attempt_at) is None
    assert store.claim_next_due([KIND], "w", now=later.next_attempt_at) == (later.pk, KIND)


@pytest.mark.skipif(connection.vendor != "postgresql", reason="threads need a real server")
def test_concurrent_workers_never_claim_one_message_twice(fake):
    for _ in range(30):
        message()
    errors = []

    def run(name):
        try:
            worker.drain([KIND], worker=name, time_budget_s=20)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    pks = [pk for pk, _ in fake.sent]
    assert len(pks) == 30 and len(set(pks)) == 30
    assert set(Message.objects.values_list("status", flat=True)) == {Status.DELIVERED}


def test_transient_failure_waits_per_backoff_then_gives_up(fake):
    m = message()
    fake.answers = [Result("retry", status_code=503), Result("retry", status_code=503),
                    Result("retry", status_code=503)]
    before = timezone.now()
    assert worker.drain([KIND]) == {"reclaimed": 0, "retry": 1}
    m.refresh_from_db()
    assert m.status == Status.PENDING and m.last_status_code == 503
    assert (m.next_attempt_at - before).total_seconds() >= 10  # schedule[1], no jitter
    for expected in ("retry", "failed"):
        Message.objects.filter(pk=m.pk).update(next_attempt_at=timezone.now())
        assert worker.drain([KIND])[expected] == 1
    m.refresh_from_db()
    assert (m.status, m.attempts, m.next_attempt_at) == (Status.FAILED, 3, None)
    assert [a.outcome for a in m.attempt_log.all()] == ["retry", "retry", "failed"]
    assert [a.number for a in m.attempt_log.all()] == [1, 2, 3]


def test_retry_after_is_a_floor(fake):
    m = message()
    fake.answers = [Result("retry", status_code=429, retry_after_s=120)]
    before = timezone.now()
    worker.drain([KIND])
    m.refresh_from_db()
    assert (m.next_attempt_at - before).total_seconds() >= 119


def test_a_crashing_deliverer_is_recorded_and_retried(fake):
    m = message()
    fake.answers = [RuntimeError("boom"), Result("ok", Status.DELIVERED)]
    assert worker.drain([KIND]) == {"reclaimed": 0, "crashed": 1}
    m.refresh_from_db()
    assert m.status == Status.PENDING and "boom" in m.last_error


def test_expired_lease_is_redelivered_and_exhausted_or_caller_sent_ones_give_up(fake):
    long_ago = timezone.now() - timedelta(seconds=60)
    dead = {"status": Status.SENDING, "claimed_by": "dead", "claimed_at": long_ago,
            "lease_until": long_ago + timedelta(seconds=30)}
    lost = message(attempts=1, **dead)
    poison = message(attempts=3, **dead)
    caller_sent = message(attempts=1, **{**dead, "next_attempt_at": None})
    alive = message(attempts=1, **{**dead, "lease_until": timezone.now() + timedelta(hours=1)})
    counts = worker.drain([KIND])
    assert counts["reclaimed"] == 3 and counts["ok"] == 1
    for m in (lost, poison, caller_sent, alive):
        m.refresh_from_db()
    assert lost.status == Status.DELIVERED and lost.attempts == 2
    assert [a.outcome for a in lost.attempt_log.all()] == ["lost", "ok"]
    assert "expired after 30 s" in lost.attempt_log.first().error
    assert poison.status == caller_sent.status == Status.FAILED
    assert alive.status == Status.SENDING  # its worker may still be sending
    assert [pk for pk, _ in fake.sent] == [lost.pk]


def test_a_late_success_wins_over_a_reclaim(fake):
    m = message()
    assert store.claim(m.pk, "slow", now=timezone.now(), lease_s=30)
    Message.objects.filter(pk=m.pk).update(claimed_by="someone-else")  # lease taken over
    m.refresh_from_db()
    store.record(m, "slow", Result("ok", Status.DELIVERED), timezone.now())
    m.refresh_from_db()
    assert m.status == Status.DELIVERED


def test_an_answer_is_announced_like_a_save(fake):
    from django.db.models.signals import post_save

    heard = []

    def listener(sender, instance, **kwargs):
        heard.append((instance.pk, instance.status, instance.outcome))

    post_save.connect(listener, sender=Message)
    try:
        m = message()
        worker.drain([KIND])
    finally:
        post_save.disconnect(listener, sender=Message)
    assert heard[-1] == (m.pk, Status.DELIVERED, "ok")


def test_cancel_and_redeliver(fake):
    m = message()
    assert store.cancel(Message.objects.filter(pk=m.pk), "superseded") == 1
    m.refresh_from_db()
    assert (m.status, m.outcome) == (Status.CANCELLED, "superseded")
    assert store.redeliver(m.pk)
    m.refresh_from_db()
    assert (m.status, m.attempts) == (Status.PENDING, 0)
    assert worker.send_now(m) == "ok"
    assert worker.send_now(m) is None  # no longer pending
