"""Plans (list, detail, trigger a run, approve, reject) and the what-if advisor."""

from __future__ import annotations

import logging

from django.db import transaction
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import exceptions, serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts import access
from controlplane.accounts.roles import ACTION, READ
from controlplane.planner.apply import PlanError
from controlplane.planner.models import Plan
from controlplane.topology.models import Cluster

from .base import RestrictedMixin, scope_related_fields
from .errors import Conflict
from .fields import NestedRef
from .mixins import idempotent
from .permissions import request_access
from .views_live import ServiceUnavailable

log = logging.getLogger(__name__)


class PlanSerializer(serializers.ModelSerializer):
    cluster = NestedRef(read_only=True)
    served_model = NestedRef(read_only=True)
    decided_by = serializers.CharField(source="decided_by.username", read_only=True,
                                       allow_null=True, default=None)

    class Meta:
        model = Plan
        fields = ["id", "cluster", "served_model", "status", "mode", "current_layout",
                  "target_layout", "current_goodput_rps", "predicted_goodput_rps", "diff",
                  "explanation", "decided_at", "decided_by", "apply_started_at",
                  "apply_deadline", "applied_at", "failure_reason", "created", "updated"]


class PlanDetailSerializer(PlanSerializer):
    class Meta(PlanSerializer.Meta):
        fields = [*PlanSerializer.Meta.fields, "inputs", "predictions", "chosen", "record"]


class PlanRejectSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=1000, required=False, allow_blank=True)


class PlanRunSerializer(serializers.Serializer):
    cluster = serializers.PrimaryKeyRelatedField(queryset=Cluster.objects.all())


class PlanRunResultSerializer(serializers.Serializer):
    cluster = serializers.IntegerField()
    plans = PlanSerializer(many=True)


def _plan_error(exc: PlanError):
    return Conflict(exc.reason)


@extend_schema_view(
    approve=extend_schema(request=None, responses={200: PlanDetailSerializer}),
    reject=extend_schema(request=PlanRejectSerializer, responses={200: PlanDetailSerializer}),
    run=extend_schema(request=PlanRunSerializer, responses={200: PlanRunResultSerializer}),
)
class PlanViewSet(RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    """Planner proposals, newest first. Operators approve, reject and trigger runs."""

    queryset = Plan.objects.select_related("cluster", "served_model", "decided_by").order_by(
        "-created", "-id")
    serializer_class = PlanSerializer
    filter_fields = {"cluster_id": "cluster_id", "served_model_id": "served_model_id",
                     "status": "status", "since": "created__gte"}
    ordering_fields = ["created", "status"]

    def required_action(self, request):
        return ACTION if self.action in {"approve", "reject", "run"} else None

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            queryset = queryset.defer("inputs", "predictions", "chosen", "record")
        return queryset

    def get_serializer_class(self):
        return PlanSerializer if self.action == "list" else PlanDetailSerializer

    def _decided(self, plan_id):
        return Response(PlanDetailSerializer(self.get_queryset().get(pk=plan_id)).data)

    @action(detail=True, methods=["post"])
    @idempotent
    def approve(self, request, pk=None):
        """Approve a proposed plan; pdplane drains the affected workers, then switches them."""
        from controlplane import audit
        from controlplane.planner.service import approve_plan

        plan = self.get_object()
        try:
            approve_plan(plan.pk, request.user)
        except PlanError as exc:
            raise _plan_error(exc) from None
        audit.log_action(plan, "approve", {"target_layout": plan.target_layout})
        return self._decided(plan.pk)

    @action(detail=True, methods=["post"])
    @idempotent
    def reject(self, request, pk=None):
        """Reject a proposed plan (nothing changes)."""
        from controlplane import audit
        from controlplane.planner.service import reject_plan

        body = PlanRejectSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        plan = self.get_object()
        reason = body.validated_data.get("reason", "")
        try:
            reject_plan(plan.pk, request.user, reason)
        except PlanError as exc:
            raise _plan_error(exc) from None
        audit.log_action(plan, "reject", {"reason": reason})
        return self._decided(plan.pk)

    @action(detail=False, methods=["post"])
    @idempotent
    def run(self, request):
        """Run one planning cycle for a cluster now; returns the plans it proposed."""
        from controlplane import audit
        from controlplane.planner.service import run_planning

        body = PlanRunSerializer(data=request.data)
        # A cluster the caller cannot see is "does not exist"; one it only views is 403.
        scope_related_fields(body, request_access(request))
        body.is_valid(raise_exception=True)
        cluster = body.validated_data["cluster"]
        if not access.can_on(request_access(request), ACTION, cluster):
            raise exceptions.PermissionDenied("Your role on this cluster does not allow "
                                              "'action'.")
        try:
            with transaction.atomic():
                plans = run_planning(cluster)
                audit.log_action(cluster, "planning_run", {"plans": [p.pk for p in plans]})
        except PlanError as exc:
            raise _plan_error(exc) from None
        except (ConnectionError, OSError) as exc:
            log.warning("planning run for cluster %s failed: %s", cluster.pk, exc)
            raise ServiceUnavailable("Planning needs live state, which is unavailable.") from None
        return Response(PlanRunResultSerializer({"cluster": cluster.pk, "plans": plans}).data)


class WhatIfRequestSerializer(serializers.Serializer):
    """Any subset of the what-if fields (docs/planner.md); omitted fields take defaults."""

    gpu = serializers.CharField(required=False, max_length=100)
    nodes = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    gpus_per_node = serializers.IntegerField(required=False, min_value=1, max_value=64)
    tp = serializers.IntegerField(required=False, min_value=1, max_value=64)
    nvlink_group_size = serializers.IntegerField(required=False, min_value=0, max_value=64)
    nic_gbps = serializers.FloatField(required=False, min_value=0.001, max_value=1e6)
    rdma = serializers.BooleanField(required=False)
    pcie_generation = serializers.IntegerField(required=False, min_value=3, max_value=6)
    model = serializers.CharField(required=False, max_length=100)
    layers = serializers.IntegerField(required=False, min_value=1, max_value=1000)
    kv_heads = serializers.IntegerField(required=False, min_value=1, max_value=1024)
    head_dim = serializers.IntegerField(required=False, min_value=1, max_value=4096)
    kv_dtype_bytes = serializers.FloatField(required=False, min_value=0.125, max_value=8)
    params_b = serializers.FloatField(required=False, min_value=0.001, max_value=10000)
    weight_dtype_bytes = serializers.FloatField(required=False, min_value=0.125, max_value=8)
    isl = serializers.FloatField(required=False, min_value=0, max_value=10_000_000)
    osl = serializers.FloatField(required=False, min_value=0, max_value=10_000_000)
    prefix_hit = serializers.FloatField(required=False, min_value=0, max_value=1)
    rate_rps = serializers.FloatField(required=False, min_value=0, max_value=1_000_000)
    ttft_slo_ms = serializers.FloatField(required=False, min_value=0.001, max_value=1e7)
    itl_slo_ms = serializers.FloatField(required=False, min_value=0.001, max_value=1e7)
    inflight_peak = serializers.IntegerField(required=False, min_value=0, max_value=10_000_000)


class WhatIfAnswerSerializer(serializers.Serializer):
    query = serializers.DictField()
    best = serializers.CharField()
    candidates = serializers.ListField(child=serializers.DictField())
    arithmetic = serializers.ListField(child=serializers.CharField())
    explanation = serializers.CharField()


class WhatIfView(APIView):
    """How would each prefill/decode layout do for this hardware, model and traffic?"""

    required_action = READ
    # Hypothetical hardware only, no cluster data: a read role on any cluster is enough.
    access_scope = "anywhere"

    @extend_schema(request=WhatIfRequestSerializer, responses={200: WhatIfAnswerSerializer})
    def post(self, request):
        from controlplane.planner.whatif import WhatIfError, WhatIfQuery, whatif

        body = WhatIfRequestSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        try:
            answer = whatif(WhatIfQuery.from_dict(body.validated_data))
        except WhatIfError as exc:
            raise exceptions.ValidationError({k: [v] for k, v in exc.errors.items()}) from None
        return Response(WhatIfAnswerSerializer(answer.as_dict()).data)
