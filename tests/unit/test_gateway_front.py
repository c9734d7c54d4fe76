"""The gateway's lean HTTP/1.1 server (gateway/front.py): the OpenAI endpoints and the rest
served as under aiohttp (the P/D, "why" and admin-hardening scenarios run again over it),
and hostile HTTP — malformed, huge heads, oversized and chunked bodies, pipelining, slow
heads — answered with a 4xx, never a 500 or a dead server."""

from __future__ import annotations

import asyncio

import aiohttp
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import front
from gateway.app import Gateway
from gateway.config import GatewayConfig
from tests.conftest import WAIT_S

from . import test_gateway_pd_pairs, test_gateway_table_hardening, test_gateway_why
from .gateway_stub import MODEL, StubEngine, table_for


class LeanClient:
    """What the scenarios use of aiohttp's TestClient, over the lean server."""

    def __init__(self, frontend: front.Front, server, url: str):
        self.front, self.server, self.url = frontend, server, url
        self.session = aiohttp.ClientSession(base_url=url)

    def __getattr__(self, name):  # post, get, put
        return getattr(self.session, name)

    async def close(self) -> None:
        await self.session.close()
        await self.front.stop(self.server)


async def start_lean(table: dict | None, **config) -> tuple[Gateway, LeanClient]:
    gateway = Gateway(GatewayConfig(kv_events=False, seed=1, **config))
    frontend = front.Front(gateway)
    server = await frontend.start("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    if table is not None:
        assert gateway.store.apply(table).outcome == "ack"
    return gateway, LeanClient(frontend, server, f"http://127.0.0.1:{port}")


# --- the scenarios of the aiohttp server, again over this one ---------------------------


def test_pd_pair_scenario_over_the_lean_server(monkeypatch):
    monkeypatch.setattr(test_gateway_pd_pairs, "start_gateway", start_lean)
    test_gateway_pd_pairs.test_refusing_decode_and_dying_prefill_cost_the_client_nothing()


def test_why_scenario_over_the_lean_server(monkeypatch):
    monkeypatch.setattr(test_gateway_why, "start_gateway", start_lean)
    test_gateway_why.test_header_log_and_avoidable_counter_over_http()


def test_admin_refusals_over_the_lean_server(monkeypatch):
    async def with_lean(fn, **config):
        gateway, client = await start_lean(None, admin_secrets=[test_gateway_table_hardening
                                                                .SECRET], **config)
        try:
            await fn(client, gateway)
        finally:
            await client.close()

    monkeypatch.setattr(test_gateway_table_hardening, "with_client", with_lean)
    test_gateway_table_hardening.test_admin_push_refusals_are_typed_and_early()


# --- the OpenAI endpoints and the plain ones ---------------------------------------------


def test_openai_and_plain_endpoints():
    async def scenario():
        engine = await StubEngine("a").start()
        _gateway, client = await start_lean(table_for([(engine, "both")]))
        try:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 2}
            r = await client.post("/v1/completions", json=body)
            assert r.status == 200 and r.headers["X-Pdplane-Worker"] == "a"
            assert r.headers["X-Request-Id"] and "rule=" in r.headers["X-Pdplane-Route"]
            assert (await r.json())["served_by"] == "a"
            r = await client.post("/v1/chat/completions", json={**body, "stream": True},
                                  headers={"X-Request-Id": "mine"})
            assert r.status == 200 and r.headers["Transfer-Encoding"] == "chunked"
            assert r.headers["X-Request-Id"] == "mine"
            assert (await r.read()).endswith(b"data: [DONE]\n\n")
            r = await client.post("/v1/completions", data=b"{not json")
            assert r.status == 400 and b"not JSON" in await r.read()
            r = await client.post("/v1/completions", json={**body, "model": "nope"})
            assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
            r = await client.post("/v1/models", json={})
            assert r.status == 405 and r.headers["Allow"] == "GET"
            r = await client.get("/v1/completions")
            assert r.status == 405
            r = await client.get("/nowhere")
            assert r.status == 404
            r = await client.get("/v1/models")
            assert (await r.json())["data"][0]["id"] == MODEL
            r = await client.get("/health")
            assert r.status == 200 and (await r.json())["table_version"] == 1
            r = await client.head("/health")
            assert r.status == 200 and await r.read() == b""
            r = await client.get("/metrics")
            assert b"pdplane_gateway_requests_total" in await r.read()
        finally:
            await client.close()
            await engine.close()

    asyncio.run(scenario())


# --- raw HTTP -------------------------------------------------------------------------


async def _exchange(port: int, data: bytes, *, until_closed: bool = True,
                    timeout: float = WAIT_S) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        if until_closed:
            return await asyncio.wait_for(reader.read(), timeout)
        return await asyncio.wait_for(reader.read(65536), timeout)
    finally:
        writer.close()


def _request(body: bytes, extra: bytes = b"", path: bytes = b"/v1/completions") -> bytes:
    return (b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n%s\r\n%s" % (path, len(body), extra, body))


def test_hostile_http_gets_4xx_and_the_server_stays_up(monkeypatch):
    monkeypatch.setattr(front, "MAX_BODY", 64 * 1024)

    async def scenario():
        engine = await StubEngine("a").start()
        _gateway, client = await start_lean(table_for([(engine, "both")]))
        port = int(client.url.rsplit(":", 1)[1])
        body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1})
        try:
            # Pipelined: two requests in one write, answered in order, then a close asked for.
            out = await _exchange(port, _request(body) + _request(
                body, b"X-Request-Id: second\r\nConnection: close\r\n"))
            assert out.count(b"HTTP/1.1 200 OK") == 2
            assert out.index(b"X-Request-Id: gw-") < out.index(b"X-Request-Id: second")
            # A chunked request body; Expect: 100-continue.
            chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: "
                       b"chunked\r\nConnection: close\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                       % (len(body), body))
            assert b"HTTP/1.1 200 OK" in await _exchange(port, chunked)
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            head = _request(body, b"Expect: 100-continue\r\nConnection: close\r\n")
            writer.write(head[:-len(body)])
            assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), WAIT_S) == \
                b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            assert (await asyncio.wait_for(reader.read(), WAIT_S)).startswith(b"HTTP/1.1 200 OK")
            writer.close()
            # HTTP/1.0: answered, and the connection ends.
            out = await _exchange(port, _request(body).replace(b"HTTP/1.1", b"HTTP/1.0", 1))
            assert out.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in out
            # Malformed.
            for junk in (b"NOT HTTP AT ALL\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\n"
                         b"Content-Length: abc\r\n\r\n", b"\x00\x01\x02\r\n\r\n"):
                out = await _exchange(port, junk)
                assert out.startswith(b"HTTP/1.1 400 "), (junk, out[:200])
            # An upgrade is not made: the request is answered, then the connection ends.
            out = await _exchange(port, b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: "
                                  b"Upgrade\r\nUpgrade: h2c\r\n\r\nPRI * HTTP/2.0\r\n")
            assert out.startswith(b"HTTP/1.1 200 OK") and out.count(b"HTTP/1.1") == 1
            # A head too large: refused as it arrives, never buffered whole.
            huge = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\n\r\n"
            assert (await _exchange(port, huge)).startswith(b"HTTP/1.1 431 ")
            # A body too large: by Content-Length before it is sent, or as it arrives.
            out = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Content-Length: 100000000\r\nExpect: 100-continue\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 413 ")
            big = b"x" * 60000
            out = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\n"
                                  + b"%x\r\n%s\r\n" % (len(big), big) * 3 + b"0\r\n\r\n")
            assert out.startswith(b"HTTP/1.1 413 ")
            # Broken chunked framing mid-body.
            out = await _exchange(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                                  b"Transfer-Encoding: chunked\r\n\r\nzz\r\n")
            assert out.startswith(b"HTTP/1.1 400 ")
            r = await client.get("/health")
            assert r.status == 200
        finally:
            await client.close()
            await engine.close()

    asyncio.run(scenario())


def test_slow_heads_and_idle_connections_are_cut_off(monkeypatch):
    monkeypatch.setattr(front, "HEAD_TIMEOUT_S", 2)
    monkeypatch.setattr(front, "KEEPALIVE_S", 2)

    async def scenario():
        _gateway, client = await start_lean(None)
        port = int(client.url.rsplit(":", 1)[1])
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
            for _ in range(2):  # a drip keeps the bytes moving but never ends the head
                await asyncio.sleep(0.3)
                writer.write(b"X-Drip: 1\r\n")
            try:
                out = await asyncio.wait_for(reader.read(), WAIT_S)
            except ConnectionResetError:  # cut off while this side was still dripping
                out = b"HTTP/1.1 408 "
            assert out.startswith(b"HTTP/1.1 408 ")
            writer.close()
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            out = await asyncio.wait_for(reader.read(), WAIT_S)  # answered, then idle: closed
            assert out.startswith(b"HTTP/1.1 503 ")
            writer.close()
        finally:
            await client.close()

    asyncio.run(scenario())


def test_client_gone_mid_stream_leaves_no_load_behind():
    """(That the engine sees the request aborted is the integration test's, against the
    simulator: tests/integration/gateway/test_gateway_sim.py.)"""

    async def scenario():
        engine = await StubEngine("a").start()
        gateway, client = await start_lean(table_for([(engine, "both")]))
        port = int(client.url.rsplit(":", 1)[1])
        body = orjson.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 1, "stream": True})
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_request(body))
            assert b"200 OK" in await asyncio.wait_for(reader.readuntil(b"\r\n"), WAIT_S)
            writer.transport.abort()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + WAIT_S
            while loop.time() < deadline:  # released once its handler is cancelled
                if all(load.in_flight == 0 for load in gateway.loads.values()):
                    break
                await asyncio.sleep(0.05)
            assert all(load.in_flight == 0 for load in gateway.loads.values())
            r = await client.get("/health")
            assert r.status == 200
        finally:
            await client.close()
            await engine.close()

    asyncio.run(scenario())


@pytest.mark.parametrize("server", ["lean", "aiohttp"])
def test_server_setting(server):
    assert GatewayConfig(server=server).server == server
    with pytest.raises(ValueError):
        GatewayConfig(server="nginx").validate()


# --- the decoded-forms caches (front._TARGETS, _NAMES, _METHODS) -----------------------


def _split_target_as_before(url: bytes) -> tuple[str, str]:
    """on_headers_complete's target handling before the caches (the oracle)."""
    import contextlib
    from urllib.parse import unquote

    import httptools

    if url[:1] != b"/":
        with contextlib.suppress(httptools.HttpParserInvalidURLError):
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    path, _, query = url.partition(b"?")
    text = path.decode("latin-1")
    if "%" in text:
        text = unquote(text)
    return text, query.partition(b"#")[0].decode("latin-1")


_TARGET_BYTES = st.lists(st.sampled_from([b"/", b"v1", b"%20", b"%zz", b"?", b"#", b"a=b",
                                          b"&", b"http://h:1", b"*", b"\xe9"]),
                         max_size=8).map(b"".join)


@settings(max_examples=300, deadline=None)
@given(_TARGET_BYTES)
def test_request_targets_split_as_before_cached_or_not(url):
    assert front._split_target(url) == _split_target_as_before(url)


def test_cached_names_methods_and_targets_parse_as_the_first_time():
    """The same request twice (the second from the caches) and a fresh-cased one parse to
    the same method, path, query and headers."""
    gateway = Gateway(GatewayConfig(kv_events=False, seed=1))
    frontend = front.Front(gateway)

    class _Transport:
        def get_extra_info(self, name, default=None):
            return None

    conn = front._Conn(frontend)
    conn.transport = _Transport()
    conn._kick = lambda: None
    raw = (b"POST /v1/x%20y?a=1#f HTTP/1.1\r\nHost: h\r\nX-Request-Id: r1\r\n"
           b"Content-Length: 2\r\n\r\n{}")
    seen = []
    for data in (raw, raw, raw.replace(b"X-Request-Id", b"x-REQUEST-id")):
        conn.data_received(data)
        req = conn.queue.pop()
        seen.append((req.method, req.path, req.query_string, dict(req.headers), req.hot))
    assert seen[0] == seen[1] == seen[2]
    assert seen[0][:3] == ("POST", "/v1/x y", "a=1")
    assert seen[0][3] == {"host": "h", "x-request-id": "r1", "content-length": "2"}
