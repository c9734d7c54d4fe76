"""Policies: one cluster-wide row plus optional per-model overrides.

Every field is nullable: empty means "inherit" (from the cluster row, then from the
built-in defaults in :mod:`controlplane.policies.effective`).
"""

from django.core.exceptions import ValidationError
from django.db import models

from controlplane.core.models import TimestampedModel

from .effective import POLICY_FIELDS, PolicyError, merge_policy


class DisaggregationMode(models.TextChoices):
    AUTO = "auto", "Auto (planner decides)"
    AGGREGATED = "aggregated", "Always aggregated"
    DISAGGREGATED = "disaggregated", "Always disaggregated"


class RebalancingMode(models.TextChoices):
    OFF = "off", "Off"
    RECOMMEND = "recommend", "Recommend (plans wait for approval)"
    AUTO = "auto", "Auto (apply plans)"


def _opt_float(help_text: str = ""):
    return models.FloatField(null=True, blank=True, help_text=help_text)


def _opt_int(help_text: str = ""):
    return models.IntegerField(null=True, blank=True, help_text=help_text)


class Policy(TimestampedModel):
    cluster = models.ForeignKey(
        "topology.Cluster", on_delete=models.CASCADE, related_name="policies"
    )
    served_model = models.OneToOneField(
        "topology.ServedModel",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="policy",
        help_text="Empty: the cluster-wide default",
    )
    # Latency targets
    ttft_p95_ms = _opt_float("Time-to-first-token target at p95, ms")
    itl_p95_ms = _opt_float("Inter-token latency target at p95, ms")
    attainment = _opt_float("Share of requests that must meet both targets (0–1)")
    # Routing
    kv_overlap_weight = _opt_float("Credit for cached prefix blocks in the routing cost")
    load_weight = _opt_float("Weight of the worker's prefill load in the routing cost")
    routing_temperature = _opt_float("0 = always the cheapest worker; > 0 samples a softmax")
    routing_block_size = _opt_int("Tokens per block for prefix matching (0 = model's)")
    prefix_min_match = _opt_float(
        "Follow a cached prefix covering at least this share of the prompt (0–1)")
    affinity_load_factor = _opt_float(
        "Prefix affinity only to a worker within this × the mean load (0 = unbounded)")
    affinity_kv_limit = _opt_float(
        "Prefix affinity only to a worker using at most this share of its KV (0–1)")
    cache_balance_band = _opt_float(
        "Costs within this fraction of the lowest count as tied: fewest in flight, then "
        "least new KV")
    shed_after_ttft_factor = _opt_float(
        "Gateway cancels a request with no first token after this many times the TTFT "
        "target (0 = never)"
    )
    # Disaggregation
    disaggregation_mode = models.CharField(
        max_length=16, choices=DisaggregationMode.choices, blank=True, default=""
    )
    min_prefill_workers = _opt_int()
    max_prefill_workers = _opt_int()
    min_decode_workers = _opt_int()
    max_decode_workers = _opt_int()
    local_prefill_max_tokens = _opt_int(
        "Prefill on the decode worker when the uncached prompt is at most this long"
    )
    # Rebalancing
    rebalancing_enabled = models.BooleanField(null=True, blank=True)
    rebalancing_mode = models.CharField(
        max_length=16, choices=RebalancingMode.choices, blank=True, default=""
    )
    rebalance_interval_s = _opt_int("Seconds between planning runs")
    cooldown_s = _opt_int("Seconds a worker keeps a new role before it may change again")
    hysteresis = _opt_float("Predicted goodput gain needed before changing layout (0.1 = 10%)")
    max_changes_per_cycle = _opt_int("Most workers whose role may change in one cycle")
    overload_change_share = _opt_float(
        "When the current layout is overloaded (predicted and queueing) and the target is "
        "not: share of the workers that may change in one cycle (0–1, 0 = off)"
    )
    kv_headroom = _opt_float("Share of decode KV capacity kept free (0–1)")

    class Meta:
        verbose_name_plural = "policies"
        constraints = [
            models.UniqueConstraint(
                fields=["cluster"],
                condition=models.Q(served_model__isnull=True),
                name="policy_one_default_per_cluster",
            ),
        ]

    def __str__(self):
        scope = self.served_model.name if self.served_model_id else "default"
        return f"{self.cluster} / {scope}"

    def layer(self) -> dict:
        """This row as a policy layer: set fields only (blank strings count as unset)."""
        values = {}
        for name in POLICY_FIELDS:
            value = getattr(self, name)
            if value is None or value == "":
                continue
            values[name] = value
        values["_source"] = "model" if self.served_model_id else "cluster"
        return values

    def clean(self):
        if self.served_model_id and self.served_model.cluster_id != self.cluster_id:
            raise ValidationError({"served_model": "The model belongs to another cluster."})
        base = None
        if self.served_model_id:
            base = Policy.objects.filter(cluster_id=self.cluster_id, served_model=None).first()
        try:
            merge_policy(base.layer() if base else None, self.layer())
        except PolicyError as exc:
            raise ValidationError(
                {k if k in POLICY_FIELDS else None: v for k, v in exc.errors.items()}
            ) from None


def effective_policy_for(served_model):
    """The merged policy and its sources for a served model (defaults ← cluster ← model)."""
    rows = {
        p.served_model_id: p
        for p in Policy.objects.filter(cluster_id=served_model.cluster_id).filter(
            models.Q(served_model=None) | models.Q(served_model=served_model)
        )
    }
    cluster_row = rows.get(None)
    model_row = rows.get(served_model.pk)
    return merge_policy(
        cluster_row.layer() if cluster_row else None,
        model_row.layer() if model_row else None,
    )
