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

These are the *fleet-wide* roles. Roles on single clusters (ClusterMembership) and the
per-cluster checks every surface uses live in controlplane/accounts/access.py; ``can`` and
``restrict`` here are the fleet-wide shorthands and delegate to it.
"""

from __future__ import annotations

from django.db.models import QuerySet

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

_ROLE_CACHE_ATTR = "_pdplane_role"


def role_of(user) -> str | None:
    """The user's role, or None for anonymous users and users in no role group.

    Cached on the user object: one query per request at most.
    """
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return None
    if user.is_superuser:
        return ADMIN
    cached = getattr(user, _ROLE_CACHE_ATTR, False)
    if cached is not False:
        return cached
    names = set(user.groups.filter(name__in=ROLES).values_list("name", flat=True))
    role = next((r for r in reversed(ROLES) if r in names), None)
    setattr(user, _ROLE_CACHE_ATTR, role)
    return role


def allowed_actions(user, token=None) -> frozenset[str]:
    """What ``user`` may do fleet-wide (on every cluster), narrowed by ``token``."""
    from .access import access_for

    return access_for(user, token).fleet


def may_issue_scope(user, scope: str, current_token=None) -> bool:
    """Whether ``user`` (authenticated through ``current_token``, if any) may create a token
    of ``scope``: what the new token would allow must not exceed what is allowed now, so a
    read token cannot mint a write token. A scope above the role is fine — it is clipped.
    Roles on single clusters count: a cluster viewer may hold a read token."""
    from .access import access_for

    would_allow = access_for(user).reach & SCOPE_ALLOWS.get(scope, frozenset())
    return bool(would_allow) and would_allow <= access_for(user, current_token).reach


def can(user, action: str, token=None) -> bool:
    """May ``user`` (through ``token``, if given) perform ``action`` fleet-wide — on every
    cluster and on objects that belong to none?

    ``action`` is one of read / write / action / admin. For one cluster or one object, ask
    ``access.can_on`` / ``access.can_on_object``.
    """
    if action not in ACTIONS:
        raise ValueError(f"unknown permission action {action!r}; expected one of {ACTIONS}")
    return action in allowed_actions(user, token)


def restrict(queryset: QuerySet, user, action: str = READ, token=None) -> QuerySet:
    """``queryset`` limited to what ``user`` may ``action`` — NetBox's ``.restrict()``:
    all of it for a fleet-wide role, the rows of the clusters the user holds a role on
    otherwise (controlplane/accounts/access.py)."""
    from .access import restrict as restrict_to_access

    return restrict_to_access(queryset, user, action, token)


def set_role(user, role: str | None) -> None:
    """Put ``user`` in exactly the group for ``role`` (None removes every role)."""
    from django.contrib.auth.models import Group

    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    if role is not None:
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    if hasattr(user, _ROLE_CACHE_ATTR):
        delattr(user, _ROLE_CACHE_ATTR)
    from .access import forget

    forget(user)
