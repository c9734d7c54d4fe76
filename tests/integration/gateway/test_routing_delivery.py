"""Table delivery end to end: control plane (Celery worker, live HTTP) ⇄ gateway process.

ACK, NACK (gateway keeps its last good table; the control plane records the error),
stale refusal, retries while a gateway is down, and cold start by pull after a restart.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid

import pytest
from django.db import connection

from controlplane.outbox.models import Status
from controlplane.routing import signing
from controlplane.routing.builder import canonical_json, content_sha
from controlplane.routing.delivery import put_table
from controlplane.routing.models import (
    NACK,
    ROUTING_PUSH_KIND,
    GatewayDelivery,
    RoutingTableVersion,
)
from controlplane.routing.service import latest_table, publish, queue_deliveries, request_publish
from controlplane.topology.models import GPU, Cluster, Gateway, Node, ServedModel, Worker
from tests.conftest import WAIT_S, free_port

from .conftest import wait_until

pytestmark = [
    pytest.mark.integration,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(120),
    pytest.mark.skipif(connection.vendor != "postgresql",
                       reason="the Celery worker needs a shared database"),
]
GB = 1000**3


def make_cluster(n_workers: int = 2) -> tuple[Cluster, list[Worker]]:
    cluster = Cluster.objects.create(name=f"rt-{uuid.uuid4().hex[:8]}")
    model = ServedModel.objects.create(cluster=cluster, name="m", layers=2, kv_heads=2,
                                       head_dim=32, kv_dtype_bytes=2, weight_bytes=GB)
    workers = []
    for i in range(n_workers):
        node = Node.objects.create(cluster=cluster, hostname=f"h{i}")
        gpu = GPU.objects.create(node=node, index=0, uuid=f"GPU-{uuid.uuid4().hex}",
                                 product_name="H200", memory_bytes=141 * GB)
        worker = Worker.objects.create(served_model=model, node=node, name="e0",
                                       api_url=f"http://127.0.0.1:{9 + i}")
        worker.gpus.add(gpu)
        workers.append(worker)
    return cluster, workers


def kick(queue: str) -> None:
    from controlplane.outbox.tasks import deliver_due

    deliver_due.apply_async(([ROUTING_PUSH_KIND],), queue=queue)


def gateway_row(pk) -> Gateway:
    return Gateway.objects.get(pk=pk)


def test_push_ack_nack_and_stale(celery_worker, gateway_process):
    gw = gateway_process(wait_healthy=False)
    cluster, workers = make_cluster()
    row = Gateway.objects.create(cluster=cluster, name="gw1", url=gw.url, secret=gw.secret)

    # v1: published after commit, pushed by the Celery worker, ACKed.
    request_publish(cluster.pk, "test: first table", "tester")
    wait_until(lambda: gateway_row(row.pk).applied_table_version == 1, timeout=30,
               message=f"no ACK; worker log:\n{celery_worker.tail()}")
    gw.wait_health(version=1)
    delivery = GatewayDelivery.objects.get(gateway=row)
    assert (delivery.status, delivery.outcome) == (Status.DELIVERED, "ack")
    assert delivery.attempt_log.count() == 1
    assert gateway_row(row.pk).last_ack_at is not None
    v1 = latest_table(cluster.pk)
    assert (v1.cause, v1.actor) == ("test: first table", "tester")

    # Nothing changed: no new version.
    request_publish(cluster.pk, "test: no-op", "tester")
    assert latest_table(cluster.pk).version == 1

    # Draining a worker is a change: v2 reaches the gateway, which stops using the worker.
    Worker.objects.filter(pk=workers[0].pk).update(state="draining")
    request_publish(cluster.pk, "drain h0/e0", "planner")
    wait_until(lambda: gateway_row(row.pk).applied_table_version == 2, timeout=30)
    states = {w["id"]: w["state"] for w in gw.admin_table()["table"]["models"][0]["workers"]}
    assert states == {"h0/e0": "draining", "h1/e0": "active"}

    # NACK: a table the gateway cannot accept. It keeps v2; the control plane records why
    # and does not retry the same invalid version.
    bad = json.loads(json.dumps(latest_table(cluster.pk).body))
    bad["version"] = 3
    bad["models"][0]["workers"][0]["url"] = "gopher://nowhere"
    bad_row = RoutingTableVersion.objects.create(
        cluster=cluster, version=3, body=bad, content_sha=content_sha(bad),
        cause="test: invalid", actor="tester")
    queue_deliveries(bad_row)
    kick(celery_worker.queue)
    wait_until(lambda: GatewayDelivery.objects.filter(table=bad_row, status=Status.FAILED,
                                                      outcome=NACK).exists(),
               timeout=30, message=celery_worker.tail())
    gateway = gateway_row(row.pk)
    assert gateway.applied_table_version == 2
    assert "v3 refused" in gateway.last_error and "url" in gateway.last_error
    assert gw.admin_table()["applied_version"] == 2
    gw.wait_health(version=2)

    # A valid newer table heals it.
    Worker.objects.filter(pk=workers[0].pk).update(state="active")
    request_publish(cluster.pk, "undrain", "planner")
    wait_until(lambda: gateway_row(row.pk).applied_table_version == 4, timeout=30)
    assert gateway_row(row.pk).last_error == ""

    # Stale: an older version is refused with 409 and the gateway says what it has.
    v2 = RoutingTableVersion.objects.get(cluster=cluster, version=2)
    result = put_table(gw.url, gw.secret, canonical_json(v2.body), 4, "manual-stale")
    assert (result.outcome, result.status_code, result.applied_version) == ("stale", 409, 4)
    # ... and a wrong signature is refused outright.
    result = put_table(gw.url, "wrong-secret", canonical_json(v2.body), 4, "manual-bad")
    assert (result.outcome, result.status_code) == ("unauthorized", 401)

    # Periodic reconcile: nothing changed, so no new version; a gateway silent for longer
    # than RESYNC_S gets the latest table again (an idempotent ACK here).
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.routing.tasks import RESYNC_S, reconcile_routing

    long_ago = timezone.now() - timedelta(seconds=RESYNC_S + 60)
    Gateway.objects.filter(pk=row.pk).update(last_ack_at=long_ago)
    assert reconcile_routing()["queued"] == 1
    assert latest_table(cluster.pk).version == 4
    assert gateway_row(row.pk).last_ack_at > long_ago
    assert reconcile_routing()["queued"] == 0  # in sync and recently heard from


def test_unreachable_gateway_is_retried_then_cold_starts_by_pull(
    celery_worker, gateway_process, live_server
):
    # (The pull endpoint's own checks ride along here to save a database flush.)
    check_pull_endpoint_auth_and_etag(live_server)
    port = free_port()
    cluster, workers = make_cluster()
    row = Gateway.objects.create(cluster=cluster, name="gw1", url=f"http://127.0.0.1:{port}",
                                 secret="pull-secret")
    request_publish(cluster.pk, "first", "tester")
    wait_until(
        lambda: GatewayDelivery.objects.filter(gateway=row, attempts__gte=2).exists(),
        timeout=30, message=celery_worker.tail())
    delivery = GatewayDelivery.objects.get(gateway=row)
    assert delivery.status in (Status.PENDING, Status.SENDING)
    assert "unreachable" in gateway_row(row.pk).last_error
    assert delivery.next_attempt_at is not None

    pull_args = ("--control-plane", live_server.url, "--cluster", cluster.name,
                 "--gateway-name", "gw1", "--pull-interval", "1")
    gw = gateway_process(*pull_args, port=port, secret="pull-secret", wait_healthy=False)
    gw.wait_health(version=1)  # cold start by pull
    # The gateway reports what it runs (on its next pull, or the retried push lands).
    wait_until(lambda: gateway_row(row.pk).applied_table_version == 1, timeout=20)

    # Restart with a change made while it was down: it comes back on the new table.
    gw.stop()
    Worker.objects.filter(pk=workers[1].pk).update(desired_role="decode")
    Worker.objects.filter(pk=workers[0].pk).update(desired_role="prefill")
    assert publish(cluster.pk, "split roles", "planner").version == 2
    gw2 = gateway_process(*pull_args, port=port, secret="pull-secret", wait_healthy=False)
    gw2.wait_health(version=2)
    table = gw2.admin_table()["table"]
    assert table["models"][0]["mode"] == "conditional"
    wait_until(lambda: gateway_row(row.pk).applied_table_version == 2, timeout=20)


def check_pull_endpoint_auth_and_etag(live_server):
    cluster, _ = make_cluster(1)
    Gateway.objects.create(cluster=cluster, name="gw1", url="http://127.0.0.1:9", secret="k")
    path = f"/routing/v1/clusters/{cluster.name}/table"

    def get(secret="k", name="gw1", etag=None, applied=None):  # noqa: S107
        headers = {signing.GATEWAY_HEADER: name,
                   **signing.signed_headers(secret, "GET", path, b"", now=time.time())}
        if etag:
            headers["If-None-Match"] = etag
        if applied is not None:
            headers[signing.APPLIED_VERSION_HEADER] = str(applied)
        req = urllib.request.Request(live_server.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    assert get()[0] == 404  # nothing published yet
    publish(cluster.pk, "first", "tester")
    status, headers, body = get()
    assert status == 200 and json.loads(body)["version"] == 1
    etag = headers["ETag"]
    assert get(etag=etag)[0] == 304
    assert get(secret="nope")[0] == 401
    assert get(name="stranger")[0] == 401
    get(applied=1)
    assert Gateway.objects.get(cluster=cluster).applied_table_version == 1
