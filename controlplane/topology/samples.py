"""The example fleets of the product brief, as plain data (see shared/data/scenarios.json).

Hardware figures come from vendor datasheets (shared/reference/CALIBRATION.md).
"""

from __future__ import annotations

GIB = 1024**3
GB = 1000**3

LLAMA_33_70B_FP8 = {
    "name": "llama-3.3-70b-fp8",
    "layers": 80,
    "kv_heads": 8,
    "head_dim": 128,
    "kv_dtype_bytes": 1,
    "weight_bytes": int(70.6 * GB),  # ~1 byte per parameter in FP8
    "kv_block_size": 16,
    "max_model_len": 8192,
}

SAMPLE_FLEETS = [
    {
        "cluster": "two-rtxpro-servers",
        "description": "2 servers × 8 RTX PRO 6000 Blackwell, 100 G Ethernet (TCP), no NVLink",
        "nodes": 2,
        "hostname": "rtxpro-{:02d}",
        "racks": ["r1"],
        "gpu": {
            "product_name": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
            "memory_bytes": 96 * GB,
            "memory_bandwidth_gbs": 1600,
            "nvlink_group_size": 0,
            "nvlink_bandwidth_gbs": 0,
            "pcie_generation": 5,
        },
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
        "gpu": {
            "product_name": "NVIDIA H200 NVL",
            "memory_bytes": 141 * GB,
            "memory_bandwidth_gbs": 4800,
            "nvlink_group_size": 4,
            "nvlink_bandwidth_gbs": 900,
            "pcie_generation": 5,
        },
        "gpus_per_node": 8,
        "fabric": {"name": "ib400", "transport": "infiniband", "rdma": True, "line_rate_gbps": 400},
        "nics_per_node": 1,
        "model": LLAMA_33_70B_FP8,
    },
]
