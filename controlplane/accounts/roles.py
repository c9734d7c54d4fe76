"""Roles and the one permission layer that the API, the UI and the admin all ask.

Three roles, held as Django groups of the same name (created by a data migration):

=========  ===========================================================================
viewer     reads everything
operator   reads, and runs the fleet: drain/resume workers, trigger planning runs,
           approve or reject plans (the ``action`` permission)
admin      everything: also changes inventory, models and policies (``write``) and
           manages users and tokens (``admin``). Superusers are always admin.
=========  ===========================================================================

An API token narrows its owner's role to the token's scope; it never widens it:
effective permission = role ∩ scope.

These are the *fleet-wide* roles and the vocabulary of actions and scopes. Every check —
fleet-wide (``access.can``) or on one cluster (``access.can_on``), querysets
(``access.restrict``), granting roles (``access.set_role``) — lives in
controlplane/accounts/access.py, which imports this module and never the reverse.
"""

from __future__ import annotations

VIEWER = "viewer"
OPERATOR = "operator"
ADMIN = "admin"
ROLES = (VIEWER, OPERATOR, ADMIN)

READ = "read"
WRITE = "write"
ACTION = "action"
MANAGE = "admin"
ACTIONS = (READ, WRITE, ACTION, MANAGE)

ROLE_ALLOWS: dict[str | None, frozenset[str]] = {
    None: frozenset(),
    VIEWER: frozenset({READ}),
    OPERATOR: frozenset({READ, ACTION}),
    ADMIN: frozenset(ACTIONS),
}

# Token scopes (see controlplane.accounts.models.APIToken).
SCOPE_READ = "read"
SCOPE_WRITE = "write"
SCOPE_ADMIN = "admin"
SCOPE_ALLOWS: dict[str, frozenset[str]] = {
    SCOPE_READ: frozenset({READ}),
    SCOPE_WRITE: frozenset({READ, WRITE, ACTION}),
    SCOPE_ADMIN: frozenset(ACTIONS),
}

ROLE_CACHE_ATTR = "_pdplane_role"


def role_of(user) -> str | None:
    """The user's role, or None for anonymous users and users in no role group.

    Cached on the user object: one query per request at most.
    """
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, ROLE_CACHE_ATTR, False)
    if cached is not False:
        return cached
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    role = next((r for r in reversed(ROLES) if r in names), None)
    setattr(user, ROLE_CACHE_ATTR, role)
    return role
