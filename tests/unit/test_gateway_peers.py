"""Gateway processes sharing one port share in-flight load, prefix routes and pushed tables
over the peer bus (real ZMQ ipc sockets); a silent sibling's load is taken back out."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest

from gateway.peers import PeerBus
from gateway.router import WorkerLoad


async def until(pred, timeout=5.0):
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
        buses = [PeerBus(i, 2, 9999, loads=loads[i], base=str(tmp_path), dead_after_s=1.0,
                         on_route=lambda *a: routes.append(a), on_table=tables.append)
                 for i in range(2)]
        for bus in buses:
            await bus.start()
        try:
            await asyncio.sleep(0.3)  # subscriptions connect
            buses[0].load("w1", 10.0, 20.0, 1)
            buses[0].route("m", "w1", [b"h1", b"h2"])
            buses[0].table(b'{"version": 2}')
            assert await until(lambda: loads[1]["w1"].in_flight == 1)
            assert loads[1]["w1"].decode_blocks == 20.0 and loads[0]["w1"].in_flight == 0
            assert await until(lambda: routes == [("m", "w1", [b"h1", b"h2"])])
            assert await until(lambda: tables == [b'{"version": 2}'])
            buses[0].load("w1", -10.0, 0.0, 0)
            assert await until(lambda: loads[1]["w1"].prefill_blocks == 0.0)
            # Process 0 dies with a request in flight: process 1 takes its load back out.
            await buses[0].close()
            assert await until(lambda: loads[1]["w1"].in_flight == 0, timeout=5)
            assert loads[1]["w1"].decode_blocks == 0.0
        finally:
            for bus in buses:
                await bus.close()

    asyncio.run(scenario())
