"""HMAC signing of table pushes and pulls.

The implementation lives in :mod:`gateway.signing` (pure, no Django) so the gateway and
the control plane cannot drift apart; this module is the control plane's name for it.
"""

from gateway.signing import (
    APPLIED_VERSION_HEADER,
    DELIVERY_ID_HEADER,
    EXPECTED_VERSION_HEADER,
    GATEWAY_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    SignatureError,
    sign,
    signed_headers,
    verify,
)

__all__ = [
    "APPLIED_VERSION_HEADER",
    "DELIVERY_ID_HEADER",
    "EXPECTED_VERSION_HEADER",
    "GATEWAY_HEADER",
    "SIGNATURE_HEADER",
    "TIMESTAMP_HEADER",
    "SignatureError",
    "sign",
    "signed_headers",
    "verify",
]
