"""Serializers: one full and one brief per resource. Foreign keys are NestedRef fields
(write a primary key, read ``{"id", "display"}``). Every write runs the model's own
validation (``full_clean``: clean(), field validators and constraints) so the API accepts
exactly what the admin accepts, and bad input is a field error instead of a 500.
"""

from __future__ import annotations

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import serializers
from rest_framework.fields import get_error_detail

from controlplane.accounts.models import APIToken
from controlplane.audit.models import ChangeRecord
from controlplane.policies.models import Policy
from controlplane.topology.choices import Role
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
from controlplane.topology.models.serving import check_worker_gpus

from .fields import NestedRef


def _as_drf_error(exc: DjangoValidationError) -> serializers.ValidationError:
    return serializers.ValidationError(get_error_detail(exc))


class ModelCleanSerializer(serializers.ModelSerializer):
    """Applies the validated data to a copy of the instance and runs ``full_clean``."""

    display = serializers.SerializerMethodField()

    def get_display(self, obj) -> str:
        return str(obj)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        model = self.Meta.model
        m2m = {f.name for f in model._meta.many_to_many}
        if self.instance is not None:
            candidate = model._base_manager.get(pk=self.instance.pk)
        else:
            candidate = model()
        for name, value in attrs.items():
            if name not in m2m:
                setattr(candidate, name, value)
        try:
            candidate.full_clean(exclude=list(m2m))
        except DjangoValidationError as exc:
            raise _as_drf_error(exc) from None
        self._validated_candidate = candidate
        return attrs


def _text_without_nul(value, field):
    if isinstance(value, str) and "\x00" in value:
        raise serializers.ValidationError({field: ["NUL characters are not allowed."]})


class ClusterSerializer(ModelCleanSerializer):
    class Meta:
        model = Cluster
        fields = ["id", "display", "name", "description", "created", "updated"]


class FabricSerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())

    class Meta:
        model = Fabric
        fields = ["id", "display", "cluster", "name", "transport", "rdma", "line_rate_gbps",
                  "created", "updated"]


class NodeSerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())
    labels = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    gpu_count = serializers.IntegerField(read_only=True, required=False)

    class Meta:
        model = Node
        fields = ["id", "display", "cluster", "hostname", "rack", "zone", "labels", "status",
                  "last_seen", "agent_version", "agent_protocol", "gpu_count", "created",
                  "updated"]
        read_only_fields = ["last_seen", "agent_version", "agent_protocol"]

    def validate_labels(self, value):
        for key in value:
            _text_without_nul(key, "labels")
        return value


class GPUSerializer(ModelCleanSerializer):
    node = NestedRef(queryset=Node.objects.all())

    class Meta:
        model = GPU
        fields = ["id", "display", "node", "index", "uuid", "product_name", "memory_bytes",
                  "memory_bandwidth_gbs", "nvlink_group", "nvlink_bandwidth_gbs",
                  "pcie_generation", "pcie_width", "missing", "created", "updated"]


class NICSerializer(ModelCleanSerializer):
    node = NestedRef(queryset=Node.objects.all())
    fabric = NestedRef(queryset=Fabric.objects.all(), allow_null=True, required=False)

    class Meta:
        model = NIC
        fields = ["id", "display", "node", "name", "line_rate_gbps", "transport", "rdma",
                  "fabric", "missing", "created", "updated"]


class ServedModelSerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())
    kv_bytes_per_token = serializers.IntegerField(read_only=True)

    class Meta:
        model = ServedModel
        fields = ["id", "display", "cluster", "name", "layers", "kv_heads", "head_dim",
                  "kv_dtype_bytes", "kv_bytes_per_token_explicit", "kv_bytes_per_token",
                  "weight_bytes", "kv_block_size", "max_model_len", "created", "updated"]


class WorkerGPURef(NestedRef):
    """A worker's GPUs are all on its node, so ``gpu<index>`` names one without loading
    the node again for every GPU of every worker on the page."""

    def to_representation(self, value):
        return {"id": value.pk, "display": f"gpu{value.index}"}


class WorkerSerializer(ModelCleanSerializer):
    served_model = NestedRef(queryset=ServedModel.objects.all())
    node = NestedRef(queryset=Node.objects.all())
    gpus = WorkerGPURef(queryset=GPU.objects.select_related("node"), many=True, required=False)
    observed_role = serializers.ChoiceField(
        choices=[("", "Not reported yet"), *Role.choices], read_only=True
    )

    class Meta:
        model = Worker
        fields = ["id", "display", "served_model", "node", "name", "gpus", "tp_size",
                  "engine_kind", "api_url", "metrics_url", "kv_events_endpoint",
                  "kv_replay_endpoint", "desired_role", "observed_role", "state", "generation",
                  "observed_generation", "role_changed_at", "created", "updated"]
        read_only_fields = ["observed_role", "state", "generation", "observed_generation",
                            "role_changed_at"]

    def validate(self, attrs):
        attrs = super().validate(attrs)
        candidate = self._validated_candidate
        if "gpus" in attrs:
            gpus = list(attrs["gpus"])
        elif self.instance is not None:
            gpus = list(self.instance.gpus.all())
        else:
            gpus = []
        if self.instance is not None or gpus:
            try:
                check_worker_gpus(candidate, gpus)
            except DjangoValidationError as exc:
                raise _as_drf_error(exc) from None
        return attrs

    def update(self, instance, validated_data):
        new_role = validated_data.get("desired_role", instance.desired_role)
        if new_role != instance.desired_role:
            # A change of desired state bumps the generation (Kubernetes convention).
            validated_data["generation"] = instance.generation + 1
        return super().update(instance, validated_data)


class GatewaySerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())
    secret = serializers.CharField(write_only=True, max_length=128)

    class Meta:
        model = Gateway
        fields = ["id", "display", "cluster", "name", "url", "kind", "secret",
                  "applied_table_version", "last_ack_at", "last_error", "created", "updated"]
        read_only_fields = ["applied_table_version", "last_ack_at", "last_error"]


class PolicySerializer(ModelCleanSerializer):
    cluster = NestedRef(queryset=Cluster.objects.all())
    served_model = NestedRef(queryset=ServedModel.objects.all(), allow_null=True, required=False)

    class Meta:
        model = Policy
        fields = "__all__"

    def get_field_names(self, declared_fields, info):
        names = super().get_field_names(declared_fields, info)
        return ["id", "display", *[n for n in names if n not in {"id", "display"}]]


class EffectivePolicySerializer(serializers.Serializer):
    served_model = serializers.IntegerField()
    policy = serializers.DictField()
    sources = serializers.DictField(child=serializers.CharField())


class PublishResultSerializer(serializers.Serializer):
    cluster = serializers.IntegerField()
    changed = serializers.BooleanField()
    version = serializers.IntegerField(allow_null=True)


class WorkerActionSerializer(serializers.Serializer):
    reason = serializers.CharField(max_length=200, required=False, allow_blank=True)


class APITokenSerializer(serializers.ModelSerializer):
    class Meta:
        model = APIToken
        fields = ["id", "prefix", "description", "scope", "expires", "created", "last_used_at",
                  "revoked"]
        read_only_fields = ["prefix", "created", "last_used_at", "revoked"]

    def validate_expires(self, value):
        from django.utils import timezone

        if value is not None and value <= timezone.now():
            raise serializers.ValidationError("Must be in the future.")
        return value


class APITokenCreatedSerializer(APITokenSerializer):
    token = serializers.CharField(read_only=True, help_text="Shown once; store it now")

    class Meta(APITokenSerializer.Meta):
        fields = [*APITokenSerializer.Meta.fields, "token"]


class ChangeRecordSerializer(serializers.ModelSerializer):
    class Meta:
        model = ChangeRecord
        fields = ["id", "time", "action", "verb", "object_type", "object_id", "object_repr",
                  "actor_kind", "actor_name", "user", "token_id", "node_id", "request_id",
                  "before", "after"]


def brief_serializer(full: type[serializers.ModelSerializer], extra=()):
    """A brief variant: id, display and a few identifying fields."""
    meta_model = full.Meta.model
    names = ["id", "display", *extra]

    class Brief(full):
        class Meta(full.Meta):
            model = meta_model
            fields = names
            read_only_fields = []

    Brief.__name__ = f"Brief{full.__name__}"
    return Brief

