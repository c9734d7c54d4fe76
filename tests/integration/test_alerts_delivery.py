"""Webhook delivery end to end: real receiver process verifying signatures with the
``standardwebhooks`` library, real database, the real outbox worker loop."""

from __future__ import annotations

import time

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.alerts import delivery as outbox
from controlplane.alerts.evaluation import run_cycle
from controlplane.alerts.models import (
    WEBHOOK_KIND,
    Alert,
    AlertRule,
    Delivery,
    DeliveryStatus,
    WebhookEndpoint,
    WebhookFormat,
)
from controlplane.alerts.rules import NODE_OFFLINE, FleetSnapshot
from controlplane.outbox.worker import drain
from tests.conftest import WAIT_S
from tests.integration.alerts_support.fixtures import (
    FAST_SETTINGS,
    Receiver,
    offline_snapshot,
    running_receiver,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
]


@pytest.fixture(autouse=True)
def fast_alerts():
    with override_settings(**FAST_SETTINGS):
        AlertRule.objects.create(rule=NODE_OFFLINE, for_seconds=0)
        yield


def cycle(*nodes: str, cluster: str = "c1"):
    return run_cycle(snapshot=offline_snapshot(time.time(), *nodes, cluster=cluster))


def sweep(**kw) -> dict:
    """One run of the outbox's worker loop over webhook deliveries."""
    return drain([WEBHOOK_KIND], **kw)


def sweep_until_settled(timeout: float = WAIT_S):
    """Run the sweeper until nothing is pending (or the timeout)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sweep(time_budget_s=5)
        if not Delivery.objects.filter(
            status__in=[DeliveryStatus.PENDING, DeliveryStatus.SENDING]
        ).exists():
            return
        time.sleep(0.1)
    raise AssertionError("deliveries still pending")


def three_clusters_offline() -> FleetSnapshot:
    now = time.time()
    nodes = [offline_snapshot(now, "n1", cluster=c).nodes[0] for c in ("c1", "c2", "c3")]
    return FleetSnapshot(now=now, nodes=tuple(nodes))


def make_endpoint(url: str, **kw) -> WebhookEndpoint:
    return WebhookEndpoint.objects.create(name=kw.pop("name", "oncall"), url=url, **kw)


def test_firing_then_resolved_arrive_once_each_with_stable_id_on_retries(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        rx.control(fail_first=2)  # every message fails twice before it is accepted
        cycle("gpu-01")
        cycle("gpu-01")  # still offline: nothing new to say
        sweep_until_settled()
        cycle()  # back online
        sweep_until_settled()

        requests = rx.requests()
        assert all(r["verified"] for r in requests), requests
        got = rx.delivered()
        assert [r["body"]["status"] for r in got] == ["firing", "resolved"]
        # Retries reuse the webhook-id: 3 requests per message, 2 distinct ids.
        assert len(requests) == 6
        assert len({r["id"] for r in requests}) == 2
        alert = got[0]["body"]["alerts"][0]
        assert alert["labels"]["node"] == "gpu-01"
        assert alert["labels"]["alertname"] == NODE_OFFLINE
        assert got[1]["body"]["alerts"][0]["ends_at"] is not None

    for d in Delivery.objects.all():
        assert d.status == DeliveryStatus.DELIVERED
        assert d.attempts == 3
        assert [a.outcome for a in d.attempt_log.all()] == ["retry", "retry", "delivered"]
        assert [a.status_code for a in d.attempt_log.all()] == [503, 503, 200]
    closed = Alert.objects.get()
    assert not closed.is_open and closed.status == "resolved"


def test_receiver_down_then_up_loses_nothing(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    rx = Receiver(tmp_path, ep.secret)
    ep.url = rx.url
    ep.save()
    # Three groups (three clusters) fire while nobody listens.
    run_cycle(snapshot=three_clusters_offline())
    run_cycle(snapshot=three_clusters_offline())
    assert Delivery.objects.count() == 3
    # Sweeps until each has been tried and retried (the schedule retries within a second).
    deadline = time.monotonic() + WAIT_S
    while not all(d.attempts >= 2 for d in Delivery.objects.all()):
        assert time.monotonic() < deadline, list(Delivery.objects.values("attempts"))
        sweep(time_budget_s=2)
        time.sleep(0.1)
    assert Delivery.objects.filter(status=DeliveryStatus.PENDING).count() == 3
    errors = {a.error.split(":")[0] for a in Delivery.objects.first().attempt_log.all()}
    assert errors == {"ConnectionRefusedError"}

    rx.start()
    try:
        sweep_until_settled()
        got = rx.delivered()
    finally:
        rx.stop()
    assert sorted(r["body"]["group_labels"]["cluster"] for r in got) == ["c1", "c2", "c3"]
    assert all(r["verified"] for r in rx.requests())
    assert set(Delivery.objects.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}


def test_gone_disables_endpoint_and_raises_a_notice(tmp_path):
    gone = make_endpoint("http://placeholder.invalid/", name="gone")
    other = make_endpoint("http://placeholder.invalid/", name="still-here")
    with (
        running_receiver(tmp_path, gone.secret) as rx_gone,
        running_receiver(tmp_path, other.secret) as rx_other,
    ):
        gone.url, other.url = rx_gone.url, rx_other.url
        gone.save()
        other.save()
        rx_gone.control(status=410)
        cycle("n1")
        sweep_until_settled()
        gone.refresh_from_db()
        assert not gone.enabled
        assert "410" in gone.disabled_reason
        assert gone.deliveries.get().status == DeliveryStatus.FAILED
        assert len(rx_gone.requests()) == 1  # 410 is final: no retry

        # The next evaluation raises the notice, and it reaches the endpoint still enabled.
        cycle("n1")
        sweep_until_settled()
        names = [
            a["labels"]["alertname"] for r in rx_other.delivered() for a in r["body"]["alerts"]
        ]
        assert "WebhookEndpointDisabled" in names
        assert len(rx_gone.requests()) == 1


def test_alertmanager_body_has_every_v4_field(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/", format=WebhookFormat.ALERTMANAGER)
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        cycle("n1", "n2")
        sweep_until_settled()
        cycle()
        sweep_until_settled()
        firing, resolved = (r["body"] for r in rx.delivered())
    top = {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    per_alert = {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    for body in (firing, resolved):
        assert set(body) == top
        assert body["version"] == "4"
        assert body["receiver"] == "oncall"
        assert body["truncatedAlerts"] == 0
        assert len(body["alerts"]) == 2
        for a in body["alerts"]:
            assert set(a) == per_alert
    assert firing["status"] == "firing"
    assert firing["groupLabels"] == {"alertname": NODE_OFFLINE, "cluster": "c1"}
    assert firing["commonLabels"]["cluster"] == "c1" and "node" not in firing["commonLabels"]
    assert firing["alerts"][0]["endsAt"] == "0001-01-01T00:00:00Z"
    assert resolved["status"] == "resolved"
    assert all(a["endsAt"] != "0001-01-01T00:00:00Z" for a in resolved["alerts"])
    assert firing["groupKey"] == resolved["groupKey"]


def test_retry_after_is_honoured(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        rx.control(status=429, retry_after=30)
        cycle("n1")
        before = timezone.now()
        sweep()
        d = Delivery.objects.get()
        assert d.status == DeliveryStatus.PENDING
        assert (d.next_attempt_at - before).total_seconds() >= 29
        assert d.attempt_log.get().status_code == 429


def test_test_send_is_signed_and_never_retried(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        ok = outbox.send_test(ep)
        assert ok.status == DeliveryStatus.DELIVERED
        rx.control(status=500)
        bad = outbox.send_test(ep)
        assert bad.status == DeliveryStatus.FAILED and bad.next_attempt_at is None
        sweep()
        assert len(rx.requests()) == 2
        assert all(r["verified"] for r in rx.requests())
        assert rx.requests()[0]["body"]["type"] == "pdplane.webhook.test"


def test_rotated_secret_overlaps(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    old_secret = ep.secret
    with running_receiver(tmp_path, old_secret) as rx:
        ep.url = rx.url
        ep.rotate_secret()
        ep.save()
        assert ep.secret != old_secret
        assert outbox.send_test(ep).status == DeliveryStatus.DELIVERED
        assert rx.requests()[0]["signature"].count("v1,") == 2
    with running_receiver(tmp_path, ep.secret) as rx_new:
        ep.url = rx_new.url
        ep.save()
        assert outbox.send_test(ep).status == DeliveryStatus.DELIVERED


def test_private_target_refused_without_allow_list(tmp_path):
    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx, override_settings(ALERTS_WEBHOOK_ALLOW=[]):
        ep.url = rx.url
        ep.save()
        d = outbox.send_test(ep)
        assert d.status == DeliveryStatus.FAILED
        assert "refused" in d.attempt_log.get().error
        assert rx.requests() == []


def test_filters_and_silence(tmp_path):
    from datetime import timedelta

    from controlplane.alerts.models import Silence

    critical_only = make_endpoint("http://placeholder.invalid/", min_severity="critical")
    prod_only = make_endpoint(
        "http://placeholder.invalid/", name="prod", label_filters={"cluster": "prod"}
    )
    with (
        running_receiver(tmp_path, critical_only.secret) as rx1,
        running_receiver(tmp_path, prod_only.secret) as rx2,
    ):
        critical_only.url, prod_only.url = rx1.url, rx2.url
        critical_only.save()
        prod_only.save()
        Silence.objects.create(
            matchers={"node": "muted"}, ends_at=timezone.now() + timedelta(hours=1), comment="t"
        )
        run_cycle(snapshot=offline_snapshot(time.time(), "a", "muted", cluster="prod"))
        run_cycle(snapshot=FleetSnapshot(now=time.time()))  # resolves "a"
        sweep_until_settled()
        nodes1 = [a["labels"]["node"] for r in rx1.delivered() for a in r["body"]["alerts"]]
        nodes2 = [a["labels"]["node"] for r in rx2.delivered() for a in r["body"]["alerts"]]
    assert nodes1 == ["a", "a"]  # firing then resolved, the silenced node never
    assert nodes2 == ["a", "a"]


def test_concurrent_sweepers_never_send_twice(tmp_path):
    """Four sweepers race over 24 due deliveries: the conditional UPDATE gives each
    message to exactly one of them."""
    import threading

    from django.db import connection

    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        rx.control(delay_s=0.02)
        for i in range(24):
            Delivery.objects.create(
                endpoint=ep,
                event_type="alerts.notification",
                payload={"n": i},
                next_attempt_at=timezone.now(),
            )
        errors = []
        together = threading.Barrier(4, timeout=WAIT_S)  # all four sweep from the start

        def sweeper(name):
            try:
                together.wait()
                sweep(worker=name, time_budget_s=20)
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
            finally:
                connection.close()

        threads = [threading.Thread(target=sweeper, args=(f"w{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        assert not errors
        ids = [r["id"] for r in rx.requests()]
    assert len(ids) == 24 and len(set(ids)) == 24
    workers = set(Delivery.objects.values_list("attempt_log__worker", flat=True))
    assert len(workers) > 1  # the work really was shared
    assert set(Delivery.objects.values_list("status", flat=True)) == {DeliveryStatus.DELIVERED}


def test_expired_claim_is_resent_and_a_poison_message_gives_up(tmp_path):
    from datetime import timedelta

    ep = make_endpoint("http://placeholder.invalid/")
    with running_receiver(tmp_path, ep.secret) as rx:
        ep.url = rx.url
        ep.save()
        long_ago = timezone.now() - timedelta(seconds=FAST_SETTINGS["ALERTS_CLAIM_LEASE_S"] + 5)
        common = dict(
            endpoint=ep,
            event_type="alerts.notification",
            payload={},
            status=DeliveryStatus.SENDING,
            claimed_by="dead-worker",
            claimed_at=long_ago,
            lease_until=long_ago + timedelta(seconds=FAST_SETTINGS["ALERTS_CLAIM_LEASE_S"]),
        )
        lost = Delivery.objects.create(**common, attempts=1)
        poison = Delivery.objects.create(
            **common, attempts=len(FAST_SETTINGS["ALERTS_RETRY_SCHEDULE"])
        )
        counts = sweep()
        assert counts["reclaimed"] == 2
        lost.refresh_from_db()
        poison.refresh_from_db()
        assert lost.status == DeliveryStatus.DELIVERED
        assert [a.outcome for a in lost.attempt_log.all()] == ["lost", "delivered"]
        assert poison.status == DeliveryStatus.FAILED
        assert [r["id"] for r in rx.requests()] == [lost.webhook_id]


def test_endpoint_added_later_gets_no_resolved_for_what_it_never_saw(tmp_path):
    first = make_endpoint("http://placeholder.invalid/", name="first")
    with running_receiver(tmp_path, first.secret) as rx1:
        first.url = rx1.url
        first.save()
        cycle("n1")
        sweep_until_settled()
        late = make_endpoint("http://placeholder.invalid/", name="late")
        with running_receiver(tmp_path, late.secret) as rx2:
            late.url = rx2.url
            late.save()
            cycle()
            sweep_until_settled()
            assert rx2.requests() == []
        assert [r["body"]["status"] for r in rx1.delivered()] == ["firing", "resolved"]
