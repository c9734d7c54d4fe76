from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "controlplane.outbox"
    label = "outbox"
    verbose_name = "Outbox"

    def ready(self):
        try:
            from controlplane.audit import registry
        except ImportError:
            return
        # Rewritten on every claim and attempt: a log of their own, not configuration.
        for name in ("Message", "Attempt"):
            registry.register(f"outbox.{name}", exclude=True)
