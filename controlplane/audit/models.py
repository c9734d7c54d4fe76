"""The change log: one row per create/update/delete of an audited object, or per action."""

from django.conf import settings
from django.db import models

from .context import ACTOR_KINDS


class ChangeAction(models.TextChoices):
    CREATE = "create", "Created"
    UPDATE = "update", "Updated"
    DELETE = "delete", "Deleted"
    ACTION = "action", "Action"


class ChangeRecord(models.Model):
    time = models.DateTimeField(auto_now_add=True, db_index=True)
    action = models.CharField(max_length=8, choices=ChangeAction.choices)
    # For ACTION rows: what was done, e.g. "drain", "approve".
    verb = models.CharField(max_length=64, blank=True)
    # "app_label.modelname", e.g. "topology.node": stable even after the model is removed.
    object_type = models.CharField(max_length=100)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    actor_kind = models.CharField(
        max_length=8, choices=[(k, k) for k in ACTOR_KINDS], default="system"
    )
    actor_name = models.CharField(max_length=200)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_constraint=False,
    )
    token_id = models.BigIntegerField(null=True, blank=True)
    node_id = models.BigIntegerField(null=True, blank=True)
    request_id = models.CharField(max_length=64, blank=True, db_index=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)

    class Meta:
        ordering = ["-time", "-id"]
        indexes = [
            models.Index(fields=["object_type", "object_id"], name="audit_object_idx"),
            models.Index(fields=["actor_kind", "actor_name"], name="audit_actor_idx"),
        ]

    def __str__(self):
        what = self.verb or self.action
        return f"{self.time:%Y-%m-%d %H:%M:%S} {self.actor_name} {what} {self.object_repr}"

    @property
    def changed_fields(self) -> list[str]:
        before, after = self.before or {}, self.after or {}
        return sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
