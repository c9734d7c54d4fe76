from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "controlplane.routing"
    label = "routing"
    verbose_name = "Routing tables"

    def ready(self):
        from controlplane.outbox import registry as outbox

        from .delivery import RoutingPushDeliverer

        outbox.register(RoutingPushDeliverer())
