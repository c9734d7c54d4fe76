"""Gateway deliveries move into the one outbox (outbox.Message + outbox.Attempt).

A new child table of outbox.Message takes every existing delivery with its attempts; the
old statuses become the outbox's status plus the gateway's answer as ``outcome``
(acked → delivered/ack, stale → delivered/stale, nacked → failed/nack, superseded →
cancelled/superseded, failed → failed). ``claimed_until`` becomes the lease. 0003 drops
the old tables and gives the new one the old name. Row ids are new.
"""

from datetime import timedelta

import django.db.models.deletion
from django.db import migrations, models

KIND = "routing.push"
CLAIM_S = 60
STATUS = {
    "pending": ("pending", ""),
    "sending": ("sending", ""),
    "acked": ("delivered", "ack"),
    "stale": ("delivered", "stale"),
    "nacked": ("failed", "nack"),
    "superseded": ("cancelled", "superseded"),
    "failed": ("failed", "failed"),
}


def move_deliveries(apps, schema_editor):
    Old = apps.get_model("routing", "GatewayDelivery")
    OldAttempt = apps.get_model("routing", "DeliveryAttempt")
    New = apps.get_model("routing", "OutboxGatewayDelivery")
    Message = apps.get_model("outbox", "Message")
    Attempt = apps.get_model("outbox", "Attempt")
    for old in Old.objects.order_by("pk").iterator():
        attempts = list(OldAttempt.objects.filter(delivery_id=old.pk).order_by("started_at", "pk"))
        status, outcome = STATUS.get(old.status, ("failed", old.status[:16]))
        new = New.objects.create(
            kind=KIND,
            status=status,
            outcome=outcome or (attempts[-1].outcome if attempts else ""),
            attempts=old.attempts,
            next_attempt_at=old.next_attempt_at if status == "pending" else None,
            claimed_at=old.claimed_until - timedelta(seconds=CLAIM_S)
            if old.claimed_until else None,
            lease_until=old.claimed_until,
            last_status_code=old.last_status_code,
            last_error=old.last_error,
            finished_at=old.finished_at,
            gateway_id=old.gateway_id,
            table_id=old.table_id,
        )
        Message.objects.filter(pk=new.pk).update(created=old.created, updated=old.updated)
        Attempt.objects.bulk_create(
            Attempt(
                message_id=new.pk,
                number=n,
                started_at=a.started_at,
                status_code=a.status_code,
                latency_ms=a.duration_ms,
                error=a.error,
                outcome=a.outcome,
                detail={"applied_version": a.applied_version},
            )
            for n, a in enumerate(attempts, start=1)
        )


class Migration(migrations.Migration):

    dependencies = [
        ("routing", "0001_initial"),
        ("topology", "0001_initial"),
        ("outbox", "0002_due_now_by_default"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxGatewayDelivery",
            fields=[
                ("message_ptr", models.OneToOneField(auto_created=True, on_delete=django.db.models.deletion.CASCADE, parent_link=True, primary_key=True, serialize=False, to="outbox.message")),
                ("gateway", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="topology.gateway")),
                ("table", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="routing.routingtableversion")),
            ],
            options={
                "verbose_name_plural": "gateway deliveries",
                "ordering": ["-created"],
            },
            bases=("outbox.message",),
        ),
        migrations.RunPython(move_deliveries, migrations.RunPython.noop, elidable=False),
    ]
