"""API permissions: the same roles and token scopes as everywhere (accounts/roles.py).

GET/HEAD/OPTIONS need ``read``; other methods need ``write`` unless the view (or the
viewset action) declares ``required_action`` — ``"action"`` for drain/approve/trigger.
"""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from controlplane.accounts.models import APIToken
from controlplane.accounts.roles import READ, WRITE, can


def request_token(request):
    return request.auth if isinstance(request.auth, APIToken) else None


def required_action_for(request, view) -> str:
    declared = getattr(view, "required_action", None)
    if callable(declared):
        declared = declared(request)
    if declared:
        return declared
    return READ if request.method in SAFE_METHODS else WRITE


class RolePermission(BasePermission):
    message = "Your role or token scope does not allow this."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        action = required_action_for(request, view)
        self.message = f"Your role or token scope does not allow '{action}'."
        return can(request.user, action, request_token(request))
