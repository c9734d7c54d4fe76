"""API viewsets. Each is a queryset, a serializer and its filters; the behaviour common to
all (permissions, restrict(), brief, ETag/If-Match, Idempotency-Key) lives in the base."""

from __future__ import annotations

from django.db import transaction
from django.db.models import Count, OuterRef, Prefetch, Subquery
from django.db.models.functions import Coalesce
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.permissions import SAFE_METHODS
from rest_framework.response import Response

from controlplane.accounts.access import may_issue_scope
from controlplane.accounts.models import APIToken
from controlplane.accounts.roles import ACTION, READ
from controlplane.audit.models import ChangeRecord
from controlplane.policies.effective import PolicyError
from controlplane.policies.models import Policy, effective_policy_for
from controlplane.topology.models import (
    GPU,
    NIC,
    Cluster,
    Fabric,
    Gateway,
    Node,
    ServedModel,
    Worker,
)

from . import hooks
from . import serializers as s
from . import views_live as live_views
from .base import PdplaneModelViewSet, RestrictedMixin
from .errors import Conflict
from .mixins import idempotent
from .permissions import request_token

ERRORS = {
    400: OpenApiResponse(description="Invalid input: {error: {code, message, fields}}"),
    403: OpenApiResponse(description="Role or token scope too low"),
}


@extend_schema_view(
    live=extend_schema(responses={200: live_views.ClusterLiveSerializer, 503: None}),
    publish_routing_table=extend_schema(
        request=s.WorkerActionSerializer, responses={200: s.PublishResultSerializer}),
)
class ClusterViewSet(PdplaneModelViewSet):
    queryset = Cluster.objects.all()
    serializer_class = s.ClusterSerializer
    brief_fields = ("name",)
    filter_fields = {"name": "name"}
    ordering_fields = ["name", "created"]

    def required_action(self, request):
        return ACTION if self.action == "publish_routing_table" else None

    @action(detail=True, methods=["get"])
    def live(self, request, pk=None):
        """Live state of every node and worker of the cluster (from telemetry)."""
        return live_views.live_cluster(self, self.get_object())

    @action(detail=True, methods=["post"], url_path="publish-routing-table")
    @idempotent
    def publish_routing_table(self, request, pk=None):
        """Rebuild the cluster's routing table now and push it if it changed."""
        from controlplane import audit
        from controlplane.routing.service import publish

        body = s.WorkerActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        cluster = self.get_object()
        reason = body.validated_data.get("reason") or "requested through the API"
        row = publish(cluster.pk, cause=reason, actor=audit.current_actor().name)
        audit.log_action(cluster, "publish_routing_table",
                         {"reason": reason, "version": row.version if row else None})
        return Response(s.PublishResultSerializer(
            {"cluster": cluster.pk, "changed": row is not None,
             "version": row.version if row else None}).data)


class FabricViewSet(PdplaneModelViewSet):
    queryset = Fabric.objects.select_related("cluster").order_by("cluster_id", "name")
    serializer_class = s.FabricSerializer
    brief_fields = ("name",)
    filter_fields = {"cluster_id": "cluster_id", "name": "name", "transport": "transport"}
    ordering_fields = ["name", "line_rate_gbps"]


@extend_schema_view(live=extend_schema(responses={200: live_views.LiveStateSerializer,
                                                 503: None}))
class NodeViewSet(PdplaneModelViewSet):
    queryset = Node.objects.select_related("cluster").order_by("cluster_id", "rack", "hostname")
    serializer_class = s.NodeSerializer
    brief_fields = ("hostname", "status")
    filter_fields = {
        "cluster_id": "cluster_id",
        "cluster": "cluster__name",
        "hostname": "hostname",
        "rack": "rack",
        "zone": "zone",
        "status": "status",
    }
    ordering_fields = ["hostname", "rack", "zone", "status", "last_seen", "created"]

    @action(detail=True, methods=["get"])
    def live(self, request, pk=None):
        """The node's latest telemetry report (GPUs, NICs, engines), or null."""
        return live_views.live_node(self, self.get_object())

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            # A subquery, not Count() over a join: the page's COUNT(*) stays a plain count.
            per_node = (GPU.objects.filter(node=OuterRef("pk")).order_by()
                        .values("node").annotate(n=Count("pk")).values("n"))
            queryset = queryset.annotate(gpu_count=Coalesce(Subquery(per_node), 0))
        return queryset


class GPUViewSet(PdplaneModelViewSet):
    queryset = GPU.objects.select_related("node").order_by("node_id", "index")
    serializer_class = s.GPUSerializer
    brief_fields = ("uuid", "index")
    filter_fields = {
        "node_id": "node_id",
        "cluster_id": "node__cluster_id",
        "product_name": "product_name",
        "uuid": "uuid",
        "missing": "missing",
        "nvlink_group": "nvlink_group",
    }
    ordering_fields = ["index", "memory_bytes", "product_name", "created"]


class NICViewSet(PdplaneModelViewSet):
    queryset = NIC.objects.select_related("node", "fabric__cluster").order_by("node_id", "name")
    serializer_class = s.NICSerializer
    brief_fields = ("name",)
    filter_fields = {
        "node_id": "node_id",
        "fabric_id": "fabric_id",
        "transport": "transport",
        "rdma": "rdma",
        "missing": "missing",
    }
    ordering_fields = ["name", "line_rate_gbps"]


@extend_schema_view(
    effective_policy=extend_schema(responses={200: s.EffectivePolicySerializer, 409: None})
)
class ServedModelViewSet(PdplaneModelViewSet):
    queryset = ServedModel.objects.select_related("cluster").order_by("cluster_id", "name")
    serializer_class = s.ServedModelSerializer
    brief_fields = ("name",)
    filter_fields = {"cluster_id": "cluster_id", "name": "name"}
    ordering_fields = ["name", "weight_bytes", "created"]

    @action(detail=True, methods=["get"], url_path="effective-policy")
    def effective_policy(self, request, pk=None):
        """The policy this model runs under, with each value's source (default/cluster/model)."""
        served_model = self.get_object()
        try:
            policy, sources = effective_policy_for(served_model)
        except PolicyError as exc:
            raise Conflict(f"The stored policies do not merge: {exc}") from None
        data = {"served_model": served_model.pk, "policy": policy.as_dict(), "sources": sources}
        return Response(s.EffectivePolicySerializer(data).data)


@extend_schema_view(
    drain=extend_schema(request=s.WorkerActionSerializer,
                        responses={200: s.WorkerSerializer, 409: None}),
    resume=extend_schema(request=s.WorkerActionSerializer,
                         responses={200: s.WorkerSerializer, 409: None}),
    live=extend_schema(responses={200: live_views.LiveStateSerializer, 503: None}),
)
class WorkerViewSet(PdplaneModelViewSet):
    queryset = (
        Worker.objects.select_related("node", "served_model")
        .prefetch_related(Prefetch("gpus", GPU.objects.only("id", "index", "node_id")))
        .order_by("served_model_id", "node_id", "name")
    )
    serializer_class = s.WorkerSerializer
    brief_fields = ("name", "state", "desired_role")
    filter_fields = {
        "node_id": "node_id",
        "served_model_id": "served_model_id",
        "cluster_id": "node__cluster_id",
        "state": "state",
        "desired_role": "desired_role",
        "engine_kind": "engine_kind",
    }
    ordering_fields = ["name", "state", "desired_role", "created"]

    def required_action(self, request):
        return ACTION if self.action in {"drain", "resume"} else None

    @action(detail=True, methods=["get"])
    def live(self, request, pk=None):
        """The worker's latest engine metrics (queue, KV use, latency), or null."""
        return live_views.live_worker(self, self.get_object())

    @action(detail=True, methods=["post"])
    @idempotent
    def drain(self, request, pk=None):
        """Stop sending new work to the worker; it finishes what it has."""
        return self._change_state(request, "draining", "drain", refuse={"missing", "failed"})

    @action(detail=True, methods=["post"])
    @idempotent
    def resume(self, request, pk=None):
        """Put a drained or draining worker back into service."""
        return self._change_state(request, "active", "resume", refuse={"missing", "failed"})

    def _change_state(self, request, state, verb, refuse):
        body = s.WorkerActionSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        worker = self.get_object()
        with transaction.atomic():
            worker = Worker.objects.select_for_update().get(pk=worker.pk)
            if worker.state in refuse:
                raise Conflict(f"The worker is {worker.state}; only its agent can change that.")
            before = {"state": worker.state, "generation": worker.generation}
            if worker.state != state and not (verb == "drain" and worker.state == "drained"):
                worker.state = state
                worker.generation += 1
                worker.save(update_fields=["state", "generation", "updated"])
            from controlplane import audit

            audit.log_action(
                worker, verb,
                before=before,
                after={"state": worker.state, "generation": worker.generation,
                       "reason": body.validated_data.get("reason", "")},
            )
            hooks.after_worker_state_change(worker, verb, audit.current_actor().name)
        worker = self.get_queryset().get(pk=worker.pk)
        return Response(s.WorkerSerializer(worker, context=self.get_serializer_context()).data)


class GatewayViewSet(PdplaneModelViewSet):
    queryset = Gateway.objects.select_related("cluster").order_by("cluster_id", "name")
    serializer_class = s.GatewaySerializer
    brief_fields = ("name",)
    filter_fields = {"cluster_id": "cluster_id", "name": "name", "kind": "kind"}
    ordering_fields = ["name", "applied_table_version", "last_ack_at"]


class PolicyViewSet(PdplaneModelViewSet):
    queryset = Policy.objects.select_related("cluster", "served_model").order_by("id")
    serializer_class = s.PolicySerializer
    filter_fields = {"cluster_id": "cluster_id", "served_model_id": "served_model_id"}
    ordering_fields = ["id", "created"]

    def required_action(self, request):
        # Targets and rebalancing rules are how operators run the fleet, in the UI and here
        # alike; inventory stays with admins.
        return None if request.method in SAFE_METHODS else ACTION


class ChangeRecordFilterMixin:
    filter_fields = {
        "object_type": "object_type",
        "object_id": "object_id",
        "action": "action",
        "actor_kind": "actor_kind",
        "actor": "actor_name__istartswith",
        "request_id": "request_id",
        "since": "time__gte",
        "until": "time__lt",
    }


class ChangeRecordViewSet(ChangeRecordFilterMixin, RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    """The audit log: every change and action, newest first."""

    queryset = ChangeRecord.objects.all()
    serializer_class = s.ChangeRecordSerializer
    ordering_fields = ["time", "id"]


@extend_schema_view(
    create=extend_schema(responses={201: s.APITokenCreatedSerializer, **ERRORS}),
)
class APITokenViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.CreateModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    """Your own API tokens. The clear token is in the create response only. DELETE revokes."""

    serializer_class = s.APITokenSerializer
    queryset = APIToken.objects.all()
    ordering_fields = ["created", "last_used_at"]
    required_action = READ  # everyone manages their own tokens, within their role
    access_scope = "anywhere"  # a role on any one cluster is enough

    def get_queryset(self):
        return APIToken.objects.filter(user=self.request.user).select_related("user")

    @idempotent
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        scope = serializer.validated_data.get("scope", "read")
        if not may_issue_scope(request.user, scope, request_token(request)):
            raise serializers.ValidationError(
                {"scope": ["Above what your role (and the token you are using) allows."]}
            )
        token, raw = APIToken.issue(
            request.user,
            scope=scope,
            description=serializer.validated_data.get("description", ""),
            expires=serializer.validated_data.get("expires"),
        )
        data = s.APITokenCreatedSerializer(token).data
        data["token"] = raw
        return Response(data, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        instance.revoked = True
        instance.save(update_fields=["revoked"])
