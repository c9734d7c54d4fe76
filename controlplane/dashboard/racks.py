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
from django.db.models import Count, Q
from django.utils.html import escape
from django.utils.safestring import mark_safe

from controlplane.telemetry import hotstate
from controlplane.topology.choices import Role, WorkerState
from controlplane.topology.models import GPU, Worker

from . import nodestatus

SUMMARY_ABOVE_NODES = 64
# Rack tiles per page: about two screens at 1440×900. Work and payload are bounded by this,
# not by the fleet: only these racks' nodes are read from the database and the hot state.
RACKS_PER_PAGE = 40


def rack_page(nodes_qs, number) -> tuple[list[tuple[int, str]], dict]:
    """The (cluster id, rack) pairs on page ``number`` and paging facts for the template."""
    pairs = list(nodes_qs.order_by("cluster__name", "rack").values_list("cluster_id", "rack")
                 .distinct())
    pages = max(1, -(-len(pairs) // RACKS_PER_PAGE))
    try:
        n = min(max(1, int(number or 1)), pages)
    except (TypeError, ValueError):
        n = 1
    on_page = pairs[(n - 1) * RACKS_PER_PAGE: n * RACKS_PER_PAGE]
    first = (n - 1) * RACKS_PER_PAGE
    return on_page, {"number": n, "pages": pages, "racks": len(pairs), "first": first + 1,
                     "last": first + len(on_page),
                     "previous": n - 1 if n > 1 else None, "next": n + 1 if n < pages else None}


def nodes_in_racks(nodes_qs, pairs: list[tuple[int, str]]):
    condition = Q(pk__in=[])
    for cluster_id, rack in pairs:
        condition |= Q(cluster_id=cluster_id, rack=rack)
    return nodes_qs.filter(condition)


def fleet_totals(nodes_qs) -> dict:
    """Counts over the whole filtered fleet (not just the racks on screen): one GROUP BY."""
    by_status: dict[str, int] = defaultdict(int)
    for status, seen, n in (nodes_qs.order_by().values("status")
                            .annotate(seen=Count("last_seen"), n=Count("id", distinct=True))
                            .values_list("status", "seen", "n")):
        if status == "unknown" and not seen:
            by_status[nodestatus.NOT_MONITORED] += n
        else:
            by_status[status] += n
    return {"statuses": sorted(by_status.items()),
            "gpus": GPU.objects.filter(node__in=nodes_qs).count()}


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
    def cells_html(self) -> str:
        """The node cells, built here rather than in the template: a 5,000-node page has
        5,000 of them, and the template engine spends ~0.1 ms on each (hostnames escaped)."""
        return mark_safe("".join(  # noqa: S308 - every interpolated string is escaped
            f'<a href="/nodes/{c.id}/" class="c s-{c.status} r-{c.role or "idle"} '
            f'u{_decile(c.util)}{" draining" if c.draining else ""}" title="'
            f'{escape(c.hostname)} · {nodestatus.LABELS.get(c.status, c.status)} · GPU '
            f'{"no data" if c.util is None else f"{round(c.util * 100)}%"}'
            f'{" · draining" if c.draining else ""}"></a>'
            for c in self.cells))

    @property
    def util(self) -> float | None:
        known = [c.util for c in self.cells if c.util is not None]
        return sum(known) / len(known) if known else None


def _decile(fraction: float | None) -> str:
    return "n" if fraction is None else str(max(0, min(10, round(fraction * 10))))


def _hot_nodes(rows: list[dict]) -> dict[int, dict]:
    """{node id: (mean GPU utilisation, last report, stale)} from each cluster's hash,
    one HMGET per cluster."""
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
    default_interval = hotstate.report_interval_s()
    out = {}
    for ids, values in zip(order, pipe.execute() if order else [], strict=True):
        for node_id, raw in zip(ids, values, strict=True):
            if not raw:
                continue
            state = orjson.loads(raw)
            utils = [u for g in state.get("gpus") or [] if isinstance(g, dict)
                     and isinstance(u := g.get("utilization"), int | float)]
            received = state.get("received_at") or 0
            # Same rule as hotstate._decorate, without copying the whole record.
            stale = (now - received) > hotstate.STALE_AFTER_REPORTS * (
                state.get("interval_s") or default_interval)
            out[node_id] = (sum(utils) / len(utils) if utils else None,
                            state.get("received_at"), stale)
    return out


def rack_summaries(rows: list[dict], nodes_qs) -> list[RackSummary]:
    """Summaries of the racks holding ``rows`` (NODE_FIELDS dicts of ``nodes_qs``)."""
    gpu_count = dict(GPU.objects.filter(node__in=nodes_qs).values("node_id")
                     .annotate(n=Count("id")).values_list("node_id", "n"))
    # One pass over the workers, grouped by node only (cheaper than by node, role, state).
    roles: dict[int, dict[str, int]] = {}
    draining: dict[int, int] = {}
    role_names = tuple(Role.values)
    per_role = {f"n_{r}": Count("id", filter=Q(desired_role=r)) for r in role_names}
    for node_id, drain, *counts in (
        Worker.objects.filter(node__in=nodes_qs).order_by().values("node_id")
        .annotate(drain=Count("id", filter=Q(state=WorkerState.DRAINING)), **per_role)
        .values_list("node_id", "drain", *per_role)
    ):
        roles[node_id] = {r: n for r, n in zip(role_names, counts, strict=True) if n}
        draining[node_id] = drain
    hot = _hot_nodes(rows)
    racks: dict[tuple[str, str], RackSummary] = {}
    for r in rows:
        key = (r["cluster__name"], r["rack"] or "—")
        rack = racks.get(key) or racks.setdefault(key, RackSummary(*key))
        util, last, stale = hot.get(r["id"]) or (None, None, False)
        last = last or (r["last_seen"].timestamp() if r["last_seen"] else None)
        node_roles = roles.get(r["id"]) or {}
        role = (next(iter(node_roles)) if len(node_roles) == 1 else
                "mixed" if node_roles else "")
        rack.cells.append(NodeCell(
            id=r["id"], hostname=r["hostname"],
            status=nodestatus.node_status(r["status"], last, stale),
            util=util, role=role, draining=bool(draining.get(r["id"])),
        ))
        rack.gpus += gpu_count.get(r["id"], 0)
        rack.draining += draining.get(r["id"], 0)
        for name, n in node_roles.items():
            rack.roles[name] = rack.roles.get(name, 0) + n
    return list(racks.values())
