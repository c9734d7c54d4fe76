"""Webhook deliveries move into the one outbox (outbox.Message + outbox.Attempt).

A new child table of outbox.Message takes every existing delivery (same webhook-id, body,
status, attempts, schedule and claim; an open claim gets the default 120 s lease from
its claim time) and its attempts; 0003 drops the old tables and gives the new one the
old name. Row ids are new (they come from the outbox's sequence); the webhook-id, which
receivers dedupe on, is kept.
"""

import django.db.models.deletion
from django.db import migrations, models

import controlplane.alerts.signing

KIND = "alerts.webhook"
LEASE_S = 120  # ALERTS_CLAIM_LEASE_S's default


def move_deliveries(apps, schema_editor):
    from datetime import timedelta

    Old = apps.get_model("alerts", "Delivery")
    OldAttempt = apps.get_model("alerts", "DeliveryAttempt")
    New = apps.get_model("alerts", "OutboxDelivery")
    Message = apps.get_model("outbox", "Message")
    Attempt = apps.get_model("outbox", "Attempt")
    for old in Old.objects.order_by("pk").iterator():
        attempts = list(OldAttempt.objects.filter(delivery_id=old.pk).order_by("number", "pk"))
        finished = old.status in ("delivered", "failed", "cancelled")
        new = New.objects.create(
            kind=KIND,
            status=old.status,
            outcome=attempts[-1].outcome if attempts else "",
            attempts=old.attempts,
            next_attempt_at=old.next_attempt_at,
            claimed_by=old.claimed_by,
            claimed_at=old.claimed_at,
            lease_until=old.claimed_at + timedelta(seconds=LEASE_S) if old.claimed_at else None,
            last_status_code=old.last_status_code,
            last_error=old.last_error,
            finished_at=(old.delivered_at or old.updated) if finished else None,
            endpoint_id=old.endpoint_id,
            webhook_id=old.webhook_id,
            event_type=old.event_type,
            group_key=old.group_key,
            notification_status=old.notification_status,
            payload=old.payload,
            is_test=old.is_test,
        )
        Message.objects.filter(pk=new.pk).update(created=old.created, updated=old.updated)
        Attempt.objects.bulk_create(
            Attempt(
                message_id=new.pk,
                number=a.number,
                started_at=a.started_at,
                worker=a.worker,
                status_code=a.status_code,
                latency_ms=a.latency_ms,
                response_excerpt=a.response_excerpt,
                error=a.error,
                outcome=a.outcome,
            )
            for a in attempts
        )


class Migration(migrations.Migration):

    dependencies = [
        ("alerts", "0001_initial"),
        ("outbox", "0001_messages_and_attempts"),
    ]

    operations = [
        migrations.CreateModel(
            name="OutboxDelivery",
            fields=[
                ("message_ptr", models.OneToOneField(auto_created=True, on_delete=django.db.models.deletion.CASCADE, parent_link=True, primary_key=True, serialize=False, to="outbox.message")),
                ("webhook_id", models.CharField(default=controlplane.alerts.signing.new_message_id, max_length=64, unique=True)),
                ("event_type", models.CharField(max_length=64)),
                ("group_key", models.CharField(blank=True, max_length=500)),
                ("notification_status", models.CharField(blank=True, help_text="firing|resolved", max_length=16)),
                ("payload", models.JSONField()),
                ("is_test", models.BooleanField(default=False)),
                ("endpoint", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="+", to="alerts.webhookendpoint")),
            ],
            options={
                "verbose_name_plural": "deliveries",
                "ordering": ["-created"],
            },
            bases=("outbox.message",),
        ),
        migrations.RunPython(move_deliveries, migrations.RunPython.noop, elidable=False),
    ]
