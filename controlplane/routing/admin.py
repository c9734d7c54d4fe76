from django.contrib import admin

from controlplane.outbox.admin import MESSAGE_FIELDS, AttemptInline

from .models import GatewayDelivery, RoutingTableVersion


@admin.register(RoutingTableVersion)
class RoutingTableVersionAdmin(admin.ModelAdmin):
    list_display = ["cluster", "version", "cause", "actor", "created", "short_sha"]
    list_filter = ["cluster"]
    search_fields = ["cause", "actor"]
    readonly_fields = ["cluster", "version", "body", "content_sha", "cause", "actor", "created"]

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
