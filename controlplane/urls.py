from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path


def healthz(request):
    return JsonResponse({"status": "ok"})


urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("api/", include("controlplane.api.urls")),
    path("routing/", include("controlplane.routing.urls")),
    path("telemetry/", include("controlplane.telemetry.urls")),
    path("planner/", include("controlplane.planner.urls")),
    path("alerts/", include("controlplane.alerts.urls")),
    path("audit/", include("controlplane.audit.urls")),
    path("accounts/", include("controlplane.accounts.urls")),
    path("", include("controlplane.dashboard.urls")),
]
