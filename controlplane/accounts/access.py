"""Who may see and do what, per cluster: the one place the API, the pages, the live
websockets, what-if and the metrics/SD endpoints ask.

Two sources of permission (roles.py names the roles and what each allows):

* a **fleet-wide role** (the viewer/operator/admin group): applies to every cluster and to
  the objects that belong to no cluster (webhook endpoints, silences, fleet-wide alert
  rules, the admin site). Small teams need nothing else.
* **cluster memberships** (:class:`~controlplane.accounts.models.ClusterMembership`): a role
  on one cluster. A user's membership adds to their fleet-wide role there; a user with
  memberships only sees those clusters and nothing fleet-wide.

An API token narrows its owner, never widens: every action is clipped to the token's scope,
and a token with memberships of its own reaches only those clusters, each with at most
the token's role there (and never more than its owner has there).

Objects of a cluster the principal cannot read do not exist for it: querysets go through
:func:`restrict`, so lookups answer 404 rather than 403 and lists leave them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.core.exceptions import FieldError
from django.db.models import CharField, Q, QuerySet
from django.db.models.functions import Cast

from .roles import ACTIONS, ROLE_ALLOWS, ROLE_CACHE_ATTR, ROLES, SCOPE_ALLOWS, role_of

# How each cluster-scoped model reaches its cluster (an ORM path to the Cluster row, or
# "pk" for the cluster itself). Models not listed belong to the whole fleet. Labels, not
# classes, so this module imports no other app.
CLUSTER_PATHS: dict[str, str] = {
    "topology.cluster": "pk",
    "topology.fabric": "cluster",
    "topology.node": "cluster",
    "topology.gpu": "node__cluster",
    "topology.nic": "node__cluster",
    "topology.servedmodel": "cluster",
    "topology.worker": "node__cluster",
    "topology.gateway": "cluster",
    "policies.policy": "cluster",
    "routing.routingtableversion": "cluster",
    "routing.gatewaydelivery": "gateway__cluster",
    "planner.plan": "cluster",
    "planner.modelplannerstate": "served_model__cluster",
    "alerts.alertrule": "cluster",  # a rule with no cluster is fleet-wide
    "accounts.clustermembership": "cluster",
}
# Alerts carry their cluster as a label (by name), not as a foreign key.
ALERT_LABEL = "alerts.alert"
AUDIT_LOG = "audit.changerecord"

_CACHE_ATTR = "_pdplane_access"


@dataclass(frozen=True)
class Access:
    """What one principal may do: ``fleet`` on everything, plus ``clusters[id]`` on one."""

    fleet: frozenset[str] = frozenset()
    clusters: dict[int, frozenset[str]] = field(default_factory=dict)

    def on(self, cluster_id: int | None) -> frozenset[str]:
        """Actions allowed on ``cluster_id`` (None: on fleet-wide objects)."""
        if cluster_id is None:
            return self.fleet
        return self.fleet | self.clusters.get(cluster_id, frozenset())

    def anywhere(self, action: str) -> bool:
        return action in self.fleet or any(action in a for a in self.clusters.values())

    def everywhere(self, action: str) -> bool:
        return action in self.fleet

    def cluster_ids(self, action: str) -> set[int] | None:
        """Clusters where ``action`` is allowed; None means every cluster."""
        if action in self.fleet:
            return None
        return {cid for cid, allowed in self.clusters.items() if action in allowed}

    @property
    def reach(self) -> frozenset[str]:
        """Every action allowed somewhere (what a new token could at most be given)."""
        out = set(self.fleet)
        for allowed in self.clusters.values():
            out |= allowed
        return frozenset(out)


NOTHING = Access()


def _check_action(action: str) -> None:
    if action not in ACTIONS:
        raise ValueError(f"unknown permission action {action!r}; expected one of {ACTIONS}")


def _memberships(**where) -> dict[int, str]:
    from .models import ClusterMembership

    return dict(ClusterMembership.objects.filter(**where).values_list("cluster_id", "role"))


def _user_access(user) -> Access:
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return NOTHING
    cached = getattr(user, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    fleet = ROLE_ALLOWS[role_of(user)]
    clusters = {}
    if fleet != frozenset(ACTIONS):  # a fleet-wide admin gains nothing from memberships
        for cid, role in _memberships(user=user).items():
            extra = ROLE_ALLOWS.get(role, frozenset()) - fleet
            if extra:
                clusters[cid] = extra
    access = Access(fleet, clusters)
    setattr(user, _CACHE_ATTR, access)
    return access


def access_for(user, token=None) -> Access:
    """The principal's access: ``user``, narrowed by ``token`` when the request used one.

    Cached on the user (or token) object, so a request or websocket connection queries the
    memberships once.
    """
    base = _user_access(user)
    if token is None:
        return base
    cached = getattr(token, _CACHE_ATTR, None)
    if cached is not None:
        return cached
    if not token.is_usable():
        access = NOTHING
    else:
        scope = SCOPE_ALLOWS.get(token.scope, frozenset())
        own = _memberships(token=token)
        if not own:
            clusters = {c: a & scope for c, a in base.clusters.items() if a & scope}
            access = Access(base.fleet & scope, clusters)
        else:
            clusters = {}
            for cid, role in own.items():
                allowed = base.on(cid) & scope & ROLE_ALLOWS.get(role, frozenset())
                if allowed:
                    clusters[cid] = allowed
            access = Access(frozenset(), clusters)
    setattr(token, _CACHE_ATTR, access)
    return access


def forget(principal) -> None:
    """Drop the cached access of a user or token (after its roles changed)."""
    if hasattr(principal, _CACHE_ATTR):
        delattr(principal, _CACHE_ATTR)


def _as_access(principal, token=None) -> Access:
    return principal if isinstance(principal, Access) else access_for(principal, token)


def cluster_path(model) -> str | None:
    return CLUSTER_PATHS.get(model._meta.label_lower)


def is_cluster_scoped(model) -> bool:
    label = model._meta.label_lower
    return label in CLUSTER_PATHS or label in (ALERT_LABEL, AUDIT_LOG)


def cluster_of(obj) -> int | None:
    """The id of the cluster ``obj`` belongs to; None for fleet-wide objects."""
    label = obj._meta.label_lower
    if label == ALERT_LABEL:
        name = (obj.labels or {}).get("cluster")
        if not isinstance(name, str):
            return None
        from controlplane.topology.models import Cluster

        return Cluster.objects.filter(name=name).values_list("pk", flat=True).first()
    path = CLUSTER_PATHS.get(label)
    if path is None:
        return None
    if path == "pk":
        return obj.pk
    *hops, last = path.split("__")
    for hop in hops:
        obj = getattr(obj, hop, None)
        if obj is None:
            return None
    return getattr(obj, f"{last}_id", None)


def cluster_of_data(model, data: dict, instance=None) -> int | None:
    """The cluster an object *would* belong to after a create or update with ``data``
    (validated serializer data: related objects, not ids). None: fleet-wide or unknown."""
    path = CLUSTER_PATHS.get(model._meta.label_lower)
    if path is None or path == "pk":
        return instance.pk if (path == "pk" and instance is not None) else None
    first, *rest = path.split("__")
    related = data[first] if first in data else getattr(instance, first, None)
    if related is None:
        return None
    if not rest:
        return related.pk
    *hops, last = rest
    for hop in hops:
        related = getattr(related, hop, None)
        if related is None:
            return None
    return getattr(related, f"{last}_id", None)


def role_on(principal, cluster, token=None) -> str | None:
    """The highest role ``principal`` holds on ``cluster`` (object or id), or None."""
    access = _as_access(principal, token)
    allowed = access.on(getattr(cluster, "pk", cluster))
    return next((r for r in reversed(ROLES) if ROLE_ALLOWS[r] <= allowed), None)


def can_on(principal, action: str, cluster, token=None) -> bool:
    """May ``principal`` ``action`` on ``cluster`` (object, id, or None for fleet-wide)?"""
    _check_action(action)
    return action in _as_access(principal, token).on(getattr(cluster, "pk", cluster))


def can_on_object(principal, action: str, obj, token=None) -> bool:
    """May ``principal`` ``action`` on ``obj`` (judged by the cluster it belongs to)?"""
    _check_action(action)
    access = _as_access(principal, token)
    if access.everywhere(action):
        return True
    label = obj._meta.label_lower
    if label == AUDIT_LOG:
        # Read-only, and visible only through restrict(): the row being here is the answer.
        return action == "read" and access.anywhere(action)
    if not is_cluster_scoped(type(obj)):
        return False
    return action in access.on(cluster_of(obj))


def can_anywhere(principal, action: str, token=None) -> bool:
    _check_action(action)
    return _as_access(principal, token).anywhere(action)


def visible_clusters(principal, action: str = "read", token=None) -> QuerySet:
    """The clusters ``principal`` may ``action`` on (default: see)."""
    from controlplane.topology.models import Cluster

    return restrict(Cluster.objects.all(), principal, action, token)


def restrict(queryset: QuerySet, principal, action: str = "read", token=None) -> QuerySet:
    """``queryset`` limited to the rows ``principal`` may ``action`` — NetBox's
    ``.restrict()``. ``principal`` is a user (with ``token`` if the request used one) or an
    :class:`Access`. Fleet-wide models are all or nothing."""
    _check_action(action)
    access = _as_access(principal, token)
    ids = access.cluster_ids(action)
    if ids is None:
        return queryset
    if not ids:
        return queryset.none()
    label = queryset.model._meta.label_lower
    if label == ALERT_LABEL:
        from controlplane.topology.models import Cluster

        names = list(Cluster.objects.filter(pk__in=ids).values_list("name", flat=True))
        return queryset.filter(labels__cluster__in=names)
    if label == AUDIT_LOG:
        return queryset.filter(_audit_condition(access, action))
    path = CLUSTER_PATHS.get(label)
    if path is None:
        return queryset.none()
    return queryset.filter(**{"pk__in" if path == "pk" else f"{path}__in": ids})


def _audit_condition(access: Access, action: str) -> Q:
    """Change records of objects the principal may ``action`` on: for each cluster-scoped
    model, the records whose object id is one of its visible rows."""
    from django.apps import apps

    condition = Q(pk__in=[])
    for label, _ in CLUSTER_PATHS.items():
        try:
            model = apps.get_model(label)
        except LookupError:
            continue
        try:
            visible = restrict(model._base_manager.all(), access, action).order_by()
            ids = visible.annotate(_id_text=Cast("pk", CharField())).values("_id_text")
        except FieldError:  # a model whose path changed: test_cluster_paths_resolve says so
            continue
        condition |= Q(object_type=label, object_id__in=ids)
    return condition


def access_of_request(request) -> Access:
    """The access of a DRF or Django request (API token when one authenticated it)."""
    from .models import APIToken

    auth = getattr(request, "auth", None)
    return access_for(getattr(request, "user", None),
                      auth if isinstance(auth, APIToken) else None)


def set_cluster_role(cluster, role: str | None, *, user=None, token=None):
    """Give ``user`` or ``token`` exactly ``role`` on ``cluster`` (None removes it)."""
    from .models import ClusterMembership

    if (user is None) == (token is None):
        raise ValueError("give exactly one of user= or token=")
    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    who = {"user": user} if user is not None else {"token": token}
    ClusterMembership.objects.filter(cluster=cluster, **who).delete()
    forget(user if user is not None else token)
    if role is None:
        return None
    return ClusterMembership.objects.create(cluster=cluster, role=role, **who)


# --------------------------------------------------------------------------- fleet-wide
def allowed_actions(user, token=None) -> frozenset[str]:
    """What ``user`` may do fleet-wide (on every cluster), narrowed by ``token``."""
    return access_for(user, token).fleet


def may_issue_scope(user, scope: str, current_token=None) -> bool:
    """Whether ``user`` (authenticated through ``current_token``, if any) may create a token
    of ``scope``: what the new token would allow must not exceed what is allowed now, so a
    read token cannot mint a write token. A scope above the role is fine — it is clipped.
    Roles on single clusters count: a cluster viewer may hold a read token."""
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


def set_role(user, role: str | None) -> None:
    """Put ``user`` in exactly the group for ``role`` (None removes every role)."""
    from django.contrib.auth.models import Group

    if role is not None and role not in ROLES:
        raise ValueError(f"unknown role {role!r}; expected one of {ROLES}")
    user.groups.remove(*Group.objects.filter(name__in=ROLES))
    if role is not None:
        group, _ = Group.objects.get_or_create(name=role)
        user.groups.add(group)
    if hasattr(user, ROLE_CACHE_ATTR):
        delattr(user, ROLE_CACHE_ATTR)
    forget(user)
