"""REST resources for alerts (mounted by controlplane/api/urls.py under /api/v1/).

Built on the API app's bases, so roles, token scopes, restrict(), filters, ETag/If-Match
and Idempotency-Key behave as on every other resource. Operators (``action``) acknowledge,
silence, redeliver and test; changing rules and endpoints needs ``write``.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.roles import ACTION
from controlplane.api.errors import Conflict
from controlplane.api.mixins import idempotent
from controlplane.api.serializers import ModelCleanSerializer
from controlplane.api.views import PdplaneModelViewSet, RestrictedMixin
from controlplane.outbox.models import Attempt

from . import delivery as outbox
from . import ssrf
from .conf import load
from .evaluation import acknowledge
from .models import Alert, AlertRule, Delivery, Silence, WebhookEndpoint


# --- Serializers -----------------------------------------------------------------------
class AlertRuleSerializer(ModelCleanSerializer):
    class Meta:
        model = AlertRule
        fields = [
            "id",
            "display",
            "rule",
            "cluster",
            "enabled",
            "severity",
            "for_seconds",
            "threshold",
            "created",
            "updated",
        ]
        read_only_fields = ["created", "updated"]


class AlertSerializer(serializers.ModelSerializer):
    acknowledged = serializers.BooleanField(read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id",
            "fingerprint",
            "rule",
            "severity",
            "status",
            "is_open",
            "labels",
            "annotations",
            "group_key",
            "active_since",
            "starts_at",
            "ends_at",
            "notified_firing",
            "silenced",
            "acknowledged",
            "acknowledged_at",
            "acknowledged_by",
            "last_evaluated_at",
        ]
        read_only_fields = fields


class SilenceSerializer(ModelCleanSerializer):
    matchers = serializers.DictField(
        child=serializers.CharField(max_length=200),
        allow_empty=False,
        help_text='Label → value; alerts with all of them are muted, e.g. {"node": "gpu-07"}',
    )

    class Meta:
        model = Silence
        fields = [
            "id",
            "display",
            "matchers",
            "starts_at",
            "ends_at",
            "comment",
            "created_by",
            "created",
        ]
        read_only_fields = ["created_by", "created"]


class WebhookEndpointSerializer(ModelCleanSerializer):
    """Never includes the secret; see the create and rotate-secret responses."""

    label_filters = serializers.DictField(
        child=serializers.CharField(max_length=200),
        required=False,
        help_text='Send only alerts with these labels, e.g. {"cluster": "prod"}',
    )

    class Meta:
        model = WebhookEndpoint
        fields = [
            "id",
            "display",
            "name",
            "url",
            "format",
            "min_severity",
            "label_filters",
            "enabled",
            "disabled_reason",
            "disabled_at",
            "previous_secret_expires_at",
            "created",
            "updated",
        ]
        read_only_fields = [
            "disabled_reason",
            "disabled_at",
            "previous_secret_expires_at",
            "created",
            "updated",
        ]

    def validate_url(self, value):
        try:
            ssrf.check_url_static(value, load().allow)
        except ssrf.UnsafeTarget as exc:
            raise serializers.ValidationError(str(exc)) from None
        return value

    def update(self, instance, validated_data):
        if validated_data.get("enabled"):
            validated_data.setdefault("disabled_reason", "")
            validated_data.setdefault("disabled_at", None)
        return super().update(instance, validated_data)


class WebhookEndpointSecretSerializer(WebhookEndpointSerializer):
    secret = serializers.CharField(read_only=True, help_text="Shown once; store it now")

    class Meta(WebhookEndpointSerializer.Meta):
        fields = [*WebhookEndpointSerializer.Meta.fields, "secret"]


class DeliveryAttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = [
            "number",
            "started_at",
            "worker",
            "outcome",
            "status_code",
            "latency_ms",
            "response_excerpt",
            "error",
        ]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    attempt_log = DeliveryAttemptSerializer(many=True, read_only=True)
    delivered_at = serializers.DateTimeField(read_only=True, allow_null=True)

    class Meta:
        model = Delivery
        fields = [
            "id",
            "endpoint",
            "webhook_id",
            "event_type",
            "group_key",
            "notification_status",
            "is_test",
            "status",
            "attempts",
            "next_attempt_at",
            "last_status_code",
            "last_error",
            "delivered_at",
            "created",
            "payload",
            "attempt_log",
        ]
        read_only_fields = fields


# --- Viewsets --------------------------------------------------------------------------
class AlertRuleViewSet(PdplaneModelViewSet):
    queryset = AlertRule.objects.select_related("cluster")
    serializer_class = AlertRuleSerializer
    brief_fields = ("rule",)
    filter_fields = {"rule": "rule", "cluster_id": "cluster_id", "enabled": "enabled"}
    ordering_fields = ["rule", "created"]


@extend_schema_view(acknowledge=extend_schema(request=None, responses={200: AlertSerializer}))
class AlertViewSet(RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Alert.objects.all()
    serializer_class = AlertSerializer
    filter_fields = {
        "status": "status",
        "is_open": "is_open",
        "rule": "rule",
        "severity": "severity",
        "fingerprint": "fingerprint",
    }
    ordering_fields = ["active_since", "starts_at", "ends_at", "severity"]

    def required_action(self, request):
        return ACTION if self.action == "acknowledge" else None

    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None):
        """Stop repeat notifications for this alert until it resolves."""
        alert = self.get_object()
        if not alert.is_open or alert.status != "firing":
            raise Conflict("Only a firing alert can be acknowledged.")
        acknowledge(alert, request.user)
        alert.refresh_from_db()
        return Response(self.get_serializer(alert).data)


class SilenceViewSet(PdplaneModelViewSet):
    queryset = Silence.objects.all()
    serializer_class = SilenceSerializer
    filter_fields = {"ends_at__gte": "ends_at__gte"}
    ordering_fields = ["ends_at", "created"]

    def required_action(self, request):
        return ACTION if request.method not in ("GET", "HEAD", "OPTIONS") else None

    def perform_create(self, serializer):
        serializer.save(created_by=self.request.user)


@extend_schema_view(
    create=extend_schema(responses={201: WebhookEndpointSecretSerializer}),
    rotate_secret=extend_schema(request=None, responses={200: WebhookEndpointSecretSerializer}),
    test=extend_schema(request=None, responses={200: DeliverySerializer}),
)
class WebhookEndpointViewSet(PdplaneModelViewSet):
    queryset = WebhookEndpoint.objects.all()
    serializer_class = WebhookEndpointSerializer
    brief_fields = ("name",)
    # Not "format": DRF reads ?format= as the response renderer.
    filter_fields = {"name": "name", "enabled": "enabled", "body_format": "format"}
    ordering_fields = ["name", "created"]

    def required_action(self, request):
        return ACTION if self.action == "test" else None

    def get_serializer_class(self):
        if self.action == "create":
            return WebhookEndpointSecretSerializer
        return super().get_serializer_class()

    @action(detail=True, methods=["post"], url_path="rotate-secret")
    def rotate_secret(self, request, pk=None):
        """A new secret (returned once); the previous one keeps signing for 24 h."""
        endpoint = self.get_object()
        endpoint.rotate_secret()
        endpoint.save()
        return Response(
            WebhookEndpointSecretSerializer(endpoint, context={"request": request}).data
        )

    @action(detail=True, methods=["post"])
    @idempotent
    def test(self, request, pk=None):
        """Send one signed test message now (never retried) and return its record."""
        d = outbox.send_test(self.get_object())
        return Response(DeliverySerializer(d).data)


@extend_schema_view(redeliver=extend_schema(request=None, responses={200: DeliverySerializer}))
class WebhookDeliveryViewSet(RestrictedMixin, viewsets.ReadOnlyModelViewSet):
    queryset = Delivery.objects.prefetch_related("attempt_log")
    serializer_class = DeliverySerializer
    filter_fields = {
        "endpoint_id": "endpoint_id",
        "status": "status",
        "webhook_id": "webhook_id",
        "is_test": "is_test",
    }
    ordering_fields = ["created", "next_attempt_at"]

    def required_action(self, request):
        return ACTION if self.action == "redeliver" else None

    @action(detail=True, methods=["post"])
    def redeliver(self, request, pk=None):
        """Queue again: same webhook-id and body, a fresh retry schedule."""
        d = self.get_object()
        if not outbox.redeliver(d):
            raise Conflict("It is being sent right now, or its endpoint is disabled.")
        d.refresh_from_db()
        return Response(self.get_serializer(d).data)


def register(router) -> None:
    router.register("alert-rules", AlertRuleViewSet, basename="alert-rule")
    router.register("alerts", AlertViewSet, basename="alert")
    router.register("silences", SilenceViewSet, basename="silence")
    router.register("webhook-endpoints", WebhookEndpointViewSet, basename="webhook-endpoint")
    router.register("webhook-deliveries", WebhookDeliveryViewSet, basename="webhook-delivery")
