"""Issue 20, defect 1: a policy value or a row can no longer stop all routing.

The policy is refused where it is written (API, UI, model clean all run validate_policy),
and a routing table is checked against its JSON Schema before it is stored: an invalid one
is never stored or pushed; the refusal is a typed error, logged and in the change log.
"""

import logging

import pytest

from controlplane.audit.models import ChangeRecord
from controlplane.policies.models import Policy
from controlplane.routing.models import GatewayDelivery, RoutingTableVersion
from controlplane.routing.service import InvalidRoutingTable, publish, request_publish
from controlplane.topology.models import Worker
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin():
    return token_client(make_user("admin"))[0]


@pytest.mark.parametrize("body", [{"routing_block_size": -5}, {"local_prefill_max_tokens": -1},
                                  {"min_decode_workers": -1}])
def test_defect1_api_refuses_policy_values_that_break_tables(admin, body):
    fleet = build_fleet()
    response = admin.patch(f"/api/v1/policies/{fleet['policy'].pk}/", body, format="json")
    assert response.status_code == 400, response.content
    assert set(body) <= set(response.json()["error"]["fields"])
    fleet["policy"].refresh_from_db()
    assert all(getattr(fleet["policy"], k) is None for k in body)


def test_defect1_stored_bad_policy_still_routes_with_defaults():
    """A row written before this check (or by raw SQL) falls back to defaults, so the
    published table stays valid."""
    fleet = build_fleet()
    Policy.objects.filter(pk=fleet["policy"].pk).update(routing_block_size=-5)
    row = publish(fleet["cluster"].pk, "test", "tester")
    model = row.body["models"][0]
    assert model["routing"]["block_size"] >= 1


def test_defect1_invalid_table_is_never_stored_or_pushed(caplog):
    fleet = build_fleet()
    # A worker row with no URL (the API requires one; an old row or raw SQL may not).
    Worker.objects.filter(pk=fleet["worker"].pk).update(api_url="")
    with (caplog.at_level(logging.ERROR, logger="controlplane.routing.service"),
          pytest.raises(InvalidRoutingTable) as exc):
        publish(fleet["cluster"].pk, "test", "tester")
    assert any("url" in p for p in exc.value.problems)
    assert not RoutingTableVersion.objects.filter(cluster=fleet["cluster"]).exists()
    assert not GatewayDelivery.objects.exists()
    assert "refused" in caplog.text
    record = ChangeRecord.objects.filter(verb="routing_table_refused").get()
    assert record.after["problems"]
    # Callers that publish as a side effect (API hooks, planner) are not broken by it.
    request_publish(fleet["cluster"].pk, "side effect", "tester")
    assert not RoutingTableVersion.objects.exists()


def test_defect1_api_publish_of_invalid_table_is_a_typed_4xx(admin):
    fleet = build_fleet()
    Worker.objects.filter(pk=fleet["worker"].pk).update(api_url="")
    response = admin.post(f"/api/v1/clusters/{fleet['cluster'].pk}/publish-routing-table/",
                          {}, format="json")
    assert response.status_code == 400, response.content
    assert "routing table" in response.json()["error"]["message"]


def test_defect1_policy_page_refuses_the_same_values(client):
    """The UI form runs the model's clean(), i.e. the same validate_policy."""
    fleet = build_fleet()
    client.force_login(make_user("admin", "ui-admin"))
    response = client.post(f"/policies/{fleet['cluster'].name}/edit",
                           {"routing_block_size": "-5", "local_prefill_max_tokens": "-1"})
    assert response.status_code == 200  # the form again, with its errors
    errors = response.context["form"].errors
    assert "routing_block_size" in errors and "local_prefill_max_tokens" in errors
    fleet["policy"].refresh_from_db()
    assert fleet["policy"].routing_block_size is None
