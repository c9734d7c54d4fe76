"""Every page that shows changing state is live: models, plans, routing, alerts, node
(region fragments over the same consumer), and topology as rack tiles for big fleets."""

import io
import time

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.test import Client

from controlplane.accounts.access import set_role
from controlplane.dashboard.consumers import GLOBAL_GROUP, LiveTopologyConsumer, cluster_group
from controlplane.topology.models import Cluster, Node, ServedModel
from tests.integration.live_support import WAIT_S, next_update

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _setup():
    call_command("load_sample_fleets", stdout=io.StringIO())
    user = get_user_model().objects.create_user("live-pages", password="pw-123456789")
    set_role(user, "operator")
    cluster = Cluster.objects.get(name="two-rtxpro-servers")
    return user, cluster


async def _connect(user, query, cookies=None):
    communicator = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), f"/ws/live/?{query}")
    communicator.scope["user"] = user
    communicator.scope["cookies"] = cookies or {}
    connected, _ = await communicator.connect(timeout=WAIT_S)
    assert connected
    return communicator


def _new_plan(cluster):
    from controlplane.planner.models import Plan

    model = ServedModel.objects.get(cluster=cluster)
    return Plan.objects.create(cluster=cluster, served_model=model, current_layout="A8",
                               target_layout="2P:6D", explanation="live-plan-marker",
                               diff=[])


@pytest.mark.parametrize("page,region", [("plans", "plans-live"), ("models", "models-live")])
async def test_a_new_plan_reaches_plans_and_models_pages(page, region, monkeypatch):
    # The timelines' axis moves on at each 5-minute mark, which re-sends the region once:
    # pin it, or a run that straddles a mark sees a legitimate extra send (seen at 11:15:00).
    from controlplane.dashboard import modelspage

    end = modelspage._timeline_end(time.time())
    monkeypatch.setattr(modelspage, "_timeline_end", lambda now: end)
    user, cluster = await sync_to_async(_setup)()
    communicator = await _connect(user, f"page={page}")
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="live-status"' in snapshot and f'id="{region}"' in snapshot
        assert "live-plan-marker" not in snapshot
        await sync_to_async(_new_plan)(cluster)
        await get_channel_layer().group_send(cluster_group(cluster.pk),
                                             {"type": "page.changed"})
        update = await next_update(communicator)
        assert f'id="{region}" hx-swap-oob="true"' in update and "live-plan-marker" in update
        # Nothing changed since: at most a small status heartbeat, never the region again.
        later = await communicator.receive_from(timeout=WAIT_S)
        assert f'id="{region}"' not in later and 'id="live-status"' in later
    finally:
        await communicator.disconnect()


async def test_routing_page_updates_on_a_new_table_version():
    from controlplane.routing.models import RoutingTableVersion

    user, cluster = await sync_to_async(_setup)()
    communicator = await _connect(user, "page=routing")
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="routing-live"' in snapshot and "v77" not in snapshot
        await sync_to_async(RoutingTableVersion.objects.create)(
            cluster=cluster, version=77, body={"version": 77}, cause="test", actor="t")
        await get_channel_layer().group_send(cluster_group(cluster.pk), {"type": "page.changed"})
        update = await next_update(communicator)
        assert "v77" in update
    finally:
        await communicator.disconnect()


async def test_alerts_page_updates_when_an_alert_opens():
    from django.utils import timezone

    from controlplane.alerts.models import Alert

    user, cluster = await sync_to_async(_setup)()
    communicator = await _connect(user, "page=alerts")
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="alerts-live"' in snapshot and "Nothing is firing" in snapshot
        await sync_to_async(Alert.objects.create)(
            fingerprint="f" * 16, rule="GpuMemoryHigh", severity="warning", status="firing",
            is_open=True, labels={"cluster": cluster.name, "node": "rtxpro-01"},
            annotations={"summary": "live-alert-marker"}, group_key="g",
            active_since=timezone.now(), starts_at=timezone.now(),
            last_evaluated_at=timezone.now())
        await get_channel_layer().group_send(GLOBAL_GROUP, {"type": "page.changed"})
        update = await next_update(communicator)
        assert "live-alert-marker" in update
    finally:
        await communicator.disconnect()


async def test_node_page_updates_card_and_engines():
    from controlplane.topology.models import Worker

    user, cluster = await sync_to_async(_setup)()
    node = await sync_to_async(Node.objects.filter(cluster=cluster).order_by("hostname").first)()
    communicator = await _connect(user, f"page=node&node={node.pk}",
                                  cookies={"csrftoken": "a" * 32})
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert f'id="node-{node.pk}"' in snapshot and 'id="engines-live"' in snapshot
        await sync_to_async(Worker.objects.filter(node=node, name="engine-0").update)(
            state="draining")
        await get_channel_layer().group_send(
            cluster_group(cluster.pk), {"type": "topology.changed", "node_ids": [node.pk]})
        update = await next_update(communicator)
        assert 'id="engines-live" hx-swap-oob="true"' in update and ">resume</button>" in update
        # A form in a live fragment carries a CSRF token field (from the browser's cookie).
        assert 'name="csrfmiddlewaretoken"' in update
    finally:
        await communicator.disconnect()


async def test_a_node_the_viewer_cannot_see_sends_nothing_but_status():
    user, _ = await sync_to_async(_setup)()
    communicator = await _connect(user, "page=node&node=999999")
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="live-status"' in snapshot and "engines-live" not in snapshot
    finally:
        await communicator.disconnect()


def _big_fleet(racks=6, per_rack=16):
    from controlplane.topology.models import GPU, Worker

    cluster = Cluster.objects.create(name="big")
    model = ServedModel.objects.create(cluster=cluster, name="m", layers=32, kv_heads=8,
                                       head_dim=128, kv_dtype_bytes=2, weight_bytes=16 * 10**9)
    nodes = Node.objects.bulk_create([
        Node(cluster=cluster, hostname=f"n{i:03d}", rack=f"r{i // per_rack}", status="online")
        for i in range(racks * per_rack)])
    gpus = GPU.objects.bulk_create([GPU(node=n, index=0, uuid=f"GPU-big-{n.pk}",
                                        product_name="H200", memory_bytes=141 * 10**9)
                                    for n in nodes])
    workers = Worker.objects.bulk_create([Worker(served_model=model, node=n, name="e0",
                                                 api_url="http://127.0.0.1:1")
                                          for n in nodes])
    Worker.gpus.through.objects.bulk_create([Worker.gpus.through(worker_id=w.pk, gpu_id=g.pk)
                                             for w, g in zip(workers, gpus, strict=True)])
    user = get_user_model().objects.create_user("big-viewer", password="pw-123456789")
    set_role(user, "viewer")
    return user, cluster, nodes


async def test_big_fleet_topology_is_rack_tiles_and_hints_update_one_rack():
    user, cluster, nodes = await sync_to_async(_big_fleet)()
    client = Client()
    await sync_to_async(client.force_login)(user)
    html = (await sync_to_async(client.get)("/?cluster=big")).content.decode()
    assert html.count('class="rack-tile"') == 6 and 'class="gpu ' not in html
    assert "?cluster=big&amp;rack=r2" in html
    drill = (await sync_to_async(client.get)("/?cluster=big&rack=r2")).content.decode()
    assert drill.count('class="node ') == 16 and 'class="rack-tile"' not in drill

    communicator = await _connect(user, "cluster=big")
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert snapshot.count('class="rack-tile"') == 6
        await get_channel_layer().group_send(
            cluster_group(cluster.pk),
            {"type": "telemetry.changed", "node_ids": [nodes[0].pk, nodes[1].pk]})
        update = await next_update(communicator)
        assert update.count('class="rack-tile"') == 1 and "n000" in update
    finally:
        await communicator.disconnect()
