from django.contrib import admin

from .models import Policy


@admin.register(Policy)
class PolicyAdmin(admin.ModelAdmin):
    list_display = ["__str__", "ttft_p95_ms", "itl_p95_ms", "disaggregation_mode",
                    "rebalancing_mode", "updated"]
    list_filter = ["cluster", "rebalancing_mode", "disaggregation_mode"]
