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


@pytest.mark.timeout(30)
def test_a_flush_sends_each_workers_load_deltas_summed_once(tmp_path, monkeypatch):
    """Bookings and releases made within one flush interval reach a sibling as one message
    per worker with their sums, and a route once; what they add up to is what the sibling
    holds."""
    import msgpack

    import gateway.peers as peers

    monkeypatch.setattr(peers, "FLUSH_S", 0.05)

    async def scenario():
        bus = PeerBus(0, 2, 9998, loads=defaultdict(WorkerLoad), base=str(tmp_path),
                      on_route=lambda *a: None)
        sent = []

        class Pub:
            def send(self, raw, flags=0):
                sent.append(msgpack.unpackb(raw))

        bus.pub = Pub()
        bus.load("w1", 10.0, 0.0, 0)  # request A: prefill queued on w1
        bus.load("w2", 0.0, 20.0, 1)  # ... and decoding on w2
        bus.load("w1", 4.0, 0.0, 0)  # request B behind it
        bus.load("w1", -10.0, 0.0, 0)  # A's prefill done
        bus.route("m", "w2", [b"h"])
        bus.route("m", "w2", [b"h"])  # the same prompt again: sent once
        assert sent == []  # nothing before the interval ends
        await asyncio.sleep(0.2)
        assert len(sent) == 1
        peer, batch = sent[0]
        assert peer == 0 and [m for m in batch if m[0] == "route"] == [
            ["route", "m", "w2", [b"h"]]]
        loads = [m for m in batch if m[0] == "load"]
        assert sorted(loads) == [["load", "w1", True, 4.0, 0.0, 0, True],
                                 ["load", "w2", False, 0.0, 20.0, 1, False]]
        sibling = defaultdict(WorkerLoad)
        other = PeerBus(1, 2, 9998, loads=sibling, on_route=lambda *a: None)
        for message in batch:
            other.apply(0, message)
        assert sibling["w1"].prefill_blocks == 4.0 and sibling["w2"].in_flight == 1

    asyncio.run(scenario())

