"""Applying a plan: drain, switch roles once in-flight work of the old kind is done, republish.

A role change is a drain. The worker is marked ``draining`` (the routing table keeps its old
role, and the gateway sends it no new work), the table is republished, and once the agent
reports that its in-flight work of the old kind is done the worker takes the new role
(``desired_role``, ``generation`` + 1, ``role_changed_at``) and the table is republished
again. A plan whose workers do not drain before its deadline fails, visibly, and the
workers go back to their old role.
"""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from controlplane.routing.service import request_publish
from controlplane.telemetry import hotstate
from controlplane.telemetry.commands import CommandError, send_command
from controlplane.topology.models import Worker

from .models import Plan, PlanStatus

log = logging.getLogger(__name__)

_COVERS = {"prefill": {"prefill"}, "decode": {"decode"}, "both": {"prefill", "decode"}}


class PlanError(ValueError):
    """A plan cannot move to the asked state; ``reason`` says why."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def drain_timeout_s() -> float:
    return float(getattr(settings, "PLANNER_DRAIN_TIMEOUT_S", 600))


def lost_kinds(from_role: str, to_role: str) -> set[str]:
    return _COVERS.get(from_role, set()) - _COVERS.get(to_role, set())


def is_drained(from_role: str, to_role: str, state: dict | None, since: float) -> bool:
    """Whether a worker's in-flight work of the kinds it loses is done, judged from an agent
    report received after the drain began (an older report proves nothing)."""
    lost = lost_kinds(from_role, to_role)
    if not lost:
        return True
    if not state or state.get("stale") or (state.get("received_at") or 0) <= since:
        return False
    running = state.get("running") or 0
    waiting = state.get("waiting") or 0
    if from_role == "prefill" or "decode" in lost:
        return running == 0 and waiting == 0
    # both → decode: only queued prompts would still be prefilled here; decodes carry on.
    return waiting == 0


def _switch(worker: Worker, role: str, now) -> None:
    Worker.objects.filter(pk=worker.pk).update(
        desired_role=role, state="active", generation=F("generation") + 1, role_changed_at=now
    )
    args = {"engine": worker.name, "role": role}
    node_id = worker.node_id
    # The agent hears of it after the commit (a rolled-back switch must not reach it).
    transaction.on_commit(lambda: _tell_agent(node_id, args))


def _tell_agent(node_id: int, args: dict) -> None:
    try:
        send_command(node_id, "set_role", args)
    except CommandError as exc:
        log.warning("set_role for node %s not queued: %s", node_id, exc)


def start_apply(plan_id: int, actor: str = "system") -> Plan:
    """Begin applying an approved plan: drain the workers that lose work, switch the others."""
    now = timezone.now()
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan_id)
        if plan.status != PlanStatus.APPROVED:
            raise PlanError(f"plan {plan.pk} is {plan.status}, not approved")
        ids = [entry["worker_id"] for entry in plan.diff]
        workers = {w.pk: w for w in Worker.objects.select_for_update().filter(pk__in=ids)}
        for entry in plan.diff:
            w = workers.get(entry["worker_id"])
            if w is None or w.desired_role != entry["from_role"] or w.state != "active":
                plan.status = PlanStatus.FAILED
                plan.failure_reason = (
                    f"worker {entry['worker']} changed since the plan was made "
                    "(gone, other role or not active); nothing was applied"
                )
                plan.save(update_fields=["status", "failure_reason", "updated"])
                return plan
        for entry in plan.diff:
            w = workers[entry["worker_id"]]
            if lost_kinds(entry["from_role"], entry["to_role"]):
                Worker.objects.filter(pk=w.pk).update(state="draining")
                entry["done"] = False
            else:
                _switch(w, entry["to_role"], now)
                entry["done"] = True
        plan.status = PlanStatus.APPLYING
        plan.apply_started_at = now
        plan.apply_deadline = now + timedelta(seconds=drain_timeout_s())
        plan.save(update_fields=["status", "diff", "apply_started_at", "apply_deadline",
                                 "updated"])
        request_publish(plan.cluster_id, f"plan {plan.pk}: drain", actor)
    return advance(plan.pk)


def advance(plan_id: int) -> Plan:
    """Switch every drained worker; finish the plan, or fail it past its deadline."""
    now = timezone.now()
    with transaction.atomic():
        plan = Plan.objects.select_for_update().get(pk=plan_id)
        if plan.status != PlanStatus.APPLYING:
            return plan
        since = plan.apply_started_at.timestamp() if plan.apply_started_at else 0.0
        changed = False
        pending = []
        for entry in plan.diff:
            if entry.get("done"):
                continue
            state = _worker_state(entry["worker_id"])
            if is_drained(entry["from_role"], entry["to_role"], state, since):
                w = Worker.objects.select_for_update().get(pk=entry["worker_id"])
                _switch(w, entry["to_role"], now)
                entry["done"] = True
                changed = True
            else:
                pending.append((entry, state))
        if not pending:
            plan.status = PlanStatus.APPLIED
            plan.applied_at = now
        elif plan.apply_deadline and now >= plan.apply_deadline:
            names = ", ".join(
                f"{e['worker']} (running {(s or {}).get('running', '?')}, "
                f"waiting {(s or {}).get('waiting', '?')})"
                for e, s in pending
            )
            plan.status = PlanStatus.FAILED
            plan.failure_reason = (
                f"drain timed out after {drain_timeout_s():.0f} s: {names} still had work of "
                "the old kind; they keep their old role"
            )
            Worker.objects.filter(pk__in=[e["worker_id"] for e, _ in pending]).update(
                state="active"
            )
            changed = True
        plan.save(update_fields=["status", "diff", "applied_at", "failure_reason", "updated"])
        if changed:
            request_publish(plan.cluster_id, f"plan {plan.pk}: {plan.status}", "system")
    return plan


def _worker_state(worker_id: int) -> dict | None:
    try:
        return hotstate.worker_state(worker_id)
    except Exception as exc:  # Redis hiccup: try again next tick
        log.warning("hot state of worker %s unavailable: %s", worker_id, exc)
        return None
