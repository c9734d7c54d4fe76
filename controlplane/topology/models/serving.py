from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from controlplane.core.kvgeometry import kv_bytes_per_token
from controlplane.core.models import TimestampedModel
from controlplane.topology.choices import EngineKind, GatewayKind, Role, WorkerState

from .cluster import Cluster
from .hardware import GPU, Node


class ServedModel(TimestampedModel):
    """A model served in a cluster, with the KV-cache geometry the planner needs."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="served_models")
    name = models.CharField(max_length=128, help_text="The name clients send as `model`")
    layers = models.PositiveIntegerField()
    kv_heads = models.PositiveIntegerField()
    head_dim = models.PositiveIntegerField()
    kv_dtype_bytes = models.FloatField(help_text="Bytes per KV element: 2 for BF16, 1 for FP8")
    kv_bytes_per_token_explicit = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text="Only for models whose KV does not follow the formula (MLA, e.g. DeepSeek)",
    )
    weight_bytes = models.PositiveBigIntegerField(help_text="Total weight bytes across TP ranks")
    kv_block_size = models.PositiveIntegerField(default=16, help_text="Tokens per KV block")
    max_model_len = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="servedmodel_unique_name"),
        ]

    def __str__(self):
        return self.name

    @property
    def kv_bytes_per_token(self) -> int:
        return kv_bytes_per_token(
            self.layers,
            self.kv_heads,
            self.head_dim,
            self.kv_dtype_bytes,
            self.kv_bytes_per_token_explicit,
        )

    def clean(self):
        errors = {}
        for field in ("layers", "kv_heads", "head_dim", "kv_block_size", "weight_bytes"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                errors[field] = "Must be positive."
        if self.kv_dtype_bytes is not None and self.kv_dtype_bytes <= 0:
            errors["kv_dtype_bytes"] = "Must be positive (2 for BF16/FP16, 1 for FP8)."
        if self.kv_bytes_per_token_explicit == 0:
            errors["kv_bytes_per_token_explicit"] = "Leave empty or give a positive size."
        if errors:
            raise ValidationError(errors)


class Worker(TimestampedModel):
    """One inference engine instance (possibly tensor-parallel over several GPUs of a node).

    ``desired_role`` is what pdplane wants; ``observed_role`` what the agent last saw.
    ``generation`` increments on every change of desired state and the agent records
    ``observed_generation`` once it has acted, as in Kubernetes.
    """

    served_model = models.ForeignKey(ServedModel, on_delete=models.CASCADE, related_name="workers")
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="workers")
    name = models.CharField(max_length=128, help_text="Engine id, unique per node")
    gpus = models.ManyToManyField(GPU, related_name="workers")
    tp_size = models.PositiveSmallIntegerField(default=1, validators=[MinValueValidator(1)])
    engine_kind = models.CharField(
        max_length=16, choices=EngineKind.choices, default=EngineKind.VLLM
    )
    api_url = models.URLField(help_text="OpenAI-compatible base URL, e.g. http://10.0.0.5:8000")
    metrics_url = models.URLField(blank=True)
    kv_events_endpoint = models.CharField(max_length=200, blank=True, help_text="tcp://host:5557")
    kv_replay_endpoint = models.CharField(max_length=200, blank=True)
    desired_role = models.CharField(max_length=16, choices=Role.choices, default=Role.BOTH)
    observed_role = models.CharField(max_length=16, choices=Role.choices, blank=True)
    state = models.CharField(max_length=16, choices=WorkerState.choices, default=WorkerState.ACTIVE)
    generation = models.PositiveIntegerField(default=1)
    observed_generation = models.PositiveIntegerField(default=0)
    role_changed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["served_model", "node", "name"]
        constraints = [
            models.UniqueConstraint(fields=["node", "name"], name="worker_unique_name"),
        ]

    def __str__(self):
        return f"{self.node.hostname}/{self.name}"

    def clean(self):
        if (
            self.served_model_id
            and self.node_id
            and self.served_model.cluster_id != self.node.cluster_id
        ):
            raise ValidationError(
                {"node": "The node and the served model belong to different clusters."}
            )

    def validate_gpus(self, gpus) -> None:
        """Check a GPU set before assigning it (many-to-many cannot be checked in clean()).

        Raises ValidationError naming the offending GPUs.
        """
        check_worker_gpus(self, list(gpus))


def check_worker_gpus(worker: Worker, gpus: list[GPU]) -> None:
    if len(gpus) != worker.tp_size:
        raise ValidationError(
            {"gpus": f"TP size is {worker.tp_size} but {len(gpus)} GPU(s) were given."}
        )
    foreign = [str(g) for g in gpus if g.node_id != worker.node_id]
    if foreign:
        raise ValidationError(
            {"gpus": f"GPU(s) {', '.join(foreign)} are not on node {worker.node.hostname}."}
        )
    taken = (
        Worker.gpus.through.objects.filter(
            gpu__in=gpus, worker__served_model_id=worker.served_model_id
        )
        .exclude(worker_id=worker.pk)
        .values_list("worker__name", "gpu__index")
    )
    clashes = sorted({f"gpu{idx} (worker {name})" for name, idx in taken})
    if clashes:
        raise ValidationError(
            {
                "gpus": "A GPU belongs to one worker of a model at a time; already taken: "
                + ", ".join(clashes)
            }
        )


class Gateway(TimestampedModel):
    """A router that receives the cluster's routing table (push) or pulls it."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="gateways")
    name = models.SlugField(max_length=64)
    url = models.URLField(help_text="Admin base URL the table is pushed to")
    kind = models.CharField(max_length=16, choices=GatewayKind.choices, default=GatewayKind.PDPLANE)
    secret = models.CharField(max_length=128, help_text="HMAC key shared with the gateway")
    applied_table_version = models.PositiveBigIntegerField(default=0)
    last_ack_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="gateway_unique_name"),
        ]

    def __str__(self):
        return f"{self.cluster}/{self.name}"
