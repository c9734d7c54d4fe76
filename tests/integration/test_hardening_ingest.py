"""Issue 20 regression tests for the agent consumer (in-process, real PostgreSQL + Redis):
defects 3 (DB limits and DB errors during hello), 6 (generation-checked hot-state writes),
8 (rate limits per frame kind) and 9 (hellos that do not queue behind each other).

Defects 2 and 10 need the real ASGI server: tests/integration/adversarial/.
"""

import asyncio
import threading
import time

import orjson
import pytest
from django.db import OperationalError

from controlplane.telemetry import consumers, framelimits, hotstate, reconcile
from controlplane.telemetry.ingest import NodeContext, index_commands, report_commands
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import GPU, Node, Worker
from tests.integration import test_ingest_consumer as base
from tests.integration.live_support import WAIT_S
from tests.integration.test_ingest_consumer import (
    connect,
    disconnect,
    hello,
    output,
    recv,
    report,
    run,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]
fleet, redis_prefix = base.fleet, base.redis_prefix  # the consumer tests' fixtures


def send(comm, msg):
    return comm.send_to(text_data=orjson.dumps(msg).decode())


# --------------------------------------------------------------------------- defect 3

def test_defect3_longest_protocol_values_are_stored(fleet):
    _c, a, token_a, _b, _ = fleet
    msg = hello()
    msg["inventory"]["gpus"][0]["uuid"] = "GPU-" + "u" * 124  # 128 characters
    msg["inventory"]["gpus"][0]["name"] = "N" * 128

    async def scenario():
        comm = await connect(token_a)
        await send(comm, msg)
        assert (await recv(comm))["type"] == "welcome"
        await disconnect(comm)

    run(scenario())
    gpu = GPU.objects.get(node=a, index=0)
    assert len(gpu.uuid) == 128 and gpu.product_name == "N" * 128


def test_defect3_database_error_during_hello_closes_with_a_typed_error(fleet, monkeypatch):
    _c, _a, token_a, _b, _ = fleet

    def broken(*args, **kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(reconcile, "accept_hello", broken)

    async def scenario():
        comm = await connect(token_a)
        await send(comm, hello())
        # Welcomed from the quick reads; the reconcile behind it fails: a typed error and
        # a close (1011), so the agent retries with backoff instead of waiting forever.
        assert (await recv(comm))["type"] == "welcome"
        err = await recv(comm)
        assert err["type"] == "error" and err["code"] == "internal"
        assert await output(comm) == {"type": "websocket.close", "code": 1011}
        await disconnect(comm)

    run(scenario())


# --------------------------------------------------------------------------- defect 6

def test_defect6_report_of_an_older_generation_is_not_applied(fleet):
    cluster, a, _token_a, _b, _ = fleet
    keys = hotstate.Keys()
    client = hotstate.sync_redis()

    def write(gen, running):
        ctx = NodeContext(a.pk, cluster.pk, a.hostname, gen, 2.0, {"e0": 99})
        msg = report(1, running=running)
        replies = [client.execute_command(*cmd) for cmd in index_commands(ctx, keys)]
        for cmd in report_commands(ctx, msg, time.time(), keys, lambda k, n: True):
            replies.append(client.execute_command(*cmd))
        return replies

    client.set(keys.gen(a.pk), 2)  # generation 2 was welcomed
    write(2, running=5)
    write(1, running=77)  # in flight from the old connection
    assert hotstate.worker_state(99)["running"] == 5
    assert hotstate.node_state(a.pk)["gen"] == 2


def test_defect6_old_connection_reports_after_newer_welcome_are_neither_applied_nor_acked(
        fleet, monkeypatch):
    _c, a, token_a, _b, _ = fleet

    async def superseded_late(self, event):  # the supersede message is still in flight
        return None

    monkeypatch.setattr(consumers.AgentConsumer, "agent_superseded", superseded_late)

    async def scenario():
        old = await connect(token_a)
        await send(old, hello())
        assert (await recv(old))["type"] == "welcome"
        new = await connect(token_a)
        await send(new, hello())
        assert (await recv(new))["type"] == "welcome"
        await send(new, report(1, running=5))
        got = await recv(new)
        assert got["type"] == "ack", got
        await send(old, report(2, running=77))
        answer = await recv(old)
        assert answer["type"] == "error" and answer["code"] == "superseded", answer
        await disconnect(old, new)

    run(scenario())
    worker = Worker.objects.get(node=a, name="e0")
    assert hotstate.worker_state(worker.pk)["running"] == 5


# --------------------------------------------------------------------------- defect 8

def test_defect8_inventory_flood_is_rate_limited_before_the_database(fleet, monkeypatch):
    _c, a, token_a, _b, token_b = fleet
    calls = []
    held, release = threading.Event(), threading.Event()
    real = reconcile.accept_hello

    def counting(node_id, agent_version, *args, **kwargs):
        calls.append(node_id)
        if node_id == a.pk and agent_version is None:  # one of A's inventory frames
            held.set()
            release.wait(2 * WAIT_S)  # past B's wait: a B stuck behind A fails first
        return real(node_id, agent_version, *args, **kwargs)

    monkeypatch.setattr(reconcile, "accept_hello", counting)
    # The bucket's burst as configured, its refill (0.2/s) all but stopped: A's frames are
    # held for as long as B takes, which on a loaded box would refill a frame or two.
    burst = framelimits.FRAME_RATES["inventory"][1]
    monkeypatch.setitem(framelimits.FRAME_RATES, "inventory", (1e-4, burst))
    burst = int(burst)

    async def scenario():
        ca, cb = await connect(token_a), await connect(token_b)
        await send(ca, hello("node-a"))
        await send(cb, hello("node-b"))
        assert (await recv(ca))["type"] == "welcome"
        assert (await recv(cb))["type"] == "welcome"
        inventory = {"type": "inventory", "inventory": hello("node-a")["inventory"]}
        for _ in range(60):
            await send(ca, inventory)
        # While A's first inventory is held in the database, B's report is answered: it
        # does not queue behind A's flood.
        assert await asyncio.to_thread(held.wait, WAIT_S)
        await send(cb, report(1))
        assert (await recv(cb))["type"] == "ack"
        release.set()
        limited = [await recv(ca) for _ in range(60 - burst)]
        assert all(f["code"] == "rate_limited" for f in limited), limited
        await disconnect(ca, cb)

    try:
        run(scenario())
    finally:
        release.set()
    # One hello plus the burst reached the database.
    assert calls.count(a.pk) == burst + 1


# --------------------------------------------------------------------------- defect 9

def test_defect9_hellos_of_different_nodes_are_stored_side_by_side(fleet, monkeypatch):
    cluster, _a, _ta, _b, _tb = fleet
    nodes = [Node.objects.create(cluster=cluster, hostname=f"par-{i}") for i in range(3)]
    tokens = [issue_token(n) for n in nodes]
    # Each hello's reconcile goes on only once all three are in the database at once: side
    # by side they are; queued behind each other the barrier times out and the hellos'
    # inventories are not stored (no timing to judge on a loaded box).
    together = threading.Barrier(len(nodes), timeout=WAIT_S)
    real = reconcile.accept_hello

    def side_by_side(*args, **kwargs):
        together.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(reconcile, "accept_hello", side_by_side)

    async def one(node, token):
        comm = await connect(token)
        await send(comm, hello(node.hostname))
        welcome = await recv(comm)
        await disconnect(comm)  # which waits for the hello's reconcile
        return welcome

    async def scenario():
        return await asyncio.gather(*(one(n, t) for n, t in zip(nodes, tokens, strict=True)))

    welcomes = run(scenario())
    assert all(w["type"] == "welcome" for w in welcomes)
    assert not together.broken
    assert Worker.objects.filter(node__in=nodes, name="e0").count() == len(nodes)


def test_defect9_hello_after_a_crash_is_welcomed_though_the_old_channel_is_gone(
        fleet, monkeypatch):
    """After kill -9 of the web server, live:<node> still names a channel of the dead
    process; the superseded hint to it fails (its inbox is full), and must not cost the new
    connection its welcome (the 500-agent restart bench found it)."""
    from channels.exceptions import ChannelFull
    from channels.layers import get_channel_layer

    _c, a, token_a, _b, _ = fleet
    hotstate.sync_redis().hset(hotstate.Keys().live(a.pk), mapping={
        "gen": 1, "channel": "specific.deadprocess!abc"})
    layer = type(get_channel_layer())

    async def full(self, channel, message):
        raise ChannelFull()

    monkeypatch.setattr(layer, "send", full)

    async def scenario():
        comm = await connect(token_a)
        await send(comm, hello())
        assert (await recv(comm))["type"] == "welcome"
        await send(comm, report(1))
        assert (await recv(comm))["type"] == "ack"
        await disconnect(comm)

    run(scenario())


# --------------------------------------------------------------------------- defect 2

def test_defect2_frames_after_a_superseded_close_are_not_answered(fleet):
    """After the server closed a connection (4009 here, 4008 in the live-server test), frames
    already on their way are dropped unanswered: answering them is a send after close,
    which uvicorn refuses with the RuntimeError that escaped receive()."""
    _c, _a, token_a, _b, _ = fleet

    async def scenario():
        old = await connect(token_a)
        await send(old, hello())
        assert (await recv(old))["type"] == "welcome"
        new = await connect(token_a)
        await send(new, hello())
        assert (await recv(new))["type"] == "welcome"
        assert (await recv(old))["code"] == "superseded"
        assert (await output(old))["type"] == "websocket.close"
        for seq in range(3):
            await send(old, report(seq))
        await old.send_to(text_data="{not json")
        assert await old.receive_nothing(0.5)
        await disconnect(old, new)

    run(scenario())


def test_defect2_channel_messages_after_the_close_are_not_sent(fleet):
    """A superseded hint that reaches a connection this side already closed is not
    answered (it would be a send after close: a RuntimeError outside receive())."""
    _c, _a, token_a, _b, _ = fleet

    async def scenario():
        comm = await connect(token_a)
        await send(comm, hello())
        assert (await recv(comm))["type"] == "welcome"
        for _ in range(consumers.ERROR_LIMIT + 1):
            await comm.send_to(text_data="{not json")
        outputs = [await output(comm) for _ in range(consumers.ERROR_LIMIT + 1)]
        assert outputs[-1] == {"type": "websocket.close", "code": 4008}
        live = await asyncio.to_thread(hotstate.live_connection, _a.pk)
        from channels.layers import get_channel_layer

        await get_channel_layer().send(live["channel"], {"type": "agent.superseded",
                                                         "gen": -1})
        assert await comm.receive_nothing(1.0)
        await disconnect(comm)

    run(scenario())
