"""Upstream calls: open a request to a worker, and the P/D request rewriting.

The rule that makes retries safe: nothing is sent to the client until the upstream has
produced its first body chunk. :func:`open_upstream` returns only once that chunk is in
hand (or raises :class:`UpstreamFailure`), so a worker that refuses the connection, errs
with 5xx or dies before its first byte can be replaced by another, invisibly.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import aiohttp

REMOTE_DECODE_PARAMS = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "server",
               "date", "content-encoding"}


class UpstreamFailure(Exception):
    """The worker failed before producing any byte for the client (retryable)."""

    def __init__(self, worker_id: str, reason: str, status: int | None = None):
        super().__init__(f"{worker_id}: {reason}")
        self.worker_id = worker_id
        self.reason = reason
        self.status = status


def prefill_body(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
    """The prefill copy: one token, not streamed, asking the engine to keep the KV."""
    out = copy.copy(body)
    out["max_tokens"] = 1
    if chat or "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    for key in ("stream", "stream_options", "min_tokens"):
        out.pop(key, None)
    out["kv_transfer_params"] = dict(REMOTE_DECODE_PARAMS)
    return out


def decode_body(body: dict[str, Any], kv_transfer_params: dict[str, Any] | None) -> dict:
    out = copy.copy(body)
    if kv_transfer_params:
        out["kv_transfer_params"] = kv_transfer_params
    else:
        out.pop("kv_transfer_params", None)
    return out


@dataclass
class OpenUpstream:
    response: aiohttp.ClientResponse
    first_chunk: bytes
    worker_id: str

    @property
    def status(self) -> int:
        return self.response.status

    def client_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.response.headers.items() if k.lower() not in HOP_HEADERS}

    def close(self) -> None:
        self.response.close()


async def open_upstream(
    session: aiohttp.ClientSession,
    worker_id: str,
    url: str,
    data: bytes,
    headers: dict[str, str],
    *,
    timeout: aiohttp.ClientTimeout,
) -> OpenUpstream:
    """POST and wait for the first body chunk. 5xx and transport errors before it raise
    :class:`UpstreamFailure`; 4xx are returned as they are (the request is at fault)."""
    try:
        response = await session.post(url, data=data, headers=headers, timeout=timeout)
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise UpstreamFailure(worker_id, f"connect/send failed: {exc!r}") from exc
    try:
        if response.status >= 500:
            detail = (await response.read())[:500].decode("utf-8", "replace")
            response.release()
            raise UpstreamFailure(worker_id, f"HTTP {response.status}: {detail}",
                                  response.status)
        first = await response.content.readany()
        if not first and response.status == 200 and not response.content.at_eof():
            first = await response.content.readany()
        if not first and response.status == 200:
            response.close()
            raise UpstreamFailure(worker_id, "closed before the first byte", response.status)
        return OpenUpstream(response, first, worker_id)
    except UpstreamFailure:
        raise
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        response.close()
        raise UpstreamFailure(worker_id, f"failed before the first byte: {exc!r}") from exc
    except BaseException:
        response.close()
        raise
