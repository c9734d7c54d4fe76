"""Hostile agents against the live consumer: real uvicorn, PostgreSQL and Redis.

Regression tests for issue 20 defects 2 (close after too many errors), 5 (byte limit) and
10 (oversized upgrade header), and a hypothesis run of generated frames: every frame gets
exactly one typed answer, the server logs no crash, and another node is not disturbed.
"""

from __future__ import annotations

import asyncio
import socket
import time

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed

from controlplane.telemetry import hotstate
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Node, ServedModel
from tests.conftest import WAIT_S, wait_until
from tests.integration.test_ingest_consumer import frames, hello, report

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

ANSWER_CODES = {"bad_json", "too_large", "unknown_type", "bad_schema", "out_of_range",
                "unknown_gpu", "unknown_engine", "unknown_nic", "forbidden", "rate_limited"}


@pytest.fixture
def nodes(hot_prefix):
    cluster = Cluster.objects.create(name=f"adv{time.monotonic_ns() % 10**8}")
    ServedModel.objects.create(cluster=cluster, name="m", layers=2, kv_heads=2, head_dim=32,
                               kv_dtype_bytes=2, weight_bytes=1000)
    a = Node.objects.create(cluster=cluster, hostname="node-a")
    b = Node.objects.create(cluster=cluster, hostname="node-b")
    return a, issue_token(a), b, issue_token(b)


async def agent(url: str, token: str, host: str):
    ws = await ws_connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                          max_size=None, open_timeout=WAIT_S)
    await ws.send(orjson.dumps(hello(host)).decode())
    welcome = orjson.loads(await asyncio.wait_for(ws.recv(), WAIT_S))
    assert welcome["type"] == "welcome", welcome
    return ws


async def answer(ws, timeout: float = WAIT_S) -> dict:
    return orjson.loads(await asyncio.wait_for(ws.recv(), timeout))


# --------------------------------------------------------------------------- defect 2

def test_defect2_too_many_errors_closes_cleanly_and_marks_the_node(cp_server, nodes):
    a, token_a, _b, token_b = nodes

    async def scenario():
        ws = await agent(cp_server.ws_url, token_a, "node-a")
        for _ in range(260):  # more than ERROR_LIMIT (200) in the window, without waiting
            await ws.send("{not json")
        await ws.send(orjson.dumps(report(1)).decode())  # arrives after the close
        with pytest.raises(ConnectionClosed):
            while True:
                await asyncio.wait_for(ws.recv(), WAIT_S)
        assert ws.close_code == 4008
        other = await agent(cp_server.ws_url, token_b, "node-b")  # the server still serves
        await other.send(orjson.dumps(report(1)).decode())
        assert (await answer(other)) == {"type": "ack", "seq": 1}
        await other.close()

    asyncio.run(scenario())
    live = wait_until(lambda: (c := hotstate.live_connection(a.pk)).get("disconnected_at") and c)
    assert "channel" not in live
    wait_until(lambda: Node.objects.get(pk=a.pk).status == "stale")
    time.sleep(0.5)
    cp_server.assert_no_crash()


# --------------------------------------------------------------------------- defect 5

def test_defect5_frame_limit_is_in_bytes_on_the_wire(cp_server, nodes):
    _a, token_a, _b, _tb = nodes

    async def scenario():
        ws = await agent(cp_server.ws_url, token_a, "node-a")
        # 100 k characters, 300 KB in UTF-8: over the 256 KiB limit.
        await ws.send(orjson.dumps(report(1) | {"pad": "€" * 100_000}).decode())
        assert (await answer(ws))["code"] == "too_large"
        await ws.close()

    asyncio.run(scenario())
    cp_server.assert_no_crash()


# --------------------------------------------------------------------------- defect 10

@pytest.mark.parametrize("size", [9_000, 100_000])
def test_defect10_oversized_authorization_header_is_refused_fast(cp_server, size):
    request = (
        "GET /ws/agent/v1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
        f"Sec-WebSocket-Version: 13\r\nAuthorization: Bearer {'a' * size}\r\n\r\n").encode()
    # "Fast" means the server answers the head itself instead of reading on or timing out;
    # how many seconds that takes on a loaded 2-core CI box is not something a test can
    # bound (this module failed once, unexplained, with two test runs at once).
    with socket.create_connection(("127.0.0.1", cp_server.port), timeout=WAIT_S) as sock:
        sock.sendall(request)
        head = sock.recv(200)
    assert head.startswith(b"HTTP/1.1 431"), head


# --------------------------------------------------------------------------- property

# Bounded for CI: no shrinking phase (a failure prints its example and seed anyway).
@hsettings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(batch=st.lists(frames(), min_size=1, max_size=8))
def test_generated_frames_each_get_one_typed_answer_over_the_real_server(cp_server, nodes,
                                                                        batch):
    _a, token_a, _b, token_b = nodes

    async def scenario():
        ws, other = await agent(cp_server.ws_url, token_a, "node-a"), \
            await agent(cp_server.ws_url, token_b, "node-b")
        for text in batch:
            await ws.send(text)
            got = await answer(ws)
            assert got["type"] in ("ack", "error"), got
            if got["type"] == "error":
                assert got["code"] in ANSWER_CODES and got["reason"], got
        with pytest.raises(TimeoutError):  # exactly one answer per frame
            await asyncio.wait_for(ws.recv(), 0.1)
        await other.send(orjson.dumps(report(1, running=5)).decode())
        assert (await answer(other)) == {"type": "ack", "seq": 1}
        await ws.close()
        await other.close()

    asyncio.run(scenario())
    cp_server.assert_no_crash()
