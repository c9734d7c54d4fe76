"""The node page: GPUs, engines, NICs, 15-minute sparklines and drain/resume."""

from __future__ import annotations

import pdcatalog
from controlplane.accounts.access import can_on
from controlplane.accounts.roles import ACTION
from controlplane.topology.models import Worker

from . import nodestatus
from .live import engine_history
from .svg import line_chart
from .viewmodels import NODE_FIELDS, Filters, node_cards

SPARK_METRICS = (
    ("kv_usage", "KV cache used", 1.0, None),
    ("ttft_p95_s", "TTFT p95", None, "ttft"),
    ("itl_p95_s", "ITL p95", None, "itl"),
    ("generation_tokens_per_s", "generated tokens/s", None, None),
)


def node_live_context(user, node_id) -> dict | None:
    """The node page's live part, or None when the node is gone or not visible."""
    from controlplane.accounts.access import restrict
    from controlplane.accounts.roles import READ
    from controlplane.topology.models import Node

    if not str(node_id).isdigit():
        return None
    node = restrict(Node.objects.select_related("cluster"), user, READ).filter(
        pk=int(node_id)).first()
    return node_context(user, node) if node else None


def node_context(user, node) -> dict:
    row = {field: value for field, value in zip(
        NODE_FIELDS,
        (node.id, node.hostname, node.cluster_id, node.cluster.name, node.rack, node.status,
         node.last_seen),
        strict=True,
    )}
    card = node_cards([row], Filters())[0]
    workers = list(
        Worker.objects.filter(node=node).select_related("served_model").prefetch_related("gpus")
    )
    engines_hot = card.engines_hot
    history = engine_history([(w.id, w.name) for w in workers])
    engines = []
    for w in workers:
        live = engines_hot.get(w.name) or {}
        slo = _slo(w)
        series = history.get(w.name) or {}
        sparks = []
        for key, label, y_max, target_key in SPARK_METRICS:
            target = slo.get(target_key) if target_key else None
            chart = line_chart(series.get(key) or [], width=260, height=48, y_max=y_max,
                               target=target)
            sparks.append({"label": label, "chart": chart, "last": _fmt(key, chart.last),
                           "top": _fmt(key, chart.y_max)})
        engines.append({"worker": w, "live": live, "sparks": sparks, "slo": slo,
                        "state": nodestatus.engine_state_label(w.state, card.status),
                        "gpus": sorted(g.index for g in w.gpus.all())})
    return {
        "node": node,
        "card": card,
        "engines": engines,
        "gpu_estimates": gpu_estimates(node),
        "can_act": can_on(user, ACTION, node.cluster_id),
    }


def gpu_estimates(node) -> list[tuple[str, str]]:
    """(product name, why) for each GPU model on the node the hardware catalog does not
    know: the planner plans it with an estimated profile, and the page says so."""
    products = sorted({g.product_name for g in node.gpus.all() if not g.missing})
    found = [pdcatalog.lookup_gpu(p) for p in products]
    return [(f.query, f.reason) for f in found if f.estimated]


def _fmt(metric: str, value) -> str:
    """A sparkline's value as read: KV share in %, latencies in ms, rates as numbers."""
    if value is None:
        return "no data"
    if metric == "kv_usage":
        return f"{value * 100:.0f}%"
    if metric.endswith("_p95_s"):
        return f"{value * 1000:.0f} ms"
    return f"{value:,.0f}"


def _slo(worker) -> dict:
    from controlplane.policies.models import effective_policy_for

    policy, _ = effective_policy_for(worker.served_model)
    return {"ttft": policy.ttft_p95_ms / 1000, "itl": policy.itl_p95_ms / 1000}
