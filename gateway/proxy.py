"""Upstream calls: open a request to a worker.

The rule that makes retries safe: nothing is sent to the client until the upstream has
produced its first body chunk. :func:`open_upstream` returns only once that chunk is in
hand (or raises :class:`UpstreamFailure`), so a worker that refuses the connection, errs
with 5xx or dies before its first byte can be replaced by another, invisibly.
"""

from __future__ import annotations

from dataclasses import dataclass

# The P/D request rewriting lives with its engine adapter; re-exported for old callers.
from .engines.vllm_nixl import REMOTE_DECODE_PARAMS, decode_body, prefill_body  # noqa: F401
from .upstream_http import Target, Timeouts, UpstreamPool, UpstreamResponse

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "server",
               "date", "content-encoding"}
_HOP_BYTES = {h.encode() for h in HOP_HEADERS}


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
    response: UpstreamResponse
    first_chunk: bytes
    worker_id: str

    @property
    def status(self) -> int:
        return self.response.status

    def client_headers(self) -> dict[str, str]:
        """The worker's headers to pass on (decoded only if they are passed on)."""
        return {n.decode("latin-1"): v.decode("latin-1")
                for n, v in self.response._raw_headers if n.lower() not in _HOP_BYTES}

    def close(self) -> None:
        self.response.close()


async def open_upstream(
    pool: UpstreamPool,
    worker_id: str,
    target: Target,
    data: bytes,
    headers: dict[str, str],
    *,
    timeout: Timeouts,
) -> OpenUpstream:
    """POST and wait for the first body chunk. 5xx and transport errors before it raise
    :class:`UpstreamFailure`; 4xx are returned as they are (the request is at fault)."""
    try:
        response = await pool.post(target, data, headers, timeout)
    except (TimeoutError, OSError) as exc:
        raise UpstreamFailure(worker_id, f"connect/send failed: {exc!r}") from exc
    try:
        if response.status >= 500:
            detail = (await response.read())[:500].decode("utf-8", "replace")
            raise UpstreamFailure(worker_id, f"HTTP {response.status}: {detail}",
                                  response.status)
        first = await response.readany()
        if not first and response.status == 200:
            raise UpstreamFailure(worker_id, "closed before the first byte", response.status)
        return OpenUpstream(response, first, worker_id)
    except UpstreamFailure:
        response.close()
        raise
    except (TimeoutError, OSError) as exc:
        response.close()
        raise UpstreamFailure(worker_id, f"failed before the first byte: {exc!r}") from exc
    except BaseException:
        response.close()
        raise
