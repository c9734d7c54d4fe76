"""Standard Webhooks v1 signing (https://www.standardwebhooks.com). Pure.

``webhook-signature`` carries one ``v1,<base64 HMAC-SHA256("id.timestamp.body")>`` per
secret: during a rotation both the new and the previous secret sign, so receivers that
still hold the old secret keep verifying until they switch.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets as _secrets
from collections.abc import Sequence

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32  # Standard Webhooks: 24–64 random bytes
TOLERANCE_S = 300


class SignatureError(ValueError):
    pass


def generate_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(_secrets.token_bytes(SECRET_BYTES)).decode()


def new_message_id() -> str:
    return "msg_" + _secrets.token_urlsafe(18)


def _key(secret: str) -> bytes:
    raw = secret[len(SECRET_PREFIX) :] if secret.startswith(SECRET_PREFIX) else secret
    try:
        return base64.b64decode(raw, validate=True)
    except ValueError:
        raise SignatureError("webhook secret is not valid base64") from None


def signature(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(_key(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(secrets: Sequence[str], msg_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    if not secrets:
        raise SignatureError("no secret to sign with")
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signature(s, msg_id, timestamp, body) for s in secrets),
        "content-type": "application/json",
    }


def verify(secret: str, hdrs: dict[str, str], body: bytes, now: int) -> None:
    """Receiver side, for docs and tests: raises SignatureError unless valid and fresh."""
    lowered = {k.lower(): v for k, v in hdrs.items()}
    try:
        msg_id = lowered["webhook-id"]
        ts = int(lowered["webhook-timestamp"])
        sent = lowered["webhook-signature"].split()
    except (KeyError, ValueError):
        raise SignatureError("missing or malformed webhook headers") from None
    if abs(now - ts) > TOLERANCE_S:
        raise SignatureError("timestamp outside the tolerance")
    expected = signature(secret, msg_id, ts, body)
    if not any(hmac.compare_digest(expected, s) for s in sent):
        raise SignatureError("no signature matches")
