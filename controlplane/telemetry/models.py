"""Telemetry records kept in the database.

Live values live in Redis (hotstate.py); the database holds what must outlast it:
commands sent to agents and their results, and rolled-up history at a bounded rate.
"""

import uuid

from django.db import models

from controlplane.topology.models import Node, Worker


class CommandStatus(models.TextChoices):
    PENDING = "pending", "Pending (not yet delivered)"
    SENT = "sent", "Sent to the agent"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    REFUSED = "refused", "Refused by the agent"
    EXPIRED = "expired", "Expired before delivery"


class AgentCommand(models.Model):
    """A command for one node's agent (drain, resume, set_role, restart_engine)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="agent_commands")
    command = models.CharField(max_length=32)
    args = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=CommandStatus.choices, default=CommandStatus.PENDING
    )
    detail = models.TextField(blank=True)
    created = models.DateTimeField(auto_now_add=True)
    sent_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField()

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["node", "status"], name="agentcommand_node_status")]

    def __str__(self):
        return f"{self.command} → {self.node} ({self.status})"

    @property
    def done(self) -> bool:
        return self.status in {
            CommandStatus.SUCCEEDED, CommandStatus.FAILED, CommandStatus.REFUSED,
            CommandStatus.EXPIRED,
        }


class NodeSample(models.Model):
    """One rolled-up sample of a node (about once a minute), for history beyond Redis."""

    node = models.ForeignKey(Node, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(db_index=True)
    gpu_utilization = models.FloatField(null=True, help_text="Mean over GPUs, 0–1")
    gpu_memory_used_bytes = models.BigIntegerField(null=True)
    power_w = models.FloatField(null=True)
    nic_tx_gbps = models.FloatField(null=True)
    nic_rx_gbps = models.FloatField(null=True)

    class Meta:
        ordering = ["node", "-at"]

    def __str__(self):
        return f"{self.node_id}@{self.at:%Y-%m-%d %H:%M}"


class WorkerSample(models.Model):
    """One rolled-up sample of a worker (engine)."""

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="samples")
    at = models.DateTimeField(db_index=True)
    running = models.IntegerField(null=True)
    waiting = models.IntegerField(null=True)
    kv_usage = models.FloatField(null=True)
    prefix_hit_rate = models.FloatField(null=True)
    prompt_tokens_per_s = models.FloatField(null=True)
    generation_tokens_per_s = models.FloatField(null=True)
    ttft_p95_s = models.FloatField(null=True)
    itl_p95_s = models.FloatField(null=True)

    class Meta:
        ordering = ["worker", "-at"]

    def __str__(self):
        return f"{self.worker_id}@{self.at:%Y-%m-%d %H:%M}"
