"""Agent protocol v1: message shapes, limits and validation (docs/agent-protocol.md).

Shared by the agent and the control plane's ingest; pure Python, no Django, no I/O.
Validation is hand-written rather than JSON-Schema driven because it runs on every report
(thousands per second) and must also check values against the node's own inventory.
Every check returns typed :class:`ProtocolError` values; nothing here raises on bad input.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any

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


class ErrorCode:
    BAD_JSON = "bad_json"
    TOO_LARGE = "too_large"
    BAD_SCHEMA = "bad_schema"
    OUT_OF_RANGE = "out_of_range"
    UNKNOWN_TYPE = "unknown_type"
    UNKNOWN_GPU = "unknown_gpu"
    UNKNOWN_ENGINE = "unknown_engine"
    UNKNOWN_NIC = "unknown_nic"
    HELLO_REQUIRED = "hello_required"
    UNSUPPORTED_VERSION = "unsupported_version"
    FORBIDDEN = "forbidden"
    RATE_LIMITED = "rate_limited"
    UNKNOWN_COMMAND = "unknown_command"
    INTERNAL = "internal"


@dataclass(frozen=True)
class ProtocolError:
    code: str
    reason: str
    path: str = ""

    def frame(self, ref: Any = None) -> dict:
        out = {"type": "error", "code": self.code, "reason": self.reason}
        if self.path:
            out["path"] = self.path
        if ref is not None:
            out["ref"] = ref
        return out


@dataclass
class Inventory:
    """What a node announced in ``hello``: the keys later reports may refer to."""

    gpu_indexes: frozenset[int] = frozenset()
    engine_ids: frozenset[str] = frozenset()
    nic_names: frozenset[str] = frozenset()

    @classmethod
    def from_hello(cls, inventory: dict) -> Inventory:
        return cls(
            gpu_indexes=frozenset(g["index"] for g in inventory.get("gpus", [])),
            engine_ids=frozenset(e["id"] for e in inventory.get("engines", [])),
            nic_names=frozenset(n["name"] for n in inventory.get("nics", [])),
        )


@dataclass
class _Checker:
    errors: list[ProtocolError] = field(default_factory=list)

    def fail(self, code: str, reason: str, path: str) -> None:
        self.errors.append(ProtocolError(code, reason, path))

    # Each helper returns True when the value is acceptable (None allowed if optional).
    def number(
        self,
        obj: dict,
        key: str,
        path: str,
        *,
        lo: float | None = 0.0,
        hi: float | None = None,
        optional: bool = True,
        integer: bool = False,
    ) -> bool:
        value = obj.get(key)
        where = f"{path}.{key}"
        if value is None:
            if optional:
                return True
            self.fail(ErrorCode.BAD_SCHEMA, "required number is missing", where)
            return False
        if isinstance(value, bool) or not isinstance(value, int | float):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a number", where)
            return False
        if integer and not isinstance(value, int):
            self.fail(ErrorCode.BAD_SCHEMA, "must be an integer", where)
            return False
        if isinstance(value, float) and not math.isfinite(value):
            self.fail(ErrorCode.OUT_OF_RANGE, "must be finite (no NaN or infinity)", where)
            return False
        if lo is not None and value < lo:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be ≥ {lo:g}", where)
            return False
        if hi is not None and value > hi:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be ≤ {hi:g}", where)
            return False
        return True

    def string(
        self, obj: dict, key: str, path: str, *, optional: bool = False, choices=None,
        max_len: int = MAX_ID_LEN,
    ) -> bool:
        value = obj.get(key)
        where = f"{path}.{key}"
        if value is None:
            if optional:
                return True
            self.fail(ErrorCode.BAD_SCHEMA, "required string is missing", where)
            return False
        if not isinstance(value, str):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a string", where)
            return False
        if len(value) > max_len:
            self.fail(ErrorCode.OUT_OF_RANGE, f"longer than {max_len} characters", where)
            return False
        if choices is not None and value not in choices:
            self.fail(ErrorCode.OUT_OF_RANGE, f"must be one of {', '.join(choices)}", where)
            return False
        return True

    def objects(self, obj: dict, key: str, path: str, limit: int) -> list[dict]:
        value = obj.get(key, [])
        where = f"{path}.{key}"
        if not isinstance(value, list):
            self.fail(ErrorCode.BAD_SCHEMA, "must be a list", where)
            return []
        if len(value) > limit:
            self.fail(ErrorCode.OUT_OF_RANGE, f"more than {limit} entries", where)
            return []
        good = []
        for i, item in enumerate(value):
            if isinstance(item, dict):
                good.append(item)
            else:
                self.fail(ErrorCode.BAD_SCHEMA, "must be an object", f"{where}[{i}]")
        return good

    def boolean(self, obj: dict, key: str, path: str) -> bool:
        value = obj.get(key)
        if value is None or isinstance(value, bool):
            return True
        self.fail(ErrorCode.BAD_SCHEMA, "must be true or false", f"{path}.{key}")
        return False


BIG = 2.0**63  # counters and byte sizes fit in int64


def validate_hello(msg: Any) -> list[ProtocolError]:
    """Check a ``hello`` frame; returns the errors (empty when valid)."""
    c = _Checker()
    if not isinstance(msg, dict) or msg.get("type") != "hello":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a hello object", "")]
    versions = msg.get("protocol")
    if not (
        isinstance(versions, list)
        and versions
        and all(isinstance(v, int) and not isinstance(v, bool) for v in versions)
    ):
        c.fail(ErrorCode.BAD_SCHEMA, "must be a non-empty list of integers", "hello.protocol")
    c.string(msg, "agent_version", "hello", max_len=32)
    c.string(msg, "hostname", "hello", max_len=MAX_HOSTNAME_LEN)
    # Optional: the port of the agent's own /metrics, so service discovery can list it.
    c.number(msg, "metrics_port", "hello", lo=1, hi=65535, integer=True)
    inv = msg.get("inventory")
    if not isinstance(inv, dict):
        c.fail(ErrorCode.BAD_SCHEMA, "must be an object", "hello.inventory")
        return c.errors
    seen: set = set()
    for i, gpu in enumerate(c.objects(inv, "gpus", "inventory", MAX_GPUS)):
        p = f"inventory.gpus[{i}]"
        if c.number(gpu, "index", p, lo=0, hi=MAX_GPUS - 1, optional=False, integer=True):
            if gpu["index"] in seen:
                c.fail(ErrorCode.BAD_SCHEMA, "duplicate GPU index", f"{p}.index")
            seen.add(gpu["index"])
        c.string(gpu, "uuid", p)
        c.string(gpu, "name", p, optional=True)
        c.number(gpu, "memory_total_bytes", p, lo=1, hi=BIG, integer=True)
        peers = gpu.get("nvlink_peers", [])
        if not isinstance(peers, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in peers
        ):
            c.fail(ErrorCode.BAD_SCHEMA, "must be a list of GPU indexes", f"{p}.nvlink_peers")
    gpu_indexes = seen
    seen = set()
    for i, nic in enumerate(c.objects(inv, "nics", "inventory", MAX_NICS)):
        p = f"inventory.nics[{i}]"
        if c.string(nic, "name", p, max_len=MAX_NIC_NAME_LEN):
            if nic["name"] in seen:
                c.fail(ErrorCode.BAD_SCHEMA, "duplicate NIC name", f"{p}.name")
            seen.add(nic["name"])
        c.number(nic, "line_rate_gbps", p, lo=0, hi=1e5)
        c.string(nic, "transport", p, optional=True, choices=TRANSPORTS)
        c.boolean(nic, "rdma", p)
    seen = set()
    for i, eng in enumerate(c.objects(inv, "engines", "inventory", MAX_ENGINES)):
        p = f"inventory.engines[{i}]"
        if c.string(eng, "id", p):
            if eng["id"] in seen:
                c.fail(ErrorCode.BAD_SCHEMA, "duplicate engine id", f"{p}.id")
            seen.add(eng["id"])
        c.string(eng, "model", p)
        c.string(eng, "kind", p, optional=True, choices=ENGINE_KINDS)
        c.string(eng, "role", p, optional=True, choices=ROLES)
        for key in ("api_url", "metrics_url", "kv_events_endpoint", "kv_replay_endpoint"):
            c.string(eng, key, p, optional=True, max_len=MAX_URL_LEN)
        c.number(eng, "tp", p, lo=1, hi=MAX_GPUS, integer=True)
        c.number(eng, "block_size", p, lo=1, hi=1 << 20, integer=True)
        c.number(eng, "num_gpu_blocks", p, lo=0, hi=BIG, integer=True)
        gpus = eng.get("gpus", [])
        if not isinstance(gpus, list) or not all(
            isinstance(x, int) and not isinstance(x, bool) for x in gpus
        ):
            c.fail(ErrorCode.BAD_SCHEMA, "must be a list of GPU indexes", f"{p}.gpus")
        else:
            for x in gpus:
                if x not in gpu_indexes:
                    c.fail(ErrorCode.UNKNOWN_GPU, f"GPU {x} is not in the inventory", f"{p}.gpus")
    return c.errors


def validate_inventory_message(msg: Any) -> list[ProtocolError]:
    """An ``inventory`` frame re-announces the inventory mid-connection (same shape as hello)."""
    if not isinstance(msg, dict):
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected an object", "")]
    as_hello = {
        "type": "hello", "protocol": [PROTOCOL_VERSION], "agent_version": "0",
        "hostname": "-", "inventory": msg.get("inventory"),
    }
    return validate_hello(as_hello)


def negotiate_version(offered: list[int]) -> int | None:
    common = [v for v in offered if v in SUPPORTED_VERSIONS]
    return max(common) if common else None


# Report fields as (name, low, high, integer). Checked table-driven with a fast path for
# the common all-valid case (this runs for every report; see bench/ingest_bench.py).
GPU_REPORT_FIELDS = (
    ("memory_used_bytes", 0, BIG, False), ("memory_total_bytes", 0, BIG, False),
    ("utilization", 0, 1.0, False), ("temperature_c", -50, 200, False),
    ("power_w", 0, 10_000, False), ("nvlink_tx_gbps", 0, 1e5, False),
    ("nvlink_rx_gbps", 0, 1e5, False),
)
ENGINE_REPORT_FIELDS = (
    ("generation", 0, BIG, True), ("running", 0, BIG, True), ("waiting", 0, BIG, True),
    ("kv_blocks_used", 0, BIG, True), ("kv_blocks_total", 0, BIG, True),
    ("preemptions", 0, BIG, True), ("kv_usage", 0, 1.0, False),
    ("prefix_hit_rate", 0, 1.0, False), ("prompt_tokens_per_s", 0, 1e9, False),
    ("generation_tokens_per_s", 0, 1e9, False), ("ttft_p50_s", 0, 1e5, False),
    ("ttft_p95_s", 0, 1e5, False), ("itl_p50_s", 0, 1e5, False), ("itl_p95_s", 0, 1e5, False),
)
KV_EVENT_FIELDS = tuple((k, -1, BIG, True) for k in (
    "blocks", "gaps", "replayed", "lost", "unknown_events", "decode_errors", "last_seq",
    "restarts", "strays"))
NIC_REPORT_FIELDS = (
    ("tx_gbps", 0, 1e5, False), ("rx_gbps", 0, 1e5, False), ("rx_errors", 0, BIG, True),
    ("tx_errors", 0, BIG, True), ("rx_drops", 0, BIG, True), ("tx_drops", 0, BIG, True),
)
AGENT_FIELDS = (("dropped_reports", 0, BIG, True), ("buffered", 0, BIG, True),
                ("reconnects", 0, BIG, True))

# What is kept of a report's gpus[], nics[] and agent{} entries. Unknown fields are dropped,
# not refused: a newer agent may send more, and an older server must still store what it
# knows (issue 20, defect 5: they used to be stored as sent).
GPU_REPORT_KEYS = frozenset(["index", *(f[0] for f in GPU_REPORT_FIELDS)])
NIC_REPORT_KEYS = frozenset(["name", *(f[0] for f in NIC_REPORT_FIELDS)])
AGENT_REPORT_KEYS = frozenset(f[0] for f in AGENT_FIELDS)


def known_fields(obj: dict, keys: frozenset[str]) -> dict:
    """``obj`` without the keys the protocol does not define."""
    if keys.issuperset(obj):
        return obj
    return {k: v for k, v in obj.items() if k in keys}


def _check_fields(c: _Checker, obj: dict, spec, path: str) -> None:
    get = obj.get
    for key, lo, hi, integer in spec:
        value = get(key)
        if value is None:
            continue
        t = type(value)
        if t is int:
            if lo <= value <= hi:
                continue
        elif t is float and not integer and value - value == 0.0 and lo <= value <= hi:
            continue  # (value - value is NaN for NaN and ±inf)
        c.number(obj, key, path, lo=lo, hi=hi, integer=integer)  # slow path: says why


# Optional per-engine cumulative counters and histogram buckets (docs/agent-protocol.md,
# "Engine counters and histograms"): names are free-form within these limits, so a newer
# agent can add a family without a protocol change; the control plane uses those it knows.
MAX_ENGINE_COUNTERS = 32
MAX_ENGINE_HISTOGRAMS = 16
MAX_HISTOGRAM_BUCKETS = 64


def _finite_number(value) -> bool:
    return type(value) in (int, float) and value - value == 0


def _ascending_numbers(values: list, strict: bool) -> bool:
    """Finite numbers in ascending order, checked in C-level passes (reports carry a few
    hundred bucket values per node): ``sum`` refuses non-numbers and turns NaN or an
    infinity into a non-finite total; ``map`` over neighbours compares them."""
    try:
        if not math.isfinite(sum(values)):
            return False
    except TypeError:
        return False
    return all(map(operator.lt if strict else operator.le, values, values[1:]))


def _check_engine_telemetry(c: _Checker, eng: dict, path: str) -> None:
    counters = eng.get("counters")
    if counters is not None:
        if type(counters) is not dict or len(counters) > MAX_ENGINE_COUNTERS:
            c.fail(ErrorCode.BAD_SCHEMA, f"must be an object of at most {MAX_ENGINE_COUNTERS} "
                   "counters", f"{path}.counters")
        else:
            for name, value in counters.items():
                if len(name) > 64 or not _finite_number(value) or not 0 <= value <= BIG:
                    c.fail(ErrorCode.OUT_OF_RANGE, "must be a finite number ≥ 0",
                           f"{path}.counters.{name[:64]}")
    hists = eng.get("histograms")
    if hists is None:
        return
    if type(hists) is not dict or len(hists) > MAX_ENGINE_HISTOGRAMS:
        c.fail(ErrorCode.BAD_SCHEMA, f"must be an object of at most {MAX_ENGINE_HISTOGRAMS} "
               "histograms", f"{path}.histograms")
        return
    for name, h in hists.items():
        le = h.get("le") if type(h) is dict else None
        counts = h.get("counts") if type(h) is dict else None
        error = None
        if type(le) is not list or type(counts) is not list or len(name) > 64:
            error = (ErrorCode.BAD_SCHEMA, "must be {le: [bounds], counts: [cumulative], sum}",
                     "")
        elif len(le) > MAX_HISTOGRAM_BUCKETS or len(counts) != len(le) + 1:
            error = (ErrorCode.BAD_SCHEMA, f"at most {MAX_HISTOGRAM_BUCKETS} finite bounds "
                     "and one count per bound plus the +Inf count", "")
        elif not _ascending_numbers(le, strict=True):
            error = (ErrorCode.OUT_OF_RANGE, "bounds must be finite and strictly ascending",
                     ".le")
        elif not _ascending_numbers(counts, strict=False) or not 0 <= counts[0] <= counts[
            -1
        ] <= BIG:
            error = (ErrorCode.OUT_OF_RANGE, "counts must be cumulative: ≥ 0 and "
                     "non-decreasing", ".counts")
        elif not _finite_number(h.get("sum", 0)):
            error = (ErrorCode.OUT_OF_RANGE, "must be a finite number", ".sum")
        if error is not None:
            c.fail(error[0], error[1], f"{path}.histograms.{name[:64]}{error[2]}")


def validate_report(msg: Any, inventory: Inventory) -> list[ProtocolError]:
    """Check a ``report`` frame against the node's announced inventory."""
    c = _Checker()
    if not isinstance(msg, dict) or msg.get("type") != "report":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a report object", "")]
    c.number(msg, "seq", "report", lo=0, hi=BIG, optional=False, integer=True)
    c.number(msg, "ts", "report", lo=0, hi=1e11, optional=False)
    c.boolean(msg, "ack", "report")
    for i, gpu in enumerate(c.objects(msg, "gpus", "report", MAX_GPUS)):
        index = gpu.get("index")
        if type(index) is not int or index not in inventory.gpu_indexes:
            p = f"report.gpus[{i}]"
            if c.number(gpu, "index", p, lo=0, hi=MAX_GPUS - 1, optional=False, integer=True):
                c.fail(ErrorCode.UNKNOWN_GPU, f"GPU {index} was not in hello", f"{p}.index")
        _check_fields(c, gpu, GPU_REPORT_FIELDS, f"report.gpus[{i}]")
        used, total = gpu.get("memory_used_bytes"), gpu.get("memory_total_bytes")
        if (
            type(used) in (int, float) and type(total) in (int, float)
            and total and used > total
        ):
            c.fail(ErrorCode.OUT_OF_RANGE, "used memory exceeds total",
                   f"report.gpus[{i}].memory_used_bytes")
    for i, eng in enumerate(c.objects(msg, "engines", "report", MAX_ENGINES)):
        eid = eng.get("id")
        if type(eid) is not str or eid not in inventory.engine_ids:
            p = f"report.engines[{i}]"
            if c.string(eng, "id", p):
                c.fail(ErrorCode.UNKNOWN_ENGINE, f"engine {eid!r} was not in hello", f"{p}.id")
        up = eng.get("up")
        if up is not None and type(up) is not bool:
            c.boolean(eng, "up", f"report.engines[{i}]")
        role = eng.get("role")
        if role is not None and role not in ROLES:
            c.string(eng, "role", f"report.engines[{i}]", optional=True, choices=ROLES)
        _check_fields(c, eng, ENGINE_REPORT_FIELDS, f"report.engines[{i}]")
        used, total = eng.get("kv_blocks_used"), eng.get("kv_blocks_total")
        if type(used) is int and type(total) is int and total and used > total:
            c.fail(ErrorCode.OUT_OF_RANGE, "KV blocks used exceed total",
                   f"report.engines[{i}].kv_blocks_used")
        if "counters" in eng or "histograms" in eng:
            _check_engine_telemetry(c, eng, f"report.engines[{i}]")
        kv = eng.get("kv_events")
        if kv is not None:
            p = f"report.engines[{i}].kv_events"
            if type(kv) is not dict:
                c.fail(ErrorCode.BAD_SCHEMA, "must be an object", p)
            else:
                _check_fields(c, kv, KV_EVENT_FIELDS, p)
                digest = kv.get("digest")
                if digest is not None and (type(digest) is not str or len(digest) > 64):
                    c.string(kv, "digest", p, optional=True, max_len=64)
                for flag in ("connected", "complete", "stalled"):
                    value = kv.get(flag)
                    if value is not None and type(value) is not bool:
                        c.boolean(kv, flag, p)
    for i, nic in enumerate(c.objects(msg, "nics", "report", MAX_NICS)):
        name = nic.get("name")
        if type(name) is not str or name not in inventory.nic_names:
            p = f"report.nics[{i}]"
            if c.string(nic, "name", p, max_len=MAX_NIC_NAME_LEN):
                c.fail(ErrorCode.UNKNOWN_NIC, f"NIC {name!r} was not in hello", f"{p}.name")
        _check_fields(c, nic, NIC_REPORT_FIELDS, f"report.nics[{i}]")
    agent = msg.get("agent")
    if agent is not None:
        if type(agent) is not dict:
            c.fail(ErrorCode.BAD_SCHEMA, "must be an object", "report.agent")
        else:
            _check_fields(c, agent, AGENT_FIELDS, "report.agent")
    return c.errors


def validate_command_result(msg: Any) -> list[ProtocolError]:
    c = _Checker()
    if not isinstance(msg, dict) or msg.get("type") != "command_result":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a command_result object", "")]
    c.string(msg, "id", "command_result", max_len=64)
    c.string(msg, "status", "command_result", choices=COMMAND_STATUSES)
    c.string(msg, "detail", "command_result", optional=True, max_len=4000)
    return c.errors


def validate_command(msg: Any) -> list[ProtocolError]:
    """Agent-side check of a server ``command`` frame."""
    c = _Checker()
    if not isinstance(msg, dict) or msg.get("type") != "command":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a command object", "")]
    c.string(msg, "id", "command", max_len=64)
    if c.string(msg, "command", "command", max_len=64) and msg["command"] not in COMMANDS:
        c.fail(ErrorCode.UNKNOWN_COMMAND, f"unknown command {msg['command']!r}", "command.command")
    args = msg.get("args", {})
    if not isinstance(args, dict):
        c.fail(ErrorCode.BAD_SCHEMA, "must be an object", "command.args")
    return c.errors


def validate_welcome(msg: Any) -> list[ProtocolError]:
    c = _Checker()
    if not isinstance(msg, dict) or msg.get("type") != "welcome":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a welcome object", "")]
    c.number(msg, "protocol", "welcome", lo=1, optional=False, integer=True)
    c.number(msg, "node_id", "welcome", lo=1, optional=False, integer=True)
    c.number(msg, "report_interval_s", "welcome", lo=0.05, hi=3600, optional=False)
    c.number(msg, "server_time", "welcome", optional=True)
    return c.errors


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
