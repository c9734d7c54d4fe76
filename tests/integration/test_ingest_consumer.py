"""The agent consumer in-process (channels WebsocketCommunicator) with real Redis/Postgres."""

import asyncio
import contextlib
import uuid

import orjson
import pytest
from channels.testing import WebsocketCommunicator
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from controlplane.telemetry import hotstate
from controlplane.telemetry.models import AgentCommand
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import GPU, NIC, Cluster, Node, ServedModel, Worker
from tests.integration.live_support import WAIT_S

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def redis_prefix(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_MAX_REPORTS_PER_S = 50
    settings.TELEMETRY_REPORT_BURST = 50
    from controlplane.telemetry import framelimits

    framelimits._buckets.clear()
    yield
    client = hotstate.sync_redis()
    keys = list(client.scan_iter(settings.TELEMETRY_REDIS_PREFIX + "*"))
    if keys:
        client.delete(*keys)


@pytest.fixture
def fleet():
    cluster = Cluster.objects.create(name="c1")
    ServedModel.objects.create(cluster=cluster, name="m", layers=2, kv_heads=2, head_dim=32,
                               kv_dtype_bytes=2, weight_bytes=1000)
    a = Node.objects.create(cluster=cluster, hostname="node-a")
    b = Node.objects.create(cluster=cluster, hostname="node-b")
    return cluster, a, issue_token(a), b, issue_token(b)


def hello(host="node-a"):
    return {
        "type": "hello", "protocol": [1], "agent_version": "test", "hostname": host,
        "inventory": {
            "gpus": [{"index": 0, "uuid": f"GPU-{host}-0", "name": "H200",
                      "memory_total_bytes": 141 * 2**30},
                     {"index": 1, "uuid": f"GPU-{host}-1", "name": "H200",
                      "memory_total_bytes": 141 * 2**30}],
            "nics": [{"name": "eth0", "line_rate_gbps": 100, "transport": "ethernet"}],
            "engines": [{"id": "e0", "model": "m", "kind": "vllm", "gpus": [0], "tp": 1,
                         "role": "both", "api_url": "http://127.0.0.1:1"},
                        {"id": "e1", "model": "unknown-model", "gpus": [1]}],
        },
    }


def report(seq, **engine):
    return {"type": "report", "seq": seq, "ts": 1.0, "ack": True,
            "gpus": [{"index": 0, "utilization": 0.5, "memory_used_bytes": 10,
                      "memory_total_bytes": 100}],
            "nics": [{"name": "eth0", "tx_gbps": 1.5, "rx_gbps": 0.5}],
            "engines": [{"id": "e0", "up": True, "running": 3, "waiting": 1,
                         "kv_blocks_used": 40, "kv_blocks_total": 100, "kv_usage": 0.4,
                         "role": "both", **engine},
                        {"id": "e1", "up": True, "running": 1}]}


async def connect(token):
    from controlplane.asgi import application

    headers = [(b"authorization", f"Bearer {token}".encode())] if token else []
    comm = WebsocketCommunicator(application, "/ws/agent/v1/", headers=headers)
    # Every wait here for something expected is WAIT_S, an upper bound and not a goal:
    # beside the background shard a token lookup on a fresh PostgreSQL connection took
    # over Channels' default 1 s (CI at a8ebe4e).
    connected, _ = await comm.connect(timeout=WAIT_S)
    assert connected
    return comm


async def recv(comm, timeout=WAIT_S):
    return orjson.loads(await comm.receive_from(timeout))


async def output(comm) -> dict:
    """The next ASGI message the server sends (a frame, or its close)."""
    return await comm.receive_output(WAIT_S)


async def disconnect(*comms) -> None:
    """Disconnect and wait for the consumer's disconnect handler (it waits for the inventory
    reconcile, then marks the node). Channels' default waits 1 s and then silently cancels
    the consumer, its bookkeeping half done."""
    for comm in comms:
        await comm.disconnect(timeout=WAIT_S)


def run(coro):
    return asyncio.run(coro)


def test_hello_report_hot_state_and_reconciliation(fleet):
    cluster, a, token_a, _b, _ = fleet

    async def scenario():
        comm = await connect(token_a)
        await comm.send_to(text_data=orjson.dumps(hello()).decode())
        welcome = await recv(comm)
        assert welcome["type"] == "welcome" and welcome["node_id"] == a.pk
        assert welcome["unmatched_engines"] == ["e1"]
        await comm.send_to(text_data=orjson.dumps(report(1)).decode())
        assert await recv(comm) == {"type": "ack", "seq": 1}
        await disconnect(comm)

    run(scenario())
    worker = Worker.objects.get(node=a, name="e0")
    assert not Worker.objects.filter(name="e1").exists()
    assert GPU.objects.filter(node=a).count() == 2 and NIC.objects.get(node=a).name == "eth0"
    state = hotstate.worker_state(worker.pk)
    assert (state["running"], state["waiting"], state["kv_blocks_used"]) == (3, 1, 40)
    assert state["stale"] is False and state["node_id"] == a.pk
    node = hotstate.node_state(a.pk)
    assert node["unmatched_engines"][0]["id"] == "e1"
    assert node["gpus"][0]["utilization"] == 0.5
    snap = hotstate.cluster_snapshot(cluster.pk)
    assert set(snap["nodes"]) == {a.pk} and set(snap["workers"]) == {worker.pk}
    assert hotstate.history("kv_usage", worker_id=worker.pk)[0][1] == 0.4
    assert hotstate.history("nic_tx_gbps", node_id=a.pk)[0][1] == 1.5
    a.refresh_from_db()
    assert a.status == "stale"  # its only connection closed


def test_missing_inventory_is_flagged_not_deleted(fleet):
    _c, a, token_a, _b, _ = fleet

    async def scenario(msg):
        comm = await connect(token_a)
        await comm.send_to(text_data=orjson.dumps(msg).decode())
        assert (await recv(comm))["type"] == "welcome"
        await disconnect(comm)

    run(scenario(hello()))
    smaller = hello()
    smaller["inventory"]["gpus"] = smaller["inventory"]["gpus"][:1]
    smaller["inventory"]["engines"] = []
    smaller["inventory"]["nics"] = []
    run(scenario(smaller))
    assert GPU.objects.get(node=a, index=1).missing is True
    assert NIC.objects.get(node=a, name="eth0").missing is True
    assert Worker.objects.get(node=a, name="e0").state == "missing"
    run(scenario(hello()))
    assert GPU.objects.get(node=a, index=1).missing is False
    assert Worker.objects.get(node=a, name="e0").state == "active"


def test_bad_token_and_speaking_for_another_node(fleet):
    _c, _a, token_a, _b, _ = fleet

    async def scenario():
        comm = await connect("wrong")
        err = await recv(comm)
        assert err["code"] == "unauthorized"
        assert (await output(comm))["code"] == 4001
        comm = await connect(token_a)
        await comm.send_to(text_data=orjson.dumps(hello("node-b")).decode())
        err = await recv(comm)
        assert err["code"] == "forbidden"
        assert (await output(comm))["code"] == 4003

    run(scenario())


def test_malformed_and_flood_get_typed_errors_and_other_node_unaffected(fleet, settings):
    _c, _a, token_a, b, token_b = fleet
    # A burst of 5 that all but never refills: the flood below is refused however slowly a
    # loaded box gets through it (at 5/s, 20 reports taking over 3 s were all accepted).
    settings.TELEMETRY_MAX_REPORTS_PER_S = 1e-4
    settings.TELEMETRY_REPORT_BURST = 5

    async def scenario():
        ca = await connect(token_a)
        cb = await connect(token_b)
        await ca.send_to(text_data=orjson.dumps(hello("node-a")).decode())
        await cb.send_to(text_data=orjson.dumps(hello("node-b")).decode())
        assert (await recv(ca))["type"] == "welcome"
        assert (await recv(cb))["type"] == "welcome"
        cases = [
            ("{not json", "bad_json"),
            ("[1,2]", "unknown_type"),
            (orjson.dumps({"type": "report", "seq": 1, "ts": 1.0,
                           "gpus": [{"index": 9}]}).decode(), "unknown_gpu"),
            (orjson.dumps(report(2) | {"gpus": [{"index": 0, "utilization": 2}]}).decode(),
             "out_of_range"),
            ("x" * 300_000, "too_large"),
        ]
        for text, code in cases:
            await ca.send_to(text_data=text)
            assert (await recv(ca))["code"] == code
        # Flood: beyond the bucket, reports are refused with rate_limited…
        for seq in range(10, 30):
            await ca.send_to(text_data=orjson.dumps(report(seq)).decode())
        frames = [await recv(ca) for _ in range(20)]
        assert any(f.get("code") == "rate_limited" for f in frames)
        # …while node B goes on undisturbed.
        await cb.send_to(text_data=orjson.dumps(report(1, running=7)).decode())
        assert await recv(cb) == {"type": "ack", "seq": 1}
        await disconnect(ca, cb)

    run(scenario())
    worker_b = Worker.objects.get(node=b, name="e0")
    assert hotstate.worker_state(worker_b.pk)["running"] == 7


def test_command_round_trip_and_late_delivery(fleet):
    from controlplane.telemetry.commands import command_status, send_command

    _c, a, token_a, _b, _ = fleet
    queued_early = send_command(a.pk, "drain", {"engine": "e0"})  # not connected yet

    async def scenario():
        comm = await connect(token_a)
        await comm.send_to(text_data=orjson.dumps(hello()).decode())
        assert (await recv(comm))["type"] == "welcome"
        early = await recv(comm)
        assert early["type"] == "command" and early["id"] == queued_early
        from asgiref.sync import sync_to_async

        cid = await sync_to_async(send_command)(a.pk, "set_role",
                                                {"engine": "e0", "role": "prefill"})
        cmd = await recv(comm)
        assert cmd == {"type": "command", "id": cid, "command": "set_role",
                       "args": {"engine": "e0", "role": "prefill"},
                       "expires_at": cmd["expires_at"]}
        for ident in (cid, queued_early):
            await comm.send_to(text_data=orjson.dumps(
                {"type": "command_result", "id": ident, "status": "succeeded",
                 "detail": "ok"}).decode())
        await comm.send_to(text_data=orjson.dumps(
            {"type": "command_result", "id": str(uuid.uuid4()), "status": "succeeded"}
        ).decode())
        assert (await recv(comm))["code"] == "forbidden"
        await disconnect(comm)
        return cid

    cid = run(scenario())
    assert command_status(cid)["status"] == "succeeded"
    assert AgentCommand.objects.get(pk=queued_early).status == "succeeded"


def test_old_connection_late_disconnect_does_not_mark_node_offline(fleet):
    _c, a, token_a, _b, _ = fleet

    async def scenario():
        old = await connect(token_a)
        await old.send_to(text_data=orjson.dumps(hello()).decode())
        assert (await recv(old))["type"] == "welcome"
        new = await connect(token_a)
        await new.send_to(text_data=orjson.dumps(hello()).decode())
        assert (await recv(new))["type"] == "welcome"
        superseded = await recv(old)
        assert superseded["code"] == "superseded"
        await disconnect(old)
        await asyncio.sleep(0.2)
        live = await asyncio.to_thread(hotstate.live_connection, a.pk)
        assert live.get("channel")  # the new connection still owns the node
        await new.send_to(text_data=orjson.dumps(report(1)).decode())
        assert (await recv(new))["type"] == "ack"
        await disconnect(new)

    run(scenario())


# --------------------------------------------------------------------------- property test


json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                           max_leaves=20)
report_keys = st.sampled_from(["seq", "ts", "gpus", "engines", "nics", "agent"])
gpu_keys = st.sampled_from(["index", "utilization", "memory_used_bytes", "power_w",
                            "temperature_c", "nvlink_tx_gbps"])
engine_keys = st.sampled_from(["id", "running", "kv_usage", "kv_blocks_used", "role",
                               "prefix_hit_rate", "ttft_p95_s", "kv_events", "up"])


@st.composite
def frames(draw):
    kind = draw(st.sampled_from(["value", "report", "gpu", "engine", "garbage", "huge"]))
    if kind == "value":
        value = draw(json_values)
        if isinstance(value, dict) and value.get("type") == "inventory":
            value["type"] = "x"  # a valid inventory is answered by silence
        if isinstance(value, dict) and value.get("type") == "report":
            value["ack"] = True
        return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode() \
            if not _has_bad_float(value) else "NaN"
    if kind == "garbage":
        return draw(st.text(min_size=1, max_size=50)).replace("{", "[") + "{"
    if kind == "huge":
        return orjson.dumps(report(1) | {"pad": "x" * 300_000}).decode()
    msg = report(draw(st.integers(min_value=0, max_value=10**6)))
    if kind == "report":
        msg[draw(report_keys)] = draw(json_values)
    elif kind == "gpu":
        msg["gpus"][0][draw(gpu_keys)] = draw(json_values)
    else:
        msg["engines"][0][draw(engine_keys)] = draw(json_values)
    msg["ack"] = True
    if _has_bad_float(msg):
        return orjson.dumps(msg, default=str).decode().replace('"nan"', "NaN")
    return orjson.dumps(msg, option=orjson.OPT_NON_STR_KEYS).decode()


def _has_bad_float(value) -> bool:
    if isinstance(value, float):
        return value != value or value in (float("inf"), float("-inf"))
    if isinstance(value, dict):
        return any(_has_bad_float(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_bad_float(v) for v in value)
    return False


# Bounded for CI: no shrinking phase (a failure prints its example and seed anyway).
@hsettings(max_examples=15, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
           suppress_health_check=[HealthCheck.function_scoped_fixture,
                                  HealthCheck.too_slow])
@given(batch=st.lists(frames(), min_size=1, max_size=8))
def test_property_every_bad_frame_gets_one_typed_answer(fleet, batch):
    _c, _a, token_a, _b, token_b = fleet

    async def scenario():
        ca = await connect(token_a)
        cb = await connect(token_b)
        await ca.send_to(text_data=orjson.dumps(hello("node-a")).decode())
        await cb.send_to(text_data=orjson.dumps(hello("node-b")).decode())
        assert (await recv(ca))["type"] == "welcome"
        assert (await recv(cb))["type"] == "welcome"
        for text in batch:
            await ca.send_to(text_data=text)
            answer = await recv(ca)
            assert answer["type"] in ("ack", "error"), answer
            if answer["type"] == "error":
                assert answer["code"] in {
                    "bad_json", "too_large", "unknown_type", "bad_schema", "out_of_range",
                    "unknown_gpu", "unknown_engine", "unknown_nic", "forbidden",
                    "rate_limited"}, answer
                assert answer["reason"]
        assert await ca.receive_nothing(0.05)  # exactly one answer per frame
        await cb.send_to(text_data=orjson.dumps(report(1, running=5)).decode())
        assert await recv(cb) == {"type": "ack", "seq": 1}
        await disconnect(ca, cb)

    run(scenario())


def test_live_fanout_is_coalesced_per_cluster(fleet):
    from channels.layers import get_channel_layer

    cluster, _a, token_a, _b, token_b = fleet

    async def scenario():
        loop = asyncio.get_running_loop()
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(f"live.cluster.{cluster.pk}", channel)
        started = loop.time()
        ca, cb = await connect(token_a), await connect(token_b)
        for comm, host in ((ca, "node-a"), (cb, "node-b")):
            await comm.send_to(text_data=orjson.dumps(hello(host)).decode())
            assert (await recv(comm))["type"] == "welcome"
        for seq in range(1, 6):
            for comm in (ca, cb):
                await comm.send_to(text_data=orjson.dumps(report(seq)).decode())
                assert (await recv(comm))["type"] == "ack"
        span = loop.time() - started
        messages, nodes = [], set()
        while nodes != {_a.pk, _b.pk}:
            messages.append(await asyncio.wait_for(layer.receive(channel), WAIT_S))
            nodes.update(messages[-1]["node_ids"])
        with contextlib.suppress(asyncio.TimeoutError):  # a last one still due
            while True:
                messages.append(await asyncio.wait_for(layer.receive(channel), 1.5))
        assert {m["type"] for m in messages} == {"telemetry.changed"}
        # At most one message per cluster per fan-out interval, both nodes in one: on a
        # quiet box the ten reports fit one interval and make one message, not ten. A
        # starved box spreads them over more intervals, each allowed its message.
        assert len(messages) <= span / hotstate.FANOUT_INTERVAL_S + 2, (span, messages)
        await layer.group_discard(f"live.cluster.{cluster.pk}", channel)
        await disconnect(ca, cb)

    run(scenario())
