"""Routing tables (one monotonically versioned series per cluster) and their delivery.

A :class:`RoutingTableVersion` is immutable once stored. A :class:`GatewayDelivery` is an
outbox row: "bring this gateway up to the cluster's latest table", claimed by a
conditional update and retried with backoff + jitter via ``next_attempt_at`` (long waits
live in the database, not in Celery; see reference/RELIABILITY.md on the visibility
timeout). Every HTTP attempt is kept as a :class:`DeliveryAttempt` for the operator.
"""

from django.db import models

from controlplane.core.models import TimestampedModel


class RoutingTableVersion(models.Model):
    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.CASCADE, related_name="routing_tables"
    )
    version = models.PositiveBigIntegerField()
    body = models.JSONField(help_text="The table as pushed (docs/routing-table.md)")
    content_sha = models.CharField(
        max_length=64, help_text="SHA-256 of the canonical body without its version number"
    )
    cause = models.CharField(max_length=200, help_text="What made the table change")
    actor = models.CharField(max_length=150, default="system", help_text="Who caused it")
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster", "-version"]
        get_latest_by = "version"
        constraints = [
            models.UniqueConstraint(
                fields=["cluster", "version"], name="routingtable_unique_version"
            ),
        ]

    def __str__(self):
        return f"{self.cluster} v{self.version}"

    @property
    def etag(self) -> str:
        return f'"v{self.version}-{self.content_sha[:16]}"'

    @classmethod
    def latest_per_cluster(cls) -> dict[int, int]:
        """cluster id → newest table version (one grouped query)."""
        return dict(cls.objects.values_list("cluster_id").annotate(v=models.Max("version")))


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending (waiting for its next attempt)"
    SENDING = "sending", "Sending (claimed by a worker)"
    ACKED = "acked", "Acknowledged"
    NACKED = "nacked", "Refused as invalid (gateway kept its last good table)"
    STALE = "stale", "Refused as stale (gateway already has a newer table)"
    SUPERSEDED = "superseded", "Superseded by a newer table before it was sent"
    FAILED = "failed", "Gave up (unreachable or refused)"


class GatewayDelivery(TimestampedModel):
    """Bring one gateway to one table version; the unit of retry."""

    gateway = models.ForeignKey(
        "topology.Gateway", on_delete=models.CASCADE, related_name="deliveries"
    )
    table = models.ForeignKey(
        RoutingTableVersion, on_delete=models.CASCADE, related_name="deliveries"
    )
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "gateway deliveries"
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self):
        return f"{self.gateway} ← v{self.table.version} ({self.status})"


class DeliveryAttempt(models.Model):
    delivery = models.ForeignKey(
        GatewayDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16)
    error = models.TextField(blank=True)
    applied_version = models.PositiveBigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["-started_at"]

    def __str__(self):
        return f"{self.delivery_id} {self.outcome} {self.status_code}"
