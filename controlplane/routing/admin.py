from django.contrib import admin

from controlplane.outbox.admin import MESSAGE_FIELDS, AttemptInline

from .models import GatewayDelivery, RoutingTableVersion


@admin.register(RoutingTableVersion)
class RoutingTableVersionAdmin(admin.ModelAdmin):
    list_display = ["cluster", "version", "cause", "actor", "created", "short_sha"]
    list_filter = ["cluster"]
    search_fields = ["cause", "actor"]
    readonly_fields = ["cluster", "version", "body", "content_sha", "cause", "actor", "created"]

    # Derived records (the planner / the table builder write them): viewable, never added
    # or edited by hand — approve or reject plans in the dashboard or the API.
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    @admin.display(description="sha")
    def short_sha(self, obj):
        return obj.content_sha[:12]


@admin.register(GatewayDelivery)
class GatewayDeliveryAdmin(admin.ModelAdmin):
    list_display = ["gateway", "table", "status", "outcome", "attempts", "next_attempt_at",
                    "last_status_code", "last_error"]
    list_filter = ["status", "outcome", "gateway__cluster"]
    readonly_fields = ["gateway", "table", *MESSAGE_FIELDS]
    inlines = [AttemptInline]
