"""Change records for each kind of actor, with before/after and request ids."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane import audit
from controlplane.audit.models import ChangeRecord
from controlplane.audit.tasks import prune_change_records
from controlplane.topology.models import GPU, Cluster, Node, Worker
from tests.integration.api_support import build_fleet, make_user, token_client

pytestmark = pytest.mark.django_db


def _records(object_type, **filters):
    return list(ChangeRecord.objects.filter(object_type=object_type, **filters).order_by("id"))


def test_api_token_actor_with_before_after_and_request_id():
    user = make_user("admin", "alice")
    client, raw = token_client(user)
    created = client.post("/api/v1/clusters/", {"name": "c1"}, format="json",
                          HTTP_X_REQUEST_ID="req-1")
    pk = created.json()["id"]
    client.patch(f"/api/v1/clusters/{pk}/", {"description": "new"}, format="json",
                 HTTP_X_REQUEST_ID="req-2")
    client.delete(f"/api/v1/clusters/{pk}/")
    create, update, delete = _records("topology.cluster", object_id=str(pk))
    assert (create.action, update.action, delete.action) == ("create", "update", "delete")
    assert create.actor_kind == "token" and create.user_id == user.pk
    assert create.actor_name == f"alice (token {raw[4:12]})"
    assert create.request_id == "req-1" and update.request_id == "req-2"
    assert create.before is None and create.after["name"] == "c1"
    assert update.before["description"] == "" and update.after["description"] == "new"
    assert update.changed_fields == ["description"]
    assert delete.before["name"] == "c1" and delete.after is None


def test_session_user_actor():
    from rest_framework.test import APIClient

    user = make_user("admin", "bob")
    client = APIClient()
    client.force_login(user)
    client.post("/api/v1/clusters/", {"name": "c2"}, format="json")
    (record,) = _records("topology.cluster")
    assert record.actor_kind == "user" and record.actor_name == "bob"


def test_node_actor_for_agent_inventory():
    fleet = build_fleet()
    node = fleet["nodes"][1]
    with audit.actor_node(node):
        GPU.objects.create(node=node, index=7, uuid="GPU-new", product_name="H200",
                           memory_bytes=1)
        GPU.objects.filter(node=node, index=0).first().delete()
    records = _records("topology.gpu", actor_kind="node")
    assert [r.action for r in records] == ["create", "delete"]
    assert records[0].node_id == node.pk and records[0].actor_name == node.hostname
    assert records[0].request_id == records[1].request_id  # one context, one id


def test_named_system_actor_and_default():
    fleet = build_fleet()
    worker = fleet["worker"]
    with audit.actor("planner"):
        worker.desired_role = "prefill"
        worker.save()
    worker.desired_role = "decode"
    worker.save()
    planner, system = _records("topology.worker", action="update")[-2:]
    assert (planner.actor_kind, planner.actor_name) == ("system", "planner")
    assert planner.before["desired_role"] == "both" and planner.after["desired_role"] == "prefill"
    assert (system.actor_kind, system.actor_name) == ("system", "system")


def test_celery_task_actor():
    from controlplane.celery import app

    @app.task(name="tests.audit_rename")
    def rename(pk):
        Cluster.objects.filter(pk=pk).first().save()  # no change: not recorded
        cluster = Cluster.objects.get(pk=pk)
        cluster.description = "by celery"
        cluster.save()

    cluster = Cluster.objects.create(name="c3")
    rename.apply(args=[cluster.pk])  # runs eagerly, with the task signals
    (record,) = _records("topology.cluster", action="update")
    assert record.actor_name == "celery:tests.audit_rename"


def test_actions_are_recorded_with_reason():
    fleet = build_fleet()
    client, _ = token_client(make_user("operator", "op"), scope="write")
    client.post(f"/api/v1/workers/{fleet['worker'].pk}/drain/", {"reason": "maint"}, format="json")
    (action,) = _records("topology.worker", action="action")
    assert action.verb == "drain"
    assert action.before["state"] == "active"
    assert action.after == {"state": "draining", "generation": 2, "reason": "maint"}
    assert Worker.objects.get(pk=fleet["worker"].pk).state == "draining"


def test_m2m_gpu_changes_and_secrets_masked():
    fleet = build_fleet()
    worker = fleet["worker"]
    with audit.actor("inventory-sync"):
        worker.gpus.set([fleet["gpus"][1]])  # a remove and an add: one record
    m2m = _records("topology.worker", action="update")[-1]
    assert m2m.before == {"gpus": [fleet["gpus"][0].pk]}
    assert m2m.after == {"gpus": [fleet["gpus"][1].pk]}
    (gateway,) = _records("topology.gateway")
    assert gateway.after["secret"] == "********"


def test_heartbeat_only_updates_are_not_recorded():
    node = Node.objects.create(cluster=Cluster.objects.create(name="c4"), hostname="n")
    node.last_seen = timezone.now()
    node.save()
    assert not _records("topology.node", action="update")


def test_audit_api_filters():
    fleet = build_fleet()
    client, _ = token_client(make_user("viewer", "v"), scope="read")
    since = (timezone.now() - timedelta(minutes=1)).isoformat()
    response = client.get("/api/v1/audit/", {"object_type": "topology.node", "since": since,
                                             "actor": "sys"})
    assert response.status_code == 200
    assert response.json()["count"] == len(fleet["nodes"])
    assert client.get("/api/v1/audit/?since=yesterday").status_code == 400


@override_settings(AUDIT_RETENTION_DAYS=30)
def test_retention_prunes_old_records():
    build_fleet()
    total = ChangeRecord.objects.count()
    old = ChangeRecord.objects.order_by("id")[:3]
    ChangeRecord.objects.filter(pk__in=[r.pk for r in old]).update(
        time=timezone.now() - timedelta(days=31))
    assert prune_change_records() == 3
    assert ChangeRecord.objects.count() == total - 3


def test_rolled_back_change_leaves_no_record():
    from django.db import transaction

    with pytest.raises(RuntimeError), transaction.atomic():
        Cluster.objects.create(name="ghost")
        raise RuntimeError
    assert not _records("topology.cluster")


def test_ui_change_through_the_admin_is_recorded_as_the_user():
    from django.test import Client

    cluster = Cluster.objects.create(name="c5")
    client = Client()
    client.force_login(make_user("admin", "carol"))
    response = client.post(f"/admin/topology/cluster/{cluster.pk}/change/",
                           {"name": "c5", "description": "edited in the UI"},
                           HTTP_X_REQUEST_ID="ui-1")
    assert response.status_code == 302
    (record,) = _records("topology.cluster", action="update")
    assert (record.actor_kind, record.actor_name, record.request_id) == ("user", "carol", "ui-1")
    assert record.after["description"] == "edited in the UI"
