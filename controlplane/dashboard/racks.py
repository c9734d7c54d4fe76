"""Rack summaries: the topology's default view of a large fleet.

Above ``SUMMARY_ABOVE_NODES`` nodes the page shows one tile per rack — node statuses,
GPU roles, mean GPU utilisation and queue, and one small cell per node — instead of every
GPU. A click on a rack drills down to its node cards (``?cluster=…&rack=…``). The work and
the payload grow with racks and nodes, never with GPUs: the database is asked for counts
(GROUP BY), and the hot state only for node records (one HMGET per cluster).
"""

from __future__ import annotations

import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, field

import orjson
from django.db.models import Count

from controlplane.telemetry import hotstate
from controlplane.topology.choices import WorkerState
from controlplane.topology.models import GPU, Worker

from . import nodestatus

SUMMARY_ABOVE_NODES = 64


@dataclass
class NodeCell:
    id: int
    hostname: str
    status: str
    util: float | None  # mean GPU utilisation 0–1, None = no data
    role: str  # prefill / decode / both / mixed / "" (no worker)
    draining: bool


@dataclass
class RackSummary:
    cluster: str
    rack: str
    cells: list[NodeCell] = field(default_factory=list)
    gpus: int = 0
    roles: dict[str, int] = field(default_factory=dict)  # GPUs' workers per role
    draining: int = 0

    @property
    def dom_id(self) -> str:
        # Stable across processes (the page, the poll and the socket may be different ones).
        return f"rack-{zlib.crc32(f'{self.cluster}/{self.rack}'.encode()):08x}"

    @property
    def statuses(self) -> list[tuple[str, int]]:
        counts: dict[str, int] = defaultdict(int)
        for c in self.cells:
            counts[c.status] += 1
        return sorted(counts.items())

    @property
    def util(self) -> float | None:
        known = [c.util for c in self.cells if c.util is not None]
        return sum(known) / len(known) if known else None


def _hot_nodes(rows: list[dict]) -> dict[int, dict]:
    """{node id: {"util", "last", "stale"}} from each cluster's hash, one HMGET each."""
    by_cluster: dict[int, list[int]] = defaultdict(list)
    for r in rows:
        by_cluster[r["cluster_id"]].append(r["id"])
    keys = hotstate.Keys()
    pipe = hotstate.sync_redis().pipeline(transaction=False)
    order = []
    for cluster_id, ids in by_cluster.items():
        pipe.hmget(keys.cluster(cluster_id), [f"n:{i}" for i in ids])
        order.append(ids)
    now = time.time()
    out = {}
    for ids, values in zip(order, pipe.execute() if order else [], strict=True):
        for node_id, raw in zip(ids, values, strict=True):
            if not raw:
                continue
            state = hotstate._decorate(orjson.loads(raw), now)
            utils = [g.get("utilization") for g in state.get("gpus") or []
                     if isinstance(g, dict) and isinstance(g.get("utilization"), int | float)]
            out[node_id] = {"util": sum(utils) / len(utils) if utils else None,
                            "last": state.get("received_at"), "stale": state.get("stale")}
    return out


def rack_summaries(rows: list[dict], nodes_qs) -> list[RackSummary]:
    """Summaries of the racks holding ``rows`` (NODE_FIELDS dicts of ``nodes_qs``)."""
    gpu_count = dict(GPU.objects.filter(node__in=nodes_qs).values("node_id")
                     .annotate(n=Count("id")).values_list("node_id", "n"))
    roles: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    draining: dict[int, int] = defaultdict(int)
    for node_id, role, state, n in (
        Worker.objects.filter(node__in=nodes_qs).values("node_id", "desired_role", "state")
        .annotate(n=Count("id")).values_list("node_id", "desired_role", "state", "n")
    ):
        roles[node_id][role] += n
        if state == WorkerState.DRAINING:
            draining[node_id] += n
    hot = _hot_nodes(rows)
    racks: dict[tuple[str, str], RackSummary] = {}
    for r in rows:
        key = (r["cluster__name"], r["rack"] or "—")
        rack = racks.get(key) or racks.setdefault(key, RackSummary(*key))
        node_hot = hot.get(r["id"]) or {}
        last = node_hot.get("last") or (r["last_seen"].timestamp() if r["last_seen"] else None)
        node_roles = roles.get(r["id"]) or {}
        role = (next(iter(node_roles)) if len(node_roles) == 1 else
                "mixed" if node_roles else "")
        rack.cells.append(NodeCell(
            id=r["id"], hostname=r["hostname"],
            status=nodestatus.node_status(r["status"], last, bool(node_hot.get("stale"))),
            util=node_hot.get("util"), role=role, draining=bool(draining.get(r["id"])),
        ))
        rack.gpus += gpu_count.get(r["id"], 0)
        rack.draining += draining.get(r["id"], 0)
        for name, n in node_roles.items():
            rack.roles[name] = rack.roles.get(name, 0) + n
    return list(racks.values())
