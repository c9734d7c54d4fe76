"""REST resource for roles on single clusters: ``/api/v1/cluster-memberships/``.

Mounted by controlplane/api/urls.py, built on the API's bases, so it is scoped like every
other resource: a caller sees the memberships of the clusters it can see. Granting needs
``admin`` on that cluster (fleet-wide admins, and admins of that one cluster). A
membership for a token narrows that token, so only its owner (or a fleet-wide admin) may
give one — nobody can shrink someone else's token — and its owner needs only to see the
cluster (a viewer may confine their own read token to one cluster).
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework import serializers
from rest_framework.permissions import SAFE_METHODS

from controlplane.api.fields import NestedRef
from controlplane.api.serializers import ModelCleanSerializer
from controlplane.api.views import PdplaneModelViewSet
from controlplane.topology.models import Cluster

from .access import access_of_request, forget
from .models import APIToken, ClusterMembership
from .roles import MANAGE, READ


class ClusterMembershipSerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())
    user = serializers.SlugRelatedField(
        slug_field="username", queryset=get_user_model().objects.all(), required=False,
        allow_null=True, help_text="Username; give this or token, not both",
    )
    token = serializers.PrimaryKeyRelatedField(
        queryset=APIToken.objects.all(), required=False, allow_null=True,
        help_text="API token id (one of your own); give this or user, not both",
    )

    class Meta:
        model = ClusterMembership
        fields = ["id", "display", "cluster", "user", "token", "role", "created"]
        read_only_fields = ["created"]
        # The model's constraints are checked by full_clean (ModelCleanSerializer); DRF's
        # generated unique-together validators would make ``user`` and ``token`` required.
        validators = []

    def validate_token(self, token):
        request = self.context.get("request")
        if token is None or request is None:
            return token
        if token.user_id != request.user.pk and not access_of_request(request).everywhere(
                MANAGE):
            # Not yours: answered as if it did not exist.
            raise serializers.ValidationError(f'Invalid pk "{token.pk}" - object does not '
                                              "exist.")
        return token


class ClusterMembershipViewSet(PdplaneModelViewSet):
    """Roles on single clusters, for users and API tokens (see docs/api.md, Roles)."""

    queryset = ClusterMembership.objects.select_related("cluster", "user", "token").order_by(
        "cluster_id", "id")
    serializer_class = ClusterMembershipSerializer
    filter_fields = {"cluster_id": "cluster_id", "user": "user__username",
                     "token_id": "token_id", "role": "role"}
    ordering_fields = ["created", "id"]

    def required_action(self, request):
        if request.method in SAFE_METHODS:
            return None
        if request.method == "POST" and _for_a_token_only(request):
            # Narrowing one's own token (validate_token checks it is theirs) needs no more
            # than seeing the cluster: the token never gets beyond its owner anyway.
            return READ
        return MANAGE

    def perform_create(self, serializer):
        super().perform_create(serializer)
        _forget(serializer.instance)

    def perform_update(self, serializer):
        super().perform_update(serializer)
        _forget(serializer.instance)


def _for_a_token_only(request) -> bool:
    try:
        data = request.data
    except Exception:  # unparsable body: the serializer reports it
        return False
    return isinstance(data, dict) and data.get("token") is not None and not data.get("user")


def _forget(membership) -> None:
    for principal in (membership.user, membership.token):
        if principal is not None:
            forget(principal)
