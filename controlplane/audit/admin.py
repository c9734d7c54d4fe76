from django.contrib import admin

from .models import ChangeRecord


@admin.register(ChangeRecord)
class ChangeRecordAdmin(admin.ModelAdmin):
    """Read-only: the log is written by pdplane, never edited by hand."""

    list_display = ["time", "actor_kind", "actor_name", "action", "verb", "object_type",
                    "object_repr", "request_id"]
    list_filter = ["action", "actor_kind", "object_type"]
    search_fields = ["object_repr", "actor_name", "request_id", "object_id"]
    date_hierarchy = "time"
    readonly_fields = [f.name for f in ChangeRecord._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
