"""Plans (what the planner proposed, who decided, what happened) and per-model planner state."""

from django.conf import settings
from django.db import models

from controlplane.core.models import TimestampedModel


class PlanStatus(models.TextChoices):
    PROPOSED = "proposed", "Proposed (waiting for approval)"
    APPROVED = "approved", "Approved"
    APPLYING = "applying", "Applying (workers draining)"
    APPLIED = "applied", "Applied"
    REJECTED = "rejected", "Rejected"
    SUPERSEDED = "superseded", "Superseded by a newer plan"
    FAILED = "failed", "Failed"


OPEN_STATUSES = (PlanStatus.PROPOSED, PlanStatus.APPROVED, PlanStatus.APPLYING)


class Plan(TimestampedModel):
    """One proposed change of worker roles for a served model, with its reasons.

    ``diff`` lists {worker_id, worker, node, from_role, to_role, done}; ``predictions`` holds
    the planner's predictions per candidate layout; ``inputs`` what it saw.
    """

    cluster = models.ForeignKey("topology.Cluster", on_delete=models.CASCADE, related_name="plans")
    served_model = models.ForeignKey(
        "topology.ServedModel", on_delete=models.CASCADE, related_name="plans"
    )
    status = models.CharField(
        max_length=16, choices=PlanStatus.choices, default=PlanStatus.PROPOSED, db_index=True
    )
    mode = models.CharField(max_length=16, default="recommend", help_text="recommend or auto")
    current_layout = models.CharField(max_length=32, blank=True)
    target_layout = models.CharField(max_length=32, blank=True)
    current_goodput_rps = models.FloatField(null=True, blank=True)
    predicted_goodput_rps = models.FloatField(null=True, blank=True)
    inputs = models.JSONField(default=dict, blank=True)
    predictions = models.JSONField(default=dict, blank=True)
    chosen = models.JSONField(default=dict, blank=True)
    # The decision record: observe → predict → choose → gate → step, each verdict with its
    # numbers (controlplane.planner.record); the explanation is rendered from it.
    record = models.JSONField(default=dict, blank=True)
    diff = models.JSONField(default=list, blank=True)
    explanation = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    apply_started_at = models.DateTimeField(null=True, blank=True)
    apply_deadline = models.DateTimeField(null=True, blank=True)
    applied_at = models.DateTimeField(null=True, blank=True)
    failure_reason = models.TextField(blank=True)

    class Meta:
        ordering = ["-created"]
        indexes = [models.Index(fields=["served_model", "status"])]

    def __str__(self):
        return f"plan {self.pk}: {self.served_model} {self.current_layout}→{self.target_layout}"

    @property
    def is_open(self) -> bool:
        return self.status in OPEN_STATUSES


class ModelPlannerState(TimestampedModel):
    """The planner's memory per served model: last decision (also when it changed nothing),
    calibration factors, and the workload hint used when telemetry cannot tell requests
    from tokens."""

    served_model = models.OneToOneField(
        "topology.ServedModel", on_delete=models.CASCADE, related_name="planner_state"
    )
    last_run_at = models.DateTimeField(null=True, blank=True)
    last_action = models.CharField(max_length=16, blank=True)
    last_reason = models.CharField(max_length=32, blank=True)
    last_explanation = models.TextField(blank=True)
    last_predictions = models.JSONField(default=dict, blank=True)
    last_inputs = models.JSONField(default=dict, blank=True)
    last_record = models.JSONField(default=dict, blank=True)
    # The last move (A → B, when, at which load): keeps a move under way one move and
    # A → B → A out of the dwell window (controlplane.planner.record.MoveMemory).
    move_memory = models.JSONField(default=dict, blank=True)
    # Calibration per workload bucket and its model-error flags (calibration.py).
    calibration = models.JSONField(default=dict, blank=True)
    ttft_factor = models.FloatField(default=1.0)
    itl_factor = models.FloatField(default=1.0)
    calibration_samples = models.PositiveIntegerField(default=0)
    expected_output_tokens = models.PositiveIntegerField(
        default=256,
        help_text="Mean answer length assumed when telemetry gives tokens/s but no request rate",
    )
    peak_rps = models.FloatField(default=0.0, help_text="Decaying recent peak request rate")

    def __str__(self):
        return f"planner state of {self.served_model}"
