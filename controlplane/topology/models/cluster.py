from django.core.validators import MinValueValidator
from django.db import models

from controlplane.core.models import TimestampedModel
from controlplane.topology.choices import Transport


class Cluster(TimestampedModel):
    """A set of nodes planned together; one routing table is published per cluster."""

    name = models.SlugField(max_length=64, unique=True)
    description = models.CharField(max_length=200, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self):
        return self.name


class Fabric(TimestampedModel):
    """A network that NICs attach to. Two nodes can move KV directly over a fabric they
    both have a NIC on; the slower of the two NICs bounds the path."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="fabrics")
    name = models.SlugField(max_length=64)
    transport = models.CharField(max_length=16, choices=Transport.choices)
    rdma = models.BooleanField(default=False)
    line_rate_gbps = models.FloatField(
        validators=[MinValueValidator(0.001)], help_text="Nominal per-port rate in Gb/s"
    )

    class Meta:
        ordering = ["cluster", "name"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "name"], name="fabric_unique_name"),
            models.CheckConstraint(
                condition=models.Q(line_rate_gbps__gt=0), name="fabric_line_rate_positive"
            ),
        ]

    def __str__(self):
        return f"{self.cluster}/{self.name}"
