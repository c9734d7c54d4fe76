"""Routing tables (current, history, diff, publish) and live state through the API."""

import pytest

from controlplane.routing.service import publish
from controlplane.topology.models import Worker
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def fleet():
    return build_fleet()


def test_history_current_and_diff(fleet):
    cluster = fleet["cluster"]
    first = publish(cluster.pk, cause="test", actor="tester")
    Worker.objects.filter(pk=fleet["worker"].pk).update(state="draining")
    second = publish(cluster.pk, cause="drain", actor="tester")
    assert first and second and second.version == first.version + 1
    client, _ = token_client(make_user("viewer"), scope="read")
    listed = client.get(f"/api/v1/routing-tables/?cluster_id={cluster.pk}").json()
    assert [t["version"] for t in listed["results"]] == [second.version, first.version]
    assert "body" not in listed["results"][0]
    current = client.get(f"/api/v1/routing-tables/current/?cluster_id={cluster.pk}").json()
    assert current["version"] == second.version and current["body"]["version"] == second.version
    diff = client.get(f"/api/v1/routing-tables/{second.pk}/diff/").json()
    assert diff["from_version"] == first.version
    assert any(c.get("field") == "state" for c in diff["changes"]), diff
    against = client.get(f"/api/v1/routing-tables/{first.pk}/diff/?against={second.pk}")
    assert against.status_code == 200
    assert client.get("/api/v1/routing-tables/current/").status_code == 400
    assert client.get("/api/v1/routing-tables/current/?cluster_id=999999").status_code == 404


def test_publish_is_an_action(fleet):
    url = f"/api/v1/clusters/{fleet['cluster'].pk}/publish-routing-table/"
    viewer, _ = token_client(make_user("viewer"), scope="read")
    assert viewer.post(url, {}, format="json").status_code == 403
    operator, _ = token_client(make_user("operator"), scope="write")
    first = operator.post(url, {"reason": "ci"}, format="json").json()
    assert first["changed"] is True and first["version"] == 1
    again = operator.post(url, {"reason": "ci"}, format="json").json()
    assert again == {"cluster": fleet["cluster"].pk, "changed": False, "version": None}


def test_live_state_shapes(fleet):
    client, _ = token_client(make_user("viewer"), scope="read")
    node = client.get(f"/api/v1/nodes/{fleet['nodes'][0].pk}/live/")
    assert node.status_code == 200 and set(node.json()) == {"id", "state"}
    worker = client.get(f"/api/v1/workers/{fleet['worker'].pk}/live/")
    assert worker.status_code == 200 and worker.json()["id"] == fleet["worker"].pk
    cluster = client.get(f"/api/v1/clusters/{fleet['cluster'].pk}/live/")
    assert cluster.status_code == 200 and set(cluster.json()) == {"id", "at", "nodes", "workers"}


def test_live_state_store_down_is_503(fleet, monkeypatch):
    from controlplane.telemetry import hotstate

    def down(*args):
        raise ConnectionError("redis is down")

    monkeypatch.setattr(hotstate, "node_state", down)
    client, _ = token_client(make_user("viewer"), scope="read")
    response = client.get(f"/api/v1/nodes/{fleet['nodes'][0].pk}/live/")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "unavailable"
