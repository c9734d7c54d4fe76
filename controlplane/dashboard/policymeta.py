"""How the policies page shows each setting: section, plain name, unit and description.

Descriptions come from the Policy model's help texts (one place for the words); the few
fields without one get theirs here. Units format the value once (``800 ms``, ``10 %``).
"""

from __future__ import annotations

# field: (section, label, unit, description when the model has no help text)
FIELDS: dict[str, tuple[str, str, str, str]] = {
    "ttft_p95_ms": ("Latency targets", "TTFT target (p95)", "ms", ""),
    "itl_p95_ms": ("Latency targets", "ITL target (p95)", "ms", ""),
    "attainment": ("Latency targets", "Attainment", "share", ""),
    "kv_overlap_weight": ("Routing", "Cached-prefix credit", "weight", ""),
    "load_weight": ("Routing", "Load weight", "weight", ""),
    "routing_temperature": ("Routing", "Routing temperature", "", ""),
    "routing_block_size": ("Routing", "Prefix block size", "tokens", ""),
    "prefix_min_match": ("Routing", "Prefix affinity: minimum match", "share", ""),
    "affinity_load_factor": ("Routing", "Prefix affinity: load limit", "× mean", ""),
    "affinity_kv_limit": ("Routing", "Prefix affinity: KV limit", "share", ""),
    "cache_balance_band": ("Routing", "Cache balance band", "share", ""),
    "shed_after_ttft_factor": ("Routing", "Shed after", "× TTFT target", ""),
    "disaggregation_mode": ("Disaggregation", "Mode", "",
                            "auto: the planner picks aggregated or a P:D split; or force one"),
    "min_prefill_workers": ("Disaggregation", "Prefill workers, at least", "workers",
                            "The planner never proposes fewer prefill workers"),
    "max_prefill_workers": ("Disaggregation", "Prefill workers, at most", "workers",
                            "The planner never proposes more prefill workers"),
    "min_decode_workers": ("Disaggregation", "Decode workers, at least", "workers",
                           "The planner never proposes fewer decode workers"),
    "max_decode_workers": ("Disaggregation", "Decode workers, at most", "workers",
                           "The planner never proposes more decode workers"),
    "local_prefill_max_tokens": ("Disaggregation", "Local prefill up to", "tokens", ""),
    "rebalancing_enabled": ("Rebalancing", "Rebalancing", "",
                            "Whether the planner runs for this model at all"),
    "rebalancing_mode": ("Rebalancing", "Plans are", "",
                         "recommend: wait for an operator's approval; auto: applied"),
    "rebalance_interval_s": ("Rebalancing", "Planning interval", "s", ""),
    "cooldown_s": ("Rebalancing", "Cooldown", "s", ""),
    "hysteresis": ("Rebalancing", "Hysteresis", "share", ""),
    "max_changes_per_cycle": ("Rebalancing", "Changes per cycle, at most", "workers", ""),
    "overload_change_share": ("Rebalancing", "Changes when overloaded, share", "share", ""),
    "kv_headroom": ("Rebalancing", "KV headroom", "share", ""),
}

SOURCES = {"default": "built-in default", "cluster": "cluster policy",
           "model": "model override"}


def format_value(value, unit: str) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    if value is None or value == "":
        return "inherit"
    if unit == "share" and isinstance(value, int | float):
        return f"{value * 100:g} %"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value:g} {unit}".strip() if isinstance(value, int | float) and unit else str(value)


def describe(model_cls, name: str) -> dict:
    section, label, unit, fallback = FIELDS.get(name, ("Other", name, "", ""))
    try:
        help_text = str(model_cls._meta.get_field(name).help_text or "")
    except Exception:  # a field the model does not have (yet): the fallback will do
        help_text = ""
    return {"section": section, "label": label, "unit": unit,
            "description": help_text or fallback}
