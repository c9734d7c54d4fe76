from django.urls import path

from . import views

app_name = "alerts"
urlpatterns = [
    path("", views.alert_list, name="list"),
    path("<int:pk>/ack/", views.alert_ack, name="ack"),
    path("silences/", views.silence_create, name="silence-create"),
    path("silences/<int:pk>/expire/", views.silence_expire, name="silence-expire"),
    path("rules/", views.rule_list, name="rules"),
    path("rules/<int:pk>/delete/", views.rule_delete, name="rule-delete"),
    path("endpoints/", views.endpoint_list, name="endpoints"),
    path("endpoints/new/", views.endpoint_create, name="endpoint-create"),
    path("endpoints/<int:pk>/", views.endpoint_edit, name="endpoint-edit"),
    path("endpoints/<int:pk>/rotate/", views.endpoint_rotate, name="endpoint-rotate"),
    path("endpoints/<int:pk>/test/", views.endpoint_test, name="endpoint-test"),
    path("deliveries/", views.delivery_list, name="deliveries"),
    path("deliveries/<int:pk>/", views.delivery_detail, name="delivery"),
    path("deliveries/<int:pk>/redeliver/", views.delivery_redeliver, name="redeliver"),
]
