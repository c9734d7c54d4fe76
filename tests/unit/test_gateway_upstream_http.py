"""The gateway's lean HTTP/1.1 client (gateway/upstream_http.py) against real sockets."""

from __future__ import annotations

import asyncio

import pytest

from gateway import upstream_http
from gateway.upstream_http import Target, Timeouts, UpstreamHTTPError, UpstreamPool
from tests.conftest import WAIT_S


async def _raw_server(answer):
    """A TCP server whose handler ``answer(reader, writer)`` speaks raw HTTP."""
    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    return server, Target.parse(f"http://127.0.0.1:{port}/v1/completions")


async def _read_request(reader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def test_target_parses_once():
    target = Target.parse("http://w1:8001/v1/chat/completions")
    assert target.key == ("w1", 8001, False)
    assert target.request_line == b"POST /v1/chat/completions HTTP/1.1\r\nHost: w1:8001\r\n"
    assert Target.parse("https://w/v1/x").key == ("w", 443, True)
    with pytest.raises(ValueError):
        Target.parse("ftp://w/x")


def test_keep_alive_reuses_one_connection_and_sends_one_write():
    connections = []

    async def answer(reader, writer):
        connections.append(writer)
        while True:
            try:
                request = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            assert request.endswith(b'{"a":1}') and b"X-Request-Id: r1" in request
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 2\r\n\r\nok")
            await writer.drain()

    async def main():
        server, target = await _raw_server(answer)
        pool = UpstreamPool()
        try:
            for _ in range(3):
                response = await pool.post(target, b'{"a":1}', {"X-Request-Id": "r1"},
                                           Timeouts(total=WAIT_S))
                assert response.status == 200
                assert response.headers.get("content-type") == "application/json"
                assert await response.read() == b"ok"
        finally:
            await pool.close()
            server.close()
        assert len(connections) == 1

    asyncio.run(main())


def test_chunked_stream_arrives_piece_by_piece():
    async def answer(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()

    async def main():
        server, target = await _raw_server(answer)
        pool = UpstreamPool()
        try:
            response = await pool.post(target, b"{}", {}, Timeouts(total=WAIT_S))
            assert await response.readany() == b"first"
            assert not response.at_eof()
            assert [c async for c in response.iter_any()] == [b"second"]
            assert response.at_eof()
            response.release()
        finally:
            await pool.close()
            server.close()

    asyncio.run(main())


def test_body_delimited_by_close_and_stale_kept_connection_is_retried_fresh():
    served = []
    dropped = asyncio.Event()

    async def answer(reader, writer):
        await _read_request(reader)
        served.append(1)
        if len(served) == 1:  # keep-alive answer, then the worker drops the idle connection
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\na")
            await writer.drain()
            await asyncio.sleep(0.05)
            writer.close()
            await writer.wait_closed()
            dropped.set()
            return
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil-close")
        await writer.drain()
        writer.close()

    async def main():
        server, target = await _raw_server(answer)
        pool = UpstreamPool()
        try:
            first = await pool.post(target, b"{}", {}, Timeouts(total=WAIT_S))
            assert await first.read() == b"a"
            await asyncio.wait_for(dropped.wait(), WAIT_S)  # the worker closed the kept one
            await asyncio.sleep(0.05)  # and its FIN reached this side (loopback)
            second = await pool.post(target, b"{}", {}, Timeouts(total=WAIT_S))
            assert await second.read() == b"until-close"
        finally:
            await pool.close()
            server.close()
        assert len(served) == 2

    asyncio.run(main())


def test_timeouts_and_refused_connections_are_typed():
    async def silent(reader, writer):
        await _read_request(reader)
        await asyncio.sleep(5)

    async def main():
        server, target = await _raw_server(silent)
        pool = UpstreamPool()
        try:
            with pytest.raises(TimeoutError):
                await pool.post(target, b"{}", {}, Timeouts(total=0.2))
            port = target.key[1]
            server.close()
            await server.wait_closed()
            dead = Target.parse(f"http://127.0.0.1:{port}/v1/completions")
            with pytest.raises(UpstreamHTTPError):
                await pool.post(dead, b"{}", {}, Timeouts(total=WAIT_S, connect=WAIT_S))
            with pytest.raises(UpstreamHTTPError):
                await pool.post(dead, b"{}", {"X-Evil": "a\r\nHost: x"}, Timeouts(total=WAIT_S))
        finally:
            await pool.close()

    asyncio.run(main())


def test_a_worker_dying_mid_answer_is_an_error_not_an_end():
    async def answer(reader, writer):
        await _read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()

    async def main():
        server, target = await _raw_server(answer)
        pool = UpstreamPool()
        try:
            response = await pool.post(target, b"{}", {}, Timeouts(total=WAIT_S))
            assert await response.readany() == b"partial"
            with pytest.raises(UpstreamHTTPError):
                await response.readany()
            response.close()
        finally:
            await pool.close()
            server.close()

    asyncio.run(main())


def test_deadlines_share_a_timer_per_tick_and_never_fire_early():
    """Totals fire on a tick (``_arm``): not before the deadline, at most a tick after it;
    an answer that finished leaves its tick, so only the unfinished one times out."""
    started: list[asyncio.StreamWriter] = []

    async def answer(reader, writer):
        request = await _read_request(reader)
        started.append(writer)
        if b'"fast"' in request:
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            await writer.drain()
        await asyncio.sleep(5)

    async def main():
        server, target = await _raw_server(answer)
        pool = UpstreamPool()
        loop = asyncio.get_running_loop()
        try:
            fast = await pool.post(target, b'"fast"', {}, Timeouts(total=0.3))
            assert fast.read_now() in (None, b"ok")  # complete or not yet: never an error
            assert await fast.read() in (b"", b"ok")
            t0 = loop.time()
            with pytest.raises(TimeoutError):
                await pool.post(target, b'"slow"', {}, Timeouts(total=0.3))
            waited = loop.time() - t0
            assert 0.3 - 0.002 <= waited < 0.3 + upstream_http.DEADLINE_TICK_S + 0.25
            # Both deadlines fell in a tick of their own or a shared one: at most two timers
            # for two requests, and no response left waiting in any tick.
            assert all(not bucket for bucket in pool._deadlines.values())
        finally:
            await pool.close()
            server.close()

    asyncio.run(main())


def test_tick_rounding_bounds_the_lateness():
    pool = UpstreamPool()

    class _Loop:
        armed: list[float] = []

        def call_at(self, when, callback, *args):
            self.armed.append(when)

    class _Response:
        _bucket = None

    loop = _Loop()
    for total, deadline in ((0.2, 10.001), (600.0, 1000.3), (60.0, 77.77), (0.0, 5.0)):
        response = _Response()
        pool._arm(loop, response, deadline, total)
        when = loop.armed[-1]
        tick = max(total / upstream_http.DEADLINE_TICKS, upstream_http.DEADLINE_TICK_S)
        assert deadline <= when <= deadline + tick + 1e-9
        assert response in response._bucket
    # Two deadlines in one tick: one timer.
    before = len(loop.armed)
    pool._arm(loop, _Response(), 1000.31, 600.0)
    assert len(loop.armed) == before
