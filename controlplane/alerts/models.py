"""Alert rules, alert state, silences, webhook endpoints and webhook deliveries.

The evaluation and lifecycle logic is pure (``rules.py``, ``lifecycle.py``); these models
only hold its configuration and state. A ``Delivery`` is a row of the one outbox
(``controlplane.outbox``): the evaluator writes it, the outbox's worker loop sends it
through ``delivery.WebhookDeliverer``.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from django.utils import timezone

from controlplane.core.models import TimestampedModel
from controlplane.outbox.models import Message, Status

from . import rules, signing


class Severity(models.TextChoices):
    INFO = "info", "Info"
    WARNING = "warning", "Warning"
    CRITICAL = "critical", "Critical"


RULE_CHOICES = [(name, name) for name in rules.DEFAULT_RULES]


class AlertRule(TimestampedModel):
    """Overrides one built-in rule's knobs, for one cluster or (cluster empty) for all.

    Fields left empty inherit the built-in default shown in ``rules.DEFAULT_RULES``.
    """

    rule = models.CharField(max_length=64, choices=RULE_CHOICES)
    cluster = models.ForeignKey(
        "topology.Cluster",
        on_delete=models.CASCADE,
        null=True,
        blank=True,
        related_name="alert_rules",
        help_text="Empty: applies to every cluster",
    )
    enabled = models.BooleanField(default=True)
    severity = models.CharField(max_length=16, choices=Severity.choices, blank=True)
    for_seconds = models.FloatField(
        null=True, blank=True, help_text="How long the condition must hold before firing"
    )
    threshold = models.FloatField(null=True, blank=True, help_text="Meaning depends on the rule")

    class Meta:
        ordering = ["rule", "cluster"]
        constraints = [
            models.UniqueConstraint(
                fields=["rule", "cluster"], name="alertrule_unique_per_cluster"
            ),
            models.UniqueConstraint(
                fields=["rule"], condition=Q(cluster=None), name="alertrule_unique_global"
            ),
        ]

    def __str__(self):
        return f"{self.rule} ({self.cluster or 'all clusters'})"

    def override(self) -> dict:
        return {
            "enabled": self.enabled,
            "severity": self.severity or None,
            "for_s": self.for_seconds,
            "threshold": self.threshold,
        }

    def clean(self):
        if self.for_seconds is not None and self.for_seconds < 0:
            raise ValidationError({"for_seconds": "Must not be negative."})


class AlertStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    FIRING = "firing", "Firing"
    RESOLVED = "resolved", "Resolved"


class Alert(models.Model):
    """One episode of one alert (a fingerprint). ``is_open`` rows are lifecycle state;
    closed rows are history."""

    fingerprint = models.CharField(max_length=16, db_index=True)
    rule = models.CharField(max_length=64)
    severity = models.CharField(max_length=16, choices=Severity.choices)
    labels = models.JSONField(default=dict)
    annotations = models.JSONField(default=dict)
    group_key = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=AlertStatus.choices)
    is_open = models.BooleanField(default=True)
    for_seconds = models.FloatField(default=0)
    active_since = models.DateTimeField()
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    notified_firing = models.BooleanField(default=False)
    silenced = models.BooleanField(default=False)
    acknowledged_at = models.DateTimeField(null=True, blank=True)
    acknowledged_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    last_evaluated_at = models.DateTimeField()

    class Meta:
        ordering = ["-active_since"]
        constraints = [
            models.UniqueConstraint(
                fields=["fingerprint"], condition=Q(is_open=True), name="alert_one_open_episode"
            ),
        ]
        indexes = [models.Index(fields=["is_open", "status"])]

    def __str__(self):
        return f"{self.rule} {self.labels}"

    @property
    def summary(self) -> str:
        return self.annotations.get("summary", "")

    @property
    def acknowledged(self) -> bool:
        return self.acknowledged_at is not None


class AlertGroup(models.Model):
    """Notification state of one group (lifecycle.GroupState)."""

    group_key = models.CharField(max_length=500, unique=True)
    group_labels = models.JSONField(default=dict)
    first_ready_at = models.DateTimeField(null=True, blank=True)
    last_notified_at = models.DateTimeField(null=True, blank=True)
    last_digest = models.TextField(blank=True)

    def __str__(self):
        return self.group_key


class EvaluatorMemory(models.Model):
    """What rules remember between runs (previous NIC counters, hit-rate baselines)."""

    name = models.CharField(max_length=32, unique=True, default="default")
    data = models.JSONField(default=dict)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self):
        return self.name


class Silence(TimestampedModel):
    """Mutes alerts whose labels include every matcher, from ``starts_at`` to ``ends_at``."""

    matchers = models.JSONField(help_text='Label → value, e.g. {"node": "gpu-07"}')
    starts_at = models.DateTimeField(default=timezone.now)
    ends_at = models.DateTimeField()
    comment = models.CharField(max_length=200)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )

    class Meta:
        ordering = ["-ends_at"]

    def __str__(self):
        return f"{self.matchers} until {self.ends_at:%Y-%m-%d %H:%M}"

    def clean(self):
        errors = {}
        if not isinstance(self.matchers, dict) or not self.matchers:
            errors["matchers"] = "Give at least one label: value pair."
        elif not all(isinstance(k, str) and isinstance(v, str) for k, v in self.matchers.items()):
            errors["matchers"] = "Labels and values must be strings."
        if self.ends_at and self.starts_at and self.ends_at <= self.starts_at:
            errors["ends_at"] = "Must be after the start."
        if errors:
            raise ValidationError(errors)

    @property
    def is_active(self) -> bool:
        now = timezone.now()
        return self.starts_at <= now < self.ends_at


class WebhookFormat(models.TextChoices):
    NATIVE = "native", "pdplane JSON"
    ALERTMANAGER = "alertmanager", "Alertmanager v4 compatible"


class WebhookEndpoint(TimestampedModel):
    name = models.SlugField(max_length=64, unique=True)
    url = models.URLField(max_length=500)
    format = models.CharField(
        max_length=16, choices=WebhookFormat.choices, default=WebhookFormat.NATIVE
    )
    secret = models.CharField(max_length=128, default=signing.generate_secret, editable=False)
    previous_secret = models.CharField(max_length=128, blank=True, editable=False)
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    min_severity = models.CharField(
        max_length=16,
        choices=Severity.choices,
        default=Severity.INFO,
        help_text="Send only alerts at least this severe",
    )
    label_filters = models.JSONField(
        default=dict,
        blank=True,
        help_text='Send only alerts with these labels, e.g. {"cluster": "prod"}',
    )
    enabled = models.BooleanField(default=True)
    disabled_reason = models.CharField(max_length=300, blank=True)
    disabled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name

    def signing_secrets(self, now=None) -> list[str]:
        """The current secret, plus the previous one while the rotation overlap lasts."""
        now = now or timezone.now()
        out = [self.secret]
        if (
            self.previous_secret
            and self.previous_secret_expires_at
            and now < self.previous_secret_expires_at
        ):
            out.append(self.previous_secret)
        return out

    def rotate_secret(self, overlap: timedelta = timedelta(hours=24)) -> str:
        """New secret; the old one keeps signing alongside for ``overlap``. Caller saves."""
        self.previous_secret = self.secret
        self.previous_secret_expires_at = timezone.now() + overlap
        self.secret = signing.generate_secret()
        return self.secret

    def accepts(self, labels: dict) -> bool:
        sev = labels.get("severity", "info")
        if rules.SEVERITY_RANK.get(sev, 0) < rules.SEVERITY_RANK.get(self.min_severity, 0):
            return False
        return all(labels.get(k) == v for k, v in (self.label_filters or {}).items())

    def clean(self):
        if not isinstance(self.label_filters, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.label_filters.items()
        ):
            raise ValidationError({"label_filters": "Give label: value pairs (strings)."})


# Webhook deliveries use the outbox's statuses as they are.
DeliveryStatus = Status

WEBHOOK_KIND = "alerts.webhook"


class Delivery(Message):
    """One message to one endpoint, an outbox row (claim, lease, retries and attempt log
    live in ``outbox.Message``). ``webhook_id`` and ``payload`` never change across
    retries, so receivers can dedupe on the id."""

    outbox_kind = WEBHOOK_KIND

    endpoint = models.ForeignKey(
        WebhookEndpoint, on_delete=models.CASCADE, related_name="deliveries"
    )
    webhook_id = models.CharField(max_length=64, unique=True, default=signing.new_message_id)
    event_type = models.CharField(max_length=64)
    group_key = models.CharField(max_length=500, blank=True)
    notification_status = models.CharField(max_length=16, blank=True, help_text="firing|resolved")
    payload = models.JSONField()
    is_test = models.BooleanField(default=False)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "deliveries"

    def __str__(self):
        return f"{self.webhook_id} → {self.endpoint}"

    @property
    def delivered_at(self):
        return self.finished_at if self.status == Status.DELIVERED else None
