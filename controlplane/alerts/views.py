"""Alert pages: alerts and silences, rules, webhook endpoints, deliveries. Thin views."""

from __future__ import annotations

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from . import delivery as outbox
from . import rules
from .conf import load
from .evaluation import _kick_sweeper as kick_sweeper
from .evaluation import acknowledge
from .forms import AlertRuleForm, EndpointForm, SilenceForm
from .models import (
    Alert,
    AlertRule,
    Delivery,
    DeliveryStatus,
    Silence,
    WebhookEndpoint,
)
from .openalerts import open_alerts_context
from .permissions import ACTION, READ, WRITE, flags, require


def _ctx(request, **values):
    return {**flags(request.user), **values}


@require(READ)
def alert_list(request):
    from controlplane.dashboard.liveregions import live_urls

    fingerprint = request.GET.get("fingerprint", "")
    history = Alert.objects.filter(is_open=False).order_by("-ends_at")
    if fingerprint:
        history = history.filter(fingerprint=fingerprint)
    now = timezone.now()
    context = _ctx(
        request,
        **open_alerts_context(request.user, fingerprint),
        **live_urls("alerts", request.GET),
        history=history[:50],
        silences=Silence.objects.filter(ends_at__gt=now).order_by("ends_at"),
        silence_form=SilenceForm(),
        fingerprint=fingerprint,
    )
    return render(request, "alerts/alert_list.html", context)


@require_POST
@require(ACTION)
def alert_ack(request, pk):
    alert = get_object_or_404(Alert, pk=pk, is_open=True)
    acknowledge(alert, request.user)
    messages.success(request, f"Acknowledged {alert.rule}: repeats are paused until it resolves.")
    return redirect("alerts:list")


@require_POST
@require(ACTION)
def silence_create(request):
    form = SilenceForm(request.POST)
    if form.is_valid():
        starts, ends = form.window()
        Silence.objects.create(
            matchers=form.cleaned_data["matchers"],
            starts_at=starts,
            ends_at=ends,
            comment=form.cleaned_data["comment"],
            created_by=request.user,
        )
        messages.success(request, f"Silenced {form.cleaned_data['matchers']} until {ends:%H:%M}.")
    else:
        for field, errs in form.errors.items():
            messages.error(request, f"Silence not created — {field}: {' '.join(errs)}")
    return redirect("alerts:list")


@require_POST
@require(ACTION)
def silence_expire(request, pk):
    Silence.objects.filter(pk=pk, ends_at__gt=timezone.now()).update(ends_at=timezone.now())
    return redirect("alerts:list")


@require(READ)
def rule_list(request):
    form = AlertRuleForm()
    if request.method == "POST":
        if not flags(request.user)["can_write"]:
            raise PermissionDenied("Your role does not allow changing alert rules.")
        existing = AlertRule.objects.filter(
            rule=request.POST.get("rule"), cluster=request.POST.get("cluster") or None
        ).first()
        form = AlertRuleForm(request.POST, instance=existing)
        if form.is_valid():
            form.save()
            messages.success(request, f"Saved the override for {form.instance}.")
            return redirect("alerts:rules")
    overrides = AlertRule.objects.select_related("cluster")
    by_rule: dict[str, list] = {}
    for o in overrides:
        by_rule.setdefault(o.rule, []).append(o)
    table = [
        {"name": name, "default": cfg, "overrides": by_rule.get(name, [])}
        for name, cfg in rules.DEFAULT_RULES.items()
    ]
    return render(request, "alerts/rule_list.html", _ctx(request, table=table, form=form))


@require_POST
@require(WRITE)
def rule_delete(request, pk):
    AlertRule.objects.filter(pk=pk).delete()
    return redirect("alerts:rules")


@require(READ)
def endpoint_list(request):
    endpoints = WebhookEndpoint.objects.all()
    return render(request, "alerts/endpoint_list.html", _ctx(request, endpoints=endpoints))


@require(WRITE)
def endpoint_create(request):
    form = EndpointForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        endpoint = form.save()
        # The secret is shown on this response only; the UI never shows it again.
        return render(
            request,
            "alerts/endpoint_secret.html",
            _ctx(request, endpoint=endpoint, secret=endpoint.secret, created=True),
        )
    return render(request, "alerts/endpoint_form.html", _ctx(request, form=form, endpoint=None))


@require(READ)
def endpoint_edit(request, pk):
    endpoint = get_object_or_404(WebhookEndpoint, pk=pk)
    form = EndpointForm(request.POST or None, instance=endpoint)
    if request.method == "POST":
        if not flags(request.user)["can_write"]:
            messages.error(request, "Your role does not allow changing endpoints.")
            return redirect("alerts:endpoint-edit", pk=pk)
        if form.is_valid():
            endpoint = form.save(commit=False)
            if endpoint.enabled:
                endpoint.disabled_reason, endpoint.disabled_at = "", None
            endpoint.save()
            messages.success(request, f"Saved {endpoint.name}.")
            return redirect("alerts:endpoints")
    recent = endpoint.deliveries.all()[:20]
    return render(
        request,
        "alerts/endpoint_form.html",
        _ctx(request, form=form, endpoint=endpoint, recent=recent),
    )


@require_POST
@require(WRITE)
def endpoint_rotate(request, pk):
    endpoint = get_object_or_404(WebhookEndpoint, pk=pk)
    endpoint.rotate_secret()
    endpoint.save()
    return render(
        request,
        "alerts/endpoint_secret.html",
        _ctx(request, endpoint=endpoint, secret=endpoint.secret, created=False),
    )


@require_POST
@require(ACTION)
def endpoint_test(request, pk):
    endpoint = get_object_or_404(WebhookEndpoint, pk=pk)
    d = outbox.send_test(endpoint)
    attempt = d.attempt_log.last()
    if d.status == DeliveryStatus.DELIVERED:
        messages.success(request, f"Test delivered to {endpoint.name} ({d.last_status_code}).")
    else:
        detail = attempt.error or f"HTTP {attempt.status_code}" if attempt else d.status
        messages.error(request, f"Test to {endpoint.name} failed: {detail}")
    return redirect("alerts:delivery", pk=d.pk)


@require(READ)
def delivery_list(request):
    qs = Delivery.objects.select_related("endpoint")
    status = request.GET.get("status", "")
    endpoint = request.GET.get("endpoint", "")
    if status in DeliveryStatus.values:
        qs = qs.filter(status=status)
    if endpoint.isdigit():
        qs = qs.filter(endpoint_id=int(endpoint))
    page = Paginator(qs, 50).get_page(request.GET.get("page"))
    return render(
        request,
        "alerts/delivery_list.html",
        _ctx(
            request,
            page=page,
            status=status,
            endpoint=endpoint,
            statuses=DeliveryStatus.choices,
            endpoints=WebhookEndpoint.objects.all(),
        ),
    )


@require(READ)
def delivery_detail(request, pk):
    d = get_object_or_404(Delivery.objects.select_related("endpoint"), pk=pk)
    return render(
        request,
        "alerts/delivery_detail.html",
        _ctx(request, d=d, attempts=d.attempt_log.all()),
    )


@require_POST
@require(ACTION)
def delivery_redeliver(request, pk):
    d = get_object_or_404(Delivery, pk=pk)
    if outbox.redeliver(d):
        if load().kick_sweeper:
            kick_sweeper()
        messages.success(request, f"{d.webhook_id} queued again (same webhook-id).")
    else:
        messages.error(request, "Cannot redeliver: it is being sent, or its endpoint is off.")
    return redirect("alerts:delivery", pk=pk)
