"""Read-only API views over other apps' data: routing tables and live (hot) state.

The apps are imported lazily so the API keeps working (and these endpoints answer 503)
if one of them is missing or its store is down.
"""

from __future__ import annotations

import logging

from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import exceptions, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.routing.diff import diff_tables, summarize
from controlplane.routing.models import RoutingTableVersion

from .base import RestrictedMixin
from .fields import NestedRef

log = logging.getLogger(__name__)


class ServiceUnavailable(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Live state is unavailable right now (Redis unreachable); retry shortly."
    default_code = "unavailable"


class RoutingTableSerializer(serializers.ModelSerializer):
    cluster = NestedRef(read_only=True)

    class Meta:
        model = RoutingTableVersion
        fields = ["id", "cluster", "version", "content_sha", "cause", "actor", "created"]


class RoutingTableDetailSerializer(RoutingTableSerializer):
    body = serializers.JSONField(read_only=True)

    class Meta(RoutingTableSerializer.Meta):
        fields = [*RoutingTableSerializer.Meta.fields, "body"]


class RoutingTableDiffSerializer(serializers.Serializer):
    cluster = serializers.IntegerField()
    from_version = serializers.IntegerField(allow_null=True)
    to_version = serializers.IntegerField()
    summary = serializers.CharField()
    changes = serializers.ListField(child=serializers.DictField())


@extend_schema_view(
    diff=extend_schema(
        parameters=[OpenApiParameter("against", int, description="Table id to compare with "
                                     "(default: the previous version of the same cluster)")],
        responses={200: RoutingTableDiffSerializer},
    ),
    current=extend_schema(
        parameters=[OpenApiParameter("cluster_id", int, required=True)],
        responses={200: RoutingTableDetailSerializer},
    ),
)
class RoutingTableViewSet(RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    """Published routing tables, newest first. Lists omit the body; detail includes it."""

    queryset = RoutingTableVersion.objects.select_related("cluster").order_by("-created", "-id")
    serializer_class = RoutingTableSerializer
    filter_fields = {"cluster_id": "cluster_id", "version": "version", "actor": "actor"}
    ordering_fields = ["version", "created"]

    def get_queryset(self):
        queryset = super().get_queryset()
        if self.action == "list":
            queryset = queryset.defer("body")
        return queryset

    def get_serializer_class(self):
        if self.action in {"retrieve", "current"}:
            return RoutingTableDetailSerializer
        return RoutingTableSerializer

    @action(detail=False, methods=["get"])
    def current(self, request):
        """The latest table of ``?cluster_id=``."""
        if "cluster_id" not in request.query_params:
            raise exceptions.ValidationError({"cluster_id": ["This parameter is required."]})
        latest = self.filter_queryset(self.get_queryset()).order_by("-version").first()
        if latest is None:
            raise exceptions.NotFound("No routing table has been published for this cluster.")
        return Response(RoutingTableDetailSerializer(latest).data)

    @action(detail=True, methods=["get"])
    def diff(self, request, pk=None):
        """Changes from another version (default: the previous one) to this one."""
        table = self.get_object()
        against = request.query_params.get("against")
        tables = self.get_queryset().filter(cluster_id=table.cluster_id)
        if against is not None:
            try:
                old = tables.filter(pk=int(against)).first()
            except ValueError:
                raise exceptions.ValidationError({"against": ["Must be a table id."]}) from None
            if old is None:
                raise exceptions.ValidationError(
                    {"against": ["No table with this id in the same cluster."]})
        else:
            old = tables.filter(version__lt=table.version).order_by("-version").first()
        changes = diff_tables(old.body if old else None, table.body)
        data = {"cluster": table.cluster_id, "from_version": old.version if old else None,
                "to_version": table.version, "summary": summarize(changes), "changes": changes}
        return Response(RoutingTableDiffSerializer(data).data)


class LiveStateSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    state = serializers.DictField(allow_null=True, help_text="Latest report; null if none yet")


class ClusterLiveSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    at = serializers.FloatField()
    nodes = serializers.DictField(child=serializers.DictField(allow_null=True))
    workers = serializers.DictField(child=serializers.DictField(allow_null=True))


def _hotstate(function: str, *args):
    try:
        from controlplane.telemetry import hotstate

        return getattr(hotstate, function)(*args)
    except (ImportError, AttributeError):
        raise ServiceUnavailable("Live state is not available in this build.") from None
    except Exception as exc:  # redis errors: connection, timeout
        log.warning("hot state read %s%s failed: %s", function, args, exc)
        raise ServiceUnavailable() from None


def live_node(view, node) -> Response:
    return Response(LiveStateSerializer({"id": node.pk, "state": _hotstate("node_state",
                                                                           node.pk)}).data)


def live_worker(view, worker) -> Response:
    return Response(LiveStateSerializer({"id": worker.pk, "state": _hotstate("worker_state",
                                                                             worker.pk)}).data)


def live_cluster(view, cluster) -> Response:
    snapshot = _hotstate("cluster_snapshot", cluster.pk)
    data = {"id": cluster.pk, "at": snapshot.get("at", 0.0),
            "nodes": {str(k): v for k, v in snapshot.get("nodes", {}).items()},
            "workers": {str(k): v for k, v in snapshot.get("workers", {}).items()}}
    return Response(ClusterLiveSerializer(data).data)
