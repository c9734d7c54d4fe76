"""Every pdplane model is reachable in the admin (issue 2: "Admin registered for every model")."""

from django.apps import apps
from django.contrib import admin

# Shown inline under their parent, or bookkeeping no operator browses or edits.
NOT_IN_ADMIN = {
    "outbox.Attempt",  # the attempt log, inline under each message
    "alerts.EvaluatorMemory",  # the evaluator's own between-cycle state
    "api.IdempotencyKey",  # stored responses for replayed POSTs, expire after 24 h
}


def test_every_pdplane_model_is_registered():
    missing = [
        f"{model._meta.app_label}.{model.__name__}"
        for model in apps.get_models()
        if model.__module__.startswith("controlplane.")
        and f"{model._meta.app_label}.{model.__name__}" not in NOT_IN_ADMIN
        and not admin.site.is_registered(model)
    ]
    assert missing == []
