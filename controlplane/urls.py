from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path

from controlplane.observability.views import metrics_view, prometheus_targets_view


def healthz(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    path("admin/", admin.site.urls),
    # Before the API include: a plain view Prometheus can call with a bearer token.
    path("api/v1/prometheus/targets", prometheus_targets_view, name="prometheus-targets"),
    path("api/", include("controlplane.api.urls")),
    path("routing/", include("controlplane.routing.urls")),
    path("telemetry/", include("controlplane.telemetry.urls")),
    path("planner/", include("controlplane.planner.urls")),
    path("alerts/", include("controlplane.alerts.urls")),
    path("audit/", include("controlplane.audit.urls")),
    path("accounts/", include("controlplane.accounts.urls")),
    path("", include("controlplane.dashboard.urls")),
]

# JSON errors under /api/, Django's pages elsewhere.
handler404 = "controlplane.api.errors.handler404"
handler500 = "controlplane.api.errors.handler500"
