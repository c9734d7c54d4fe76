"""Turning one validated report into hot-state writes (pure: no Django, no I/O).

The consumer calls :func:`report_commands` for every report and hands the result to the
process's batching writer. Kept separate so the shape of the hot state is tested without
a server.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import orjson

from workers_agent.protocol.report import (
    AGENT_REPORT_KEYS,
    GPU_REPORT_KEYS,
    NIC_REPORT_KEYS,
    known_fields,
)

from . import enginestats
from .hotstate import HISTORY_POINTS, Keys

ENGINE_FIELDS = (
    "up", "role", "generation", "running", "waiting", "kv_blocks_used", "kv_blocks_total",
    "kv_usage", "prefix_hit_rate", "prompt_tokens_per_s", "generation_tokens_per_s",
    "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "preemptions", "kv_events",
)


@dataclass
class NodeContext:
    """What the consumer knows about its node after hello."""

    node_id: int
    cluster_id: int
    hostname: str
    gen: int
    interval_s: float
    workers: dict[str, int | None] = field(default_factory=dict)  # engine id → worker id


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def _sum(values):
    values = [v for v in values if v is not None]
    return sum(values) if values else None


def node_history_point(report: dict, now: float) -> dict:
    gpus, nics = report.get("gpus", []), report.get("nics", [])
    return {
        "t": now,
        "gpu_utilization": _mean(g.get("utilization") for g in gpus),
        "gpu_memory_used_bytes": _sum(g.get("memory_used_bytes") for g in gpus),
        "power_w": _sum(g.get("power_w") for g in gpus),
        "nic_tx_gbps": _sum(n.get("tx_gbps") for n in nics),
        "nic_rx_gbps": _sum(n.get("rx_gbps") for n in nics),
    }


def worker_history_point(engine: dict, now: float) -> dict:
    return {
        "t": now,
        **{k: engine.get(k) for k in ("running", "waiting", "kv_usage", "prefix_hit_rate",
                                      "prompt_tokens_per_s", "generation_tokens_per_s",
                                      "ttft_p95_s", "itl_p95_s")},
    }


def build_states(ctx: NodeContext, report: dict, now: float) -> tuple[dict, dict[int, dict]]:
    """(node state, {worker id: worker state}) for one report."""
    common = {"ts": report["ts"], "received_at": now, "seq": report["seq"],
              "interval_s": ctx.interval_s, "gen": ctx.gen}
    engines_brief, unmatched, workers = [], [], {}
    for eng in report.get("engines", []):
        wid = ctx.workers.get(eng["id"])
        state = {k: eng.get(k) for k in ENGINE_FIELDS}
        engines_brief.append({"id": eng["id"], "worker_id": wid})
        if wid is None:
            unmatched.append({"id": eng["id"], **state})
        else:
            workers[wid] = {"worker_id": wid, "node_id": ctx.node_id, "engine": eng["id"],
                            "last_report_at": now, **state, **common}
    node = {
        "node_id": ctx.node_id, "cluster_id": ctx.cluster_id, "hostname": ctx.hostname,
        "last_report_at": now, **common,
        "gpus": [known_fields(g, GPU_REPORT_KEYS) for g in report.get("gpus", ())],
        "nics": [known_fields(n, NIC_REPORT_KEYS) for n in report.get("nics", ())],
        "engines": engines_brief, "unmatched_engines": unmatched,
        "agent": known_fields(report.get("agent") or {}, AGENT_REPORT_KEYS),
    }
    return node, workers


# Lua: write one report only while its connection's generation is the node's newest
# (issue 20, defect 6: reports in flight on an old connection overwrote the newer one's).
# A missing counter (hot state flushed) does not block the writer.
# KEYS: gen counter, cluster hash, seen zset, history lists…; ARGV: gen, now, node id,
# number of hash arguments n, history length, n hash arguments, one point per history key.
WRITE_REPORT_LUA = """
local g = redis.call('GET', KEYS[1])
if g and g ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[4])
redis.call('HSET', KEYS[2], unpack(ARGV, 6, 5 + n))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[3])
for i = 4, #KEYS do
  redis.call('RPUSH', KEYS[i], ARGV[2 + n + i])
  redis.call('LTRIM', KEYS[i], -tonumber(ARGV[5]), -1)
end
return 1
"""
STALE = 0  # the reply of WRITE_REPORT_LUA when a newer connection owns the node


def report_commands(ctx: NodeContext, report: dict, now: float, keys: Keys,
                    history_due) -> list[tuple]:
    """The Redis command writing one report, as one script: the node's and its workers'
    fields in the cluster hash, its liveness score, and history points when
    ``history_due(key, now)`` says so. Its reply is 1, or :data:`STALE` (nothing written)
    when the report's connection generation is no longer the node's newest."""
    node, workers = build_states(ctx, report, now)
    fields: list = [f"n:{ctx.node_id}", orjson.dumps(node)]
    for wid, state in workers.items():
        fields += [f"w:{wid}", orjson.dumps(state)]
    history_keys, points = [], []
    hkey = keys.history("n", ctx.node_id)
    if history_due(hkey, now):
        history_keys.append(hkey)
        points.append(orjson.dumps(node_history_point(report, now)))
        for wid, state in workers.items():
            history_keys.append(keys.history("w", wid))
            points.append(orjson.dumps(worker_history_point(state, now)))
    script_keys = [keys.gen(ctx.node_id), keys.cluster(ctx.cluster_id), keys.seen,
                   *history_keys]
    return [("EVAL", WRITE_REPORT_LUA, len(script_keys), *script_keys, ctx.gen, now,
             ctx.node_id, len(fields), HISTORY_POINTS, *fields, *points),
            # Engine counter/histogram snapshots for fleet rates and percentiles.
            *enginestats.report_snapshot_commands(ctx.workers, report, now, keys, history_due)]


def index_commands(ctx: NodeContext, keys: Keys) -> list[tuple]:
    """Written on hello: where each node/worker of this connection lives."""
    mapping = ["HSET", keys.idx, f"n:{ctx.node_id}", ctx.cluster_id]
    for wid in ctx.workers.values():
        if wid is not None:
            mapping += [f"w:{wid}", ctx.cluster_id]
    return [tuple(mapping)]
