"""Policies: effective values per model with where each came from, and the edit form.

Operators edit targets and rebalancing rules (the ``action`` permission, as in the API);
validation is the model's own (`Policy.clean`: each value, then the merged result), shown
inline next to the field.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpResponseForbidden
from django.shortcuts import get_object_or_404, redirect, render

from controlplane.accounts.access import can_anywhere, can_on, restrict
from controlplane.accounts.roles import ACTION, READ
from controlplane.policies.effective import POLICY_FIELDS, PolicyError
from controlplane.policies.models import Policy, effective_policy_for
from controlplane.topology.models import Cluster, ServedModel

from .policymeta import SOURCES, describe, format_value

INHERIT = [("", "inherit")]


class PolicyForm(forms.ModelForm):
    class Meta:
        model = Policy
        fields = list(POLICY_FIELDS)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name, field in self.fields.items():
            meta = describe(Policy, name)
            field.label = meta["label"] + (f" ({meta['unit']})" if meta["unit"] else "")
            field.help_text = meta["description"]
            if isinstance(field, forms.NullBooleanField):
                # Django's default says "Unknown"; for a policy layer it means "inherit".
                field.widget = forms.Select(choices=[("unknown", "inherit"), ("true", "on"),
                                                     ("false", "off")])
            elif isinstance(field, forms.TypedChoiceField | forms.ChoiceField):
                field.choices = INHERIT + [c for c in field.choices if c[0] != ""]
            elif hasattr(field.widget, "attrs"):
                field.widget.attrs.setdefault("placeholder", "inherit")


def _rows(policy, sources) -> list[dict]:
    """Settings grouped by section, each with its unit-formatted value and source."""
    sections: dict[str, list] = {}
    for name in POLICY_FIELDS:
        meta = describe(Policy, name)
        sections.setdefault(meta["section"], []).append({
            **meta, "name": name, "value": format_value(getattr(policy, name), meta["unit"]),
            "source": sources[name], "source_label": SOURCES.get(sources[name], sources[name]),
        })
    return list(sections.items())


@login_required
def policies_view(request):
    clusters = restrict(Cluster.objects.all(), request.user, READ).prefetch_related(
        "served_models"
    )
    sections = []
    for cluster in clusters:
        rows = []
        for model in cluster.served_models.all():
            try:
                policy, sources = effective_policy_for(model)
                values = _rows(policy, sources)
                error = ""
            except PolicyError as exc:
                values, error = [], str(exc)
            rows.append({"model": model, "values": values, "error": error})
        sections.append({"cluster": cluster, "models": rows})
    return render(request, "dashboard/policies.html",
                  {"sections": sections, "can_edit": can_anywhere(request.user, ACTION)})


@login_required
def policy_edit_view(request, cluster: str, model_id: int | None = None):
    if not can_anywhere(request.user, ACTION):
        return HttpResponseForbidden("Your role may not change policies.")
    cluster_obj = get_object_or_404(restrict(Cluster.objects.all(), request.user, READ),
                                    name=cluster)
    if not can_on(request.user, ACTION, cluster_obj):
        return HttpResponseForbidden("Your role on this cluster may not change policies.")
    model = None
    if model_id is not None:
        model = get_object_or_404(ServedModel, pk=model_id, cluster=cluster_obj)
    instance = (Policy.objects.filter(cluster=cluster_obj, served_model=model).first()
                or Policy(cluster=cluster_obj, served_model=model))
    form = PolicyForm(request.POST or None, instance=instance)
    if request.method == "POST" and form.is_valid():
        with transaction.atomic():
            form.save()
            try:
                from controlplane.routing.service import request_publish
            except ImportError:
                request_publish = None
            if request_publish is not None:  # routing weights and thresholds are in the table
                request_publish(cluster_obj.pk, cause=f"policy change by {request.user}",
                                actor=f"user:{request.user.username}")
        scope = model.name if model else "cluster default"
        messages.success(request, f"Policy saved ({cluster_obj.name} / {scope}).")
        return redirect("dashboard:policies")
    return render(request, "dashboard/policy_form.html",
                  {"form": form, "cluster": cluster_obj, "model": model})
