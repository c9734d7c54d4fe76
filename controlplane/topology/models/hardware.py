from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from controlplane.core.models import TimestampedModel
from controlplane.topology.choices import NodeStatus, Transport

from .cluster import Cluster, Fabric


class Node(TimestampedModel):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    hostname = models.CharField(max_length=253)
    rack = models.CharField(max_length=64, blank=True)
    zone = models.CharField(max_length=64, blank=True)
    labels = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=NodeStatus.choices, default=NodeStatus.UNKNOWN
    )
    last_seen = models.DateTimeField(null=True, blank=True)
    # Agent identity: the bearer token is stored as a SHA-256 hex digest, never in clear.
    agent_token_hash = models.CharField(max_length=64, blank=True, editable=False)
    agent_version = models.CharField(max_length=32, blank=True)
    agent_protocol = models.PositiveSmallIntegerField(null=True, blank=True)
    agent_metrics_url = models.CharField(
        max_length=200, blank=True,
        help_text="The agent's own /metrics as the control plane reaches it (from its hello)",
    )

    class Meta:
        ordering = ["cluster", "rack", "hostname"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "hostname"], name="node_unique_hostname"),
        ]

    def __str__(self):
        return self.hostname

    def clean(self):
        if not isinstance(self.labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.labels.items()
        ):
            raise ValidationError({"labels": "Labels must be an object of string to string."})


class GPU(TimestampedModel):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="gpus")
    index = models.PositiveSmallIntegerField(validators=[MaxValueValidator(63)])
    uuid = models.CharField(max_length=128, unique=True, help_text="e.g. GPU-5f0c…")
    product_name = models.CharField(max_length=128)
    memory_bytes = models.PositiveBigIntegerField(validators=[MinValueValidator(1)])
    memory_bandwidth_gbs = models.FloatField(
        null=True, blank=True, help_text="HBM/GDDR bandwidth in GB/s (datasheet)"
    )
    nvlink_group = models.PositiveSmallIntegerField(
        null=True,
        blank=True,
        help_text="GPUs on the same node with the same group number share NVLink; "
        "empty means no NVLink.",
    )
    nvlink_bandwidth_gbs = models.FloatField(
        default=0, validators=[MinValueValidator(0)], help_text="Per-GPU NVLink GB/s"
    )
    pcie_generation = models.PositiveSmallIntegerField(
        default=4, validators=[MinValueValidator(1), MaxValueValidator(7)]
    )
    pcie_width = models.PositiveSmallIntegerField(
        default=16, validators=[MinValueValidator(1), MaxValueValidator(32)]
    )
    missing = models.BooleanField(
        default=False, help_text="Set when the node's agent no longer reports this GPU"
    )

    class Meta:
        ordering = ["node", "index"]
        verbose_name = "GPU"
        constraints = [
            models.UniqueConstraint(fields=["node", "index"], name="gpu_unique_index"),
            models.CheckConstraint(
                condition=models.Q(memory_bytes__gt=0), name="gpu_memory_positive"
            ),
        ]

    def __str__(self):
        return f"{self.node.hostname}/gpu{self.index}"

    @property
    def pcie_gbs(self) -> float:
        """Usable one-way PCIe bandwidth in GB/s (≈ 2 GB/s per lane at Gen4, doubling per gen)."""
        per_lane = 0.25 * 2 ** (self.pcie_generation - 1)
        return per_lane * self.pcie_width


class NIC(TimestampedModel):
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="nics")
    name = models.CharField(max_length=32, help_text="Interface name, e.g. eth0 or mlx5_0")
    line_rate_gbps = models.FloatField(validators=[MinValueValidator(0.001)])
    transport = models.CharField(max_length=16, choices=Transport.choices)
    rdma = models.BooleanField(default=False)
    fabric = models.ForeignKey(
        Fabric, null=True, blank=True, on_delete=models.SET_NULL, related_name="nics"
    )
    missing = models.BooleanField(default=False)

    class Meta:
        ordering = ["node", "name"]
        verbose_name = "NIC"
        constraints = [
            models.UniqueConstraint(fields=["node", "name"], name="nic_unique_name"),
            models.CheckConstraint(
                condition=models.Q(line_rate_gbps__gt=0), name="nic_line_rate_positive"
            ),
        ]

    def __str__(self):
        return f"{self.node.hostname}/{self.name}"

    def clean(self):
        if self.fabric_id and self.node_id and self.fabric.cluster_id != self.node.cluster_id:
            raise ValidationError({"fabric": "The fabric belongs to another cluster."})
        if self.rdma and self.transport == Transport.ETHERNET:
            raise ValidationError(
                {"rdma": "Plain Ethernet is TCP; choose RoCE, InfiniBand or EFA for RDMA."}
            )
