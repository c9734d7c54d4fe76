"""Cost parameters and KV-transfer links: what a path between two workers costs.

Pure arithmetic, no Django. Sources as in :mod:`.costmodel`'s docstring (RDMA ~87 % of line
rate from Mooncake, TCP far less once the copy through host memory is paid).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9


# --- Parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CostParams:
    chunk_tokens: int = 8192  # chunked-prefill token budget per step (vLLM V1 default)
    # Link efficiency: share of nominal bandwidth a KV transfer achieves (the simulator's
    # links use the same figures: RDMA 0.87 from Mooncake, TCP 0.40, DMA 0.8–0.85).
    nvlink_efficiency: float = 0.8
    pcie_efficiency: float = 0.85
    rdma_efficiency: float = 0.87
    tcp_efficiency: float = 0.40
    # Per-transfer set-up latency (handshake, descriptor exchange).
    nvlink_latency_s: float = 10e-6
    pcie_latency_s: float = 20e-6
    rdma_latency_s: float = 50e-6
    tcp_latency_s: float = 500e-6
    # The gateway routes each request when it arrives (gateway/router.py): one whose prompt
    # has a cached prefix covering at least this share follows the worker holding it
    # (prefix affinity, gateway.table.ModelRoute.prefix_min_match), busy or not; the rest
    # go to the least-loaded worker. 0 turns the affinity term off.
    prefix_min_match: float = 0.3
    # Calibration factors (measured ÷ predicted p95, see calibration.py).
    ttft_factor: float = 1.0
    itl_factor: float = 1.0


DEFAULT_PARAMS = CostParams()


# --- Links --------------------------------------------------------------------------------

LINK_KINDS = ("local", "nvlink", "pcie", "rdma", "tcp")


@dataclass(frozen=True)
class Link:
    """One path a KV transfer can take. ``gbs`` is the nominal one-way rate in GB/s."""

    kind: str  # local | nvlink | pcie | rdma | tcp
    gbs: float
    label: str = ""

    @classmethod
    def nic(cls, line_rate_gbps: float, rdma: bool, label: str = "") -> Link:
        kind = "rdma" if rdma else "tcp"
        text = label or f"{line_rate_gbps:g} G {'RDMA' if rdma else 'TCP'}"
        return cls(kind, line_rate_gbps / 8.0, text)

    @classmethod
    def pcie(cls, generation: int = 5, width: int = 16) -> Link:
        gbs = 0.25 * 2 ** (generation - 1) * width
        return cls("pcie", gbs, f"PCIe Gen{generation} x{width}")

    @classmethod
    def nvlink(cls, gbs: float = 900.0) -> Link:
        return cls("nvlink", gbs, f"NVLink {gbs:g} GB/s")

    def describe(self) -> str:
        return self.label or f"{self.kind} {self.gbs:g} GB/s"


def _per_kind(kind: str, params: CostParams, figure: str, local: float) -> float:
    """``params.<kind>_<figure>`` (a local hand-off costs ``local``); an unknown kind is TCP."""
    if kind == "local":
        return local
    if kind not in ("nvlink", "pcie", "rdma", "tcp"):
        kind = "tcp"
    return getattr(params, f"{kind}_{figure}")


def link_efficiency(kind: str, params: CostParams = DEFAULT_PARAMS) -> float:
    return _per_kind(kind, params, "efficiency", local=1.0)


def link_latency_s(kind: str, params: CostParams = DEFAULT_PARAMS) -> float:
    return _per_kind(kind, params, "latency_s", local=0.0)


def effective_gbs(link: Link, params: CostParams = DEFAULT_PARAMS) -> float:
    return link.gbs * link_efficiency(link.kind, params)


def transfer_time_s(
    nbytes: float, link: Link, params: CostParams = DEFAULT_PARAMS, nominal: bool = False
) -> float:
    """Seconds to move ``nbytes`` over ``link``. ``nominal`` uses the bare line rate (the
    brief's back-of-envelope arithmetic); otherwise efficiency and set-up latency apply."""
    if nbytes <= 0 or link.kind == "local":
        return 0.0
    if link.gbs <= 0:
        return math.inf
    if nominal:
        return nbytes / (link.gbs * GB)
    return link_latency_s(link.kind, params) + nbytes / (effective_gbs(link, params) * GB)


def affine_transfer(link: Link, params: CostParams = DEFAULT_PARAMS) -> tuple[float, float]:
    """(time of 1 byte, seconds per byte) over ``link``: :func:`transfer_time_s` is affine
    in the bytes, so these two give every size (how a split prices each quantile prompt's
    transfer: the latency is the first less the second)."""
    lat = transfer_time_s(1.0, link, params)
    return lat, transfer_time_s(2.0, link, params) - lat


def best_link(candidates: list[Link], params: CostParams = DEFAULT_PARAMS) -> Link | None:
    """The fastest of several paths (highest effective rate); ties: the cheaper kind first."""
    if not candidates:
        return None
    order = {kind: i for i, kind in enumerate(LINK_KINDS)}
    return max(candidates, key=lambda lk: (effective_gbs(lk, params), -order.get(lk.kind, 9)))
