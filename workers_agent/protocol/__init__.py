"""Agent protocol v1: message shapes, limits and validation (docs/agent-protocol.md).

Shared by the agent and the control plane's ingest; pure Python, no Django, no I/O.
Validation is hand-written rather than JSON-Schema driven because it runs on every report
(thousands per second) and must also check values against the node's own inventory.
Every check returns typed :class:`ProtocolError` values; nothing here raises on bad input.

One module per concern: ``limits`` (version, limits, close codes, value sets, the token
bucket), ``checks`` (the typed error and the checker), and one per message kind: ``hello``
(hello, inventory, welcome), ``report``, ``commands`` (command, command_result). This face
hands on the names the agent, the consumer and the tests use.
"""

from .checks import ErrorCode, ProtocolError
from .commands import validate_command, validate_command_result
from .hello import (
    Inventory,
    negotiate_version,
    validate_hello,
    validate_inventory_message,
    validate_welcome,
)
from .limits import (
    CLOSE_FORBIDDEN,
    CLOSE_PROTOCOL,
    CLOSE_SUPERSEDED,
    CLOSE_TOO_MANY_ERRORS,
    CLOSE_UNAUTHORIZED,
    CLOSE_UNSUPPORTED_VERSION,
    COMMANDS,
    DEFAULT_MAX_REPORTS_PER_S,
    DEFAULT_REPORT_BURST,
    DEFAULT_REPORT_INTERVAL_S,
    ENGINE_KINDS,
    MAX_FRAME_BYTES,
    MAX_GPUS,
    MAX_HOSTNAME_LEN,
    MAX_ID_LEN,
    MAX_NIC_NAME_LEN,
    MAX_URL_LEN,
    PROTOCOL_VERSION,
    ROLES,
    SUPPORTED_VERSIONS,
    TokenBucket,
    frame_too_large,
)
from .report import validate_report

__all__ = [
    "CLOSE_FORBIDDEN", "CLOSE_PROTOCOL", "CLOSE_SUPERSEDED", "CLOSE_TOO_MANY_ERRORS",
    "CLOSE_UNAUTHORIZED", "CLOSE_UNSUPPORTED_VERSION", "COMMANDS", "DEFAULT_MAX_REPORTS_PER_S",
    "DEFAULT_REPORT_BURST", "DEFAULT_REPORT_INTERVAL_S", "ENGINE_KINDS", "MAX_FRAME_BYTES",
    "MAX_GPUS", "MAX_HOSTNAME_LEN", "MAX_ID_LEN", "MAX_NIC_NAME_LEN", "MAX_URL_LEN",
    "PROTOCOL_VERSION", "ROLES", "SUPPORTED_VERSIONS", "ErrorCode", "Inventory",
    "ProtocolError", "TokenBucket", "frame_too_large", "negotiate_version",
    "validate_command", "validate_command_result", "validate_hello",
    "validate_inventory_message", "validate_report", "validate_welcome",
]
