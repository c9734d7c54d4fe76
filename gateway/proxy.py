"""Upstream calls: open a request to a worker.

The rule that makes retries safe: nothing is sent to the client until the upstream has
produced its first body chunk. :func:`open_upstream` returns only once that chunk is in
hand (or raises :class:`UpstreamFailure`), so a worker that refuses the connection, errs
with 5xx or dies before its first byte can be replaced by another, invisibly.
"""

from __future__ import annotations

from dataclasses import dataclass

import aiohttp

# The P/D request rewriting lives with its engine adapter; re-exported for old callers.
from .engines.vllm_nixl import REMOTE_DECODE_PARAMS, decode_body, prefill_body  # noqa: F401

# The engine needs none of these; not sending them is less work on both sides.
SKIP_AUTO_HEADERS = ("User-Agent", "Accept", "Accept-Encoding")
HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "server",
               "date", "content-encoding"}


class UpstreamFailure(Exception):
    """The worker failed before producing any byte for the client (retryable)."""

    def __init__(self, worker_id: str, reason: str, status: int | None = None):
        super().__init__(f"{worker_id}: {reason}")
        self.worker_id = worker_id
        self.reason = reason
        self.status = status


class PairFailure(UpstreamFailure):
    """A prefill→decode pair failed before the first byte: the prefill worker erred or
    timed out (``prefill_failed``), or the decode worker refused the transfer parameters
    (``transfer_refused``). Retryable on another pair."""

    def __init__(self, prefill: str, decode: str, kind: str, reason: str,
                 status: int | None = None):
        super().__init__(prefill if kind == "prefill_failed" else decode, reason, status)
        self.prefill, self.decode, self.kind = prefill, decode, kind


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
    url,
    data: bytes,
    headers: dict[str, str],
    *,
    timeout: aiohttp.ClientTimeout,
) -> OpenUpstream:
    """POST and wait for the first body chunk. 5xx and transport errors before it raise
    :class:`UpstreamFailure`; 4xx are returned as they are (the request is at fault)."""
    try:
        response = await session.post(url, data=data, headers=headers, timeout=timeout,
                                      skip_auto_headers=SKIP_AUTO_HEADERS)
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
