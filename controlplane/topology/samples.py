"""The example fleets of the product brief, as plain data (see shared/data/scenarios.json).

GPU and model figures come from the one catalog (:mod:`pdcatalog`, which cites them).
"""

from __future__ import annotations

import pdcatalog as catalog


def model_fields(name: str, *, kv_block_size: int, max_model_len: int) -> dict:
    """A ServedModel row's geometry for a catalogued model."""
    m = catalog.lookup_model(name)
    return {
        "name": m.name,
        "layers": m.layers,
        "kv_heads": m.kv_heads,
        "head_dim": m.head_dim,
        "kv_dtype_bytes": m.kv_bytes_per_element,
        "weight_bytes": int(m.weight_bytes),
        "kv_block_size": kv_block_size,
        "max_model_len": max_model_len,
    }


def gpu_fields(nvml_name: str, *, nvlink_group_size: int) -> dict:
    """A GPU row of a sample or demo node: the catalog's figures for the part (NVLink as the per-GPU
    total of both directions, as the inventory stores it)."""
    spec = catalog.GPUS[nvml_name]
    return {
        "product_name": spec.nvml_name,
        "memory_bytes": int(spec.memory_bytes),
        "memory_bandwidth_gbs": spec.memory_bandwidth_gbs,
        "nvlink_group_size": nvlink_group_size,
        "nvlink_bandwidth_gbs": 2 * spec.nvlink_gbs if nvlink_group_size and spec.nvlink_gbs
        else 0,
        "pcie_generation": spec.pcie_generation,
    }


LLAMA_33_70B_FP8 = model_fields("llama-3.3-70b-fp8", kv_block_size=16, max_model_len=8192)

SAMPLE_FLEETS = [
    {
        "cluster": "two-rtxpro-servers",
        "description": "2 servers × 8 RTX PRO 6000 Blackwell, 100 G Ethernet (TCP), no NVLink",
        "nodes": 2,
        "hostname": "rtxpro-{:02d}",
        "racks": ["r1"],
        "gpu": gpu_fields("NVIDIA RTX PRO 6000 Blackwell Server Edition", nvlink_group_size=0),
        "gpus_per_node": 8,
        "fabric": {"name": "eth100", "transport": "ethernet", "rdma": False, "line_rate_gbps": 100},
        "nics_per_node": 1,
        "model": LLAMA_33_70B_FP8,
    },
    {
        "cluster": "four-h200nvl-servers",
        "description": "4 servers × 8 H200 NVL (NVLink bridges, groups of 4), 400 G RDMA",
        "nodes": 4,
        "hostname": "h200nvl-{:02d}",
        "racks": ["r1", "r2"],
        "gpu": gpu_fields("NVIDIA H200 NVL", nvlink_group_size=4),
        "gpus_per_node": 8,
        "fabric": {"name": "ib400", "transport": "infiniband", "rdma": True, "line_rate_gbps": 400},
        "nics_per_node": 1,
        "model": LLAMA_33_70B_FP8,
    },
]
