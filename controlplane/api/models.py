"""Stored responses for ``Idempotency-Key`` (Stripe's model): a retried POST with the same
key and body gets the first response back instead of acting twice."""

from datetime import timedelta

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.utils import timezone

IDEMPOTENCY_KEY_TTL = timedelta(hours=24)


class IdempotencyKeyQuerySet(models.QuerySet):
    def live(self):
        return self.filter(created__gte=timezone.now() - IDEMPOTENCY_KEY_TTL)

    def expired(self):
        return self.filter(created__lt=timezone.now() - IDEMPOTENCY_KEY_TTL)


class IdempotencyKey(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    # SHA-256 of method, path and body: the same key with another request is refused.
    fingerprint = models.CharField(max_length=64)
    response_status = models.PositiveSmallIntegerField()
    response_body = models.JSONField(null=True, encoder=DjangoJSONEncoder)
    created = models.DateTimeField(default=timezone.now, db_index=True)

    objects = IdempotencyKeyQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "key"], name="idempotency_key_unique"),
        ]

    def __str__(self):
        return f"{self.user_id}:{self.key}"
