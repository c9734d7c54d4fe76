"""Live values for the dashboard, read from the ingest's hot state (controlplane.telemetry).

Everything the templates show about *now* goes through :func:`hot_for_nodes`, which returns
plain dicts keyed by node id. A node absent from the result has "no data" — shown as such,
never as zero.
"""

from __future__ import annotations

import time

import orjson

from controlplane.telemetry import hotstate

# Sparkline series per engine on the node page: (hot-state history metric, our name).
ENGINE_SERIES = ("kv_usage", "ttft_p95_s", "itl_p95_s", "generation_tokens_per_s")
HISTORY_WINDOW_S = 15 * 60
HISTORY_STEP_S = 10


def _engine_view(state: dict) -> dict:
    tokens = [state.get("prompt_tokens_per_s"), state.get("generation_tokens_per_s")]
    known = [t for t in tokens if t is not None]
    return {
        "num_running": state.get("running"),
        "num_waiting": state.get("waiting"),
        "kv_blocks_used": state.get("kv_blocks_used"),
        "kv_blocks_total": state.get("kv_blocks_total"),
        "kv_usage": state.get("kv_usage"),
        "prefix_hit_rate": state.get("prefix_hit_rate"),
        "tokens_per_s": sum(known) if known else None,
        "ttft_p95_s": state.get("ttft_p95_s"),
        "itl_p95_s": state.get("itl_p95_s"),
        "role": state.get("role"),
        "stale": state.get("stale"),
    }


def _node_view(node: dict, workers: list[dict]) -> dict:
    return {
        "gpus": {g.get("index"): g for g in node.get("gpus") or [] if isinstance(g, dict)},
        "nics": {n.get("name"): n for n in node.get("nics") or [] if isinstance(n, dict)},
        "engines": {w.get("engine"): _engine_view(w) for w in workers},
        "last_report_at": node.get("received_at"),
        "stale": node.get("stale", False),
    }


def hot_for_nodes(nodes: list[tuple[int, int]], workers: list[tuple[int, int]] | None = None
                  ) -> dict[int, dict]:
    """Latest state of ``nodes`` (node id, cluster id) and their ``workers`` (worker id,
    node id), read with one pipelined round trip: ``{node_id: {"gpus": {index: …},
    "engines": {engine name: …}, "nics": {name: …}, "last_report_at", "stale"}}``."""
    if not nodes:
        return {}
    keys = hotstate.Keys()
    cluster_of = dict(nodes)
    pipe = hotstate.sync_redis().pipeline(transaction=False)
    for node_id, cluster_id in nodes:
        pipe.hget(keys.cluster(cluster_id), f"n:{node_id}")
    worker_list = [(w, n) for w, n in (workers or []) if n in cluster_of]
    for worker_id, node_id in worker_list:
        pipe.hget(keys.cluster(cluster_of[node_id]), f"w:{worker_id}")
    raw = pipe.execute()
    now = time.time()
    node_raw, worker_raw = raw[: len(nodes)], raw[len(nodes):]
    by_node: dict[int, list[dict]] = {}
    for (_, node_id), value in zip(worker_list, worker_raw, strict=True):
        if value:
            by_node.setdefault(node_id, []).append(
                hotstate._decorate(orjson.loads(value), now)
            )
    result = {}
    for (node_id, _), value in zip(nodes, node_raw, strict=True):
        if value:
            node = hotstate._decorate(orjson.loads(value), now)
            result[node_id] = _node_view(node, by_node.get(node_id, []))
    return result


def _resample(points: list[tuple[float, float]], now: float) -> list[float | None]:
    """History points onto a fixed 10 s grid over 15 minutes; empty slots stay None."""
    slots = HISTORY_WINDOW_S // HISTORY_STEP_S
    grid: list[float | None] = [None] * slots
    start = now - HISTORY_WINDOW_S
    for ts, value in points:
        slot = int((ts - start) // HISTORY_STEP_S)
        if 0 <= slot < slots and value is not None:
            grid[slot] = value
    return grid


def engine_history(workers: list[tuple[int, str]]) -> dict[str, dict[str, list[float | None]]]:
    """Last 15 minutes per engine: ``{engine name: {metric: [values, oldest first]}}``."""
    now = time.time()
    out: dict[str, dict[str, list[float | None]]] = {}
    for worker_id, name in workers:
        series = {}
        for metric in ENGINE_SERIES:
            series[metric] = _resample(hotstate.history(metric, worker_id=worker_id), now)
        out[name] = series
    return out
