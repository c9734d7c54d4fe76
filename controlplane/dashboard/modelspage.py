"""Context builders for the models, plans, routing-table and audit pages."""

from __future__ import annotations

from django.core.paginator import Paginator

from controlplane.accounts.access import can_anywhere, restrict
from controlplane.accounts.roles import ACTION, READ
from controlplane.alerts import gateway_health
from controlplane.audit.models import ChangeRecord
from controlplane.planner.inputs import measured_latency
from controlplane.planner.models import Plan, PlanStatus
from controlplane.policies.models import effective_policy_for
from controlplane.routing.diff import diff_tables, summarize
from controlplane.routing.models import GatewayDelivery, RoutingTableVersion
from controlplane.telemetry import hotstate
from controlplane.topology.models import Cluster, Gateway, ServedModel, Worker

from .routingview import change_lines


def _layout(workers: list[Worker]) -> str:
    active = [w for w in workers if w.state in ("active", "draining")]
    prefill = sum(1 for w in active if w.desired_role == "prefill")
    decode = sum(1 for w in active if w.desired_role == "decode")
    both = sum(1 for w in active if w.desired_role == "both")
    if not prefill and not decode:
        return f"aggregated ×{both}"
    text = f"{prefill}P:{decode}D"
    return text + (f" + {both} aggregated" if both else "")


def models_context(user) -> dict:
    clusters = restrict(Cluster.objects.all(), user, READ)
    models = list(ServedModel.objects.filter(cluster__in=clusters).select_related("cluster"))
    workers = list(
        Worker.objects.filter(served_model__in=models).select_related("node")
        .prefetch_related("gpus")
    )
    worker_states: dict[int, dict] = {}
    for cluster_id in {m.cluster_id for m in models}:
        worker_states.update(hotstate.cluster_snapshot(cluster_id)["workers"])
    latest_plans = _latest_plans(models)
    timelines = _role_change_timelines(models)
    policies = {model.pk: effective_policy_for(model)[0] for model in models}
    histories = _histories(models, policies)
    rows = []
    for model in models:
        mine = [w for w in workers if w.served_model_id == model.pk]
        policy = policies[model.pk]
        ttft, itl, source = measured_latency(
            model, [worker_states[w.pk] for w in mine if w.pk in worker_states]
        )
        rows.append({
            "model": model,
            "policy": policy,
            "layout": _layout(mine),
            "workers": mine,
            "ttft_p95_s": ttft,
            "itl_p95_s": itl,
            "source": source,
            "plan": latest_plans.get(model.pk),
            "timeline": timelines.get(model.pk, []),
            "history": histories.get(model.pk),
        })
    return {"rows": rows, "can_act": can_anywhere(user, ACTION)}


def _latest_plans(models) -> dict:
    latest = {}
    for plan in Plan.objects.filter(served_model__in=models).order_by("-created")[:500]:
        latest.setdefault(plan.served_model_id, plan)
    return latest


TIMELINE_HOURS = 6


def _role_change_timelines(models) -> dict[int, list]:
    """Role changes of the last hours per model: applied (and failed) plans on an axis."""
    import time

    from .svg import timeline

    end = _timeline_end(time.time())
    start = end - TIMELINE_HOURS * 3600
    events: dict[int, list] = {}
    for plan in Plan.objects.filter(served_model__in=models, status__in=("applied", "failed"),
                                    updated__gte=_ts(start)).order_by("updated"):
        when = (plan.applied_at or plan.updated).timestamp()
        label = f"#{plan.pk} {plan.current_layout} → {plan.target_layout} ({plan.status})"
        events.setdefault(plan.served_model_id, []).append((when, label, plan.status))
    return {pk: timeline(ev, start=start, end=end) for pk, ev in events.items()}


def _histories(models, policies) -> dict:
    """Layout and measured p95 vs target over the last hours (controlplane.dashboard.history),
    on the same 5-minute-stepped axis as the role-change timeline."""
    import time

    from .history import model_histories

    return model_histories(models, policies, _timeline_end(time.time()))


def _timeline_end(now: float) -> float:
    """The axis ends at the next 5-minute mark (8 px on a 6-hour axis): marks move only then,
    so a live region with a timeline does not differ (and get re-sent) every second."""
    return (now // 300 + 1) * 300


def _ts(unix: float):
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, tz=UTC)


PLANS_PER_PAGE = 25


def _keep(query, drop=("page",)) -> str:
    """The query string without ``drop`` (paging links keep the filters)."""
    from urllib.parse import urlencode

    items = query.lists() if hasattr(query, "lists") else ((k, [v]) for k, v in query.items())
    return urlencode([(k, v) for k, vs in items if k not in drop for v in vs if v])


def plans_context(user, query) -> dict:
    """Plans list: the API's own FilterSet (``/api/v1/plans/`` parameters), paging, and a
    timeline of the filtered plans over the last hours."""
    from controlplane.api.filters import apply_filters
    from controlplane.api.views_planner import PlanViewSet

    clusters = restrict(Cluster.objects.all(), user, READ)
    plans = Plan.objects.filter(cluster__in=clusters).select_related("cluster", "served_model")
    plans, errors = apply_filters(plans, PlanViewSet.filter_fields, query)
    plans = plans.order_by("-created", "-id")
    page = Paginator(plans, PLANS_PER_PAGE).get_page(query.get("page"))
    return {
        "page": page, "errors": errors, "can_act": can_anywhere(user, ACTION),
        "filters": {k: query.get(k, "") for k in PlanViewSet.filter_fields},
        "keep": _keep(query),
        "choices": {
            "clusters": list(clusters.values_list("pk", "name")),
            "models": list(ServedModel.objects.filter(cluster__in=clusters)
                           .values_list("pk", "name", "cluster__name")),
            "statuses": PlanStatus.values,
        },
        "timeline": _plans_timeline(plans),
        "status": query.get("status", ""),
    }


def _plans_timeline(plans) -> list:
    import time

    from .svg import timeline

    end = _timeline_end(time.time())
    start = end - TIMELINE_HOURS * 3600
    events = [(p.created.timestamp(), f"#{p.pk} {p.served_model.name}: {p.current_layout} → "
               f"{p.target_layout} ({p.status})", p.status)
              for p in plans.filter(created__gte=_ts(start))[:500]]
    return timeline(events, start=start, end=end)


def routing_context(user, query=None) -> dict:
    clusters = list(restrict(Cluster.objects.all(), user, READ))
    sections = []
    for cluster in clusters:
        versions = list(
            RoutingTableVersion.objects.filter(cluster=cluster).order_by("-version")[:11]
        )
        history = []
        for newer, older in zip(versions, [*versions[1:], None], strict=False):
            if len(history) == 10:
                break
            changes = diff_tables(older.body if older else None, newer.body)
            history.append({"version": newer, "lines": change_lines(changes),
                            "summary": summarize(changes)})
        latest = versions[0].version if versions else None
        gateways = []
        for gw in Gateway.objects.filter(cluster=cluster):
            # P/D pairs that failed, as the gateway last told the alerts evaluation.
            # (None: not heard — not a pdplane gateway, or not reachable lately.)
            health = gateway_health.cached(gw.pk)
            pairs = None if health is None else [
                p for p in health.get("pd_pairs", []) if p.get("state") != "healthy"]
            gateways.append({"gateway": gw, "pairs": pairs,
                             "lag": (latest - gw.applied_table_version) if latest else None})
        deliveries = (GatewayDelivery.objects.filter(gateway__cluster=cluster)
                      .select_related("gateway", "table").order_by("-created")[:10])
        sections.append({"cluster": cluster, "history": history, "gateways": gateways,
                         "latest": latest, "deliveries": deliveries})
    return {"sections": sections}


def audit_context(user, query) -> dict:
    """Audit log: the API's FilterSet (``/api/v1/audit/`` parameters) and paging."""
    from controlplane.api.filters import apply_filters
    from controlplane.api.views import ChangeRecordFilterMixin

    fields = ChangeRecordFilterMixin.filter_fields
    records = restrict(ChangeRecord.objects.all(), user, READ)
    records, errors = apply_filters(records, fields, query)
    page = Paginator(records.order_by("-time", "-id"), 50).get_page(query.get("page"))
    return {"page": page, "errors": errors, "keep": _keep(query),
            "filters": {k: query.get(k, "") for k in fields},
            "actor_kinds": ("user", "token", "node", "system")}
