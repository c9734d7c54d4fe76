"""The live topology consumer: snapshot on connect, coalesced OOB fragments after hints."""

import asyncio
import io

import pytest
from asgiref.sync import sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.core.management import call_command

from controlplane.accounts.access import set_role
from controlplane.dashboard.consumers import (
    FLUSH_INTERVAL_S,
    LiveTopologyConsumer,
    cluster_group,
)
from controlplane.topology.models import Cluster, Node
from tests.integration.live_support import WAIT_S, beyond_status, next_update

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def _setup(role="viewer"):
    call_command("load_sample_fleets", stdout=io.StringIO())
    user = get_user_model().objects.create_user(f"live-{role}", password="pw-123456789")
    set_role(user, role)
    cluster = Cluster.objects.get(name="two-rtxpro-servers")
    node = Node.objects.filter(cluster=cluster).order_by("hostname").first()
    return user, cluster.pk, node.pk


async def _connect(user, query="cluster=two-rtxpro-servers"):
    communicator = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), f"/ws/live/?{query}")
    communicator.scope["user"] = user
    connected, _ = await communicator.connect(timeout=WAIT_S)
    return communicator, connected


async def test_snapshot_then_coalesced_updates():
    user, cluster_id, node_id = await sync_to_async(_setup)()
    communicator, connected = await _connect(user)
    assert connected
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="live-status"' in snapshot
        assert snapshot.count('hx-swap-oob="true"') == 1 + 2  # status + two nodes
        layer = get_channel_layer()
        loop = asyncio.get_running_loop()
        started = loop.time()
        for _ in range(5):  # a burst of hints for the same node...
            await layer.group_send(cluster_group(cluster_id),
                                   {"type": "telemetry.changed", "node_ids": [node_id]})
        span = loop.time() - started
        updates = [await next_update(communicator), *await beyond_status(communicator, 1.2)]
        # ...becomes one fragment for that node only, at most once per flush interval: one
        # update on a quiet box, where the burst fits an interval; a starved box may spread
        # it over two or more.
        for update in updates:
            assert update.count('hx-swap-oob="true"') == 1
            assert f'id="node-{node_id}"' in update
        assert len(updates) <= span / FLUSH_INTERVAL_S + 2, (span, len(updates))
    finally:
        await communicator.disconnect()


async def test_anonymous_is_refused():
    from django.contrib.auth.models import AnonymousUser

    communicator = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), "/ws/live/")
    communicator.scope["user"] = AnonymousUser()
    connected, code = await communicator.connect(timeout=WAIT_S)
    assert not connected and code == 4401


async def test_user_without_a_role_receives_nothing():
    user, cluster_id, node_id = await sync_to_async(_setup)()
    await sync_to_async(set_role)(user, None)
    communicator, connected = await _connect(user)
    assert connected
    try:
        snapshot = await communicator.receive_from(timeout=WAIT_S)
        assert 'id="node-' not in snapshot
        await get_channel_layer().group_send(
            cluster_group(cluster_id), {"type": "telemetry.changed", "node_ids": [node_id]}
        )
        assert await beyond_status(communicator, 1.5) == []
    finally:
        await communicator.disconnect()
    await asyncio.sleep(0)
