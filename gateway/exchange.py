"""What the request path needs from the server it runs under, and nothing more.

The OpenAI endpoints (:meth:`gateway.app.Gateway._serve` and the request driver) read the
client's headers and body (``body_now()``: the body if it is all in, else ``read()``) and
answer either with a whole :class:`Reply` or with a stream (:meth:`start_stream`,
:meth:`write`, :meth:`write_eof`). Two servers provide that: the lean one
(:mod:`gateway.front`, the default) and aiohttp's (:class:`AiohttpExchange`, for
``--server aiohttp`` and the in-process test client), so the request path is written once.
"""

from __future__ import annotations

import orjson
from aiohttp import web

JSON = "application/json"


class Reply:
    """A whole answer: status, body bytes, headers (the Content-Type among them)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None,
                 content_type: str | None = None):
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}
        if content_type is not None:
            self.headers["Content-Type"] = content_type


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> Reply:
    body = orjson.dumps({"error": {"message": message, "type": kind, "param": None,
                                   "code": code or kind}})
    return Reply(status, body, content_type="application/json; charset=utf-8")


class AiohttpExchange:
    """The request path's view of an aiohttp request."""

    __slots__ = ("request", "response")

    def __init__(self, request: web.Request):
        self.request = request
        self.response: web.StreamResponse | None = None

    @property
    def headers(self):
        return self.request.headers

    async def read(self) -> bytes:
        return await self.request.read()

    def body_now(self) -> bytes | None:
        """The whole body without waiting, if it can be had so (here: never; read it)."""
        return None

    async def start_stream(self, status: int, headers: dict[str, str], first: bytes) -> None:
        self.response = web.StreamResponse(status=status, headers=headers)
        await self.response.prepare(self.request)
        await self.response.write(first)

    async def write(self, chunk: bytes) -> None:
        await self.response.write(chunk)

    async def write_eof(self, last: bytes = b"") -> None:
        if last:
            await self.response.write(last)
        await self.response.write_eof()

    def finish(self, result: Reply | None) -> web.StreamResponse:
        """The aiohttp response for what the request path returned (``None``: it
        streamed)."""
        if result is None:
            return self.response
        return web.Response(body=result.body, status=result.status, headers=result.headers)
