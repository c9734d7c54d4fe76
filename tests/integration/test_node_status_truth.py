"""One truth for a node's status: topology, the node page and the alert rules agree on
each of the three states (reporting, stopped reporting, never had an agent)."""

import io
import re
import time
from datetime import timedelta

import orjson
import pytest
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

from controlplane.accounts.access import set_role
from controlplane.alerts.inputs import build_snapshot
from controlplane.alerts.rules import NODE_OFFLINE, evaluate
from controlplane.telemetry import hotstate
from controlplane.topology.models import Node

pytestmark = pytest.mark.django_db


@pytest.fixture
def three_nodes():
    call_command("load_sample_fleets", stdout=io.StringIO())
    online, offline, never = Node.objects.order_by("hostname")[:3]
    now = time.time()
    Node.objects.filter(pk=online.pk).update(status="online", last_seen=timezone.now())
    hotstate.sync_redis().hset(hotstate.Keys().cluster(online.cluster_id), f"n:{online.pk}",
                               orjson.dumps({"node_id": online.pk, "received_at": now,
                                             "interval_s": 60.0, "gpus": [], "nics": []}))
    Node.objects.filter(pk=offline.pk).update(
        status="offline", last_seen=timezone.now() - timedelta(hours=1))
    assert never.status == "unknown" and never.last_seen is None
    return {"online": online, "offline": offline, "not monitored": never}


def _badge(html: str, node_id: int) -> str:
    card = re.search(rf'<section id="node-{node_id}".*?</section>', html, re.S).group(0)
    return re.search(r'<span class="badge s-[\w-]+">([^<]+)</span>', card).group(1)


def test_pages_and_alerts_agree_on_every_state(client, three_nodes):
    user = get_user_model().objects.create_user("truth", password="pw-123456789")
    set_role(user, "operator")
    client.force_login(user)
    topology = client.get("/").content.decode()
    offline_rules = {o.labels["node"]: o for o in evaluate(build_snapshot(timezone.now()))
                     .observations if o.rule == NODE_OFFLINE}
    for expected, node in three_nodes.items():
        node_page = client.get(f"/nodes/{node.pk}/").content.decode()
        assert _badge(topology, node.pk) == expected, node.hostname
        assert _badge(node_page, node.pk) == expected, node.hostname
        engines = re.findall(r'<span class="badge state-\w+">([^<]+)</span>', node_page)
        assert engines, node.hostname
        if expected == "online":
            assert set(engines) == {"active"}
            assert node.hostname not in offline_rules
        elif expected == "offline":
            # Its engines are not claimed "active": nobody has heard from them.
            assert set(engines) == {"no report"}
            assert "offline" in offline_rules[node.hostname].annotations["summary"]
        else:
            assert set(engines) == {"not monitored"}
            assert "never reported (no agent)" in node_page
            # Never had an agent: nothing pages anyone about it.
            assert node.hostname not in offline_rules
