from __future__ import annotations

import json
from datetime import timedelta

from django import forms
from django.utils import timezone

from . import ssrf
from .conf import load
from .models import AlertRule, Severity, WebhookEndpoint


class LabelsField(forms.CharField):
    """``key=value`` pairs, comma-separated; cleaned to a dict of strings."""

    def to_python(self, value):
        value = (super().to_python(value) or "").strip()
        if not value:
            return {}
        if value.startswith("{"):
            try:
                data = json.loads(value)
            except ValueError:
                raise forms.ValidationError("Not valid JSON.") from None
        else:
            data = {}
            for item in value.split(","):
                key, sep, val = item.partition("=")
                if not sep or not key.strip():
                    raise forms.ValidationError(f"{item.strip()!r} is not label=value.")
                data[key.strip()] = val.strip()
        if not isinstance(data, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in data.items()
        ):
            raise forms.ValidationError("Give label=value pairs.")
        return data

    def prepare_value(self, value):
        if isinstance(value, dict):
            return ", ".join(f"{k}={v}" for k, v in value.items())
        return value


class EndpointForm(forms.ModelForm):
    label_filters = LabelsField(required=False, help_text="e.g. cluster=prod, model=llama")

    class Meta:
        model = WebhookEndpoint
        fields = ["name", "url", "format", "min_severity", "label_filters", "enabled"]

    def clean_url(self):
        url = self.cleaned_data["url"]
        try:
            ssrf.check_url_static(url, load().allow)
        except ssrf.UnsafeTarget as exc:
            raise forms.ValidationError(str(exc)) from None
        return url


class SilenceForm(forms.Form):
    matchers = LabelsField(help_text="Alerts with all these labels are muted, e.g. node=gpu-07")
    hours = forms.FloatField(min_value=0.05, max_value=24 * 30, initial=2)
    comment = forms.CharField(max_length=200)

    def window(self):
        now = timezone.now()
        return now, now + timedelta(hours=self.cleaned_data["hours"])


class AlertRuleForm(forms.ModelForm):
    severity = forms.ChoiceField(choices=[("", "(default)"), *Severity.choices], required=False)

    class Meta:
        model = AlertRule
        fields = ["rule", "cluster", "enabled", "severity", "for_seconds", "threshold"]
