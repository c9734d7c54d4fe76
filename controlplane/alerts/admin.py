from django.contrib import admin

from controlplane.outbox.admin import AttemptInline

from .models import (
    Alert,
    AlertGroup,
    AlertRule,
    Delivery,
    Silence,
    WebhookEndpoint,
)


@admin.register(AlertRule)
class AlertRuleAdmin(admin.ModelAdmin):
    list_display = ("rule", "cluster", "enabled", "severity", "for_seconds", "threshold")
    list_filter = ("rule", "enabled")


@admin.register(Alert)
class AlertAdmin(admin.ModelAdmin):
    list_display = ("rule", "status", "severity", "is_open", "starts_at", "ends_at", "fingerprint")
    list_filter = ("status", "is_open", "severity", "rule")
    search_fields = ("fingerprint", "rule")
    readonly_fields = [f.name for f in Alert._meta.fields]


@admin.register(AlertGroup)
class AlertGroupAdmin(admin.ModelAdmin):
    list_display = ("group_key", "last_notified_at")


@admin.register(Silence)
class SilenceAdmin(admin.ModelAdmin):
    list_display = ("matchers", "starts_at", "ends_at", "comment", "created_by")


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(admin.ModelAdmin):
    # The secrets are not editable and never displayed (shown once, in the alerts UI).
    list_display = ("name", "url", "format", "min_severity", "enabled", "disabled_reason")
    list_filter = ("enabled", "format")


@admin.register(Delivery)
class DeliveryAdmin(admin.ModelAdmin):
    list_display = ("webhook_id", "endpoint", "event_type", "status", "attempts", "next_attempt_at")
    list_filter = ("status", "event_type", "is_test")
    search_fields = ("webhook_id",)
    readonly_fields = [f.name for f in Delivery._meta.fields]
    inlines = [AttemptInline]
