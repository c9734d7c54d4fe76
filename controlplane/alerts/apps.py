from django.apps import AppConfig

# Rewritten on every evaluation or delivery attempt: state and logs of their own, not
# configuration changes worth a change record.
NOT_AUDITED = ("Alert", "AlertGroup", "EvaluatorMemory", "Delivery")


class AlertsConfig(AppConfig):
    name = "controlplane.alerts"
    label = "alerts"
    verbose_name = "Alerts"

    def ready(self):
        from controlplane.outbox import registry as outbox

        from .delivery import WebhookDeliverer

        outbox.register(WebhookDeliverer())
        try:
            from controlplane.audit import registry
        except ImportError:
            return
        for name in NOT_AUDITED:
            registry.register(f"alerts.{name}", exclude=True)
        # The rotation overlap keeps the old signing secret; never log it either.
        registry.SECRET_FIELDS.add("previous_secret")
