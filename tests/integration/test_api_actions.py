"""Worker actions reach the agent (command API) and the routing table, after commit."""

import pytest

from controlplane.topology.models import Worker
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


@pytest.fixture
def calls(monkeypatch):
    from controlplane.routing import service
    from controlplane.telemetry import commands

    seen = []
    monkeypatch.setattr(commands, "send_command",
                        lambda node_id, command, args=None: seen.append(("cmd", node_id, command,
                                                                        args)))
    monkeypatch.setattr(service, "request_publish",
                        lambda cluster_id, cause, actor="system": seen.append(
                            ("publish", cluster_id, actor)))
    return seen


def test_drain_then_resume(calls, django_capture_on_commit_callbacks):
    fleet = build_fleet()
    worker = fleet["worker"]
    client, _ = token_client(make_user("operator", "op"), scope="write")
    with django_capture_on_commit_callbacks(execute=True):
        drained = client.post(f"/api/v1/workers/{worker.pk}/drain/", {"reason": "maint"},
                              format="json")
    assert drained.status_code == 200 and drained.json()["state"] == "draining"
    assert drained.json()["generation"] == 2
    assert calls[0] == ("cmd", worker.node_id, "drain",
                        {"worker": "e0", "worker_id": worker.pk, "generation": 2})
    assert calls[1][0:2] == ("publish", fleet["cluster"].pk)
    assert calls[1][2].startswith("op (token")
    with django_capture_on_commit_callbacks(execute=True):
        resumed = client.post(f"/api/v1/workers/{worker.pk}/resume/", format="json")
    assert resumed.json()["state"] == "active" and calls[2][2] == "resume"


def test_missing_worker_cannot_be_resumed(calls):
    fleet = build_fleet()
    Worker.objects.filter(pk=fleet["worker"].pk).update(state="missing")
    client, _ = token_client(make_user("operator"), scope="write")
    response = client.post(f"/api/v1/workers/{fleet['worker'].pk}/resume/", format="json")
    assert response.status_code == 409
    assert not calls
