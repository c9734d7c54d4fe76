"""Plain data for the dashboard's templates, gathered with a fixed number of queries.

The topology page of a 500-node fleet must render in well under a second, so nothing here
walks relations per row: each table is read once with ``values()`` and joined in Python.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import django_filters

from controlplane.accounts.access import restrict
from controlplane.accounts.roles import READ
from controlplane.routing.models import RoutingTableVersion
from controlplane.topology.choices import NodeStatus, Role, WorkerState
from controlplane.topology.models import (
    GPU,
    NIC,
    Cluster,
    Fabric,
    Gateway,
    Node,
    ServedModel,
    Worker,
)

from . import nodestatus
from .live import hot_for_nodes

FILTER_KEYS = ("cluster", "rack", "model", "role", "status")


@dataclass
class Filters:
    """What the topology viewer is looking at: the query string, validated (unknown roles
    and statuses dropped); applied to nodes by :class:`TopologyFilterSet`."""

    cluster: str = ""
    rack: str = ""
    model: str = ""
    role: str = ""
    status: str = ""

    @classmethod
    def from_query(cls, query) -> Filters:
        values = {key: (query.get(key) or "").strip()[:128] for key in FILTER_KEYS}
        if values["role"] not in {"", *Role.values, "draining"}:
            values["role"] = ""
        if values["status"] not in {"", *NodeStatus.values, nodestatus.NOT_MONITORED}:
            values["status"] = ""
        return cls(**values)

    def active(self) -> bool:
        return any(getattr(self, key) for key in FILTER_KEYS)


@dataclass
class GpuTile:
    id: int
    index: int
    uuid: str
    product: str
    memory_bytes: int
    nvlink_group: int | None
    worker: str = ""
    model: str = ""
    role: str = ""  # prefill / decode / both, "" when no worker
    draining: bool = False
    dimmed: bool = False
    waiting: int | None = None  # the engine's queue (requests waiting), None = no data
    mem_used: float | None = None  # fraction 0–1, None = no data
    kv_used: float | None = None
    util: float | None = None


@dataclass
class NodeCard:
    id: int
    hostname: str
    cluster: str
    rack: str
    status: str  # nodestatus.node_status(): the one status every page shows
    last_seen: float | None
    stale: bool
    nvlink_groups: list[tuple[int | None, list[GpuTile]]] = field(default_factory=list)
    nics: list[dict] = field(default_factory=list)
    engines_hot: dict[str, dict] = field(default_factory=dict)  # engine name → live values


def _fraction(used, total) -> float | None:
    if used is None or not total:
        return None
    return max(0.0, min(1.0, used / total))


def node_cards(node_rows: list[dict], filters: Filters) -> list[NodeCard]:
    """Cards for ``node_rows`` (dicts with the fields in NODE_FIELDS), with live values."""
    node_ids = [n["id"] for n in node_rows]
    gpus = list(
        GPU.objects.filter(node_id__in=node_ids).order_by("node_id", "index").values(
            "id", "node_id", "index", "uuid", "product_name", "memory_bytes", "nvlink_group",
            "missing",
        )
    )
    workers = {
        w["id"]: w
        for w in Worker.objects.filter(node_id__in=node_ids).values(
            "id", "name", "node_id", "desired_role", "observed_role", "state",
            "served_model__name",
        )
    }
    gpu_worker: dict[int, dict] = {}
    for worker_id, gpu_id in Worker.gpus.through.objects.filter(
        worker_id__in=list(workers)
    ).values_list("worker_id", "gpu_id"):
        gpu_worker[gpu_id] = workers[worker_id]
    hot = hot_for_nodes(
        [(n["id"], n["cluster_id"]) for n in node_rows],
        [(w["id"], w["node_id"]) for w in workers.values()],
    )
    nics = defaultdict(list)
    for nic in NIC.objects.filter(node_id__in=node_ids).values(
        "node_id", "name", "line_rate_gbps", "transport", "rdma", "missing"
    ):
        nics[nic["node_id"]].append(nic)

    by_node: dict[int, list[GpuTile]] = defaultdict(list)
    for g in gpus:
        node_hot = hot.get(g["node_id"]) or {}
        gpu_hot = (node_hot.get("gpus") or {}).get(g["index"]) or {}
        worker = gpu_worker.get(g["id"])
        tile = GpuTile(
            id=g["id"], index=g["index"], uuid=g["uuid"], product=g["product_name"],
            memory_bytes=g["memory_bytes"], nvlink_group=g["nvlink_group"],
            mem_used=_fraction(gpu_hot.get("memory_used_bytes"), gpu_hot.get("memory_total_bytes")
                               or g["memory_bytes"]),
            util=gpu_hot.get("utilization"),
        )
        if worker:
            tile.worker = worker["name"]
            tile.model = worker["served_model__name"]
            tile.role = worker["desired_role"]
            tile.draining = worker["state"] == WorkerState.DRAINING
            engine_hot = (node_hot.get("engines") or {}).get(worker["name"]) or {}
            tile.kv_used = engine_hot.get("kv_usage")
            tile.waiting = engine_hot.get("num_waiting")
        tile.dimmed = bool(
            (filters.model and tile.model != filters.model)
            or (filters.role == "draining" and not tile.draining)
            or (filters.role and filters.role != "draining" and tile.role != filters.role)
        )
        by_node[g["node_id"]].append(tile)

    now = time.time()
    cards = []
    for n in node_rows:
        node_hot = hot.get(n["id"]) or {}
        groups: dict[int | None, list[GpuTile]] = defaultdict(list)
        for tile in by_node.get(n["id"], []):
            groups[tile.nvlink_group].append(tile)
        last = node_hot.get("last_report_at") or (
            n["last_seen"].timestamp() if n["last_seen"] else None
        )
        status = nodestatus.node_status(n["status"], last, bool(node_hot.get("stale")))
        card = NodeCard(
            id=n["id"], hostname=n["hostname"], cluster=n["cluster__name"], rack=n["rack"],
            # Greyed out: its numbers are old. A node never monitored has none to grey.
            status=status, last_seen=last,
            stale=status in (nodestatus.STALE, nodestatus.OFFLINE),
            nvlink_groups=sorted(groups.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)),
            engines_hot=node_hot.get("engines") or {},
        )
        for nic in nics.get(n["id"], []):
            nic_hot = (node_hot.get("nics") or {}).get(nic["name"]) or {}
            gbps = None
            if nic_hot.get("tx_gbps") is not None or nic_hot.get("rx_gbps") is not None:
                gbps = (nic_hot.get("tx_gbps") or 0) + (nic_hot.get("rx_gbps") or 0)
            card.nics.append({**nic, "gbps": gbps,
                              "util": _fraction(gbps, nic["line_rate_gbps"]),
                              "age_s": now - last if last else None})
        cards.append(card)
    return cards


class TopologyFilterSet(django_filters.FilterSet):
    """The topology page's filters (django-filter, like the API's lists): cluster and rack
    by name, model, role (``draining`` = a draining worker) and the one node status
    (``not-monitored`` = never reported)."""

    cluster = django_filters.CharFilter(field_name="cluster__name")
    rack = django_filters.CharFilter(method="_rack")
    model = django_filters.CharFilter(field_name="workers__served_model__name")
    role = django_filters.CharFilter(method="_role")
    status = django_filters.CharFilter(method="_status")

    class Meta:
        model = Node
        fields: list[str] = []

    def _rack(self, qs, name, value):
        return qs.filter(rack="" if value == "—" else value)

    def _role(self, qs, name, value):
        if value == "draining":
            return qs.filter(workers__state=WorkerState.DRAINING)
        return qs.filter(workers__desired_role=value)

    def _status(self, qs, name, value):
        if value == nodestatus.NOT_MONITORED:
            return qs.filter(status=NodeStatus.UNKNOWN, last_seen__isnull=True)
        return qs.filter(status=value)


def visible_nodes(user, filters: Filters):
    clusters = restrict(Cluster.objects.all(), user, READ)
    nodes = Node.objects.filter(cluster__in=clusters)
    data = {k: v for k, v in vars(filters).items() if v}
    return TopologyFilterSet(data, queryset=nodes).qs.distinct()


NODE_FIELDS = ("id", "hostname", "cluster_id", "cluster__name", "rack", "status", "last_seen")


def summary_mode(nodes_qs, filters: Filters) -> bool:
    """Rack tiles instead of node cards: a big fleet, no single rack chosen."""
    from .racks import SUMMARY_ABOVE_NODES

    return not filters.rack and nodes_qs.count() > SUMMARY_ABOVE_NODES


def topology(user, filters: Filters, rack_page_number=None) -> dict:
    from . import racks as rack_views

    nodes_qs = visible_nodes(user, filters)
    summary = summary_mode(nodes_qs, filters)
    clusters: dict[str, dict[str, list]] = {}
    paging = None
    if summary:
        pairs, paging = rack_views.rack_page(nodes_qs, rack_page_number)
        page_nodes = rack_views.nodes_in_racks(nodes_qs, pairs)
        node_rows = list(
            page_nodes.order_by("cluster__name", "rack", "hostname").values(*NODE_FIELDS))
        for rack in rack_views.rack_summaries(node_rows, page_nodes):
            clusters.setdefault(rack.cluster, {})[rack.rack] = rack
        totals = rack_views.fleet_totals(nodes_qs)
        node_count = sum(n for _, n in totals["statuses"])
        gpu_count = totals["gpus"]
    else:
        node_rows = list(
            nodes_qs.order_by("cluster__name", "rack", "hostname").values(*NODE_FIELDS))
        cards = node_cards(node_rows, filters)
        for card in cards:
            clusters.setdefault(card.cluster, {}).setdefault(card.rack or "—", []).append(card)
        node_count = len(node_rows)
        gpu_count = sum(len(t) for c in cards for _, t in c.nvlink_groups)
        totals = None
    cluster_qs = restrict(Cluster.objects.all(), user, READ)
    fabrics = defaultdict(list)
    for f in Fabric.objects.filter(cluster__in=cluster_qs).values(
        "cluster__name", "name", "transport", "rdma", "line_rate_gbps"
    ):
        fabrics[f["cluster__name"]].append(f)
    gateways = defaultdict(list)
    latest = RoutingTableVersion.latest_per_cluster()
    for gw in Gateway.objects.filter(cluster__in=cluster_qs).values(
        "cluster_id", "cluster__name", "name", "url", "applied_table_version", "last_ack_at",
        "last_error",
    ):
        gw["latest_version"] = latest.get(gw["cluster_id"])
        gw["lag"] = (gw["latest_version"] - gw["applied_table_version"]
                     if gw["latest_version"] is not None else None)
        gateways[gw["cluster__name"]].append(gw)
    return {
        "clusters": [
            {"name": name, "racks": sorted(racks.items()), "fabrics": fabrics.get(name, []),
             "gateways": gateways.get(name, [])}
            for name, racks in clusters.items()
        ],
        "summary": summary,
        "paging": paging,
        "totals": totals,
        "node_count": node_count,
        "gpu_count": gpu_count,
        "choices": {
            "clusters": list(cluster_qs.values_list("name", flat=True)),
            "models": sorted(set(
                ServedModel.objects.filter(cluster__in=cluster_qs)
                .values_list("name", flat=True)
            )),
            "roles": [*Role.values, "draining"],
            "statuses": [s for s in NodeStatus.values if s != NodeStatus.UNKNOWN]
            + [nodestatus.NOT_MONITORED],
        },
    }
