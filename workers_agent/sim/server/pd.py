"""Prefill→decode KV hand-off between simulated engines (vLLM NixlConnector semantics).

Where an engine sits decides how fast its KV moves to another:

- same engine: nothing moves;
- same node, every GPU of both engines in one NVLink group: NVLink;
- same node otherwise: PCIe (through host memory);
- different nodes: the network, bounded by the slower of the two nodes' best NICs, RDMA only
  if both ends have it.

Both ends compute the path from the two locations, so the prefill node counts its bytes as
sent and the decode node as received on the right counters without a shared registry.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class NicInfo:
    name: str
    line_rate_gbps: float
    transport: str
    rdma: bool


@dataclass(frozen=True)
class EngineLocation:
    node: str
    engine_id: str
    gpus: tuple[int, ...]
    nvlink_group: int | None
    nics: tuple[NicInfo, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = list(self.gpus)
        data["nics"] = [asdict(n) for n in self.nics]
        return data

    @classmethod
    def from_dict(cls, data: Any) -> EngineLocation:
        if not isinstance(data, dict):
            raise ValueError("location must be an object")
        try:
            nics = tuple(
                NicInfo(str(n["name"]), float(n["line_rate_gbps"]), str(n["transport"]),
                        bool(n["rdma"]))
                for n in data.get("nics") or []
            )
            group = data.get("nvlink_group")
            return cls(
                node=str(data["node"]),
                engine_id=str(data["engine_id"]),
                gpus=tuple(int(g) for g in data["gpus"]),
                nvlink_group=None if group is None else int(group),
                nics=nics,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed location: {exc}") from exc

    def best_nic(self) -> NicInfo | None:
        if not self.nics:
            return None
        return max(self.nics, key=lambda n: (n.line_rate_gbps, n.rdma))


def nvlink_group_of(gpus: tuple[int, ...], group_size: int) -> int | None:
    """The NVLink group shared by all these GPUs, or None (no NVLink, or they span groups)."""
    if group_size <= 0:
        return None
    groups = {g // group_size for g in gpus}
    return groups.pop() if len(groups) == 1 else None


@dataclass(frozen=True)
class KvPath:
    kind: str  # "local", "nvlink", "pcie", "network"
    gbps: float = 0.0  # network only: line rate of the slower end
    rdma: bool = False
    src_nic: str | None = None
    dst_nic: str | None = None

    def describe(self) -> str:
        if self.kind == "network":
            return f"network {self.gbps:g} Gb/s {'RDMA' if self.rdma else 'TCP'}"
        return self.kind


def kv_path(src: EngineLocation, dst: EngineLocation) -> KvPath:
    if src.node == dst.node and src.engine_id == dst.engine_id:
        return KvPath("local")
    if src.node == dst.node:
        if (
            src.nvlink_group is not None
            and src.nvlink_group == dst.nvlink_group
        ):
            return KvPath("nvlink")
        return KvPath("pcie")
    a, b = src.best_nic(), dst.best_nic()
    if a is None or b is None:
        # A node without a NIC cannot reach another; model a 1 Gb/s management port so the
        # transfer is painfully slow rather than impossible.
        return KvPath("network", gbps=1.0, rdma=False,
                      src_nic=a.name if a else None, dst_nic=b.name if b else None)
    return KvPath("network", gbps=min(a.line_rate_gbps, b.line_rate_gbps),
                  rdma=a.rdma and b.rdma, src_nic=a.name, dst_nic=b.name)
