"""AgentTransport against a small in-process websocket server: hello/welcome, reports,
buffering with counted drops while the server is away, reconnect, commands."""

import asyncio
import time

import orjson
from websockets.asyncio.server import serve

from tests.conftest import WAIT_S, free_port
from workers_agent.config import AgentConfig
from workers_agent.transport import AgentTransport


class StubAgent:
    hooks: dict = {}

    def __init__(self):
        self.seq = 0
        self.applied = []

    def hello(self):
        return {"type": "hello", "protocol": [1], "agent_version": "t", "hostname": "h",
                "inventory": {"gpus": [], "nics": [], "engines": [{"id": "e0", "model": "m"}]}}

    async def acollect(self, counters):
        self.seq += 1
        return {"type": "report", "seq": self.seq, "ts": time.time(), "agent": dict(counters)}

    def engine_ids(self):
        return {"e0"}

    def inventory_changed(self):
        return False

    def command_applied(self, command, values):
        self.applied.append((command, values))


class FakeServer:
    def __init__(self, port):
        self.port = port
        self.reports: list[dict] = []
        self.results: list[dict] = []
        self.auth: list[str] = []
        self.server = None
        self.conns = set()

    async def handler(self, ws):
        self.conns.add(ws)
        self.auth.append(ws.request.headers.get("Authorization"))
        hello = orjson.loads(await ws.recv())
        assert hello["type"] == "hello"
        await ws.send(orjson.dumps({"type": "welcome", "protocol": 1, "node_id": 1,
                                    "report_interval_s": 0.05, "server_time": time.time(),
                                    "limits": {"max_reports_per_s": 100}}).decode())
        await ws.send(orjson.dumps({"type": "command", "id": "c1", "command": "reboot_host",
                                    "args": {"engine": "e0"}}).decode())
        async for raw in ws:
            msg = orjson.loads(raw)
            (self.reports if msg["type"] == "report" else self.results).append(msg)

    async def start(self):
        self.server = await serve(self.handler, "127.0.0.1", self.port)

    async def stop(self):
        self.server.close()
        for ws in list(self.conns):
            await ws.close()
        await self.server.wait_closed()
        self.conns.clear()


async def wait_for(pred, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        await asyncio.sleep(0.02)
    return False


def test_transport_buffers_counts_drops_and_reconnects():
    async def scenario():
        port = free_port()
        server = FakeServer(port)
        await server.start()
        cfg = AgentConfig(server=f"ws://127.0.0.1:{port}/ws/agent/v1/", token="tok",
                          hostname="h", buffer_size=3, backoff_base_s=0.05, backoff_cap_s=0.2)
        transport = AgentTransport(cfg, StubAgent())
        runner = asyncio.create_task(transport.run())
        try:
            assert await wait_for(lambda: len(server.reports) >= 3)
            assert server.auth[0] == "Bearer tok"
            assert await wait_for(lambda: server.results)
            assert server.results[0]["status"] == "refused"  # unknown command, not guessed
            await server.stop()
            # Reports go on being collected while the server is away; the buffer holds 3.
            assert await wait_for(lambda: transport.buffer.dropped > 0)
            before = len(server.reports)
            server.reports.clear()
            await server.start()
            assert await wait_for(lambda: len(server.reports) >= 5), before
            assert transport.reconnects >= 1
            counters = server.reports[-1]["agent"]
            assert counters["dropped_reports"] == transport.buffer.dropped > 0
            seqs = [r["seq"] for r in server.reports]
            assert seqs == sorted(seqs)  # backlog first, oldest first
        finally:
            transport.stop()
            await asyncio.wait_for(runner, WAIT_S)
            await server.stop()

    asyncio.run(scenario())
