"""Role checks for HTML views (the API uses controlplane.api.permissions)."""

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied

from .access import can, can_anywhere
from .roles import READ


def role_required(action: str = READ, *, anywhere: bool = False):
    """Login required, then ``can(user, action)`` (fleet-wide) or 403. ``anywhere=True``:
    a role allowing ``action`` on any one cluster is enough (pages about the user's own
    things, such as their tokens)."""

    def decorator(view):
        @wraps(view)
        def wrapped(request, *args, **kwargs):
            if not request.user.is_authenticated:
                return redirect_to_login(request.get_full_path())
            allowed = (can_anywhere(request.user, action) if anywhere
                       else can(request.user, action))
            if not allowed:
                raise PermissionDenied(f"Your role does not allow '{action}'.")
            return view(request, *args, **kwargs)

        return wrapped

    return decorator


class RoleRequiredMixin:
    """Class-based views: set ``required_action`` (default read)."""

    required_action = READ

    def dispatch(self, request, *args, **kwargs):
        if not request.user.is_authenticated:
            return redirect_to_login(request.get_full_path())
        if not can(request.user, self.required_action):
            raise PermissionDenied(f"Your role does not allow '{self.required_action}'.")
        return super().dispatch(request, *args, **kwargs)
