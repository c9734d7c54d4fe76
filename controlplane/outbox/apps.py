from django.apps import AppConfig


class OutboxConfig(AppConfig):
    # Messages and attempts are never audited (audit.registry.NOT_AUDITED): they are a
    # log of their own, rewritten on every claim and attempt.
    name = "controlplane.outbox"
    label = "outbox"
    verbose_name = "Outbox"
