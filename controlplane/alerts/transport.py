"""One HTTP POST to a checked webhook target. No Django import.

Connects to the address the SSRF guard approved (not a fresh DNS answer) and, for HTTPS,
still verifies the certificate against the URL's host name.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import time
from dataclasses import dataclass

from .ssrf import Target

RESPONSE_EXCERPT_BYTES = 1024


@dataclass(frozen=True)
class Response:
    status: int | None  # None: no HTTP answer (connect error, timeout)
    latency_ms: float
    excerpt: str = ""
    retry_after: str | None = None
    error: str = ""


class _PinnedHTTP(http.client.HTTPConnection):
    def __init__(self, target: Target, timeout: float):
        super().__init__(target.host, target.port, timeout=timeout)
        self._address = target.address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)


class _PinnedHTTPS(http.client.HTTPSConnection):
    def __init__(self, target: Target, timeout: float):
        super().__init__(
            target.host, target.port, timeout=timeout, context=ssl.create_default_context()
        )
        self._address = target.address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._context.wrap_socket(sock, server_hostname=self.host)


def post(target: Target, headers: dict[str, str], body: bytes, timeout: float) -> Response:
    cls = _PinnedHTTPS if target.scheme == "https" else _PinnedHTTP
    conn = cls(target, timeout)
    started = time.monotonic()
    try:
        conn.request(
            "POST", target.path, body=body, headers={**headers, "user-agent": "pdplane-webhooks/1"}
        )
        resp = conn.getresponse()
        excerpt = resp.read(RESPONSE_EXCERPT_BYTES).decode("utf-8", "replace")
        return Response(
            resp.status,
            (time.monotonic() - started) * 1000,
            excerpt,
            resp.getheader("retry-after"),
        )
    except (OSError, http.client.HTTPException) as exc:
        return Response(
            None, (time.monotonic() - started) * 1000, error=f"{type(exc).__name__}: {exc}"
        )
    finally:
        conn.close()
