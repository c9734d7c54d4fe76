"""From topology + hot state (real Redis) + policy to alerts: the `alerts.evaluate` task."""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

import orjson
import pytest
from django.test import override_settings
from django.utils import timezone

from controlplane.alerts.inputs import build_snapshot
from controlplane.alerts.lifecycle import LifecycleConfig
from controlplane.alerts.models import Alert, AlertRule
from controlplane.alerts.tasks import evaluate
from controlplane.policies.models import Policy
from controlplane.topology.models import GPU, Cluster, Gateway, Node, ServedModel, Worker

pytestmark = [pytest.mark.integration, pytest.mark.django_db]
GB = 1000**3


@pytest.fixture
def hot_prefix():
    """A private hot-state key prefix, removed afterwards (Redis is shared)."""
    from controlplane.telemetry import hotstate

    prefix = f"test:alerts:{uuid.uuid4().hex[:8]}:"
    with override_settings(TELEMETRY_REDIS_PREFIX=prefix):
        yield prefix
        client = hotstate.sync_redis()
        keys = list(client.scan_iter(match=prefix + "*"))
        if keys:
            client.delete(*keys)


def fleet():
    cluster = Cluster.objects.create(name="prod")
    n1 = Node.objects.create(
        cluster=cluster,
        hostname="gpu-01",
        agent_protocol=1,
        agent_version="0.1.0",
        last_seen=timezone.now(),
    )
    n2 = Node.objects.create(cluster=cluster, hostname="gpu-02", agent_protocol=2)
    Node.objects.filter(pk=n2.pk).update(created=timezone.now() - timedelta(hours=1))
    GPU.objects.create(node=n1, index=0, uuid="GPU-a", product_name="H200", memory_bytes=141 * GB)
    model = ServedModel.objects.create(
        cluster=cluster,
        name="llama",
        layers=80,
        kv_heads=8,
        head_dim=128,
        kv_dtype_bytes=1,
        weight_bytes=71 * GB,
    )
    Policy.objects.create(cluster=cluster, ttft_p95_ms=500)
    w = Worker.objects.create(
        served_model=model, node=n1, name="e0", api_url="http://127.0.0.1:8000"
    )
    Gateway.objects.create(
        cluster=cluster,
        name="gw",
        url="http://127.0.0.1:9",
        secret="s",
        applied_table_version=1,
        last_error="HTTP 500 from gateway",
    )
    return cluster, n1, n2, w


def write_hot(prefix, cluster, node, worker):
    from controlplane.telemetry import hotstate

    now = time.time()
    node_state = {
        "node_id": node.pk,
        "cluster_id": cluster.pk,
        "last_report_at": now,
        "received_at": now,
        "interval_s": 2.0,
        "gpus": [{"index": 0, "memory_used_bytes": 140 * GB, "memory_total_bytes": 141 * GB}],
        "nics": [{"name": "eth0", "rx_errors": 5, "tx_errors": 0, "rx_drops": 1}],
    }
    worker_state = {
        "worker_id": worker.pk,
        "node_id": node.pk,
        "received_at": now,
        "interval_s": 2.0,
        "last_report_at": now,
        "up": True,
        "running": 4,
        "kv_usage": 0.99,
        "ttft_p95_s": 0.9,
        "itl_p95_s": 0.01,
        "prefix_hit_rate": 0.3,
        "kv_events": {"last_seq": 10, "connected": True},
    }
    hotstate.sync_redis().hset(
        f"{prefix}c:{cluster.pk}",
        mapping={
            f"n:{node.pk}": orjson.dumps(node_state),
            f"w:{worker.pk}": orjson.dumps(worker_state),
        },
    )


def test_snapshot_from_topology_hot_state_and_policy(hot_prefix):
    cluster, n1, _, w = fleet()
    write_hot(hot_prefix, cluster, n1, w)
    snap = build_snapshot(timezone.now())
    nodes = {n.node: n for n in snap.nodes}
    assert nodes["gpu-01"].last_report_age_s < 5
    assert nodes["gpu-01"].gpus[0].memory_used_bytes == 140 * GB
    assert nodes["gpu-01"].nics[0].errors_total == 5 and nodes["gpu-01"].nics[0].drops_total == 1
    assert nodes["gpu-02"].last_report_age_s > 3000  # never reported, registered an hour ago
    (worker,) = snap.workers
    assert (worker.ttft_p95_ms, worker.ttft_slo_ms, worker.itl_slo_ms) == (900.0, 500.0, 50.0)
    assert worker.has_traffic and not worker.stale and worker.kv_events_seq == 10
    (gw,) = snap.gateways
    assert gw.push_error and gw.applied_version == 1
    assert snap.expected_agent_protocol == 1


def test_failed_and_infeasible_plans():
    from django.apps import apps

    cluster, _, _, w = fleet()
    model = w.served_model
    other = ServedModel.objects.create(
        cluster=cluster,
        name="qwen",
        layers=28,
        kv_heads=4,
        head_dim=128,
        kv_dtype_bytes=2,
        weight_bytes=15 * GB,
    )
    plan = apps.get_model("planner", "Plan")
    state = apps.get_model("planner", "ModelPlannerState")
    plan.objects.create(
        cluster=cluster, served_model=model, status="failed", failure_reason="drain timed out"
    )
    state.objects.create(
        served_model=other,
        last_reason="no-feasible-layout",
        last_explanation="not enough decode KV capacity for the load",
    )
    third = ServedModel.objects.create(
        cluster=cluster, name="zeta", layers=28, kv_heads=4, head_dim=128, kv_dtype_bytes=2,
        weight_bytes=15 * GB,
    )
    state.objects.create(
        served_model=third, last_reason="all-layouts-miss",
        last_explanation="Hold: every layout is predicted to miss the ITL target",
    )
    plans = sorted(build_snapshot(timezone.now()).plans, key=lambda p: p.model)
    assert [(p.model, p.status) for p in plans] == [
        ("llama", "failed"), ("qwen", "infeasible"), ("zeta", "all-layouts-miss")]
    assert "decode KV capacity" in plans[1].reason
    assert "every layout" in plans[2].reason


def test_evaluate_task_raises_alerts_with_labels(hot_prefix):
    cluster, n1, _, w = fleet()
    write_hot(hot_prefix, cluster, n1, w)
    for rule in (
        "NodeOffline",
        "GpuMemoryHigh",
        "KvCacheUsageHigh",
        "TtftP95OverSlo",
        "RoutingPushFailing",
    ):
        AlertRule.objects.create(rule=rule, for_seconds=0)
    with override_settings(
        ALERTS_LIFECYCLE=LifecycleConfig(group_wait_s=0), ALERTS_KICK_SWEEPER=False
    ):
        summary = evaluate()
    assert summary["notifications"] >= 1
    firing = {
        (a.rule, a.labels.get("node", a.labels.get("gateway")))
        for a in Alert.objects.filter(is_open=True, status="firing")
    }
    # gpu-02 never reported: not monitored (no NodeOffline), and nothing else is judged
    # about it (its protocol skew included) until it reports.
    assert firing == {
        ("GpuMemoryHigh", "gpu-01"),
        ("KvCacheUsageHigh", "gpu-01"),
        ("TtftP95OverSlo", "gpu-01"),
        ("RoutingPushFailing", "gw"),
    }
    kv = Alert.objects.get(rule="KvCacheUsageHigh")
    assert {k: kv.labels[k] for k in ("cluster", "node", "model", "worker")} == {
        "cluster": "prod",
        "node": "gpu-01",
        "model": "llama",
        "worker": "e0",
    }


def test_prune_forgets_old_finished_work_only():
    from controlplane.alerts.models import Delivery, WebhookEndpoint
    from controlplane.alerts.tasks import prune

    ep = WebhookEndpoint.objects.create(name="e", url="https://example.com/")
    old = timezone.now() - timedelta(days=40)
    done = Delivery.objects.create(endpoint=ep, event_type="x", payload={}, status="delivered")
    waiting = Delivery.objects.create(endpoint=ep, event_type="x", payload={}, status="pending")
    Delivery.objects.filter(pk__in=[done.pk, waiting.pk]).update(created=old)
    assert prune()["deliveries"] == 1
    assert list(Delivery.objects.values_list("pk", flat=True)) == [waiting.pk]


def test_gateway_push_state_from_routing():
    from django.apps import apps

    cluster, _, _, _ = fleet()
    gw = Gateway.objects.get()
    Gateway.objects.filter(pk=gw.pk).update(last_error="")
    table = apps.get_model("routing", "RoutingTableVersion")
    push = apps.get_model("routing", "GatewayDelivery")
    v5 = table.objects.create(cluster=cluster, version=5, body={}, content_sha="x", cause="t")
    push.objects.create(
        gateway=gw,
        table=v5,
        status="failed",
        outcome="nack",
        attempts=1,
        last_error="schema: unknown field",
        next_attempt_at=timezone.now(),
    )
    (facts,) = build_snapshot(timezone.now()).gateways
    assert (facts.latest_version, facts.applied_version) == (5, 1)
    assert facts.push_error == "schema: unknown field" and facts.consecutive_push_failures == 1
