from django.contrib import admin

from .models import DeliveryAttempt, GatewayDelivery, RoutingTableVersion


@admin.register(RoutingTableVersion)
class RoutingTableVersionAdmin(admin.ModelAdmin):
    list_display = ["cluster", "version", "cause", "actor", "created", "short_sha"]
    list_filter = ["cluster"]
    search_fields = ["cause", "actor"]
    readonly_fields = ["cluster", "version", "body", "content_sha", "cause", "actor", "created"]

    @admin.display(description="sha")
    def short_sha(self, obj):
        return obj.content_sha[:12]


class DeliveryAttemptInline(admin.TabularInline):
    model = DeliveryAttempt
    extra = 0
    can_delete = False
    readonly_fields = ["started_at", "duration_ms", "status_code", "outcome", "error",
                       "applied_version"]


@admin.register(GatewayDelivery)
class GatewayDeliveryAdmin(admin.ModelAdmin):
    list_display = ["gateway", "table", "status", "attempts", "next_attempt_at",
                    "last_status_code", "last_error"]
    list_filter = ["status", "gateway__cluster"]
    readonly_fields = ["gateway", "table", "attempts", "last_status_code", "last_error",
                       "finished_at", "claimed_until"]
    inlines = [DeliveryAttemptInline]
