"""Build a routing table v1 without a control plane: from worker URLs (CLI ``--worker``) or
from a simulated fleet's endpoints document (``pdplane-sim run --endpoints-out``).

For tests, benchmarks, and operators who want the gateway alone. The result passes the
same validation as a pushed table.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

DEFAULT_ROUTING = {"kv_overlap_weight": 1.0, "load_weight": 1.0, "temperature": 0.0}


def parse_worker_flag(value: str) -> dict[str, str]:
    """``URL`` or ``URL=role`` (role: prefill, decode or both)."""
    url, _, role = value.partition("=")
    role = role or "both"
    if role not in ("prefill", "decode", "both"):
        raise ValueError(f"--worker {value!r}: role must be prefill, decode or both")
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--worker {value!r}: needs an http(s) URL")
    return {"url": url.rstrip("/"), "role": role}


def static_table(
    model: str,
    workers: list[dict[str, Any]],
    *,
    mode: str | None = None,
    version: int = 1,
    cluster: str = "static",
    block_size: int = 16,
    local_prefill_max_tokens: int = 512,
    routing: dict[str, float] | None = None,
    kv_bytes_per_token: int = 1,
) -> dict[str, Any]:
    """A table for one model. ``workers``: dicts with ``url`` and optional ``id``, ``role``,
    ``state``, ``node``, ``kv_events_endpoint``, ``kv_replay_endpoint``, ``kv_paths``."""
    entries = []
    for i, w in enumerate(workers):
        host = urlsplit(w["url"]).netloc or f"w{i}"
        events = None
        if w.get("kv_events_endpoint"):
            events = {"endpoint": w["kv_events_endpoint"],
                      "replay_endpoint": w.get("kv_replay_endpoint") or None}
        entries.append({
            "id": w.get("id") or host,
            "url": w["url"].rstrip("/"),
            "role": w.get("role", "both"),
            "previous_role": None,
            "state": w.get("state", "active"),
            "node": w.get("node") or host,
            "engine": w.get("engine", "vllm"),
            "metrics_url": w.get("metrics_url"),
            "capacity": {"gpus": 1, "tp_size": 1, "gpu_memory_bytes": 0,
                         "kv_tokens": int(w.get("kv_tokens", 0))},
            "kv_events": events,
            "kv_paths": list(w.get("kv_paths") or []),
        })
    roles = {e["role"] for e in entries if e["state"] == "active"}
    if mode is None:
        mode = "conditional" if "prefill" in roles and roles & {"decode", "both"} else "aggregated"
    return {
        "schema_version": 1,
        "cluster": cluster,
        "version": version,
        "models": [{
            "name": model,
            "mode": mode,
            "mode_reason": "static table",
            "kv_block_size": block_size,
            "kv_bytes_per_token": kv_bytes_per_token,
            "max_model_len": None,
            "routing": {"block_size": block_size, **DEFAULT_ROUTING, **(routing or {})},
            "disaggregation": {"local_prefill_max_tokens": local_prefill_max_tokens},
            "workers": entries,
        }],
    }


def table_from_sim_endpoints(endpoints: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A table for the (single) model of a simulated fleet's endpoints document."""
    engines = endpoints.get("engines") or []
    if not engines:
        raise ValueError("the endpoints document lists no engines")
    model = kwargs.pop("model", None) or engines[0]["model"]
    roles = kwargs.pop("roles", None) or {}
    kv_tokens = int(kwargs.pop("kv_tokens", 0))
    workers = [
        {
            "id": e["id"],
            "url": e["api_url"],
            "role": roles.get(e["id"], e.get("role", "both")),
            "node": e.get("node"),
            "engine": "sim",
            "metrics_url": e.get("metrics_url"),
            "kv_events_endpoint": e.get("kv_events_endpoint") or None,
            "kv_replay_endpoint": e.get("kv_replay_endpoint") or None,
            "kv_tokens": kv_tokens,
        }
        for e in engines
        if e["model"] == model
    ]
    return static_table(model, workers, **kwargs)
