"""A request as the lean server (:mod:`gateway.front`) parsed it, and its answer.

What the request path reads (:mod:`gateway.exchange`: ``headers``, ``read()``, the stream
calls) and what the plain aiohttp handlers read (``headers``, ``method``, ``path``,
``query``, ``content_length``, ``content.iter_chunked()``); the answer is written here in
one write where it can be (head and body; a stream's head and first chunk; its last chunk
and end), chunked for HTTP/1.1, delimited by the connection's end for HTTP/1.0.
"""

from __future__ import annotations

import asyncio
from collections import deque
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import parse_qsl

from .exchange import Reply

_REASONS = {s.value: s.phrase for s in HTTPStatus}
_STATUS_LINES: dict[int, str] = {}
_DATE = [""]
_LINE = "%s: %s\r\n".__mod__  # (name, value) -> a header line, in C: no loop in Python


class Refused(Exception):
    """The request cannot be served as sent (a body over the limit, broken framing): the
    answer is this Reply, and the connection ends after it."""

    def __init__(self, reply: Reply):
        super().__init__(reply.status)
        self.reply = reply


def status_line(status: int) -> str:
    line = _STATUS_LINES.get(status)
    if line is None:
        line = _STATUS_LINES[status] = f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\n"
    return line


def refresh_date() -> None:
    _DATE[0] = f"Date: {formatdate(usegmt=True)}\r\n"


def plain(status: int, text: str | None = None, headers: dict | None = None) -> Reply:
    """aiohttp's plain-text error answers ("404: Not Found")."""
    body = (text or f"{status}: {_REASONS.get(status, 'Error')}").encode()
    return Reply(status, body, headers, content_type="text/plain; charset=utf-8")


class Headers(dict):
    """A request's headers by lower-case name; lookups ignore case (the first of repeated
    headers wins, as aiohttp's ``get``)."""

    __slots__ = ()

    def get(self, name: str, default=None):
        return dict.get(self, name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return dict.__getitem__(self, name.lower())

    def __contains__(self, name) -> bool:
        return dict.__contains__(self, name.lower())


class Request:
    """One parsed request: what the request path (:mod:`gateway.exchange`) and the plain
    aiohttp handlers read, and the answer's writing."""

    __slots__ = ("_chunks", "_conn", "_waiter", "born", "complete", "continued", "discard",
                 "ended", "error", "headers", "hot", "keep_alive", "method", "path",
                 "query_string", "size", "started", "status", "unread", "version")

    def __init__(self, conn):
        self._conn = conn
        self.headers = Headers()
        self.method = "GET"
        self.path = "/"
        self.query_string = ""
        self.version = "1.1"
        self.keep_alive = True
        self.hot: tuple[str, bool] | None = None  # (endpoint, chat) of an OpenAI route
        self._chunks: deque[bytes] = deque()
        self._waiter: asyncio.Future | None = None
        self.size = 0
        self.unread = 0
        self.born = conn.front.ticks
        self.complete = False
        self.continued = False
        self.discard = False
        self.error: Reply | None = None
        self.started = False  # the answer's head is out
        self.ended = False
        self.status = 0

    # -- what handlers read
    @property
    def content_length(self) -> int | None:
        value = self.headers.get("content-length")
        return int(value) if value is not None and value.isdigit() else None

    @property
    def query(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for key, value in parse_qsl(self.query_string, keep_blank_values=True):
            out.setdefault(key, value)
        return out

    @property
    def content(self) -> Request:
        return self

    def body_now(self) -> bytes | None:
        """The whole body if it is all in (what :meth:`read` would return, without a
        coroutine); None when it must be awaited or refused (``read()`` says which)."""
        if not self.complete or self.error is not None:
            return None
        chunks = self._chunks
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self.unread = 0
        return data

    async def read(self) -> bytes:
        while not self.complete and self.error is None:
            await self._wait()
        if self.error is not None:
            raise Refused(self.error)
        data = b"".join(self._chunks) if len(self._chunks) != 1 else self._chunks[0]
        self._chunks.clear()
        self.unread = 0
        return data

    async def readany(self) -> bytes:
        while not self._chunks and not self.complete and self.error is None:
            await self._wait()
        if self.error is not None:
            raise Refused(self.error)
        data = b"".join(self._chunks)
        self._chunks.clear()
        self.unread = 0
        self._conn._consumed()
        return data

    async def iter_chunked(self, _n: int):
        while True:
            data = await self.readany()
            if not data:
                return
            yield data

    def awaits_continue(self) -> bool:
        """Is the client holding its body back until it hears "100 Continue"?"""
        return not self.continued and self.headers.get("expect", "").lower() == "100-continue"

    async def _wait(self) -> None:
        conn = self._conn
        if conn.closed:
            raise ConnectionResetError("the client has gone")
        if self.awaits_continue():  # sent once the handler wants the body, not before
            conn.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self.continued = True
        conn._consumed()
        self._waiter = asyncio.get_running_loop().create_future()
        try:
            await self._waiter
        finally:
            self._waiter = None

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- the answer
    def _head(self, status: int, headers: dict[str, str], length: int | None) -> bytes:
        if not self.complete:  # answered before its whole body came: no reuse after it
            self.keep_alive = False
        if length is not None:
            framing = f"Content-Length: {length}\r\n"
        elif self.version != "1.0":
            framing = "Transfer-Encoding: chunked\r\n"
        else:
            framing = ""
            self.keep_alive = False  # an HTTP/1.0 stream ends with the connection
        if not self.keep_alive:
            framing += "Connection: close\r\n"
        elif self.version == "1.0":
            framing += "Connection: keep-alive\r\n"
        lines = "".join(map(_LINE, headers.items()))
        head = f"{status_line(status)}{_DATE[0]}{lines}{framing}\r\n"
        self.started, self.status = True, status
        try:
            return head.encode("latin-1")
        except UnicodeEncodeError:
            return head.encode("utf-8")

    def reply(self, reply: Reply) -> None:
        body = b"" if self.method == "HEAD" else reply.body
        self._conn.write(self._head(reply.status, reply.headers, len(reply.body)) + body)
        self.ended = True

    async def start_stream(self, status: int, headers: dict[str, str], first: bytes) -> None:
        await self._conn.send(self._head(status, headers, None) + self._frame(first))

    async def write(self, chunk: bytes) -> None:
        if chunk:
            await self._conn.send(self._frame(chunk))

    async def write_eof(self, last: bytes = b"") -> None:
        self.ended = True
        chunked = self.version != "1.0"
        end = self._frame(last) + b"0\r\n\r\n" if chunked else last
        if end:
            await self._conn.send(end)

    def _frame(self, chunk: bytes) -> bytes:
        if self.version == "1.0" or not chunk:
            return chunk
        return b"%x\r\n%b\r\n" % (len(chunk), chunk)


def timed_out(req: Request) -> bytes:
    req.keep_alive = False
    reply = plain(408)
    return req._head(408, reply.headers, len(reply.body)) + reply.body
