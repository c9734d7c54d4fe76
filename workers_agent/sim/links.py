"""KV-transfer links: time = bytes / (bandwidth × efficiency) + latency.

Sources (../shared/reference/CALIBRATION.md): NVLink 900 GB/s per H100/H200 GPU (450 GB/s
each way); PCIe Gen4 x16 ~32 GB/s and Gen5 x16 ~64 GB/s each way (2 GB/s per lane per
generation step from Gen3's ~1 GB/s); NIC line rates in Gb/s ÷ 8. Efficiencies: RDMA reaches
~87% of line rate (Mooncake transfer engine: ~87 GB/s on 4×200 Gb/s RoCE); TCP on the same
hosts moved ~36–41 GB/s, i.e. ~40% of that, and llm-d calls TCP KV transfer "for testing
only". NVLink and PCIe DMA efficiencies (0.8, 0.85) and the fixed latencies are estimates.
"""

from __future__ import annotations

from dataclasses import dataclass

_PCIE_GBS_PER_LANE = {3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}


@dataclass(frozen=True)
class LinkProfile:
    kind: str  # "local", "nvlink", "pcie", "rdma", "tcp"
    bandwidth_gbs: float  # GB/s one direction, nominal
    efficiency: float
    latency_s: float
    label: str = ""

    def transfer_seconds(self, num_bytes: float, lanes: int = 1) -> float:
        """Time to move ``num_bytes``; ``lanes`` parallel links (e.g. one NIC per TP rank)."""
        if num_bytes <= 0:
            return 0.0
        if self.kind == "local":
            return 0.0
        rate = self.bandwidth_gbs * 1e9 * self.efficiency * max(lanes, 1)
        return num_bytes / rate + self.latency_s


LOCAL = LinkProfile("local", float("inf"), 1.0, 0.0, "same engine")


def nvlink(bandwidth_gbs: float = 450.0) -> LinkProfile:
    return LinkProfile("nvlink", bandwidth_gbs, 0.8, 10e-6, f"NVLink {bandwidth_gbs:g} GB/s")


def pcie(generation: int = 5, width: int = 16) -> LinkProfile:
    if generation not in _PCIE_GBS_PER_LANE:
        raise ValueError(f"unknown PCIe generation {generation}")
    if width not in (1, 2, 4, 8, 16):
        raise ValueError(f"unknown PCIe width x{width}")
    return LinkProfile(
        "pcie", _PCIE_GBS_PER_LANE[generation] * width, 0.85, 20e-6,
        f"PCIe Gen{generation} x{width}",
    )


def nic(line_rate_gbps: float, rdma: bool = True) -> LinkProfile:
    if line_rate_gbps <= 0:
        raise ValueError("line rate must be positive")
    if rdma:
        return LinkProfile("rdma", line_rate_gbps / 8, 0.87, 50e-6, f"{line_rate_gbps:g}G RDMA")
    return LinkProfile("tcp", line_rate_gbps / 8, 0.40, 500e-6, f"{line_rate_gbps:g}G TCP")


def kv_transfer_seconds(
    tokens: int, kv_bytes_per_token: int, link: LinkProfile, lanes: int = 1
) -> float:
    return link.transfer_seconds(tokens * kv_bytes_per_token, lanes)
