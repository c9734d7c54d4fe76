"""The simulated fleet's configuration: a small JSON file, parsed and checked here.

Example (docs/sim.md has the full reference)::

    {
      "time_scale": 1.0,
      "nodes": [
        {"hostname": "sim-a", "gpu": "H200", "gpu_count": 8, "nvlink_group_size": 8,
         "nics": [{"name": "mlx5_0", "line_rate_gbps": 400, "transport": "infiniband",
                   "rdma": true}],
         "telemetry_port": 0}
      ],
      "engines": [
        {"id": "a-0", "node": "sim-a", "model": "llama-3.3-70b-fp8", "gpus": [0],
         "role": "both", "http_port": 0, "kv_events_port": 0, "kv_replay_port": 0}
      ]
    }

A port of 0 means "pick a free one"; :func:`resolve_ports` does that before any process
starts, so every endpoint is known up front and can be printed and written out.
"""

from __future__ import annotations

import json
import socket
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

ROLES = ("prefill", "decode", "both")
TRANSPORTS = ("ethernet", "infiniband", "roce", "efa")


class FleetConfigError(ValueError):
    """The fleet config is malformed; the message names the offending field."""


@dataclass(frozen=True)
class NicConfig:
    name: str
    line_rate_gbps: float
    transport: str = "ethernet"
    rdma: bool = False


@dataclass(frozen=True)
class EngineConfig:
    id: str
    node: str
    model: str
    gpus: tuple[int, ...]
    tp: int
    role: str = "both"
    served_model_name: str = ""
    http_port: int = 0
    kv_events_port: int = 0
    kv_replay_port: int = 0
    num_gpu_blocks: int | None = None
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    kv_events: bool = True
    # Fault injection: publish nothing for every Nth KV-event batch (0 = off); the batch
    # still takes its sequence number and stays in the replay buffer, as a lost packet would.
    drop_kv_batch_every: int = 0
    # Seconds (simulated) a prefill engine holds KV blocks for a decode engine to pull.
    kv_hold_timeout_s: float = 30.0
    max_model_len: int | None = None  # None: the model profile's

    @property
    def model_name(self) -> str:
        """The name clients send as ``model`` (vLLM's --served-model-name)."""
        return self.served_model_name or self.model


@dataclass(frozen=True)
class NodeConfig:
    hostname: str
    gpu: str
    gpu_count: int
    nvlink_group_size: int = 0
    nics: tuple[NicConfig, ...] = ()
    telemetry_port: int = 0


@dataclass(frozen=True)
class FleetConfig:
    nodes: tuple[NodeConfig, ...]
    engines: tuple[EngineConfig, ...]
    time_scale: float = 1.0
    host: str = "127.0.0.1"
    extra: dict[str, Any] = field(default_factory=dict)

    def node(self, hostname: str) -> NodeConfig:
        for node in self.nodes:
            if node.hostname == hostname:
                return node
        raise FleetConfigError(f"no node named {hostname!r} in the fleet config")

    def engines_on(self, hostname: str) -> list[EngineConfig]:
        return [e for e in self.engines if e.node == hostname]

    def to_dict(self) -> dict[str, Any]:
        data = {
            "time_scale": self.time_scale,
            "host": self.host,
            "nodes": [
                {**asdict(n), "nics": [asdict(nic) for nic in n.nics]} for n in self.nodes
            ],
            "engines": [{**asdict(e), "gpus": list(e.gpus)} for e in self.engines],
        }
        data.update(self.extra)
        return data


def _require(obj: dict, key: str, kind, where: str):
    if key not in obj:
        raise FleetConfigError(f"{where}: missing field {key!r}")
    value = obj[key]
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise FleetConfigError(f"{where}: {key!r} must be {kind.__name__}, got {value!r}")
    return value


def _optional(obj: dict, key: str, kind, default, where: str):
    if obj.get(key) is None:
        return default
    return _require(obj, key, kind, where)


def _port(obj: dict, key: str, where: str) -> int:
    value = _optional(obj, key, int, 0, where)
    if not 0 <= value <= 65535:
        raise FleetConfigError(f"{where}: {key!r} must be a TCP port or 0 (auto), got {value}")
    return value


def parse_fleet_config(data: Any) -> FleetConfig:
    """Check a decoded JSON object and build a FleetConfig; raise FleetConfigError on errors."""
    if not isinstance(data, dict):
        raise FleetConfigError("the fleet config must be a JSON object")
    nodes_raw = data.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise FleetConfigError("'nodes' must be a non-empty list")
    nodes: list[NodeConfig] = []
    for i, raw in enumerate(nodes_raw):
        where = f"nodes[{i}]"
        if not isinstance(raw, dict):
            raise FleetConfigError(f"{where} must be an object")
        hostname = _require(raw, "hostname", str, where)
        gpu_count = _require(raw, "gpu_count", int, where)
        if gpu_count < 1:
            raise FleetConfigError(f"{where}: gpu_count must be at least 1")
        group = _optional(raw, "nvlink_group_size", int, 0, where)
        if group < 0:
            raise FleetConfigError(f"{where}: nvlink_group_size must be 0 (no NVLink) or more")
        nics = []
        for j, nic in enumerate(raw.get("nics") or []):
            nwhere = f"{where}.nics[{j}]"
            if not isinstance(nic, dict):
                raise FleetConfigError(f"{nwhere} must be an object")
            rate = _require(nic, "line_rate_gbps", float, nwhere)
            if rate <= 0:
                raise FleetConfigError(f"{nwhere}: line_rate_gbps must be positive")
            transport = _optional(nic, "transport", str, "ethernet", nwhere)
            if transport not in TRANSPORTS:
                raise FleetConfigError(f"{nwhere}: transport must be one of {TRANSPORTS}")
            rdma = _optional(nic, "rdma", bool, transport != "ethernet", nwhere)
            nics.append(NicConfig(_require(nic, "name", str, nwhere), rate, transport, rdma))
        nodes.append(
            NodeConfig(
                hostname=hostname,
                gpu=_require(raw, "gpu", str, where),
                gpu_count=gpu_count,
                nvlink_group_size=group,
                nics=tuple(nics),
                telemetry_port=_port(raw, "telemetry_port", where),
            )
        )
    hostnames = [n.hostname for n in nodes]
    if len(set(hostnames)) != len(hostnames):
        raise FleetConfigError("node hostnames must be unique")
    by_host = {n.hostname: n for n in nodes}

    engines: list[EngineConfig] = []
    for i, raw in enumerate(data.get("engines") or []):
        where = f"engines[{i}]"
        if not isinstance(raw, dict):
            raise FleetConfigError(f"{where} must be an object")
        node_name = _require(raw, "node", str, where)
        if node_name not in by_host:
            raise FleetConfigError(f"{where}: unknown node {node_name!r}")
        gpus = raw.get("gpus")
        if not isinstance(gpus, list) or not gpus or not all(
            isinstance(g, int) and not isinstance(g, bool) for g in gpus
        ):
            raise FleetConfigError(f"{where}: 'gpus' must be a non-empty list of GPU indices")
        count = by_host[node_name].gpu_count
        if any(not 0 <= g < count for g in gpus) or len(set(gpus)) != len(gpus):
            raise FleetConfigError(f"{where}: GPU indices must be distinct and below {count}")
        tp = _optional(raw, "tp", int, len(gpus), where)
        if tp != len(gpus):
            raise FleetConfigError(f"{where}: tp={tp} but {len(gpus)} GPU(s) are listed")
        role = _optional(raw, "role", str, "both", where)
        if role not in ROLES:
            raise FleetConfigError(f"{where}: role must be one of {ROLES}")
        blocks = _optional(raw, "num_gpu_blocks", int, None, where)
        if blocks is not None and blocks < 1:
            raise FleetConfigError(f"{where}: num_gpu_blocks must be positive")
        engines.append(
            EngineConfig(
                id=_require(raw, "id", str, where),
                node=node_name,
                model=_require(raw, "model", str, where),
                gpus=tuple(gpus),
                tp=tp,
                role=role,
                served_model_name=_optional(raw, "served_model_name", str, "", where),
                http_port=_port(raw, "http_port", where),
                kv_events_port=_port(raw, "kv_events_port", where),
                kv_replay_port=_port(raw, "kv_replay_port", where),
                num_gpu_blocks=blocks,
                block_size=_optional(raw, "block_size", int, 16, where),
                max_num_seqs=_optional(raw, "max_num_seqs", int, 256, where),
                max_num_batched_tokens=_optional(raw, "max_num_batched_tokens", int, 8192, where),
                enable_prefix_caching=_optional(raw, "enable_prefix_caching", bool, True, where),
                kv_events=_optional(raw, "kv_events", bool, True, where),
                drop_kv_batch_every=_optional(raw, "drop_kv_batch_every", int, 0, where),
                kv_hold_timeout_s=_optional(raw, "kv_hold_timeout_s", float, 30.0, where),
                max_model_len=_optional(raw, "max_model_len", int, None, where),
            )
        )
    # Engine ids are unique per node, like worker names in the control plane.
    ids = [(e.node, e.id) for e in engines]
    if len(set(ids)) != len(ids):
        raise FleetConfigError("engine ids must be unique on each node")
    _check_gpu_sharing(engines)

    time_scale = _optional(data, "time_scale", float, 1.0, "fleet")
    if time_scale <= 0:
        raise FleetConfigError("time_scale must be positive (0.1 = ten times faster)")
    known = {"nodes", "engines", "time_scale", "host"}
    return FleetConfig(
        nodes=tuple(nodes),
        engines=tuple(engines),
        time_scale=time_scale,
        host=_optional(data, "host", str, "127.0.0.1", "fleet"),
        extra={k: v for k, v in data.items() if k not in known},
    )


def _check_gpu_sharing(engines: list[EngineConfig]) -> None:
    # Two engines of the same model on one GPU would double-count its memory; different
    # models may share a GPU (as with small models and --gpu-memory-utilization).
    seen: dict[tuple[str, str, int], str] = {}
    for engine in engines:
        for gpu in engine.gpus:
            key = (engine.node, engine.model, gpu)
            if key in seen:
                raise FleetConfigError(
                    f"engines {seen[key]!r} and {engine.id!r} both use {engine.node} gpu{gpu}"
                )
            seen[key] = engine.id


def load_fleet_config(path: str | Path) -> FleetConfig:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise FleetConfigError(f"cannot read {path}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise FleetConfigError(f"{path} is not valid JSON: {exc}") from exc
    return parse_fleet_config(data)


def _free_port(host: str, taken: set[int]) -> int:
    while True:
        with socket.socket() as sock:
            sock.bind((host, 0))
            port = sock.getsockname()[1]
        if port not in taken:
            taken.add(port)
            return port


def resolve_ports(config: FleetConfig) -> FleetConfig:
    """Replace every port 0 by a free port on the config's host.

    There is a small window between choosing and binding in which another program could
    take the port; the launcher reports a bind failure clearly if that happens.
    """
    taken: set[int] = set()
    for node in config.nodes:
        taken.add(node.telemetry_port)
    for e in config.engines:
        taken.update((e.http_port, e.kv_events_port, e.kv_replay_port))
    taken.discard(0)

    def pick(port: int) -> int:
        return port or _free_port(config.host, taken)

    nodes = tuple(replace(n, telemetry_port=pick(n.telemetry_port)) for n in config.nodes)
    engines = tuple(
        replace(
            e,
            http_port=pick(e.http_port),
            kv_events_port=pick(e.kv_events_port) if e.kv_events else 0,
            kv_replay_port=pick(e.kv_replay_port) if e.kv_events else 0,
        )
        for e in config.engines
    )
    return replace(config, nodes=nodes, engines=engines)


def endpoints_document(config: FleetConfig) -> dict[str, Any]:
    """The machine-readable endpoints JSON that `pdplane-sim run --endpoints-out` writes."""
    host = config.host
    nodes = []
    for node in config.nodes:
        nodes.append(
            {
                "hostname": node.hostname,
                "telemetry_url": f"http://{host}:{node.telemetry_port}/sim/v1/node",
                "engines": [e.id for e in config.engines_on(node.hostname)],
            }
        )
    engines = []
    for e in config.engines:
        engines.append(
            {
                "id": e.id,
                "node": e.node,
                "model": e.model_name,
                "profile": e.model,
                "role": e.role,
                "gpus": list(e.gpus),
                "tp": e.tp,
                "api_url": f"http://{host}:{e.http_port}",
                "metrics_url": f"http://{host}:{e.http_port}/metrics",
                "kv_events_endpoint": f"tcp://{host}:{e.kv_events_port}" if e.kv_events else "",
                "kv_replay_endpoint": f"tcp://{host}:{e.kv_replay_port}" if e.kv_events else "",
            }
        )
    return {"version": 1, "time_scale": config.time_scale, "nodes": nodes, "engines": engines}
