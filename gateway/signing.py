"""HMAC signing of routing-table traffic between the control plane and gateways.

Pure, no I/O. The signed message is ``"<timestamp>.<METHOD>.<path>." + body``: the
timestamp bounds replays to a window, and method + path stop a signed pull from being
replayed as a push. The header may carry several ``v1=<hex>`` values separated by spaces
so a secret can be rotated without downtime (sign with both, accept either).
"""

from __future__ import annotations

import hashlib
import hmac

TIMESTAMP_HEADER = "X-Pdplane-Timestamp"
SIGNATURE_HEADER = "X-Pdplane-Signature"
GATEWAY_HEADER = "X-Pdplane-Gateway"
EXPECTED_VERSION_HEADER = "X-Pdplane-Expected-Version"
APPLIED_VERSION_HEADER = "X-Pdplane-Applied-Version"
DELIVERY_ID_HEADER = "X-Pdplane-Delivery-Id"
DEFAULT_TOLERANCE_S = 300


class SignatureError(ValueError):
    """The request is not signed, wrongly signed, or outside the time window."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _message(timestamp: int, method: str, path: str, body: bytes) -> bytes:
    return f"{timestamp}.{method.upper()}.{path}.".encode() + body


def sign(secret: str, timestamp: int, method: str, path: str, body: bytes = b"") -> str:
    if not secret:
        raise SignatureError("empty secret")
    digest = hmac.new(secret.encode(), _message(timestamp, method, path, body), hashlib.sha256)
    return "v1=" + digest.hexdigest()


def signed_headers(
    secret: str, method: str, path: str, body: bytes = b"", *, now: float
) -> dict[str, str]:
    timestamp = int(now)
    return {
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, method, path, body),
    }


def check_headers(
    timestamp_header: str | None,
    signature_header: str | None,
    *,
    now: float,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> None:
    """What can be checked before the body is read (missing headers, stale timestamp), so an
    unsigned request is refused without buffering it. Raises :class:`SignatureError`."""
    if not timestamp_header or not signature_header:
        raise SignatureError("missing signature or timestamp header")
    try:
        timestamp = int(timestamp_header)
    except ValueError:
        raise SignatureError("timestamp is not an integer") from None
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp outside ±{tolerance_s}s of the receiver's clock")
    if not any(part.startswith("v1=") for part in signature_header.split()):
        raise SignatureError("no v1 signature in the header")


def verify(
    secrets: str | list[str],
    timestamp_header: str | None,
    signature_header: str | None,
    method: str,
    path: str,
    body: bytes,
    *,
    now: float,
    tolerance_s: int = DEFAULT_TOLERANCE_S,
) -> None:
    """Raise :class:`SignatureError` unless one signature matches one secret in time."""
    if not timestamp_header or not signature_header:
        raise SignatureError("missing signature or timestamp header")
    try:
        timestamp = int(timestamp_header)
    except ValueError:
        raise SignatureError("timestamp is not an integer") from None
    if abs(now - timestamp) > tolerance_s:
        raise SignatureError(f"timestamp outside ±{tolerance_s}s of the receiver's clock")
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    offered = [part for part in signature_header.split() if part.startswith("v1=")]
    if not offered:
        raise SignatureError("no v1 signature in the header")
    for key in keys:
        if not key:
            continue
        expected = sign(key, timestamp, method, path, body)
        for candidate in offered:
            if hmac.compare_digest(expected, candidate):
                return
    raise SignatureError("signature does not match")
