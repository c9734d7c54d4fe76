from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "controlplane.dashboard"
    label = "dashboard"
    verbose_name = "Dashboard"

    def ready(self):
        from . import signals

        signals.connect()
