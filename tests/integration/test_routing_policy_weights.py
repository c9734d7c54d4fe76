"""Issue 18: the routing table carries the router's affinity and balance weights from the
stored policy. The builder's unit test covers the builder alone; this one goes the whole
way an operator's change goes: the policy API, the stored row, the published table, the
gateway's parse of it."""

import pytest

from controlplane.routing.service import publish
from gateway.table import parse
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db

WEIGHTS = {"affinity_load_factor": 2.5, "affinity_kv_limit": 0.75, "prefix_min_match": 0.4,
           "cache_balance_band": 0.05}


def test_policy_weights_reach_the_published_table_and_the_gateway():
    fleet = build_fleet()
    admin = token_client(make_user("admin"))[0]
    response = admin.patch(f"/api/v1/policies/{fleet['policy'].pk}/",
                           {**WEIGHTS, "itl_p95_ms": 40}, format="json")
    assert response.status_code == 200, response.content

    row = publish(fleet["cluster"].pk, "test", "tester")
    routing = row.body["models"][0]["routing"]
    assert {k: routing[k] for k in WEIGHTS} == WEIGHTS
    assert routing["ttft_itl_ratio"] == 20.0  # the fleet's policy: TTFT 800 ms ÷ ITL 40 ms
    model = parse(row.body).models[fleet["model"].name]
    assert {k: getattr(model, k) for k in WEIGHTS} == WEIGHTS
    assert model.ttft_itl_ratio == 20.0


def test_a_policy_without_the_weights_publishes_the_gateways_defaults():
    """Unset fields merge to the effective policy's defaults, which equal the gateway's."""
    from gateway.table import ModelRoute

    fleet = build_fleet()
    row = publish(fleet["cluster"].pk, "test", "tester")
    routing = row.body["models"][0]["routing"]
    defaults = {k: ModelRoute.__dataclass_fields__[k].default for k in WEIGHTS}
    assert {k: routing[k] for k in WEIGHTS} == defaults


def test_the_api_refuses_weights_the_router_cannot_use():
    fleet = build_fleet()
    admin = token_client(make_user("admin"))[0]
    for body in ({"affinity_load_factor": -1}, {"affinity_kv_limit": 1.5},
                 {"cache_balance_band": -0.1}):
        response = admin.patch(f"/api/v1/policies/{fleet['policy'].pk}/", body, format="json")
        assert response.status_code == 400, (body, response.content)
        assert set(body) <= set(response.json()["error"]["fields"])
