"""Agents that serve /metrics announce the port in hello and appear in service discovery."""

import asyncio
import uuid

import orjson
import pytest
from channels.testing import WebsocketCommunicator
from django.test import Client

from controlplane.observability.sd import agent_groups
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Node
from tests.integration.live_support import WAIT_S
from workers_agent import protocol

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def test_metrics_port_is_validated():
    base = {"type": "hello", "protocol": [1], "agent_version": "t", "hostname": "h",
            "inventory": {"gpus": [], "nics": [], "engines": []}}
    assert protocol.validate_hello(base) == []
    assert protocol.validate_hello({**base, "metrics_port": 9400}) == []
    for bad in (0, 70000, "9400", 1.5, True):
        errors = protocol.validate_hello({**base, "metrics_port": bad})
        assert errors and errors[0].path == "hello.metrics_port", bad


def test_agent_groups_skip_agents_without_metrics():
    assert agent_groups([
        {"metrics_url": "http://10.1.2.3:9400/metrics", "cluster": "c", "hostname": "n1"},
        {"metrics_url": "", "cluster": "c", "hostname": "n2"},
    ]) == [{"targets": ["10.1.2.3:9400"],
            "labels": {"__metrics_path__": "/metrics", "__scheme__": "http",
                       "job": "pdplane-agent", "cluster": "c", "node": "n1"}}]


def test_hello_with_metrics_port_lists_the_agent(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:{uuid.uuid4().hex[:8]}:"
    settings.METRICS_TOKEN = "sd-secret"
    cluster = Cluster.objects.create(name="sd")
    node = Node.objects.create(cluster=cluster, hostname="agent-host")
    token = issue_token(node)

    async def say_hello():
        from controlplane.asgi import application

        ws = WebsocketCommunicator(application, "/ws/agent/v1/",
                                   headers=[(b"authorization", f"Bearer {token}".encode())])
        ws.scope["client"] = ("10.9.8.7", 51000)
        connected, _ = await ws.connect(timeout=WAIT_S)
        assert connected
        await ws.send_to(text_data=orjson.dumps({
            "type": "hello", "protocol": [1], "agent_version": "t", "hostname": "agent-host",
            "metrics_port": 9400, "inventory": {"gpus": [], "nics": [], "engines": []},
        }).decode())
        welcome = orjson.loads(await ws.receive_from(timeout=WAIT_S))
        await ws.disconnect(timeout=WAIT_S)  # waits for the reconcile that stores the URL
        return welcome

    assert asyncio.run(say_hello())["type"] == "welcome"
    node.refresh_from_db()
    assert node.agent_metrics_url == "http://10.9.8.7:9400/metrics"
    response = Client().get("/api/v1/prometheus/targets?cluster=sd",
                            HTTP_AUTHORIZATION="Bearer sd-secret")
    agents = [g for g in response.json() if g["labels"]["job"] == "pdplane-agent"]
    assert agents == [{"targets": ["10.9.8.7:9400"],
                       "labels": {"__metrics_path__": "/metrics", "__scheme__": "http",
                                  "job": "pdplane-agent", "cluster": "sd",
                                  "node": "agent-host"}}]
