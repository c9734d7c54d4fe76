from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.routers import DefaultRouter

from controlplane.accounts.api import ClusterMembershipViewSet
from controlplane.alerts.api import register as register_alert_resources

from . import views, views_live, views_planner

app_name = "api"

router = DefaultRouter()
router.register("clusters", views.ClusterViewSet)
router.register("fabrics", views.FabricViewSet)
router.register("nodes", views.NodeViewSet)
router.register("gpus", views.GPUViewSet)
router.register("nics", views.NICViewSet)
router.register("served-models", views.ServedModelViewSet)
router.register("workers", views.WorkerViewSet)
router.register("gateways", views.GatewayViewSet)
router.register("policies", views.PolicyViewSet)
router.register("audit", views.ChangeRecordViewSet)
router.register("tokens", views.APITokenViewSet)
router.register("cluster-memberships", ClusterMembershipViewSet,
                basename="cluster-membership")
router.register("routing-tables", views_live.RoutingTableViewSet)
router.register("plans", views_planner.PlanViewSet)
register_alert_resources(router)  # alerts, rules, silences, webhook endpoints/deliveries

urlpatterns = [
    path("v1/what-if/", views_planner.WhatIfView.as_view(), name="what-if"),
    path("v1/", include(router.urls)),
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path("docs/", SpectacularSwaggerView.as_view(url_name="api:schema"), name="docs"),
]
