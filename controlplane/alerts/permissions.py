"""Who may do what on the alert pages, through the accounts app's one permission layer.

Viewers read; operators also act (acknowledge, silence, redeliver, test-send); admins also
change configuration (rules, endpoints, secrets). Falls back to "logged-in staff may do
everything" if the roles module is absent.
"""

from __future__ import annotations

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied

try:
    from controlplane.accounts.access import can
    from controlplane.accounts.roles import ACTION, READ, WRITE
except ImportError:  # accounts app without roles: staff only
    READ, ACTION, WRITE = "read", "action", "write"

    def can(user, action, token=None):
        return bool(getattr(user, "is_authenticated", False) and user.is_staff)


def allowed(user, action: str) -> bool:
    return can(user, action)


def require(action: str = READ):
    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            if not can(request.user, action):
                raise PermissionDenied(f"Your role does not allow '{action}'.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


def flags(user) -> dict[str, bool]:
    """For templates: which buttons to show."""
    return {"can_act": can(user, ACTION), "can_write": can(user, WRITE)}
