"""The control plane's counters move where the work happens: planning, routing pushes,
webhook deliveries, and the scrape-time gauges read the database and hot state."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from django.core.management import call_command
from django.utils import timezone
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from controlplane.alerts import delivery as outbox
from controlplane.alerts import ssrf, transport
from controlplane.alerts.models import WebhookEndpoint
from controlplane.observability.metrics import exposition
from controlplane.planner.service import run_planning
from controlplane.routing import delivery as pushes
from controlplane.routing.models import GatewayDelivery, RoutingTableVersion
from controlplane.telemetry import hotstate
from controlplane.topology.models import Cluster, Gateway, Node

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels or None) or 0.0


def test_planning_cycle_is_timed_and_counted_by_outcome():
    call_command("load_sample_fleets", stdout=open(os.devnull, "w"))  # noqa: SIM115
    cluster = Cluster.objects.get(name="four-h200nvl-servers")
    holds = value("pdplane_plans_total", outcome="hold")
    cycles = value("pdplane_planning_duration_seconds_count")
    run_planning(cluster)  # no telemetry: every model holds (fail-static)
    assert value("pdplane_planning_duration_seconds_count") == cycles + 1
    assert value("pdplane_plans_total", outcome="hold") >= holds + 1


def test_routing_push_results_and_latency():
    cluster = Cluster.objects.create(name="obs-push")
    gateway = Gateway.objects.create(cluster=cluster, name="gw", url="http://127.0.0.1:9",
                                     secret="s" * 32)
    table = RoutingTableVersion.objects.create(cluster=cluster, version=1, body={"version": 1},
                                               content_sha="0" * 64)
    before = {r: value("pdplane_routing_pushes_total", result=r) for r in ("ack", "nack")}
    timed = value("pdplane_routing_push_seconds_count")
    for outcome in ("nack", "ack"):
        d = GatewayDelivery.objects.create(gateway=gateway, table=table,
                                           next_attempt_at=timezone.now())
        answer = pushes.PushResult(outcome, 200, 1)
        pushes.RoutingPushDeliverer(put=lambda *a, r=answer: r).deliver(d, "test")
    for r in ("ack", "nack"):
        assert value("pdplane_routing_pushes_total", result=r) == before[r] + 1
    assert value("pdplane_routing_push_seconds_count") == timed + 2


def test_webhook_delivery_results_and_latency(monkeypatch):
    endpoint = WebhookEndpoint.objects.create(name="obs", url="http://receiver.example/hook")
    monkeypatch.setattr(ssrf, "check_url", lambda url, allow: url)
    monkeypatch.setattr(transport, "post", lambda *a, **k: transport.Response(204, 12.5))
    delivered = value("pdplane_webhook_deliveries_total", result="delivered")
    latency_sum = value("pdplane_webhook_delivery_seconds_sum")
    outbox.send_test(endpoint)
    assert value("pdplane_webhook_deliveries_total", result="delivered") == delivered + 1
    assert value("pdplane_webhook_delivery_seconds_sum") == pytest.approx(latency_sum + 0.0125)


def test_state_gauges_read_database_and_hot_state(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:obs:{uuid.uuid4().hex[:8]}:"
    cluster = Cluster.objects.create(name="obs-state")
    fresh = Node.objects.create(cluster=cluster, hostname="fresh")
    old = Node.objects.create(cluster=cluster, hostname="old")
    Gateway.objects.create(cluster=cluster, name="gw", url="http://127.0.0.1:9", secret="s" * 32)
    RoutingTableVersion.objects.create(cluster=cluster, version=3, body={}, content_sha="1" * 64)
    client = hotstate.sync_redis()
    seen = hotstate.Keys().seen
    try:
        client.zadd(seen, {str(fresh.pk): time.time(), str(old.pk): time.time() - 3600})
        body, ctype = exposition()
        assert ctype.startswith("text/plain")
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for f in text_string_to_metric_families(body.decode()) for s in f.samples}
        assert samples[("pdplane_agents_connected", ())] == 1
        assert samples[("pdplane_gateway_version_lag",
                        (("cluster", "obs-state"), ("gateway", "gw")))] == 3
        assert samples[("pdplane_nodes", (("status", fresh.status),))] >= 2
    finally:
        client.delete(seen)
