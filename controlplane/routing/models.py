"""Routing tables (one monotonically versioned series per cluster) and their delivery.

A :class:`RoutingTableVersion` is immutable once stored. A :class:`GatewayDelivery` is a
row of the one outbox (``controlplane.outbox``): "bring this gateway up to the cluster's
latest table". The outbox claims it with a conditional update, retries it with backoff +
jitter via ``next_attempt_at`` and keeps every HTTP attempt in its attempt log.
"""

from django.db import models

from controlplane.outbox.models import Message


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


ROUTING_PUSH_KIND = "routing.push"
# How a gateway answered (xDS semantics, delivery.py), kept as the outbox row's outcome.
ACK, STALE, NACK, SUPERSEDED = "ack", "stale", "nack", "superseded"


class GatewayDelivery(Message):
    """Bring one gateway to one table version: a row of the one outbox (claim, lease,
    retries and the attempt log live in ``outbox.Message``), sent by
    ``delivery.RoutingPushDeliverer``."""

    outbox_kind = ROUTING_PUSH_KIND

    gateway = models.ForeignKey(
        "topology.Gateway", on_delete=models.CASCADE, related_name="deliveries"
    )
    table = models.ForeignKey(
        RoutingTableVersion, on_delete=models.CASCADE, related_name="deliveries"
    )

    class Meta:
        ordering = ["-created"]
        verbose_name_plural = "gateway deliveries"

    def __str__(self):
        return f"{self.gateway} ← v{self.table.version} ({self.status})"
