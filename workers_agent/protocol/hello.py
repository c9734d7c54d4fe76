"""The handshake: the agent's ``hello`` (and the ``inventory`` frame that re-announces its
inventory), the version both sides speak, and the server's ``welcome``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .checks import Checker, ErrorCode, ProtocolError
from .limits import (
    BIG,
    ENGINE_KINDS,
    MAX_ENGINES,
    MAX_GPUS,
    MAX_HOSTNAME_LEN,
    MAX_NIC_NAME_LEN,
    MAX_NICS,
    MAX_URL_LEN,
    PROTOCOL_VERSION,
    ROLES,
    SUPPORTED_VERSIONS,
    TRANSPORTS,
)


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


def validate_hello(msg: Any) -> list[ProtocolError]:
    """Check a ``hello`` frame; returns the errors (empty when valid)."""
    c = Checker()
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


def validate_welcome(msg: Any) -> list[ProtocolError]:
    c = Checker()
    if not isinstance(msg, dict) or msg.get("type") != "welcome":
        return [ProtocolError(ErrorCode.BAD_SCHEMA, "expected a welcome object", "")]
    c.number(msg, "protocol", "welcome", lo=1, optional=False, integer=True)
    c.number(msg, "node_id", "welcome", lo=1, optional=False, integer=True)
    c.number(msg, "report_interval_s", "welcome", lo=0.05, hi=3600, optional=False)
    c.number(msg, "server_time", "welcome", optional=True)
    return c.errors
