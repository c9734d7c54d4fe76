"""The one outbox: every message pdplane owes someone else, and every attempt to send it.

Domain code writes a row of its own model, a child of :class:`Message` (multi-table
inheritance: ``alerts.Delivery`` for a webhook, ``routing.GatewayDelivery`` for a table
push), and the worker loop (``tasks.deliver_due``) delivers it through the deliverer
registered for its ``kind``. The lease fields, the retry timing and the attempt log live
here once; the child table holds only what the message is about.

Long waits live in ``next_attempt_at``, never in Celery countdowns (the Redis broker's
visibility timeout would redeliver them in a loop; reference/RELIABILITY.md).
"""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from controlplane.core.models import TimestampedModel


class Status(models.TextChoices):
    PENDING = "pending", "Pending (waiting for its next attempt)"
    SENDING = "sending", "Sending (claimed by a worker, under lease)"
    DELIVERED = "delivered", "Delivered (the receiver has it)"
    FAILED = "failed", "Failed (refused, or attempts used up)"
    CANCELLED = "cancelled", "Cancelled (no longer wanted)"


IN_FLIGHT = (Status.PENDING, Status.SENDING)


class Message(TimestampedModel):
    """One message to one receiver; the unit of claim, lease and retry."""

    kind = models.CharField(max_length=32, editable=False,
                            help_text="Which deliverer sends it (outbox.registry)")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    outcome = models.CharField(
        max_length=16, blank=True,
        help_text="The last answer in the deliverer's words (ack, nack, retry, lost, …)",
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        default=timezone.now, null=True, blank=True,
        help_text="Empty: never picked up by the worker loop (sent once, by its caller)",
    )
    claimed_by = models.CharField(max_length=100, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    lease_until = models.DateTimeField(
        null=True, blank=True, help_text="A claim not finished by then is presumed dead"
    )
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # Set by each child model; written into ``kind`` on first save.
    outbox_kind = ""

    class Meta:
        ordering = ["-created"]
        # One index: due rows in order (claims), and the few claimed ones (reclaims).
        # Every claim and attempt rewrites status, so each extra index costs writes;
        # ``kind`` is a filter on the few pending rows, not worth one.
        indexes = [models.Index(fields=["status", "next_attempt_at"], name="outbox_due")]

    def __str__(self):
        return f"{self.kind} #{self.pk} ({self.status})"

    def save(self, *args, **kwargs):
        if not self.kind:
            self.kind = self.outbox_kind
        if not self.kind:
            raise ValueError("an outbox message needs a kind: save a child model")
        super().save(*args, **kwargs)


class Attempt(models.Model):
    message = models.ForeignKey(Message, on_delete=models.CASCADE, related_name="attempt_log")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    worker = models.CharField(max_length=100, blank=True)
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.FloatField()
    response_excerpt = models.TextField(blank=True)
    error = models.TextField(blank=True)
    outcome = models.CharField(max_length=16)
    detail = models.JSONField(default=dict, blank=True,
                              help_text="What this kind of answer adds (applied_version, …)")

    class Meta:
        ordering = ["message", "number", "pk"]

    def __str__(self):
        return f"#{self.message_id}.{self.number}: {self.outcome}"
