"""What both sides of agent protocol v1 agree on before a frame is read: the version, the
limits the server enforces (and announces in ``welcome``), the token bucket that meters the
frame rates, the close codes and the value sets of the enumerated fields."""

from __future__ import annotations

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)

# Limits the server enforces (and announces in ``welcome``).
MAX_FRAME_BYTES = 256 * 1024
MAX_GPUS = 64
MAX_NICS = 64
MAX_ENGINES = 64
MAX_ID_LEN = 128  # GPU uuid and name, engine id and model (DB columns: 128, issue 20 defect 3)
MAX_NIC_NAME_LEN = 32
MAX_HOSTNAME_LEN = 253
MAX_URL_LEN = 200
DEFAULT_REPORT_INTERVAL_S = 2.0
DEFAULT_MAX_REPORTS_PER_S = 5.0
DEFAULT_REPORT_BURST = 20
BIG = 2.0**63  # counters and byte sizes fit in int64

# Close codes (4000–4999 are application codes in RFC 6455).
CLOSE_UNAUTHORIZED = 4001  # missing or unknown bearer token
CLOSE_FORBIDDEN = 4003  # hello for another node
CLOSE_PROTOCOL = 4002  # no hello, or hello invalid; also unsupported protocol version
CLOSE_UNSUPPORTED_VERSION = 4006
CLOSE_TOO_MANY_ERRORS = 4008  # persistent garbage: the connection is dropped
CLOSE_SUPERSEDED = 4009  # the same node connected again; the newer connection wins

ROLES = ("prefill", "decode", "both")
ENGINE_KINDS = ("vllm", "sglang", "trtllm", "sim")
TRANSPORTS = ("ethernet", "infiniband", "roce", "efa")
COMMANDS = ("drain", "resume", "set_role", "restart_engine")
COMMAND_STATUSES = ("succeeded", "failed", "refused")

AGENT_TYPES = ("hello", "report", "command_result", "inventory")
SERVER_TYPES = ("welcome", "command", "error", "ack")


def frame_too_large(data: str | bytes, limit: int = MAX_FRAME_BYTES) -> bool:
    """True when a frame is over ``limit`` bytes as sent (UTF-8), not characters.

    A text frame of n characters is n to 4n bytes: most frames are decided by their length
    alone, and only those in between are encoded to count."""
    size = len(data)
    if isinstance(data, bytes | bytearray) or size > limit:
        return size > limit
    if 4 * size <= limit:
        return False
    return len(data.encode("utf-8", "surrogatepass")) > limit


class TokenBucket:
    """Rate limiter: ``rate`` tokens per second, at most ``burst`` saved up."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def take(self, now: float, cost: float = 1.0) -> bool:
        elapsed = now - self.stamp
        if elapsed > 0:
            self.tokens = min(self.burst, self.tokens + elapsed * self.rate)
            self.stamp = now
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False
