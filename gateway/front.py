"""The gateway's own HTTP/1.1 server: asyncio protocols and llhttp (``httptools``).

Why not aiohttp's server: with the upstream client already lean (:mod:`gateway.upstream_http`)
aiohttp's server side — request objects, the router, middleware plumbing, ``Response``
preparation and its writer — was about a fifth of the gateway's CPU per request. This one
does what the gateway needs: parse a request, hand the OpenAI endpoints straight to the
request path (:meth:`gateway.app.Gateway._serve`, through the interface of
:mod:`gateway.exchange`), answer in one write where it can, keep connections alive. The
other endpoints (health, metrics, models, the signed admin API) run their aiohttp handlers
unchanged on a request object offering the few calls they make (``headers``, ``method``,
``path``, ``query``, ``content_length``, ``content``, ``read()``); their ``web.Response``
is written out here. ``--server aiohttp`` serves everything with aiohttp instead.

What it guarantees (tests/unit/test_gateway_front.py):

- keep-alive per HTTP/1.1 and 1.0 rules; pipelined requests answered in order (reading
  pauses beyond :data:`MAX_PIPELINED` waiting requests); ``Expect: 100-continue``;
  chunked request bodies; streamed answers chunked (HTTP/1.0: until the connection ends);
- bad input gets a 4xx and the connection closed, never a 500 or a dead server: malformed
  HTTP 400, a head over :data:`MAX_HEAD` bytes 431 (counted as it arrives, so a huge header
  is never buffered whole), an OpenAI body over :data:`MAX_BODY` 413 (by Content-Length
  before any of it is read, else as it passes the limit), unknown path 404, wrong method
  405; an admin body is streamed to its handler (reading pauses past :data:`BODY_HIGH_WATER`
  unread bytes), which cuts it off at its own limit;
- slow clients: a head not complete :data:`HEAD_TIMEOUT_S` after it began, a body stalled
  :data:`BODY_TIMEOUT_S`, an idle kept connection after :data:`KEEPALIVE_S` are closed —
  checked by one sweep a second, not a timer per request;
- a client that disconnects cancels its request's handler (as aiohttp's
  ``handler_cancellation``), which closes the upstream connection: the engine aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import time
from collections import deque
from urllib.parse import unquote

import httptools

from .exchange import Reply
from .front_request import Refused, Request, plain, refresh_date, timed_out

log = logging.getLogger("gateway")
access_log = logging.getLogger("gateway.access")

MAX_HEAD = 64 * 1024  # request line + headers
MAX_BODY = 64 * 1024 * 1024  # an OpenAI request body (aiohttp's client_max_size there)
BODY_HIGH_WATER = 1 << 20  # unread bytes of a streamed (admin) body before reading pauses
MAX_PIPELINED = 16  # parsed requests waiting on one connection before reading pauses
HEAD_TIMEOUT_S = 30.0
BODY_TIMEOUT_S = 120.0  # with no body byte for this long
KEEPALIVE_S = 75.0  # aiohttp's keepalive_timeout
LINGER_S = 10.0  # aiohttp's lingering_time: how long a refused body is read and dropped
SHUTDOWN_S = 10.0  # requests in flight at SIGTERM get this long to finish
GC_YOUNG_THRESHOLD = 10_000  # new containers between young collections (Python's: 700)
# Decoded forms of what clients send again and again (header names, methods, request
# targets), so a request decodes, lower-cases and splits only what it is the first to send.
# Bounded: emptied when full (a client sending ever new ones costs what it did before).
CACHE_LIMIT = 1024
CACHED_SIZE = 256  # longer names and targets are not kept (at most 256 KiB a cache)
_NAMES: dict[bytes, str] = {}  # raw header name -> lower-case str
_METHODS: dict[bytes, str] = {}
_TARGETS: dict[bytes, tuple[str, str]] = {}  # origin-form target -> (path, query string)


class _Conn(asyncio.Protocol):
    """One client connection: parses, queues, answers in order."""

    def __init__(self, front: Front):
        self.front = front
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.queue: deque[Request] = deque()
        self.parsing: Request | None = None  # the request whose bytes are arriving
        self.url = b""
        self.add_header = None  # the parsing request's headers.setdefault
        # One task per connection answers its requests in order, then waits for the next
        # (``idle``) while the connection is kept: a task per request cost its creation
        # and the loop's task registry every time.
        self.task: asyncio.Task | None = None
        self.idle: asyncio.Future | None = None
        self.answering = False  # a request is being answered (the sweeper leaves it be)
        self.head_bytes = 0
        self.closed = False
        self.reading_paused = False
        self.drain: asyncio.Future | None = None
        self.write_paused = False
        self.input_done = False
        self.lingering: int | None = None  # the sweep tick a lingering close began
        self.progress = 0  # bumped on every event the sweeper counts as progress
        self.seen = (0, front.ticks)  # the sweeper's (progress, tick it last changed)

    # -- asyncio.Protocol
    def connection_made(self, transport) -> None:
        self.transport = transport
        front = self.front
        front.conns.add(self)
        if front.loop is None:  # a Front not started by start() (tests)
            front.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            with contextlib.suppress(OSError):  # answers are single writes: send at once
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.front.conns.discard(self)
        if self.task is not None:
            self.task.cancel()  # the client is gone: so is its request (upstream closed)
        if self.drain is not None and not self.drain.done():
            self.drain.set_exception(ConnectionResetError("the client has gone"))
        for req in self.queue:
            req._wake()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.drain is not None and not self.drain.done():
            self.drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.closed or self.input_done:
            return
        self.progress += 1
        if self.parsing is None or not self.parsing.method:  # in a head: count it
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Served as a plain request (no protocol switch, as aiohttp for a route without
            # one), then the connection ends: what follows is not HTTP/1.1.
            self.input_done = True
            if self.queue:
                self.queue[-1].keep_alive = False
            else:
                self._refuse(plain(400, "400: protocol upgrades are not supported"))
            return
        except httptools.HttpParserError as exc:
            self._refuse(plain(400, f"400: malformed HTTP request ({exc})"))
            return
        if self.head_bytes > MAX_HEAD and self.parsing is not None and not self.parsing.method:
            self._refuse(plain(431, f"431: request head over {MAX_HEAD} bytes"))

    # -- httptools callbacks
    def on_message_begin(self) -> None:
        req = self.parsing = Request(self)
        req.method = ""  # "" until the head is complete
        self.url = b""
        self.add_header = req.headers.setdefault  # the first of repeated headers wins

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        key = _NAMES.get(name)
        if key is None:
            key = name.decode("latin-1").lower()
            if len(name) <= CACHED_SIZE:
                if len(_NAMES) >= CACHE_LIMIT:
                    _NAMES.clear()
                _NAMES[name] = key
        self.add_header(key, value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        req, parser = self.parsing, self.parser
        self.head_bytes = 0
        raw_method = parser.get_method()
        method = _METHODS.get(raw_method)
        if method is None:
            method = raw_method.decode("latin-1")
            if len(_METHODS) >= CACHE_LIMIT:
                _METHODS.clear()
            _METHODS[raw_method] = method
        req.method = method
        req.version = parser.get_http_version()
        req.keep_alive = parser.should_keep_alive()
        url = self.url
        target = _TARGETS.get(url)
        if target is None:
            target = _split_target(url)
            if url[:1] == b"/" and len(url) <= CACHED_SIZE:  # origin form, short
                if len(_TARGETS) >= CACHE_LIMIT:
                    _TARGETS.clear()
                _TARGETS[url] = target
        req.path, req.query_string = target
        if method == "POST":
            hot = req.hot = self.front.openai.get(req.path)
            if hot is not None:
                length = dict.get(req.headers, "content-length")  # as req.content_length
                if length is not None and length.isdigit() and int(length) > MAX_BODY:
                    req.error = plain(413, f"413: request body over the {MAX_BODY}-byte limit")
                    req.discard = True
        self.queue.append(req)
        self._kick()
        if len(self.queue) > MAX_PIPELINED:
            self._pause()

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        req.size += len(body)
        if req.discard:
            return
        req._chunks.append(body)
        req.unread += len(body)
        if req.hot is not None and req.size > MAX_BODY:
            # Chunked, past the limit: refused when read; nothing more is kept.
            req.error = plain(413, f"413: request body over the {MAX_BODY}-byte limit")
            req.discard = True
            req._chunks.clear()
        elif req.unread > BODY_HIGH_WATER and (req.hot is None or self.queue[0] is not req):
            self._pause()  # read on when its handler reads (a whole OpenAI body is read)
        if req._waiter is not None:  # a handler waits for the body (rarely: body_now)
            req._wake()

    def on_message_complete(self) -> None:
        req = self.parsing
        self.parsing = None
        req.complete = True
        if req._waiter is not None:  # a handler waits for the body (rarely: body_now)
            req._wake()
        if self.lingering is not None:
            self.closed = True
            self.transport.close()

    # -- flow control
    def _pause(self) -> None:
        if not self.reading_paused and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def _consumed(self) -> None:
        """A handler took bytes or a queued request was answered: read again if paused."""
        if self.reading_paused and not self.closed and len(self.queue) <= MAX_PIPELINED:
            self.reading_paused = False
            self.transport.resume_reading()

    def _linger(self, half_close: bool) -> None:
        """A lingering close (closing with unread input would reset the connection, and
        the client could lose the answer): read and drop for up to LINGER_S."""
        self.lingering = self.front.ticks
        if half_close and self.transport.can_write_eof():
            self.transport.write_eof()
        if self.reading_paused:
            self.reading_paused = False
            self.transport.resume_reading()

    def write(self, data: bytes) -> None:
        if self.closed or self.transport.is_closing():
            raise ConnectionResetError("the client has gone")
        self.transport.write(data)

    async def send(self, data: bytes) -> None:
        """Write, and wait while the client's socket buffer is full."""
        self.write(data)
        if self.write_paused:
            self.drain = self.front.loop.create_future()
            try:
                await self.drain
            finally:
                self.drain = None

    def _refuse(self, reply: Reply) -> None:
        """Bad input: answer it after the requests already queued (a request whose body
        was arriving gets it in place of its answer), read nothing more, then close."""
        if self.lingering is not None:  # answered already: only the close was pending
            self.closed = True
            self.transport.close()
            return
        req = self.parsing
        if req is None or not req.method:  # between requests or in a head
            req = Request(self)
            self.queue.append(req)
        req.error, req.keep_alive, req.complete, req.discard = reply, False, True, True
        req._wake()
        self.parsing = None
        self.input_done = True
        self._pause()
        self._kick()

    # -- answering
    def _kick(self) -> None:
        """A request was queued: start the connection's task, or wake it."""
        if self.task is None:
            self.task = self.front.loop.create_task(self._serve_queue())
        elif self.idle is not None and not self.idle.done():
            self.idle.set_result(None)

    async def _serve_queue(self) -> None:
        try:
            while not self.closed:
                if not self.queue:
                    self.answering = False
                    self.idle = self.front.loop.create_future()
                    try:
                        await self.idle
                    finally:
                        self.idle = None
                    continue
                self.answering = True
                req = self.queue[0]
                await self._answer(req)
                self.queue.popleft()
                self.progress += 1
                if self.reading_paused:
                    self._consumed()
                if self.input_done:  # refused input: end our side, drop what still comes
                    self._linger(half_close=True)
                    return
                if not req.complete and not req.awaits_continue():
                    # Answered before its body was read (a refusal): read the rest and drop
                    # it before closing, so that the client, still sending, gets the answer.
                    req.discard = True
                    self._linger(half_close=False)
                    return
                if not req.keep_alive or req.discard or not req.complete:
                    self.transport.close()
                    self.closed = True
                    return
        except ConnectionResetError:
            self.transport.close()  # the client went away mid-answer
        finally:
            self.task = None
            self.answering = False

    async def _answer(self, req: Request) -> None:
        front = self.front
        result = req.error
        try:
            if result is None:
                if req.hot is not None:
                    endpoint, chat = req.hot
                    result = await front.gateway._serve(req, endpoint, chat=chat)
                else:
                    result = await front.plain(req)
        except Refused as exc:
            req.keep_alive = False
            result = exc.reply
        except (ConnectionResetError, asyncio.CancelledError):
            raise
        except Exception:
            log.exception("%s %s failed", req.method, req.path)
            req.keep_alive = False
            result = None if req.started else plain(500)
        if result is not None and not req.started:
            req.reply(result)
        elif req.started and not req.ended:
            with contextlib.suppress(ConnectionResetError):
                await req.write_eof()  # as aiohttp does for a handler that did not
        if front.access_log:
            access_log.info('"%s %s HTTP/%s" %d', req.method, req.path, req.version,
                            req.status)


def _split_target(url: bytes) -> tuple[str, str]:
    """A request target -> (path, percent-decoded; query string, no fragment)."""
    if url[:1] != b"/":  # absolute form (a proxy's request) or "*"
        with contextlib.suppress(httptools.HttpParserInvalidURLError):
            parsed = httptools.parse_url(url)
            url = (parsed.path or b"/") + (b"?" + parsed.query if parsed.query else b"")
    path, _, query = url.partition(b"?")
    text = path.decode("latin-1")
    if "%" in text:
        text = unquote(text)
    return text, query.partition(b"#")[0].decode("latin-1")


class Front:
    """The listening side: routes, the sweeper, start and stop."""

    def __init__(self, gateway, access_log_on: bool = False):
        self.gateway = gateway
        self.access_log = access_log_on
        self.openai = dict(gateway.OPENAI_ENDPOINTS)  # path -> (endpoint, chat)
        self.routes: dict[str, dict[str, object]] = {}
        for method, path, handler in gateway.routes():
            self.routes.setdefault(path, {})[method] = handler
            if method == "GET":
                self.routes[path]["HEAD"] = handler
        self.conns: set[_Conn] = set()
        self.loop: asyncio.AbstractEventLoop | None = None  # set by start()
        self.ticks = 0  # seconds of sweeps: the clock of the slow-client limits

    async def plain(self, req: Request) -> Reply:
        methods = self.routes.get(req.path)
        if methods is None:
            return plain(404)
        handler = methods.get(req.method)
        if handler is None:
            allow = ",".join(sorted(m for m in methods if m != "HEAD"))
            return plain(405, headers={"Allow": allow})
        response = await handler(req)
        headers = {k: v for k, v in response.headers.items()
                   if k.lower() not in ("content-length", "transfer-encoding", "connection")}
        return Reply(response.status, response.body or b"", headers)

    async def sweep(self) -> None:
        """Once a second: the Date header, and connections too slow: a head not complete
        HEAD_TIMEOUT_S after it began (however slowly it drips), a body with no byte for
        BODY_TIMEOUT_S, a kept connection idle for KEEPALIVE_S."""
        while True:
            await asyncio.sleep(1.0)
            self.ticks += 1
            refresh_date()
            for conn in list(self.conns):
                if conn.answering or conn.progress != conn.seen[0]:
                    conn.seen = (conn.progress, self.ticks)  # answering, or moving
                if conn.answering:
                    continue  # a stream may last minutes
                quiet = self.ticks - conn.seen[1]
                req = conn.parsing
                if conn.lingering is not None:
                    expired, req = self.ticks - conn.lingering >= LINGER_S, None
                elif req is None:
                    expired = quiet >= KEEPALIVE_S
                elif not req.method:
                    expired = self.ticks - req.born >= HEAD_TIMEOUT_S
                else:
                    expired = quiet >= BODY_TIMEOUT_S
                if expired:
                    with contextlib.suppress(ConnectionResetError):
                        if req is not None:
                            conn.write(timed_out(req))
                    conn.transport.close()

    async def start(self, host: str, port: int, reuse_port: bool = False):
        """The gateway's start-up, then listen; returns the asyncio server."""
        loop = self.loop = asyncio.get_running_loop()
        refresh_date()
        await self.gateway._startup(None)
        server = await loop.create_server(lambda: _Conn(self), host, port, backlog=1024,
                                          reuse_port=reuse_port or None)
        self._sweeper = loop.create_task(self.sweep())
        return server

    async def stop(self, server) -> None:
        """Stop listening, give requests in flight SHUTDOWN_S to finish, close the rest,
        then the gateway's clean-up."""
        server.close()
        self._sweeper.cancel()
        deadline = time.monotonic() + SHUTDOWN_S
        for conn in list(self.conns):
            if not conn.answering:
                conn.transport.close()
        while any(c.answering for c in self.conns) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for conn in list(self.conns):
            conn.transport.close()
        await self.gateway._cleanup(None)

    async def run(self, host: str, port: int, reuse_port: bool) -> None:
        server = await self.start(host, port, reuse_port)
        # Garbage collection was ~5 % of the CPU at 64 requests in flight: every ~700 new
        # containers (a few requests' worth) a pass over the young objects, most of them
        # in-flight requests' that survive it. Freeze what start-up built (tables, index)
        # out of the collector's sight and collect the young less often; the request path
        # frees its objects by reference counting, cycles are still collected.
        gc.collect()
        gc.freeze()
        gc.set_threshold(GC_YOUNG_THRESHOLD, 10, 10)
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        log.warning("pdplane gateway listening on http://%s:%d", host, port)
        try:
            await stop.wait()
        finally:
            await self.stop(server)


def run(gateway, config) -> None:
    """Serve until SIGINT/SIGTERM (the caller has set the event loop policy)."""
    front = Front(gateway, access_log_on=config.access_log)
    asyncio.run(front.run(config.host, config.port, config.workers > 1))
