from django.urls import path

from . import pages, policypage, views, whatifpage

app_name = "dashboard"
urlpatterns = [
    path("", views.topology_view, name="topology"),
    path("live/poll", views.live_poll_view, name="live-poll"),
    path("nodes/<int:pk>/", views.node_view, name="node"),
    path("nodes/<int:pk>/workers/<int:worker_pk>/<str:action>", pages.worker_action_view,
         name="worker-action"),
    path("models/", pages.models_view, name="models"),
    path("models/whatif", whatifpage.whatif_fragment_view, name="whatif"),
    path("plans/", pages.plans_view, name="plans"),
    path("plans/<int:pk>/<str:decision>", pages.plan_decision_view, name="plan-decision"),
    path("tables/", pages.routing_view, name="routing"),
    path("changelog/", pages.audit_view, name="audit"),
    path("policies/", policypage.policies_view, name="policies"),
    path("policies/<str:cluster>/edit", policypage.policy_edit_view, name="policy-edit"),
    path("policies/<str:cluster>/models/<int:model_id>/edit", policypage.policy_edit_view,
         name="policy-edit-model"),
]
