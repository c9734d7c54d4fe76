"""A Celery worker killed mid-delivery: the claim's lease expires, another worker sends
the message again under the same webhook-id, and the receiver has it.

Real parts: a `celery -A controlplane worker -P solo` subprocess on the test database,
the Redis broker, a receiver process that verifies signatures with `standardwebhooks`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import pytest
from django.db import connection
from django.test import override_settings

from controlplane.alerts.evaluation import run_cycle
from controlplane.alerts.models import AlertRule, Delivery, DeliveryStatus, WebhookEndpoint
from controlplane.alerts.rules import NODE_OFFLINE
from tests.conftest import ROOT, python_env, wait_until
from tests.integration.alerts_support.fixtures import (
    FAST_SETTINGS,
    offline_snapshot,
    running_receiver,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(300),
]

LEASE_S = 16
TIMEOUT_S = 15  # long enough that the kill, not the timeout, ends the request


def database_url() -> str:
    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class Worker:
    def __init__(self, queue: str, log_path):
        self.queue, self.log_path = queue, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> Worker:
        env = python_env(
            DATABASE_URL=database_url(),
            ALERTS_WEBHOOK_ALLOW="127.0.0.1/32",
            ALERTS_RETRY_SCHEDULE="0,0.5,0.5,0.5,1,1,1,1,1,1",
            ALERTS_CLAIM_LEASE_S=str(LEASE_S),
            ALERTS_DELIVERY_TIMEOUT_S=str(TIMEOUT_S),
            ALERTS_KICK_SWEEPER="false",
            DJANGO_SETTINGS_MODULE="controlplane.settings",
        )
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "controlplane",
                "worker",
                "-P",
                "solo",
                "-Q",
                self.queue,
                "-n",
                f"{self.queue}-{uuid.uuid4().hex[:4]}@localhost",
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "-l",
                "INFO",
            ],
            cwd=ROOT,
            env=env,
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        return self

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.log.close()


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="the worker needs a shared (non-memory) database"
)
def test_worker_killed_mid_delivery_is_redelivered_after_restart(tmp_path):
    from controlplane.celery import app

    queue = f"alerts-test-{uuid.uuid4().hex[:8]}"

    def sweep_soon():
        app.send_task("outbox.deliver_due", args=(["alerts.webhook"],), queue=queue, expires=20)

    with override_settings(**FAST_SETTINGS):
        AlertRule.objects.create(rule=NODE_OFFLINE, for_seconds=0)
        ep = WebhookEndpoint.objects.create(name="oncall", url="http://placeholder.invalid/")
        first = second = None
        with running_receiver(tmp_path, ep.secret) as rx:
            ep.url = rx.url
            ep.save()
            rx.control(delay_s=200)  # slow: the worker is stuck inside the request
            run_cycle(snapshot=offline_snapshot(time.time(), "gpu-09"))
            delivery = Delivery.objects.get()
            try:
                first = Worker(queue, tmp_path / "worker1.log").start()
                sweep_soon()
                wait_until(lambda: rx.requests(), 120, what="the first request")
                delivery.refresh_from_db()
                assert delivery.status == DeliveryStatus.SENDING
                first.kill()  # SIGKILL mid-request: no chance to record anything

                rx.control(delay_s=0)
                second = Worker(queue, tmp_path / "worker2.log").start()

                def delivered():
                    sweep_soon()
                    delivery.refresh_from_db()
                    return delivery.status == DeliveryStatus.DELIVERED

                wait_until(delivered, LEASE_S + 120, interval=1.0, what="redelivery")
            finally:
                for w in (first, second):
                    if w:
                        w.stop()
                with app.connection_for_write() as conn:
                    conn.default_channel.queue_delete(queue)

            requests = rx.requests()
    assert [r["id"] for r in requests] == [delivery.webhook_id] * 2
    assert all(r["verified"] for r in requests)
    outcomes = [a.outcome for a in delivery.attempt_log.all()]
    assert outcomes == ["lost", "delivered"]
    assert "expired" in delivery.attempt_log.first().error
