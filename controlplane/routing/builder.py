"""Build a routing table v1 from a plain snapshot of topology, roles and policies.

Pure and deterministic: plain dicts in, a plain dict out, no Django, no clock, no
randomness. Same snapshot → byte-identical canonical JSON → same content hash, which is
how :mod:`controlplane.routing.service` tells "nothing changed" from "publish v+1".

Snapshot shape (what :func:`controlplane.routing.service.snapshot_cluster` produces)::

    {"cluster": "c1",
     "fabrics": {"ib400": {"transport": "infiniband", "rdma": true, "line_rate_gbps": 400}},
     "nodes": {"h1": {"nics": [{"name": "mlx5_0", "line_rate_gbps": 400, "rdma": true,
                                "fabric": "ib400", "missing": false}]}},
     "models": [{"name": "m", "kv_block_size": 16, "kv_bytes_per_token": 163840,
                 "weight_bytes": 7e10, "max_model_len": 8192, "policy": {...},
                 "workers": [{"name": "e0", "node": "h1", "url": "http://…",
                              "metrics_url": "", "engine": "vllm", "tp_size": 1,
                              "desired_role": "both", "observed_role": "",
                              "state": "active", "kv_events_endpoint": "",
                              "kv_replay_endpoint": "",
                              "gpus": [{"index": 0, "memory_bytes": …, "nvlink_group": 0,
                                        "nvlink_bandwidth_gbs": 900, "pcie_gbs": 64}]}]}]}

The format is documented in docs/routing-table.md and checked by schema.py.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

SCHEMA_VERSION = 1
# States that appear in a table. Drained, missing and failed workers are left out: the
# gateway must not send them anything, and listing them would only invite mistakes.
ROUTABLE_STATES = ("active", "draining")
PREFILL_CAPABLE = ("prefill", "both")
DECODE_CAPABLE = ("decode", "both")
# Share of GPU memory an engine gives to weights + KV (vLLM's --gpu-memory-utilization).
GPU_MEMORY_UTILIZATION = 0.9


def build_table(snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """The table for one cluster, with ``version`` 0 (the service numbers it)."""
    nodes = snapshot.get("nodes") or {}
    fabrics = snapshot.get("fabrics") or {}
    models = [
        _build_model(model, nodes, fabrics)
        for model in sorted(snapshot.get("models") or [], key=lambda m: m["name"])
    ]
    return {
        "schema_version": SCHEMA_VERSION,
        "cluster": snapshot["cluster"],
        "version": 0,
        "models": models,
    }


def content_sha(table: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of a table, ignoring its version number."""
    body = {k: v for k, v in table.items() if k != "version"}
    return hashlib.sha256(canonical_json(body)).hexdigest()


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def worker_id(worker: Mapping[str, Any]) -> str:
    return f"{worker['node']}/{worker['name']}"


def _build_model(model, nodes, fabrics) -> dict[str, Any]:
    policy = model.get("policy") or {}
    block_size = int(policy.get("routing_block_size") or 0) or int(model["kv_block_size"])
    workers = sorted(
        (w for w in model.get("workers") or [] if w.get("state") in ROUTABLE_STATES),
        key=worker_id,
    )
    mode, reason = _mode(policy.get("disaggregation_mode", "auto"), workers)
    entries = []
    for worker in workers:
        entry = _worker_entry(worker, model)
        if mode != "aggregated" and worker["desired_role"] in PREFILL_CAPABLE:
            entry["kv_paths"] = [
                path
                for other in workers
                if other is not worker and other["desired_role"] in DECODE_CAPABLE
                for path in [_kv_path(worker, other, nodes, fabrics)]
                if path is not None
            ]
        entries.append(entry)
    return {
        "name": model["name"],
        "mode": mode,
        "mode_reason": reason,
        "kv_block_size": int(model["kv_block_size"]),
        "kv_bytes_per_token": int(model["kv_bytes_per_token"]),
        "max_model_len": model.get("max_model_len"),
        "routing": {
            "block_size": block_size,
            "kv_overlap_weight": float(policy.get("kv_overlap_weight", 1.0)),
            "load_weight": float(policy.get("load_weight", 1.0)),
            "temperature": float(policy.get("routing_temperature", 0.0)),
            **_affinity(policy),
            **_deadline(policy),
            **_slo_ratio(policy),
        },
        "disaggregation": {
            "local_prefill_max_tokens": int(policy.get("local_prefill_max_tokens", 512)),
        },
        "workers": entries,
    }


# Prefix affinity and cache balance (gateway.router): policy field -> table field. Absent
# from the policy (an old snapshot): left out, and the gateway's defaults apply.
AFFINITY_FIELDS = {
    "prefix_min_match": "prefix_min_match",
    "cache_balance_band": "cache_balance_band",
    "affinity_load_factor": "affinity_load_factor",
    "affinity_kv_limit": "affinity_kv_limit",
}


def _affinity(policy: dict) -> dict:
    """The affinity and balance weights of the gateway's router, from policy."""
    return {table_key: float(policy[key]) for key, table_key in AFFINITY_FIELDS.items()
            if policy.get(key) is not None}


def _deadline(policy: dict) -> dict:
    """The gateway's first-token deadline, when the policy sheds late requests."""
    factor = float(policy.get("shed_after_ttft_factor", 0.0) or 0.0)
    ttft = float(policy.get("ttft_p95_ms", 0.0) or 0.0)
    if factor <= 0 or ttft <= 0:
        return {}
    return {"first_token_deadline_ms": round(factor * ttft, 3)}


def _slo_ratio(policy: dict) -> dict:
    """TTFT target ÷ ITL target: how the router weighs a stall to a request in flight
    against a new request's wait (gateway.router.stall_weight)."""
    ttft = float(policy.get("ttft_p95_ms", 0.0) or 0.0)
    itl = float(policy.get("itl_p95_ms", 0.0) or 0.0)
    if ttft <= 0 or itl <= 0:
        return {}
    return {"ttft_itl_ratio": round(ttft / itl, 6)}


def _mode(requested: str, workers) -> tuple[str, str]:
    active = [w for w in workers if w["state"] == "active"]
    has_prefill = any(w["desired_role"] == "prefill" for w in active)
    has_decode = any(w["desired_role"] in DECODE_CAPABLE for w in active)
    if requested == "aggregated":
        return "aggregated", "policy: aggregated"
    if not (has_prefill and has_decode):
        missing = "prefill" if not has_prefill else "decode"
        return "aggregated", f"policy {requested}, but no active {missing} worker"
    if requested == "disaggregated":
        return "disaggregated", "policy: disaggregated"
    return "conditional", "policy auto with prefill and decode workers"


def _worker_entry(worker, model) -> dict[str, Any]:
    gpus = worker.get("gpus") or []
    memory = sum(int(g["memory_bytes"]) for g in gpus)
    kv_per_token = max(int(model["kv_bytes_per_token"]), 1)
    usable = memory * GPU_MEMORY_UTILIZATION - float(model.get("weight_bytes") or 0)
    previous = worker.get("observed_role") or None
    if previous == worker["desired_role"]:
        previous = None
    events = None
    if worker.get("kv_events_endpoint"):
        events = {
            "endpoint": worker["kv_events_endpoint"],
            "replay_endpoint": worker.get("kv_replay_endpoint") or None,
        }
    return {
        "id": worker_id(worker),
        "url": worker["url"].rstrip("/"),
        "role": worker["desired_role"],
        "previous_role": previous,
        "state": worker["state"],
        "node": worker["node"],
        "engine": worker.get("engine") or "vllm",
        "metrics_url": worker.get("metrics_url") or None,
        "capacity": {
            "gpus": len(gpus),
            "tp_size": int(worker.get("tp_size") or 1),
            "gpu_memory_bytes": memory,
            "kv_tokens": max(int(usable // kv_per_token), 0),
        },
        "kv_events": events,
        "kv_paths": [],
    }


def _kv_path(src, dst, nodes, fabrics) -> dict[str, Any] | None:
    """The fastest way KV can move from ``src`` to ``dst``, or None when unknown."""
    dst_id = worker_id(dst)
    if src["node"] == dst["node"]:
        gpus = list(src.get("gpus") or []) + list(dst.get("gpus") or [])
        groups = {g.get("nvlink_group") for g in gpus}
        if gpus and len(groups) == 1 and None not in groups:
            gbs = min(float(g.get("nvlink_bandwidth_gbs") or 0) for g in gpus)
            if gbs > 0:
                return _path(dst_id, "nvlink", gbs * 8, rdma=False)
        pcie = [float(g.get("pcie_gbs") or 0) for g in gpus]
        return _path(dst_id, "pcie", min(pcie) * 8 if pcie else 0.0, rdma=False)
    best = None
    src_nics = _nics_by_fabric(nodes.get(src["node"]))
    dst_nics = _nics_by_fabric(nodes.get(dst["node"]))
    for fabric_name in sorted(set(src_nics) & set(dst_nics)):
        fabric = fabrics.get(fabric_name) or {}
        a, b = src_nics[fabric_name], dst_nics[fabric_name]
        rate = min(
            max(n["line_rate_gbps"] for n in a),
            max(n["line_rate_gbps"] for n in b),
            float(fabric.get("line_rate_gbps") or float("inf")),
        )
        rdma = bool(fabric.get("rdma")) and any(n["rdma"] for n in a) and any(
            n["rdma"] for n in b
        )
        candidate = (rdma, rate, fabric_name)
        if best is None or candidate[:2] > best[:2]:
            best = candidate
    if best is None:
        return None
    rdma, rate, fabric_name = best
    return _path(dst_id, "rdma" if rdma else "tcp", rate, rdma=rdma, fabric=fabric_name)


def _nics_by_fabric(node) -> dict[str, list[dict]]:
    grouped: dict[str, list[dict]] = {}
    for nic in (node or {}).get("nics") or []:
        if nic.get("missing") or not nic.get("fabric"):
            continue
        grouped.setdefault(nic["fabric"], []).append(
            {"line_rate_gbps": float(nic["line_rate_gbps"]), "rdma": bool(nic.get("rdma"))}
        )
    return grouped


def _path(to: str, link: str, gbps: float, *, rdma: bool, fabric: str | None = None):
    return {
        "to": to,
        "link": link,
        "bandwidth_gbps": round(float(gbps), 3),
        "rdma": rdma,
        "fabric": fabric,
    }
