"""The ``report`` frame: each GPU's, engine's and NIC's figures checked against the node's
announced inventory, the engines' optional counters and histograms, and what of each entry
is kept (docs/agent-protocol.md)."""

from __future__ import annotations

import math
import operator
from typing import Any

from .checks import Checker, ErrorCode, ProtocolError
from .hello import Inventory
from .limits import BIG, MAX_ENGINES, MAX_GPUS, MAX_NIC_NAME_LEN, MAX_NICS, ROLES

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


def _check_fields(c: Checker, obj: dict, spec, path: str) -> None:
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


def _check_engine_telemetry(c: Checker, eng: dict, path: str) -> None:
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
    c = Checker()
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
