from django.contrib import admin

from .models import ModelPlannerState, Plan


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("pk", "cluster", "served_model", "status", "current_layout",
                    "target_layout", "created", "decided_by")
    list_filter = ("status", "cluster")
    readonly_fields = ("inputs", "predictions", "chosen", "diff", "explanation")

    # Derived records (the planner / the table builder write them): viewable, never added
    # or edited by hand — approve or reject plans in the dashboard or the API.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(ModelPlannerState)
class ModelPlannerStateAdmin(admin.ModelAdmin):
    list_display = ("served_model", "last_run_at", "last_action", "last_reason",
                    "ttft_factor", "itl_factor", "expected_output_tokens")
