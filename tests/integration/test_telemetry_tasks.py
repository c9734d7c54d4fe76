"""Liveness and roll-up tasks against real Redis and Postgres."""

import time
import uuid

import pytest

from controlplane.telemetry import hotstate
from controlplane.telemetry.ingest import NodeContext, index_commands, report_commands
from controlplane.telemetry.liveness import check_liveness, mark_disconnected
from controlplane.telemetry.models import NodeSample, WorkerSample
from controlplane.telemetry.tasks import persist_rollups
from controlplane.topology.models import Cluster, Node, ServedModel, Worker
from tests.conftest import WAIT_S

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture(autouse=True)
def redis_prefix(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_REPORT_INTERVAL_S = 1.0
    settings.TELEMETRY_OFFLINE_GRACE_S = 5.0
    yield
    client = hotstate.sync_redis()
    keys = list(client.scan_iter(settings.TELEMETRY_REDIS_PREFIX + "*"))
    if keys:
        client.delete(*keys)


def write_report(node, worker, at, interval_s=1.0):
    ctx = NodeContext(node.pk, node.cluster_id, node.hostname, 1, interval_s,
                      {"e0": worker.pk} if worker else {})
    keys = hotstate.Keys()
    report = {"seq": 1, "ts": at, "gpus": [{"index": 0, "utilization": 0.5}],
              "nics": [], "engines": [{"id": "e0", "running": 2, "kv_usage": 0.5}]}
    pipe = hotstate.sync_redis().pipeline()
    for cmd in index_commands(ctx, keys) + report_commands(ctx, report, at, keys,
                                                           lambda k, n: True):
        pipe.execute_command(*cmd)
    pipe.execute()


@pytest.fixture
def fleet():
    cluster = Cluster.objects.create(name="tasks")
    model = ServedModel.objects.create(cluster=cluster, name="m", layers=1, kv_heads=1,
                                       head_dim=1, kv_dtype_bytes=2, weight_bytes=1)
    nodes = [Node.objects.create(cluster=cluster, hostname=f"n{i}") for i in range(4)]
    worker = Worker.objects.create(served_model=model, node=nodes[0], name="e0",
                                   api_url="http://x:1")
    return cluster, nodes, worker


def test_liveness_marks_online_stale_offline(fleet):
    _cluster, nodes, worker = fleet
    now = time.time()
    write_report(nodes[0], worker, now - 1)  # fresh
    write_report(nodes[1], None, now - 4)  # > 3 intervals
    write_report(nodes[2], None, now - 60)  # past the grace
    Node.objects.filter(pk=nodes[3].pk).update(status="maintenance")
    write_report(nodes[3], None, now - 60)
    hotstate.sync_redis().hset(hotstate.Keys().live(nodes[0].pk), "channel", "x")
    check_liveness(now)
    status = {n.hostname: n.status for n in Node.objects.all()}
    assert status == {"n0": "online", "n1": "stale", "n2": "offline", "n3": "maintenance"}
    assert Node.objects.get(pk=nodes[0].pk).last_seen is not None


def test_disconnect_marks_stale_and_back_online_only_with_a_connection(fleet):
    _cluster, nodes, worker = fleet
    now = time.time()
    write_report(nodes[0], worker, now)
    Node.objects.filter(pk=nodes[0].pk).update(status="online")
    mark_disconnected(nodes[0].pk)
    check_liveness(now)
    assert Node.objects.get(pk=nodes[0].pk).status == "stale"  # no live connection
    hotstate.sync_redis().hset(hotstate.Keys().live(nodes[0].pk), "channel", "x")
    check_liveness(now)
    assert Node.objects.get(pk=nodes[0].pk).status == "online"


def test_rollups_persist_fresh_state_once_per_run(fleet):
    _cluster, nodes, worker = fleet
    now = time.time()
    write_report(nodes[0], worker, now)
    write_report(nodes[1], None, now - 600)  # stale: not persisted
    assert persist_rollups(now) == (1, 1)
    sample = WorkerSample.objects.get(worker=worker)
    assert (sample.running, sample.kv_usage) == (2, 0.5)
    assert NodeSample.objects.get(node=nodes[0]).gpu_utilization == 0.5
    assert hotstate.history("running", worker_id=worker.pk)[-1][1] == 2


def test_async_read_api_matches_sync(fleet):
    import asyncio

    cluster, nodes, worker = fleet
    # Read at the wall clock's now: an interval long enough that a starved box does not see
    # it go stale (3 intervals) between the write and the read.
    write_report(nodes[0], worker, time.time(), interval_s=WAIT_S)

    async def read():
        return (await hotstate.anode_state(nodes[0].pk), await hotstate.aworker_state(worker.pk),
                await hotstate.acluster_snapshot(cluster.pk),
                await hotstate.ahistory("running", worker_id=worker.pk))

    node, work, snap, hist = asyncio.run(read())
    assert node["node_id"] == nodes[0].pk and work["running"] == 2 and not work["stale"]
    assert set(snap["workers"]) == {worker.pk} and hist[-1][1] == 2
    assert hotstate.node_state(nodes[1].pk) is None  # never reported
    with pytest.raises(ValueError):
        hotstate.history("running", node_id=1, worker_id=2)
