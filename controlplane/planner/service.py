"""Planner service API: run a planning cycle, approve or reject plans.

Called by the Celery tasks, the REST API and the dashboard. Errors are :class:`PlanError`
with a reason; nothing here raises a bare exception at a caller for a bad request.
"""

from __future__ import annotations

import logging
import time

from django.db import transaction
from django.utils import timezone

from controlplane.observability import metrics as obs
from controlplane.topology.models import Cluster

from . import apply
from . import metrics as planner_metrics
from .apply import PlanError
from .calibration import CalibrationBook, LoadPoint
from .inputs import NOT_MEASURED, Measured, gather_cluster
from .models import Plan, PlanStatus
from .planner import plan_cluster

log = logging.getLogger(__name__)

__all__ = ["PlanError", "approve_plan", "reject_plan", "run_planning"]


def _actor(user) -> str:
    return getattr(user, "username", None) or "system"


def approve_plan(plan_id: int, user=None) -> Plan:
    """Approve a proposed plan and start applying it (drain, then switch roles)."""
    with transaction.atomic():
        try:
            plan = Plan.objects.select_for_update().get(pk=plan_id)
        except Plan.DoesNotExist:
            raise PlanError(f"no plan {plan_id}") from None
        if plan.status != PlanStatus.PROPOSED:
            raise PlanError(f"plan {plan.pk} is {plan.status}; only proposed plans can be approved")
        plan.status = PlanStatus.APPROVED
        plan.decided_at = timezone.now()
        plan.decided_by = user if getattr(user, "pk", None) else None
        plan.save(update_fields=["status", "decided_at", "decided_by", "updated"])
    return apply.start_apply(plan.pk, _actor(user))


def reject_plan(plan_id: int, user=None, reason: str = "") -> Plan:
    with transaction.atomic():
        try:
            plan = Plan.objects.select_for_update().get(pk=plan_id)
        except Plan.DoesNotExist:
            raise PlanError(f"no plan {plan_id}") from None
        if plan.status != PlanStatus.PROPOSED:
            raise PlanError(f"plan {plan.pk} is {plan.status}; only proposed plans can be rejected")
        plan.status = PlanStatus.REJECTED
        plan.decided_at = timezone.now()
        plan.decided_by = user if getattr(user, "pk", None) else None
        if reason:
            plan.failure_reason = reason[:1000]
        plan.save(update_fields=["status", "decided_at", "decided_by", "failure_reason",
                                 "updated"])
    return plan


def _calibrate(state, decision, measured) -> None:
    """Compare what was measured over this window with what the model predicts for the
    layout as it is at this window's load, in this window's workload bucket (see
    calibration.py: no comparison across a mix shift)."""
    pred = decision.current_now
    rec = decision.record
    obs = rec.observation if rec else None
    if pred is None or obs is None or pred.overloaded or pred.rate_rps <= 0:
        return
    m = Measured(*measured)  # a plain (ttft, itl, source[, …]) tuple is accepted too
    ttft, itl = m.ttft_p95_s, m.itl_p95_s
    book = CalibrationBook.from_dict(state.calibration)
    _key, cal = book.factors_for(obs.isl_mean, obs.osl_mean, obs.rate_rps)
    raw_ttft = pred.ttft_p95_s / cal.ttft_factor if cal.ttft_factor else None
    raw_itl = pred.itl_p95_s / cal.itl_factor if cal.itl_factor else None
    itl_mean = m.itl_mean_s
    if itl_mean:
        # The ITL factor compares mean token gaps when the fleet histograms give one: what
        # goodput's per-request mean ITL averages to, and no knife edge (a gap p95 jumps
        # between a pure and a prefill-carrying step when ~5 % of steps carry a chunk).
        itl = itl_mean
        raw_itl = pred.itl_mean_s / cal.itl_factor if cal.itl_factor else None
    new = book.observe(LoadPoint(obs.rate_rps, obs.isl_mean, obs.osl_mean),
                       raw_ttft, ttft, raw_itl, itl, m.first_token_prompt_mean, m.backlog)
    state.calibration = book.as_dict()
    state.ttft_factor, state.itl_factor = new.ttft_factor, new.itl_factor
    state.calibration_samples = new.samples
    for err in new.model_errors():
        planner_metrics.MODEL_ERRORS.labels(err["metric"]).inc()


def run_planning(cluster: Cluster, now: float | None = None) -> list[Plan]:
    """One planning cycle for a cluster; returns the plans it created."""
    started = time.perf_counter()
    now = time.time() if now is None else now
    ci = gather_cluster(cluster)
    decision = plan_cluster(ci.models, now, ci.nodes_total, ci.nodes_stale)
    by_id = {m.served_model_id: m for m in ci.models}
    created = []
    stamp = timezone.now()
    for d in decision.models:
        inp = by_id[d.served_model_id]
        state = ci.states[d.served_model_id]
        measured = ci.measured.get(d.served_model_id, NOT_MEASURED)
        _calibrate(state, d, measured)
        inputs = _inputs_json(inp, ci, measured)
        state.last_run_at = stamp
        state.last_action, state.last_reason = d.action, d.reason
        state.last_explanation = d.explanation
        state.last_predictions = d.predictions_dict()
        state.last_inputs = inputs
        record = d.record.as_dict() if d.record else {}
        state.last_record = record
        if d.memory is not None:
            state.move_memory = d.memory.as_dict()
        state.save()
        obs.PLANS.labels(d.action).inc()
        if d.record is not None and d.record.alert == "all-layouts-miss":
            planner_metrics.ALL_LAYOUTS_MISS.inc()
        if d.action == "keep":
            # The planner no longer wants the change an older proposal asked for.
            Plan.objects.filter(
                served_model_id=d.served_model_id, status=PlanStatus.PROPOSED
            ).update(status=PlanStatus.SUPERSEDED)
        if d.action != "change":
            continue
        mode = inp.policy.rebalancing_mode
        with transaction.atomic():
            Plan.objects.filter(
                served_model_id=d.served_model_id, status=PlanStatus.PROPOSED
            ).update(status=PlanStatus.SUPERSEDED)
            plan = Plan.objects.create(
                cluster=cluster,
                served_model_id=d.served_model_id,
                mode=mode,
                current_layout=d.current.layout if d.current else "",
                target_layout=d.target.layout if d.target else "",
                current_goodput_rps=d.current.goodput_rps if d.current else None,
                predicted_goodput_rps=d.target.goodput_rps if d.target else None,
                inputs=inputs,
                predictions=d.predictions_dict(),
                chosen={"target": d.target.layout if d.target else "",
                        "step": d.step.layout if d.step else "", "reason": d.reason},
                diff=[{**c.as_dict(), "done": False} for c in d.changes],
                explanation=d.explanation,
                record=record,
            )
        created.append(plan)
        if mode == "auto":
            try:
                approve_plan(plan.pk, None)
            except PlanError as exc:
                log.warning("auto-apply of plan %s refused: %s", plan.pk, exc.reason)
    obs.PLANNING_DURATION.observe(time.perf_counter() - started)
    log.info("planned cluster %s in %.1f ms: %d plan(s)", cluster.pk,
             (time.perf_counter() - started) * 1000, len(created))
    return created


def _inputs_json(inp, ci, measured) -> dict:
    load = inp.load
    return {
        "workers": [
            {"id": w.id, "name": w.name, "node": w.node, "nvlink_group": w.nvlink_group,
             "role": w.role, "state": w.state, "running": w.running, "waiting": w.waiting,
             "kv_usage": round(w.kv_usage, 4), "stale": w.stale}
            for w in inp.workers
        ],
        "gpu": inp.shape.gpu.name,
        "tp": inp.shape.tp,
        "load": {k: (round(v, 4) if isinstance(v, float) else v)
                 for k, v in load.__dict__.items()},
        "policy": inp.policy.as_dict(),
        "calibration": {"ttft_factor": inp.params.ttft_factor,
                        "itl_factor": inp.params.itl_factor},
        "measured": Measured(*measured)._asdict(),
        "nodes": ci.nodes_total,
        "stale_nodes": ci.nodes_stale,
    }
