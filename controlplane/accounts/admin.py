from django.contrib import admin, messages

from .models import APIToken, ClusterMembership


@admin.register(APIToken)
class APITokenAdmin(admin.ModelAdmin):
    list_display = ["prefix", "user", "scope", "description", "created", "expires",
                    "last_used_at", "revoked"]
    list_filter = ["scope", "revoked"]
    search_fields = ["prefix", "user__username", "description"]
    readonly_fields = ["prefix", "created", "last_used_at"]
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        """A token added here gets its secret generated; the clear text is shown once."""
        if change:
            return super().save_model(request, obj, form, change)
        token, raw = APIToken.issue(
            obj.user, scope=obj.scope, description=obj.description, expires=obj.expires
        )
        obj.pk = token.pk
        obj.prefix, obj.token_hash, obj.created = token.prefix, token.token_hash, token.created
        self.message_user(
            request, f"New token (copy it now, it is not shown again): {raw}", messages.WARNING
        )

    @admin.action(description="Revoke selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            token.revoked = True
            token.save(update_fields=["revoked"])


@admin.register(ClusterMembership)
class ClusterMembershipAdmin(admin.ModelAdmin):
    """Roles on single clusters (controlplane/accounts/access.py explains how they combine
    with fleet-wide roles and token scopes)."""

    list_display = ["cluster", "user", "token", "role", "created"]
    list_filter = ["role", "cluster"]
    search_fields = ["user__username", "token__prefix", "cluster__name"]
    autocomplete_fields = ["user"]
    raw_id_fields = ["token"]
    readonly_fields = ["created"]
