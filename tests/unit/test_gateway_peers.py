"""Gateway processes sharing one port share in-flight load, prefix routes and pushed tables
over the peer bus (real ZMQ ipc sockets); a silent sibling's load is taken back out."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from gateway.peers import PeerBus
from gateway.router import WorkerLoad
from tests.conftest import WAIT_S


async def until(pred, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return False


@pytest.mark.timeout(30)
def test_two_buses_share_load_routes_and_tables(tmp_path):
    async def scenario():
        loads = [defaultdict(WorkerLoad), defaultdict(WorkerLoad)]
        routes, tables = [], []
        # Dead after two heartbeats (1 s each) unheard: one late heartbeat on a starved box
        # is not a death (at 1.0 s, a heartbeat a moment late took a live sibling's load out).
        buses = [PeerBus(i, 2, 9999, loads=loads[i], base=str(tmp_path), dead_after_s=2.0,
                         on_route=lambda *a: routes.append(a), on_table=tables.append)
                 for i in range(2)]
        for bus in buses:
            await bus.start()
        try:
            # Subscriptions connected (PUB/SUB joins asynchronously): each bus has heard
            # the other's probe.
            for _ in range(int(WAIT_S / 0.05)):
                buses[0].table(b"probe-0")
                buses[1].table(b"probe-1")
                if await until(lambda: {b"probe-0", b"probe-1"} <= set(tables), timeout=0.05):
                    break
            assert {b"probe-0", b"probe-1"} <= set(tables), "the buses never heard each other"
            buses[0].load("w1", 10.0, 20.0, 1)
            buses[0].route("m", "w1", [b"h1", b"h2"])
            buses[0].table(b'{"version": 2}')
            assert await until(lambda: loads[1]["w1"].in_flight == 1)
            assert loads[1]["w1"].decode_blocks == 20.0 and loads[0]["w1"].in_flight == 0
            assert await until(lambda: routes == [("m", "w1", [b"h1", b"h2"])])
            assert await until(lambda: [t for t in tables if not t.startswith(b"probe")]
                               == [b'{"version": 2}'])
            buses[0].load("w1", -10.0, 0.0, 0)
            assert await until(lambda: loads[1]["w1"].prefill_blocks == 0.0)
            # Process 0 dies with a request in flight: process 1 takes its load back out.
            await buses[0].close()
            assert await until(lambda: loads[1]["w1"].in_flight == 0)
            assert loads[1]["w1"].decode_blocks == 0.0
        finally:
            for bus in buses:
                await bus.close()

    asyncio.run(scenario())
