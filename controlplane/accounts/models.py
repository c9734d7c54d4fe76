"""Per-user API tokens.

Format: ``pdp_<prefix>_<secret>``. The 8-hex-digit prefix is public and stored in clear to
find the row; only the SHA-256 of the whole token is stored, so a database leak does not
leak usable tokens. The clear token is shown once, when it is created.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone

from .roles import ADMIN, OPERATOR, SCOPE_ADMIN, SCOPE_READ, SCOPE_WRITE, VIEWER

TOKEN_PREFIX = "pdp_"
# last_used_at is refreshed at most this often, so reads don't turn into writes.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class TokenScope(models.TextChoices):
    READ = SCOPE_READ, "Read"
    WRITE = SCOPE_WRITE, "Write (includes actions)"
    ADMIN = SCOPE_ADMIN, "Admin"


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


class APIToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    description = models.CharField(max_length=200, blank=True)
    prefix = models.CharField(max_length=8, unique=True, editable=False)
    token_hash = models.CharField(max_length=64, editable=False)
    scope = models.CharField(max_length=8, choices=TokenScope.choices, default=TokenScope.READ)
    expires = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires")
    created = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked = models.BooleanField(default=False)

    class Meta:
        ordering = ["user", "-created"]
        verbose_name = "API token"

    def __str__(self):
        return f"{TOKEN_PREFIX}{self.prefix}… ({self.user})"

    @classmethod
    def issue(cls, user, *, scope=TokenScope.READ, description="", expires=None):
        """Create a token; returns ``(token, clear_text)``. The clear text is not kept."""
        while True:
            prefix = secrets.token_hex(4)
            if not cls.objects.filter(prefix=prefix).exists():
                break
        raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        token = cls.objects.create(
            user=user,
            prefix=prefix,
            token_hash=hash_token(raw),
            scope=scope,
            description=description,
            expires=expires,
        )
        return token, raw

    @classmethod
    def authenticate(cls, raw: str) -> APIToken | None:
        """The usable token matching ``raw``, or None. Constant-time hash comparison."""
        if not raw.startswith(TOKEN_PREFIX):
            return None
        prefix, sep, _ = raw[len(TOKEN_PREFIX):].partition("_")
        if not sep or len(prefix) != 8:
            return None
        token = cls.objects.select_related("user").filter(prefix=prefix).first()
        if token is None or not hmac.compare_digest(token.token_hash, hash_token(raw)):
            return None
        if not token.is_usable():
            return None
        token.touch()
        return token

    @property
    def is_expired(self) -> bool:
        return self.expires is not None and self.expires <= timezone.now()

    def is_usable(self) -> bool:
        return not self.revoked and not self.is_expired and self.user.is_active

    def touch(self) -> None:
        now = timezone.now()
        if self.last_used_at is None or now - self.last_used_at >= LAST_USED_RESOLUTION:
            # .update(): no save signals, so token use is not an audited change.
            APIToken.objects.filter(pk=self.pk).update(last_used_at=now)
            self.last_used_at = now


class ClusterRole(models.TextChoices):
    VIEWER = VIEWER, "Viewer"
    OPERATOR = OPERATOR, "Operator"
    ADMIN = ADMIN, "Admin"


class ClusterMembership(models.Model):
    """A role on one cluster, for a user or for one API token (NetBox-style tenancy).

    A user's membership adds to their fleet-wide role on that cluster. A token's
    memberships narrow it: a token with any membership reaches only those clusters, with at
    most the listed role, and never more than its owner (controlplane/accounts/access.py).
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.CASCADE,
        related_name="cluster_memberships",
    )
    token = models.ForeignKey(
        APIToken, null=True, blank=True, on_delete=models.CASCADE,
        related_name="cluster_memberships",
    )
    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=8, choices=ClusterRole.choices)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["cluster", "id"]
        constraints = [
            models.CheckConstraint(
                condition=(models.Q(user__isnull=False, token__isnull=True)
                           | models.Q(user__isnull=True, token__isnull=False)),
                name="membership_user_xor_token",
                violation_error_message="A membership is for a user or for a token, not both.",
            ),
            models.UniqueConstraint(
                fields=["user", "cluster"], condition=models.Q(user__isnull=False),
                name="membership_unique_user_cluster",
                violation_error_message="This user already has a role on this cluster.",
            ),
            models.UniqueConstraint(
                fields=["token", "cluster"], condition=models.Q(token__isnull=False),
                name="membership_unique_token_cluster",
                violation_error_message="This token already has a role on this cluster.",
            ),
        ]

    def __str__(self):
        who = self.user if self.user_id else self.token
        return f"{who}: {self.role} on {self.cluster}"
