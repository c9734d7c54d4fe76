"""Effective policy: built-in defaults ← cluster policy ← per-model override.

Pure: no Django import. Each layer is a mapping of field name to value where ``None``
means "not set here, inherit". :func:`merge_policy` also records which layer each value
came from, so the UI and the API can show why a model runs under a given target.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any


@dataclass(frozen=True)
class EffectivePolicy:
    # Latency targets
    ttft_p95_ms: float = 1000.0
    itl_p95_ms: float = 50.0
    attainment: float = 0.90
    # Routing weights (see docs/routing-table.md)
    kv_overlap_weight: float = 1.0
    load_weight: float = 1.0
    routing_temperature: float = 0.0
    routing_block_size: int = 0  # 0: use the served model's KV block size
    # Prefix affinity (gateway.router, docs/routing-table.md): follow a cached prefix that
    # covers at least prefix_min_match of the prompt, while the holder's in-flight requests
    # and queued prefill stay within affinity_load_factor × the mean (0: unbounded) and its
    # KV use within affinity_kv_limit of capacity; among costs within cache_balance_band of
    # the lowest, the worker that took the least new KV lately wins.
    prefix_min_match: float = 0.3
    affinity_load_factor: float = 1.5
    affinity_kv_limit: float = 0.9
    cache_balance_band: float = 0.1
    # Load shedding at the gateway: a request with no first token after this many times the
    # TTFT target is cancelled (it has missed the target; serving it late only delays the
    # requests behind it). 0: off.
    shed_after_ttft_factor: float = 0.0
    # Disaggregation
    disaggregation_mode: str = "auto"  # auto | aggregated | disaggregated
    min_prefill_workers: int = 0
    max_prefill_workers: int = 64
    min_decode_workers: int = 1
    max_decode_workers: int = 256
    local_prefill_max_tokens: int = 512
    # Rebalancing
    rebalancing_enabled: bool = True
    rebalancing_mode: str = "recommend"  # off | recommend | auto
    rebalance_interval_s: int = 60
    cooldown_s: int = 300
    hysteresis: float = 0.10
    max_changes_per_cycle: int = 1
    # Overloaded now (predicted and queueing) and the target is not: up to this share of
    # the model's workers may change in one cycle (never fewer than max_changes_per_cycle;
    # 0 turns the escalation off). See docs/planner.md.
    overload_change_share: float = 0.5
    kv_headroom: float = 0.15

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


POLICY_FIELDS = tuple(f.name for f in fields(EffectivePolicy))
DEFAULT_POLICY = EffectivePolicy()


class PolicyError(ValueError):
    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


def validate_policy(p: EffectivePolicy) -> dict[str, str]:
    """Cross-field checks on a merged policy; returns field → message (empty when valid)."""
    errors: dict[str, str] = {}
    for f in fields(p):  # NaN compares false with everything: it would pass every check below
        value = getattr(p, f.name)
        if isinstance(value, float) and not math.isfinite(value):
            errors[f.name] = "must be a finite number"
    if errors:
        return errors
    if p.ttft_p95_ms <= 0:
        errors["ttft_p95_ms"] = "must be positive"
    if p.itl_p95_ms <= 0:
        errors["itl_p95_ms"] = "must be positive"
    if not 0 < p.attainment <= 1:
        errors["attainment"] = "must be in (0, 1]"
    if p.kv_overlap_weight < 0:
        errors["kv_overlap_weight"] = "must not be negative"
    if p.load_weight < 0:
        errors["load_weight"] = "must not be negative"
    # The routing table carries these as block_size ≥ 1 and local_prefill_max_tokens ≥ 0; a
    # negative value would build a table every gateway refuses (issue 20, defect 1).
    if p.routing_block_size < 0:
        errors["routing_block_size"] = "must be 0 (the model's KV block size) or positive"
    if p.local_prefill_max_tokens < 0:
        errors["local_prefill_max_tokens"] = "must not be negative"
    for name in ("min_prefill_workers", "max_prefill_workers", "min_decode_workers",
                 "max_decode_workers"):
        if getattr(p, name) < 0:
            errors[name] = "must not be negative"
    if p.shed_after_ttft_factor != 0 and p.shed_after_ttft_factor < 1:
        errors["shed_after_ttft_factor"] = "must be 0 (off) or at least 1"
    if p.routing_temperature < 0:
        errors["routing_temperature"] = "must not be negative"
    for name in ("prefix_min_match", "affinity_load_factor", "cache_balance_band"):
        if getattr(p, name) < 0:
            errors[name] = "must not be negative"
    if not 0 <= p.affinity_kv_limit <= 1:
        errors["affinity_kv_limit"] = "must be in [0, 1] (0: no KV bound)"
    if p.disaggregation_mode not in {"auto", "aggregated", "disaggregated"}:
        errors["disaggregation_mode"] = "must be auto, aggregated or disaggregated"
    if p.rebalancing_mode not in {"off", "recommend", "auto"}:
        errors["rebalancing_mode"] = "must be off, recommend or auto"
    if p.min_prefill_workers > p.max_prefill_workers:
        errors.setdefault("min_prefill_workers", "exceeds max_prefill_workers")
    if p.min_decode_workers > p.max_decode_workers:
        errors.setdefault("min_decode_workers", "exceeds max_decode_workers")
    if p.rebalance_interval_s < 5:
        errors["rebalance_interval_s"] = "must be at least 5 seconds"
    if p.cooldown_s < 0:
        errors["cooldown_s"] = "must not be negative"
    if not 0 <= p.hysteresis < 1:
        errors["hysteresis"] = "must be in [0, 1)"
    if p.max_changes_per_cycle < 1:
        errors["max_changes_per_cycle"] = "must be at least 1"
    if not 0 <= p.overload_change_share <= 1:
        errors["overload_change_share"] = "must be in [0, 1]"
    if not 0 <= p.kv_headroom < 1:
        errors["kv_headroom"] = "must be in [0, 1)"
    return errors


def merge_policy(
    *layers: Mapping[str, Any] | None,
) -> tuple[EffectivePolicy, dict[str, str]]:
    """Merge layers over the defaults, later layers winning where they set a value.

    Returns the policy and, per field, the name of the layer it came from
    (``"default"``, or ``"layer1"``, ``"layer2"``… unless a layer carries a ``"_source"`` key).
    Unknown keys are an error: a typo in an override must not silently do nothing.
    """
    values = DEFAULT_POLICY.as_dict()
    sources = dict.fromkeys(values, "default")
    for position, layer in enumerate(layers, start=1):
        if not layer:
            continue
        name = str(layer.get("_source", f"layer{position}"))
        unknown = sorted(set(layer) - set(values) - {"_source"})
        if unknown:
            raise PolicyError({key: "unknown policy field" for key in unknown})
        for key, value in layer.items():
            if key == "_source" or value is None:
                continue
            values[key] = value
            sources[key] = name
    policy = EffectivePolicy(**values)
    errors = validate_policy(policy)
    if errors:
        raise PolicyError(errors)
    return policy, sources
