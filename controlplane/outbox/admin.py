from django.contrib import admin

from .models import Attempt, Message


class AttemptInline(admin.TabularInline):
    """The attempt log, shown under a message (or under any child of it)."""

    model = Attempt
    fk_name = "message"
    extra = 0
    can_delete = False
    readonly_fields = [f.name for f in Attempt._meta.fields]


# Read-only: every field of a message is the outbox's own bookkeeping.
MESSAGE_FIELDS = [f.name for f in Message._meta.fields]


@admin.register(Message)
class MessageAdmin(admin.ModelAdmin):
    list_display = ["pk", "kind", "status", "outcome", "attempts", "next_attempt_at",
                    "last_status_code", "created"]
    list_filter = ["kind", "status", "outcome"]
    readonly_fields = MESSAGE_FIELDS
    inlines = [AttemptInline]
