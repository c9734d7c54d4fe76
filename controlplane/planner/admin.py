from django.contrib import admin

from .models import ModelPlannerState, Plan


@admin.register(Plan)
class PlanAdmin(admin.ModelAdmin):
    list_display = ("pk", "cluster", "served_model", "status", "current_layout",
                    "target_layout", "created", "decided_by")
    list_filter = ("status", "cluster")
    readonly_fields = ("inputs", "predictions", "chosen", "diff", "explanation")


@admin.register(ModelPlannerState)
class ModelPlannerStateAdmin(admin.ModelAdmin):
    list_display = ("served_model", "last_run_at", "last_action", "last_reason",
                    "ttft_factor", "itl_factor", "expected_output_tokens")
