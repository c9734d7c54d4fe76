"""A small OpenAI-style engine stub (aiohttp, loopback) for in-process gateway tests: answers
completions streamed or not, plays vLLM's NixlConnector P/D handshake, and can be told to
refuse transfers or die. The engines are the boundary the gateway does not own; the
simulator covers them end to end in tests/integration/gateway."""

from __future__ import annotations

import asyncio
import itertools

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from gateway.app import create_app
from gateway.config import GatewayConfig
from gateway.statictable import static_table

MODEL = "m"


class StubEngine:
    def __init__(self, engine_id: str):
        self.id = engine_id
        self.refuse_transfers = False  # answer 400 kv_transfer_params_unknown to decode
        self.dead = False  # close connections without an answer
        self.requests: list[dict] = []
        self._ids = itertools.count()
        self.server: TestServer | None = None

    async def start(self) -> StubEngine:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_post("/v1/chat/completions", self.completions)
        self.server = TestServer(app)
        await self.server.start_server()
        return self

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    async def close(self) -> None:
        await self.server.close()

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        self.requests.append(body)
        if self.dead:
            request.transport.close()
            await asyncio.sleep(0.05)
            return web.Response(status=500)
        params = body.get("kv_transfer_params") or {}
        if params.get("do_remote_prefill") and self.refuse_transfers:
            return web.json_response(
                {"error": {"message": "KV transfer refused", "type": "BadRequestError",
                           "code": "kv_transfer_params_unknown"}}, status=400)
        n = next(self._ids)
        answer_params = None
        if params.get("do_remote_decode"):
            answer_params = {"do_remote_prefill": True, "remote_engine_id": self.id,
                             "remote_block_ids": [1, 2], "remote_host": "127.0.0.1",
                             "remote_port": 1, "remote_request_id": f"{self.id}-{n}"}
        usage = {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for token in ("a", "b"):
                chunk = {"id": f"c{n}", "choices": [{"index": 0, "text": token}]}
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            if (body.get("stream_options") or {}).get("include_usage"):
                chunk = {"id": f"c{n}", "choices": [], "usage": usage}
                await response.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response({"id": f"c{n}", "object": "text_completion", "model": MODEL,
                                  "choices": [{"index": 0, "text": "ab",
                                               "finish_reason": "length"}],
                                  "usage": usage, "kv_transfer_params": answer_params,
                                  "served_by": self.id})


async def start_gateway(table: dict, **config):
    gateway, app = create_app(GatewayConfig(kv_events=False, seed=1, **config))
    client = TestClient(TestServer(app))
    await client.start_server()
    assert gateway.store.apply(table).outcome == "ack"
    return gateway, client


def table_for(engines: list[tuple[StubEngine, str]], mode: str = "aggregated", **routing):
    table = static_table(MODEL, [{"url": e.url, "id": e.id, "role": role} for e, role in engines],
                         mode=mode, local_prefill_max_tokens=0)
    table["models"][0]["routing"].update(routing)
    return table
