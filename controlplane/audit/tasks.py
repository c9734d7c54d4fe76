from datetime import timedelta

from celery import shared_task
from django.conf import settings
from django.utils import timezone


@shared_task(name="audit.prune_change_records")
def prune_change_records() -> int:
    """Delete change records older than AUDIT_RETENTION_DAYS (0 keeps them forever) and
    idempotency keys past their 24 h lifetime."""
    from controlplane.api.models import IdempotencyKey

    from .models import ChangeRecord

    IdempotencyKey.objects.expired().delete()
    days = settings.AUDIT_RETENTION_DAYS
    if days <= 0:
        return 0
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = ChangeRecord.objects.filter(time__lt=cutoff).delete()
    return deleted
