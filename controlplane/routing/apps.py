from django.apps import AppConfig


class RoutingConfig(AppConfig):
    name = "controlplane.routing"
    label = "routing"
    verbose_name = "Routing tables"
