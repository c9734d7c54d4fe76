"""A minimal HTTP/1.1 client for the gateway's calls to its workers.

Why not aiohttp's ``ClientSession``: on the request path it was the largest share of the
gateway's CPU after the socket writes themselves (a profile under 64 concurrent requests:
about a fifth of the process's samples in ``ClientSession._request``, ``ClientRequest``,
payload registries, trace hooks, timers and response objects). The gateway needs much less:
POST a body it already holds as bytes to a few known workers over kept-alive connections,
and read the answer as it arrives. This module does only that, on asyncio protocols and
llhttp (``httptools``, the parser uvicorn uses; installed with ``uvicorn[standard]``).

What it guarantees, as the rest of the gateway relies on:

- one ``write`` per request (request line, headers and body together);
- a connection is reused only after its previous answer was read to the end and both sides
  said keep-alive; a request that finds a kept connection closed by the worker before any
  answer byte is sent once more on a fresh connection (the worker never saw it);
- ``total`` is a deadline for the whole exchange, ``connect`` for opening a connection;
  failures are :class:`UpstreamHTTPError` (an ``OSError``) or ``TimeoutError``. The total
  fires on a tick: never early, at most ``max(total / DEADLINE_TICKS, DEADLINE_TICK_S)``
  late (a timer per request, armed and cancelled, was ~2.5 µs of every request's CPU;
  requests whose deadlines round up to the same tick share one timer);
- a streamed answer is buffered no further than :data:`HIGH_WATER` bytes (reading pauses).

The response object offers the few ``aiohttp.ClientResponse`` calls the gateway makes
(``status``, ``headers``, ``content.readany()``/``iter_any()``/``at_eof()``, ``read()``,
``release()``, ``close()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import socket
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

HIGH_WATER = 1 << 20  # buffered answer bytes before the worker's socket is paused
IDLE_KEEP_S = 30.0  # a kept connection idle longer than this is closed, not reused
MAX_IDLE_PER_HOST = 256
_FRAMING = (b"content-length", b"transfer-encoding")  # an answer without: ends at close
_LINE = "%s: %s\r\n".__mod__  # (name, value) -> a header line, in C: no loop in Python
DEADLINE_TICKS = 1024  # a total fires at most total / DEADLINE_TICKS late ...
DEADLINE_TICK_S = 1 / 64  # ... or this, whichever is longer


class UpstreamHTTPError(ConnectionError):
    """The connection failed or the worker broke HTTP. Not a ``ConnectionResetError``: the
    gateway reads those as *its client* having gone away."""


@dataclass(frozen=True)
class Timeouts:
    total: float | None = None  # the whole exchange, from the call until the answer's end
    connect: float | None = None  # opening a new connection


@dataclass(frozen=True)
class Target:
    """A worker endpoint, parsed once: where to connect and the request's first lines."""

    key: tuple[str, int, bool]  # host, port, TLS
    request_line: bytes  # b"POST /v1/completions HTTP/1.1\r\nHost: h:p\r\n"

    @classmethod
    def parse(cls, url: str) -> Target:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        tls = parts.scheme == "https"
        port = parts.port or (443 if tls else 80)
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
        line = f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n".encode("latin-1")
        return cls((parts.hostname, port, tls), line)


class _Connection(asyncio.Protocol):
    """One kept-alive connection to a worker; carries one exchange at a time."""

    __slots__ = (
        "_paused",
        "closed",
        "idle_since",
        "key",
        "loop",
        "parser",
        "pool",
        "response",
        "reused",
        "transport",
    )

    def __init__(self, pool: UpstreamPool, key: tuple[str, int, bool]):
        self.pool = pool
        self.key = key
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        # One parser for the connection's answers, one after the other (llhttp starts
        # over after each complete message; a connection is reused only after one).
        self.parser = httptools.HttpResponseParser(self)
        self.response: UpstreamResponse | None = None
        self.closed = False
        self.idle_since = 0.0
        self.reused = False
        self._paused = False

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # Each request is one write, but an answer read promptly needs no delayed ACK.
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if self.response is None:
            self.close()  # bytes nobody asked for: the connection is out of step
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.response._fail(UpstreamHTTPError(f"bad HTTP from the worker: {exc}"))
            self.close()

    def eof_received(self):
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.pool._forget(self)
        response = self.response
        if response is not None and not response.complete:
            if response.status == 0 or not response._until_close():
                response._fail(UpstreamHTTPError(
                    "connection closed by the worker" + (f": {exc!r}" if exc else "")))
            else:  # an answer delimited by the connection's end: this is its end
                response._finish()

    def pause_writing(self) -> None:  # request bodies are small: nothing to throttle
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self.response._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        response = self.response
        response.status = self.parser.get_status_code()
        waiter = response._waiter  # as response._wake(), without the call
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def on_body(self, body: bytes) -> None:
        response = self.response
        response._chunks.append(body)
        response._buffered += len(body)
        if response._buffered > HIGH_WATER and not self._paused:
            self._paused = True
            self.transport.pause_reading()
        response._wake()

    def on_message_complete(self) -> None:
        self.response._keep_alive = self.parser.should_keep_alive()
        self.response._finish()

    # -- own
    def resume(self) -> None:
        if self._paused and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.pool._forget(self)
            if self.transport is not None:
                self.transport.close()


class _Headers:
    """The answer's headers, decoded on demand (most requests never read them all)."""

    __slots__ = ("_raw",)

    def __init__(self, raw: list[tuple[bytes, bytes]]):
        self._raw = raw

    def items(self):
        return [(n.decode("latin-1"), v.decode("latin-1")) for n, v in self._raw]

    def get(self, name: str, default=None):
        wanted = name.lower().encode("latin-1")
        for n, v in self._raw:
            if n.lower() == wanted:
                return v.decode("latin-1")
        return default


class UpstreamResponse:
    __slots__ = (
        "_bucket",
        "_buffered",
        "_chunks",
        "_conn",
        "_error",
        "_keep_alive",
        "_raw_headers",
        "_released",
        "_waiter",
        "complete",
        "status",
    )

    def __init__(self, conn: _Connection):
        self._conn = conn
        self.status = 0
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self.complete = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future | None = None
        self._keep_alive = False
        self._bucket: set | None = None  # the deadline tick it waits in (UpstreamPool._arm)
        self._released = False

    # -- the aiohttp-like surface
    @property
    def headers(self) -> _Headers:
        return _Headers(self._raw_headers)

    @property
    def content(self) -> UpstreamResponse:
        return self

    def at_eof(self) -> bool:
        return self.complete and not self._chunks

    async def readany(self) -> bytes:
        """The next bytes of the body as they arrive; b"" at its end."""
        while not self._chunks:
            if self._error is not None:
                raise self._error
            if self.complete:
                return b""
            await self._wait()
        if len(self._chunks) == 1:
            data = self._chunks.popleft()
        else:
            data = b"".join(self._chunks)
            self._chunks.clear()
        self._buffered = 0
        self._conn.resume()
        return data

    async def iter_any(self):
        while True:
            data = await self.readany()
            if not data:
                return
            yield data

    def read_now(self) -> bytes | None:
        """The rest of the body if all of it is in (as :meth:`read` would return it, without
        a coroutine), else None."""
        if not self.complete:
            return None
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self._buffered = 0
        self.release()
        return data

    async def read(self) -> bytes:
        """The rest of the body."""
        while not self.complete:
            if self._error is not None:
                raise self._error
            self._conn.resume()
            await self._wait()
        if self._error is not None and not self.complete:
            raise self._error
        data = b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        self.release()
        return data

    def release(self) -> None:
        """Done with the answer: keep the connection if it is reusable, else close it."""
        if self._released:
            return
        self._released = True
        bucket = self._bucket
        if bucket is not None:
            bucket.discard(self)
            self._bucket = None
        conn = self._conn
        conn.response = None
        if self.complete and self._keep_alive and self._error is None and not conn.closed:
            conn.pool._keep(conn)
        else:
            conn.close()

    close = release  # an unfinished answer closes its connection either way

    def _until_close(self) -> bool:
        """Is the body delimited by the connection's end (no Content-Length, no
        Transfer-Encoding)? Asked only when the connection ends, so not per header."""
        return not any(len(n) in (14, 17) and n.lower() in _FRAMING for n, _ in self._raw_headers)

    # -- driven by the connection
    async def _wait(self) -> None:
        waiter = self._waiter = self._conn.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _finish(self) -> None:
        self.complete = True
        bucket = self._bucket
        if bucket is not None:
            bucket.discard(self)
            self._bucket = None
        self._wake()

    def _fail(self, error: BaseException) -> None:
        if self.complete:
            return
        self._error = error
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(error)

    def _timed_out(self) -> None:
        self._fail(TimeoutError("the worker's answer took longer than the request timeout"))
        self._conn.close()


class UpstreamPool:
    """Kept-alive connections per (host, port), and the one call the gateway makes."""

    def __init__(self, idle_keep_s: float = IDLE_KEEP_S):
        self.idle_keep_s = idle_keep_s
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}
        self._open: set[_Connection] = set()
        self._closed = False
        # Deadline tick (loop time) -> the responses whose total ends by then; one timer
        # a tick.
        self._deadlines: dict[float, set[UpstreamResponse]] = {}

    async def post(self, target: Target, body: bytes, headers: dict[str, str],
                   timeouts: Timeouts) -> UpstreamResponse:
        """POST ``body`` and return once the answer's status line and headers are in.
        Raises ``UpstreamHTTPError`` or ``TimeoutError``."""
        lines = "".join(map(_LINE, headers.items()))
        if lines.count("\n") != len(headers) or lines.count("\r") != len(headers):
            for name, value in headers.items():
                if "\r" in value or "\n" in value:
                    raise UpstreamHTTPError(f"header {name} holds a line break")
            raise UpstreamHTTPError("a header name holds a line break")
        request = b"%b%b%b\r\n%b" % (target.request_line, b"Content-Length: %d\r\n" % len(body),
                                     lines.encode("latin-1"), body)
        key = target.key
        conn = self._take(key)
        # A kept connection knows its loop (asyncio.get_running_loop() costs a getpid
        # system call on Python 3.11).
        loop = asyncio.get_running_loop() if conn is None else conn.loop
        total = timeouts.total
        deadline = None if total is None else loop.time() + total
        for attempt in range(2):
            if attempt:
                conn = self._take(key)
            if conn is None:
                conn = await self._connect(loop, key, timeouts.connect, deadline)
            response = UpstreamResponse(conn)
            conn.response = response
            if deadline is not None:
                self._arm(loop, response, deadline, total)
            conn.transport.write(request)
            try:
                while response.status == 0:
                    if response._error is not None:
                        raise response._error
                    waiter = response._waiter = loop.create_future()
                    try:
                        await waiter
                    finally:
                        response._waiter = None
            except UpstreamHTTPError:
                response.release()
                if conn.reused and response.status == 0 and not response._chunks:
                    continue  # a kept connection the worker had closed: once more, fresh
                raise
            except BaseException:
                response.release()
                raise
            return response
        raise UpstreamHTTPError("unreachable")  # pragma: no cover

    def _arm(self, loop, response: UpstreamResponse, deadline: float, total: float) -> None:
        """Time ``response`` out at ``deadline``, rounded up to its tick."""
        tick = total / DEADLINE_TICKS
        if tick < DEADLINE_TICK_S:
            tick = DEADLINE_TICK_S
        when = math.ceil(deadline / tick) * tick
        bucket = self._deadlines.get(when)
        if bucket is None:
            bucket = self._deadlines[when] = set()
            loop.call_at(when, self._expire, when)
        bucket.add(response)
        response._bucket = bucket

    def _expire(self, when: float) -> None:
        bucket = self._deadlines.pop(when, None)
        if bucket:
            for response in list(bucket):
                response._bucket = None
                response._timed_out()

    async def _connect(self, loop, key, connect_s: float | None,
                       deadline: float | None) -> _Connection:
        if self._closed:
            raise UpstreamHTTPError("the gateway is shutting down")
        limit = connect_s
        if deadline is not None:
            left = max(deadline - loop.time(), 0.0)
            limit = left if limit is None else min(limit, left)
        try:
            async with asyncio.timeout(limit):
                _transport, conn = await loop.create_connection(
                    lambda: _Connection(self, key), key[0], key[1],
                    ssl=True if key[2] else None)
        except TimeoutError:
            raise TimeoutError(f"connecting to {key[0]}:{key[1]} timed out") from None
        except OSError as exc:
            raise UpstreamHTTPError(f"cannot connect to {key[0]}:{key[1]}: {exc!r}") from exc
        self._open.add(conn)
        return conn

    def _take(self, key) -> _Connection | None:
        idle = self._idle.get(key)
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.idle_keep_s:
                conn.reused = True
                return conn
            conn.close()
        return None

    def _keep(self, conn: _Connection) -> None:
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = []
        if self._closed or len(idle) >= MAX_IDLE_PER_HOST:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        idle.append(conn)

    def _forget(self, conn: _Connection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        self._closed = True
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        self._deadlines.clear()  # their timers find nothing
        await asyncio.sleep(0)  # let the transports finish closing
