"""Alert pages: who may see and do what; the secret is shown once."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import override_settings

from controlplane.alerts.models import Alert, AlertRule, Delivery, Silence, WebhookEndpoint
from controlplane.alerts.permissions import ACTION, WRITE, can

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


def user(name, role=None, staff=False):
    u = get_user_model().objects.create_user(name, password="pw-123456", is_staff=staff)
    if role:
        try:
            from controlplane.accounts.access import set_role
        except ImportError:
            u.is_staff = True
            u.save()
        else:
            set_role(u, role)
    return u


@pytest.fixture
def viewer(client):
    return user("viewer", "viewer")


@pytest.fixture
def admin_user():
    return user("boss", "admin")


def make_alert(**kw):
    from django.utils import timezone

    now = timezone.now()
    defaults = dict(
        fingerprint="abcd",
        rule="NodeOffline",
        severity="critical",
        labels={"alertname": "NodeOffline", "node": "n1", "cluster": "c1"},
        annotations={"summary": "Node n1 is offline"},
        group_key="g",
        status="firing",
        active_since=now,
        starts_at=now,
        last_evaluated_at=now,
    )
    return Alert.objects.create(**{**defaults, **kw})


def test_anonymous_is_sent_to_login(client):
    for url in ("/alerts/", "/alerts/rules/", "/alerts/endpoints/", "/alerts/deliveries/"):
        response = client.get(url)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"]


def test_viewer_reads_but_cannot_act(client, viewer):
    make_alert()
    client.force_login(viewer)
    for url in ("/alerts/", "/alerts/rules/", "/alerts/endpoints/", "/alerts/deliveries/"):
        assert client.get(url).status_code == 200
    page = client.get("/alerts/").content.decode()
    assert "Node n1 is offline" in page
    if not can(viewer, ACTION):
        assert "Acknowledge" not in page
        alert = Alert.objects.get()
        assert client.post(f"/alerts/{alert.pk}/ack/").status_code == 403
        assert client.post("/alerts/endpoints/new/", {}).status_code == 403


def test_operator_acknowledges_and_silences(client):
    op = user("op", "operator")
    alert = make_alert()
    client.force_login(op)
    assert client.post(f"/alerts/{alert.pk}/ack/").status_code == 302
    alert.refresh_from_db()
    assert alert.acknowledged_by == op
    response = client.post(
        "/alerts/silences/", {"matchers": "node=n1", "hours": "1", "comment": "maintenance"}
    )
    assert response.status_code == 302
    assert Silence.objects.get().matchers == {"node": "n1"}


@override_settings(ALERTS_WEBHOOK_ALLOW=["127.0.0.1/32"])
def test_admin_creates_endpoint_and_sees_secret_once(client, admin_user):
    assert can(admin_user, WRITE)
    client.force_login(admin_user)
    response = client.post(
        "/alerts/endpoints/new/",
        {
            "name": "pager",
            "url": "http://127.0.0.1:9/hook",
            "format": "alertmanager",
            "min_severity": "warning",
            "label_filters": "cluster=prod",
            "enabled": "on",
        },
    )
    assert response.status_code == 200
    ep = WebhookEndpoint.objects.get()
    assert ep.label_filters == {"cluster": "prod"}
    assert ep.secret in response.content.decode()
    assert ep.secret not in client.get(f"/alerts/endpoints/{ep.pk}/").content.decode()
    assert ep.secret not in client.get("/alerts/endpoints/").content.decode()
    old = ep.secret
    rotated = client.post(f"/alerts/endpoints/{ep.pk}/rotate/")
    ep.refresh_from_db()
    assert ep.secret != old and ep.previous_secret == old
    assert ep.secret in rotated.content.decode() and old not in rotated.content.decode()
    # Test send to a port nobody listens on: recorded, failed, not retried.
    response = client.post(f"/alerts/endpoints/{ep.pk}/test/")
    d = Delivery.objects.get()
    assert response.status_code == 302 and d.status == "failed" and d.is_test
    detail = client.get(f"/alerts/deliveries/{d.pk}/").content.decode()
    assert d.webhook_id in detail and "ConnectionRefusedError" in detail


def test_private_endpoint_refused_in_form(client, admin_user):
    client.force_login(admin_user)
    response = client.post(
        "/alerts/endpoints/new/",
        {
            "name": "internal",
            "url": "http://127.0.0.1:9/hook",
            "format": "native",
            "min_severity": "info",
            "label_filters": "",
        },
    )
    assert response.status_code == 200
    assert "ALERTS_WEBHOOK_ALLOW" in response.content.decode()
    assert not WebhookEndpoint.objects.exists()


def test_admin_sets_rule_override(client, admin_user):
    client.force_login(admin_user)
    response = client.post(
        "/alerts/rules/",
        {
            "rule": "KvCacheUsageHigh",
            "enabled": "on",
            "severity": "critical",
            "for_seconds": "60",
            "threshold": "0.9",
        },
    )
    assert response.status_code == 302
    rule = AlertRule.objects.get()
    assert (rule.severity, rule.for_seconds, rule.threshold) == ("critical", 60, 0.9)
    assert "threshold 0.9" in client.get("/alerts/rules/").content.decode()
