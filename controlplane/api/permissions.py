"""API permissions: the same roles, cluster memberships and token scopes as everywhere
(controlplane/accounts/access.py).

GET/HEAD/OPTIONS need ``read``; other methods need ``write`` unless the view (or the
viewset action) declares ``required_action`` — ``"action"`` for drain/approve/trigger.

Where the action is checked:

* request level: the principal must be allowed the action *somewhere* (on some cluster)
  for views over cluster-scoped models, and fleet-wide for views over fleet-wide models
  (webhook endpoints, silences, …). Views that declare ``access_scope = "anywhere"``
  (tokens, what-if) only need the action somewhere.
* object level: on the object's own cluster. Objects of clusters the principal cannot read
  never get here: the viewset's queryset is restricted, so they are 404.
* creates and updates: on the cluster the object will belong to (``check_write_target``).
"""

from rest_framework import exceptions
from rest_framework.permissions import SAFE_METHODS, BasePermission

from controlplane.accounts import access
from controlplane.accounts.models import APIToken
from controlplane.accounts.roles import READ, WRITE


def request_token(request):
    return request.auth if isinstance(request.auth, APIToken) else None


def request_access(request) -> access.Access:
    return access.access_for(request.user, request_token(request))


def required_action_for(request, view) -> str:
    declared = getattr(view, "required_action", None)
    if callable(declared):
        declared = declared(request)
    if declared:
        return declared
    return READ if request.method in SAFE_METHODS else WRITE


def _view_model(view):
    queryset = getattr(view, "queryset", None)
    return getattr(queryset, "model", None)


def view_is_cluster_scoped(view) -> bool:
    scope = getattr(view, "access_scope", None)
    if scope is not None:
        return scope in ("cluster", "anywhere")
    model = _view_model(view)
    return model is None or access.is_cluster_scoped(model)


class RolePermission(BasePermission):
    message = "Your role or token scope does not allow this."

    def has_permission(self, request, view):
        if not request.user or not request.user.is_authenticated:
            return False
        action = required_action_for(request, view)
        self.message = f"Your role or token scope does not allow '{action}'."
        granted = request_access(request)
        if view_is_cluster_scoped(view):
            return granted.anywhere(action)
        # Fleet-wide objects: reads of what is not visible are empty lists / 404s (the
        # queryset is restricted); everything else needs the fleet-wide role.
        return granted.everywhere(action) or (action == READ and granted.anywhere(READ))

    def has_object_permission(self, request, view, obj):
        if getattr(view, "access_scope", None) == "anywhere":
            return True
        action = required_action_for(request, view)
        self.message = f"Your role or token scope does not allow '{action}' here."
        return access.can_on_object(request_access(request), action, obj)


def check_write_target(request, view, model, data: dict, instance=None) -> None:
    """Refuse (403) a create or update that would put an object in a cluster where the
    principal may not do the view's action (moving an object needs it on both ends)."""
    if getattr(view, "access_scope", None) == "anywhere":
        return
    action = required_action_for(request, view)
    granted = request_access(request)
    if granted.everywhere(action):
        return
    if not access.is_cluster_scoped(model):
        raise exceptions.PermissionDenied(f"'{action}' on this needs a fleet-wide role.")
    target = access.cluster_of_data(model, data, instance)
    if target is None and instance is None and access.cluster_path(model) == "pk":
        raise exceptions.PermissionDenied("Creating a cluster needs a fleet-wide admin role.")
    if action not in granted.on(target):
        raise exceptions.PermissionDenied(
            f"Your role on that cluster does not allow '{action}'.")
