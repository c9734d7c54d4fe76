"""Models, plans, routing-table and audit pages, and the worker action endpoint."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_POST

from controlplane.accounts.access import can_anywhere, can_on, restrict
from controlplane.accounts.roles import ACTION, READ
from controlplane.topology.actions import ActionError, drain_worker, resume_worker
from controlplane.topology.models import Cluster, Worker

from .liveregions import live_urls

WORKER_ACTIONS = {"drain": drain_worker, "resume": resume_worker}


@login_required
@require_POST
def worker_action_view(request, pk: int, worker_pk: int, action: str):
    if not can_anywhere(request.user, ACTION):
        return HttpResponseForbidden("Your role may not drain or resume workers.")
    handler = WORKER_ACTIONS.get(action)
    worker = get_object_or_404(
        restrict(Worker.objects.select_related("node"), request.user, READ),
        pk=worker_pk, node_id=pk,
    )
    if not can_on(request.user, ACTION, worker.node.cluster_id):
        return HttpResponseForbidden("Your role on this cluster may not drain or resume workers.")
    if handler is None:
        messages.error(request, f"Unknown action {action!r}.")
    else:
        try:
            handler(worker, actor=f"user:{request.user.username}")
            messages.success(request, f"{action.capitalize()} requested for {worker}.")
        except ActionError as exc:
            messages.error(request, str(exc))
    return redirect("dashboard:node", pk=pk)


@login_required
def models_view(request):
    from .modelspage import models_context
    from .whatifpage import form_context

    context = {**models_context(request.user), "whatif": form_context(),
               **live_urls("models", request.GET)}
    return render(request, "dashboard/models.html", context)


@login_required
def plans_view(request):
    from .modelspage import plans_context

    context = {**plans_context(request.user, request.GET), **live_urls("plans", request.GET)}
    return render(request, "dashboard/plans.html", context)


@login_required
def routing_view(request):
    from .modelspage import routing_context

    context = {**routing_context(request.user), **live_urls("routing", request.GET)}
    return render(request, "dashboard/routing.html", context)


@login_required
def audit_view(request):
    from .modelspage import audit_context

    return render(request, "dashboard/audit.html", audit_context(request.user, request.GET))


@login_required
@require_POST
def plan_decision_view(request, pk: int, decision: str):
    from controlplane.planner.models import Plan
    from controlplane.planner.service import PlanError, approve_plan, reject_plan

    if not can_anywhere(request.user, ACTION):
        return HttpResponseForbidden("Your role may not approve or reject plans.")
    plan = get_object_or_404(
        Plan.objects.filter(cluster__in=restrict(Cluster.objects.all(), request.user, READ)),
        pk=pk,
    )
    if not can_on(request.user, ACTION, plan.cluster_id):
        return HttpResponseForbidden("Your role on this cluster may not approve or reject plans.")
    handlers = {"approve": approve_plan, "reject": reject_plan}
    if decision not in handlers:
        messages.error(request, f"Unknown decision {decision!r}.")
    else:
        try:
            handlers[decision](plan.pk, request.user)
            messages.success(request, f"Plan #{plan.pk} {decision}d.")
        except PlanError as exc:
            messages.error(request, f"Plan #{plan.pk}: {exc.reason}")
    target = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(target, allowed_hosts={request.get_host()}):
        target = "dashboard:plans"
    return redirect(target)
