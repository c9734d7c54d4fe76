"""Plans through the API: list/detail, approve/reject (operators), trigger a run; what-if."""

import pytest

from controlplane.audit.models import ChangeRecord
from controlplane.planner.models import Plan
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return build_fleet()


def _plan(fleet, **extra):
    worker = fleet["worker"]
    return Plan.objects.create(
        cluster=fleet["cluster"], served_model=fleet["model"], current_layout="1A",
        target_layout="1P", diff=[{"worker_id": worker.pk, "worker": str(worker),
                                   "node": worker.node.hostname, "from_role": "both",
                                   "to_role": "prefill"}], **extra)


def test_list_and_detail(fleet):
    plan = _plan(fleet, inputs={"seen": 1})
    client, _ = token_client(make_user("viewer"), scope="read")
    listed = client.get(f"/api/v1/plans/?cluster_id={fleet['cluster'].pk}&status=proposed")
    assert listed.status_code == 200 and listed.json()["count"] == 1
    assert "inputs" not in listed.json()["results"][0]
    detail = client.get(f"/api/v1/plans/{plan.pk}/").json()
    assert detail["inputs"] == {"seen": 1} and detail["served_model"]["id"] == fleet["model"].pk
    assert detail["record"] == {}  # the planner's decision record (empty for a hand-made plan)


def test_operator_approves_viewer_cannot(fleet):
    plan = _plan(fleet)
    viewer, _ = token_client(make_user("viewer"), scope="read")
    assert viewer.post(f"/api/v1/plans/{plan.pk}/approve/").status_code == 403
    operator, _ = token_client(make_user("operator", "op"), scope="write")
    response = operator.post(f"/api/v1/plans/{plan.pk}/approve/", HTTP_IDEMPOTENCY_KEY="a1")
    assert response.status_code == 200, response.content
    assert response.json()["status"] in {"applying", "applied"}
    assert response.json()["decided_by"] == "op"
    replay = operator.post(f"/api/v1/plans/{plan.pk}/approve/", HTTP_IDEMPOTENCY_KEY="a1")
    assert replay.status_code == 200 and replay["Idempotent-Replayed"] == "true"
    again = operator.post(f"/api/v1/plans/{plan.pk}/approve/")
    assert again.status_code == 409
    assert "only proposed plans" in again.json()["error"]["message"]
    action = ChangeRecord.objects.get(action="action", verb="approve")
    assert action.actor_name.startswith("op (token")


def test_reject_with_reason(fleet):
    plan = _plan(fleet)
    operator, _ = token_client(make_user("operator"), scope="write")
    response = operator.post(f"/api/v1/plans/{plan.pk}/reject/", {"reason": "peak hours"},
                             format="json")
    assert response.status_code == 200
    assert response.json()["status"] == "rejected"
    assert response.json()["failure_reason"] == "peak hours"


def test_trigger_a_run(fleet):
    operator, _ = token_client(make_user("operator"), scope="write")
    response = operator.post("/api/v1/plans/run/", {"cluster": fleet["cluster"].pk},
                             format="json")
    assert response.status_code == 200, response.content
    assert response.json()["cluster"] == fleet["cluster"].pk
    assert isinstance(response.json()["plans"], list)
    assert operator.post("/api/v1/plans/run/", {"cluster": 999999},
                         format="json").status_code == 400


def test_what_if(fleet):
    client, _ = token_client(make_user("viewer"), scope="read")
    response = client.post("/api/v1/what-if/", {"nodes": 1, "gpus_per_node": 4,
                                                "rate_rps": 2}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["best"] and body["candidates"] and body["explanation"]
    bad = client.post("/api/v1/what-if/", {"tp": 8, "gpus_per_node": 4}, format="json")
    assert bad.status_code == 400 and "tp" in bad.json()["error"]["fields"]
