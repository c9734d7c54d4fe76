from django.urls import path

from . import views

app_name = "routing"
urlpatterns = [
    path("v1/clusters/<slug:cluster_name>/table", views.table_pull, name="table-pull"),
    path("v1/clusters/<slug:cluster_name>/diff", views.table_diff, name="table-diff"),
    path("v1/clusters/<slug:cluster_name>/gateways", views.gateway_status,
         name="gateway-status"),
]
