"""Glue: build the rules' :class:`FleetSnapshot` from topology, hot state and policies.

Routing and planner state are read when those apps provide them; each source is read
defensively, so an outage of one (Redis down, a model not migrated yet) degrades that
part of the picture and is logged, instead of stopping every alert.
"""

from __future__ import annotations

import logging
from datetime import datetime
from importlib import metadata

from django.apps import apps

from controlplane.topology.choices import GatewayKind, NodeStatus, WorkerState
from controlplane.topology.models import Cluster, Gateway, Node, Worker

from . import gateway_health
from .rules import (
    FleetSnapshot,
    GatewayFacts,
    GpuFacts,
    NicFacts,
    NodeFacts,
    PlanFacts,
    WorkerFacts,
)

log = logging.getLogger(__name__)


def _hot_cluster(cluster_id: int) -> dict:
    try:
        from controlplane.telemetry import hotstate
    except ImportError:
        return {"nodes": {}, "workers": {}}
    try:
        return hotstate.cluster_snapshot(cluster_id)
    except Exception:  # Redis down: judge liveness from the database only
        log.exception("alerts: hot state of cluster %s unreadable", cluster_id)
        return {"nodes": {}, "workers": {}}


def _counter_sum(items: dict, *keys: str) -> int | None:
    values = [items.get(k) for k in keys if isinstance(items.get(k), int | float)]
    return int(sum(values)) if values else None


def _node_facts(cluster: Cluster, node: Node, state: dict | None, now: float) -> NodeFacts:
    last = (state or {}).get("last_report_at")
    if last is None and node.last_seen:
        last = node.last_seen.timestamp()
    # Never reported: count from when it was registered, so a node added a minute ago
    # does not page anyone yet.
    age = now - (last if last is not None else node.created.timestamp())
    gpus = tuple(
        GpuFacts(int(g["index"]), g.get("memory_used_bytes"), g.get("memory_total_bytes"))
        for g in (state or {}).get("gpus", [])
        if isinstance(g, dict) and "index" in g
    )
    nics = tuple(
        NicFacts(
            str(n["name"]),
            _counter_sum(n, "rx_errors", "tx_errors"),
            _counter_sum(n, "rx_drops", "tx_drops"),
        )
        for n in (state or {}).get("nics", [])
        if isinstance(n, dict) and "name" in n
    )
    return NodeFacts(
        cluster=cluster.name,
        node=node.hostname,
        last_report_age_s=max(0.0, age),
        monitored=last is not None,
        maintenance=node.status == NodeStatus.MAINTENANCE,
        agent_version=node.agent_version,
        agent_protocol=node.agent_protocol,
        gpus=gpus,
        nics=nics,
        gpu_products=tuple({g.product_name for g in node.gpus.all() if not g.missing}),
    )


def _ms(seconds) -> float | None:
    return float(seconds) * 1000 if isinstance(seconds, int | float) else None


def _policy_slo(served_model, cache: dict) -> tuple[float | None, float | None]:
    if served_model.pk not in cache:
        try:
            from controlplane.policies.models import effective_policy_for

            result = effective_policy_for(served_model)
            policy = result[0] if isinstance(result, tuple) else result
            cache[served_model.pk] = (policy.ttft_p95_ms, policy.itl_p95_ms)
        except Exception:
            log.exception("alerts: no effective policy for %s", served_model)
            cache[served_model.pk] = (None, None)
    return cache[served_model.pk]


def _worker_facts(cluster, worker: Worker, state: dict | None, slo) -> WorkerFacts:
    state = state or {}
    kv = state.get("kv_events") if isinstance(state.get("kv_events"), dict) else {}
    running = state.get("running") or 0
    prompt_tps = state.get("prompt_tokens_per_s") or 0
    return WorkerFacts(
        cluster=cluster.name,
        node=worker.node.hostname,
        model=worker.served_model.name,
        worker=worker.name,
        stale=not state or bool(state.get("stale")),
        active=worker.state == WorkerState.ACTIVE and state.get("up", True) is not False,
        kv_usage=state.get("kv_usage"),
        ttft_p95_ms=_ms(state.get("ttft_p95_s")),
        itl_p95_ms=_ms(state.get("itl_p95_s")),
        ttft_slo_ms=slo[0],
        itl_slo_ms=slo[1],
        has_traffic=running > 0 or prompt_tps > 0,
        kv_events_seq=kv.get("last_seq") if isinstance(kv.get("last_seq"), int) else None,
        kv_events_connected=kv.get("connected") if "connected" in kv else None,
        kv_events_stalled=kv.get("stalled") if isinstance(kv.get("stalled"), bool) else None,
        prefix_hit_rate=state.get("prefix_hit_rate"),
    )


def _latest_routing_versions() -> dict[int, int]:
    try:
        return apps.get_model("routing", "RoutingTableVersion").latest_per_cluster()
    except Exception:  # routing app not there (yet) or not migrated
        log.debug("alerts: routing versions unavailable", exc_info=True)
        return {}


def _push_failures() -> dict[int, tuple[str, int]]:
    """gateway id → (error, failed attempts) from the routing app's latest push per
    gateway, when that push is failing (retrying after errors, refused or given up)."""
    try:
        model = apps.get_model("routing", "GatewayDelivery")
    except LookupError:
        return {}
    out: dict[int, tuple[str, int]] = {}
    try:
        for d in model.objects.order_by("gateway_id", "-created", "-pk").only(
            "gateway_id", "status", "attempts", "last_error", "last_status_code"
        ):
            if d.gateway_id in out:
                continue
            failing = d.status in ("nacked", "failed") or (
                d.status in ("pending", "sending") and d.attempts > 0 and d.last_error
            )
            error = d.last_error or (f"HTTP {d.last_status_code}" if d.last_status_code else "")
            out[d.gateway_id] = (error or d.status, d.attempts) if failing else ("", 0)
    except Exception:
        log.warning("alerts: routing deliveries unreadable", exc_info=True)
    return out


def _plans() -> list[PlanFacts]:
    """Per served model: its latest plan failed, or the planner found no feasible layout
    (e.g. not enough decode KV capacity for the load). Read only if the planner is there."""
    out: list[PlanFacts] = []
    try:
        plan_model = apps.get_model("planner", "Plan")
        state_model = apps.get_model("planner", "ModelPlannerState")
    except LookupError:
        return out
    try:
        seen: set[int] = set()
        latest = plan_model.objects.select_related("served_model__cluster").order_by(
            "served_model_id", "-created", "-pk"
        )
        for plan in latest:
            if plan.served_model_id in seen:
                continue
            seen.add(plan.served_model_id)
            if plan.status == "failed":
                sm = plan.served_model
                reason = getattr(plan, "failure_reason", "") or ""
                out.append(
                    PlanFacts(sm.cluster.name, sm.name, "failed", reason[:300], str(plan.pk))
                )
        # The planner holds when no layout is predicted to meet the targets (it no longer
        # shuffles by a capacity tie-break); on-call hears of it as a PlanFailed alert.
        status_of = {"no-feasible-layout": "infeasible", "all-layouts-miss": "all-layouts-miss"}
        for state in state_model.objects.select_related("served_model__cluster").filter(
            last_reason__in=list(status_of)
        ):
            sm = state.served_model
            explanation = (getattr(state, "last_explanation", "") or "")[:300]
            out.append(PlanFacts(sm.cluster.name, sm.name, status_of[state.last_reason],
                                 explanation))
    except Exception:  # planner tables not migrated yet, or changed shape
        log.warning("alerts: planner state unreadable", exc_info=True)
    return out


def _expected_agent() -> tuple[int | None, str]:
    try:
        from workers_agent.protocol import PROTOCOL_VERSION
    except ImportError:
        PROTOCOL_VERSION = None
    try:
        version = metadata.version("pdplane")
    except metadata.PackageNotFoundError:
        version = ""
    return PROTOCOL_VERSION, version


def build_snapshot(now: datetime) -> FleetSnapshot:
    ts = now.timestamp()
    nodes, workers, gateways = [], [], []
    slo_cache: dict = {}
    latest = _latest_routing_versions()
    pushes = _push_failures()
    for cluster in Cluster.objects.all():
        hot = _hot_cluster(cluster.pk)
        for node in Node.objects.filter(cluster=cluster).prefetch_related("gpus"):
            nodes.append(_node_facts(cluster, node, hot["nodes"].get(node.pk), ts))
        for worker in Worker.objects.filter(served_model__cluster=cluster).select_related(
            "served_model", "node"
        ):
            slo = _policy_slo(worker.served_model, slo_cache)
            workers.append(_worker_facts(cluster, worker, hot["workers"].get(worker.pk), slo))
        for gw in Gateway.objects.filter(cluster=cluster):
            # The routing app's push log when there is one, else the gateway's last error.
            error, failures = pushes.get(gw.pk, (gw.last_error, 1 if gw.last_error else 0))
            health = None
            if gw.kind == GatewayKind.PDPLANE and gw.url:
                health = gateway_health.refresh(gw, ts)
            gateways.append(
                GatewayFacts(
                    cluster=cluster.name,
                    gateway=gw.name,
                    applied_version=gw.applied_table_version,
                    latest_version=latest.get(cluster.pk),
                    push_error=error,
                    consecutive_push_failures=failures,
                    pd_pairs=gateway_health.pair_facts(health),
                    stalled_kv_streams=gateway_health.stalled_streams(health),
                )
            )
    protocol, version = _expected_agent()
    return FleetSnapshot(
        now=ts,
        nodes=tuple(nodes),
        workers=tuple(workers),
        gateways=tuple(gateways),
        plans=tuple(_plans()),
        expected_agent_protocol=protocol,
        expected_agent_version=version,
    )
