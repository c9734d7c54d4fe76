"""REST resources for alerts: roles, secret shown once, actions, schema."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.alerts.models import Alert, Delivery, WebhookEndpoint
from tests.integration.api_support import make_user, token_client

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def clients():
    return {role: token_client(make_user(role))[0] for role in ("viewer", "operator", "admin")}


def firing_alert():
    now = timezone.now()
    return Alert.objects.create(
        fingerprint="f00d",
        rule="NodeOffline",
        severity="critical",
        labels={"node": "n1"},
        annotations={"summary": "n1 offline"},
        group_key="g",
        status="firing",
        active_since=now,
        starts_at=now,
        last_evaluated_at=now,
    )


@override_settings(ALERTS_WEBHOOK_ALLOW=["127.0.0.1/32"])
def test_endpoint_secret_only_in_create_and_rotate(clients):
    admin = clients["admin"]
    body = {
        "name": "pager",
        "url": "http://127.0.0.1:9/x",
        "format": "alertmanager",
        "min_severity": "warning",
        "label_filters": {"cluster": "prod"},
    }
    created = admin.post("/api/v1/webhook-endpoints/", body, format="json")
    assert created.status_code == 201, created.content
    secret = created.json()["secret"]
    assert secret.startswith("whsec_") and secret == WebhookEndpoint.objects.get().secret
    pk = created.json()["id"]
    assert "secret" not in admin.get(f"/api/v1/webhook-endpoints/{pk}/").json()
    assert secret not in str(admin.get("/api/v1/webhook-endpoints/").json())
    rotated = admin.post(f"/api/v1/webhook-endpoints/{pk}/rotate-secret/")
    assert rotated.status_code == 200 and rotated.json()["secret"] != secret
    assert rotated.json()["previous_secret_expires_at"]

    # Operators test; viewers only read.
    assert clients["viewer"].post(f"/api/v1/webhook-endpoints/{pk}/test/").status_code == 403
    sent = clients["operator"].post(f"/api/v1/webhook-endpoints/{pk}/test/")
    assert sent.status_code == 200 and sent.json()["status"] == "failed"
    assert sent.json()["attempt_log"][0]["error"].startswith("ConnectionRefusedError")
    assert (
        clients["operator"].post("/api/v1/webhook-endpoints/", body, format="json").status_code
        == 403
    )


def test_private_url_refused_with_a_field_error(clients):
    response = clients["admin"].post(
        "/api/v1/webhook-endpoints/", {"name": "x", "url": "http://10.0.0.1/"}, format="json"
    )
    assert response.status_code == 400
    assert "url" in str(response.json())


def test_acknowledge_and_silence_need_operator(clients):
    alert = firing_alert()
    assert (
        clients["viewer"].get("/api/v1/alerts/?status=firing").json()["results"][0]["fingerprint"]
        == "f00d"
    )
    assert clients["viewer"].post(f"/api/v1/alerts/{alert.pk}/acknowledge/").status_code == 403
    acked = clients["operator"].post(f"/api/v1/alerts/{alert.pk}/acknowledge/")
    assert acked.status_code == 200 and acked.json()["acknowledged"] is True
    silence = {"matchers": {"node": "n1"}, "ends_at": "2099-01-01T00:00:00Z", "comment": "m"}
    assert clients["viewer"].post("/api/v1/silences/", silence, format="json").status_code == 403
    made = clients["operator"].post("/api/v1/silences/", silence, format="json")
    assert made.status_code == 201, made.content
    bad = clients["operator"].post("/api/v1/silences/", {**silence, "matchers": {}}, format="json")
    assert bad.status_code == 400


def test_deliveries_list_and_redeliver(clients):
    ep = WebhookEndpoint.objects.create(name="e", url="https://example.com/hook")
    d = Delivery.objects.create(
        endpoint=ep,
        event_type="alerts.notification",
        payload={"a": 1},
        status="failed",
        attempts=10,
        next_attempt_at=None,
    )
    listed = clients["viewer"].get(f"/api/v1/webhook-deliveries/?endpoint_id={ep.pk}").json()
    assert listed["results"][0]["webhook_id"] == d.webhook_id
    assert (
        clients["viewer"].post(f"/api/v1/webhook-deliveries/{d.pk}/redeliver/").status_code == 403
    )
    again = clients["operator"].post(f"/api/v1/webhook-deliveries/{d.pk}/redeliver/")
    assert again.status_code == 200
    assert (again.json()["status"], again.json()["attempts"]) == ("pending", 0)
    assert again.json()["webhook_id"] == d.webhook_id


def test_rule_overrides_need_write(clients):
    body = {"rule": "KvCacheUsageHigh", "threshold": 0.9}
    assert clients["operator"].post("/api/v1/alert-rules/", body, format="json").status_code == 403
    assert clients["admin"].post("/api/v1/alert-rules/", body, format="json").status_code == 201
    bad = clients["admin"].post("/api/v1/alert-rules/", {"rule": "Nope"}, format="json")
    assert bad.status_code == 400


def test_schema_lists_alert_resources(clients):
    schema = clients["viewer"].get("/api/schema/?format=json").json()
    for path in (
        "/api/v1/alerts/",
        "/api/v1/webhook-endpoints/{id}/rotate-secret/",
        "/api/v1/webhook-deliveries/{id}/redeliver/",
        "/api/v1/silences/",
    ):
        assert path in schema["paths"], path
