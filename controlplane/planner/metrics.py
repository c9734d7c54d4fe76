"""The planner's own Prometheus counters (same registry as controlplane.observability)."""

from prometheus_client import Counter

MODEL_ERRORS = Counter(
    "pdplane_planner_model_errors_total",
    "Planning cycles whose calibration factor wanted to leave [0.5, 2] (the cost model "
    "misses by more than 2x), by metric",
    ["metric"],
)
ALL_LAYOUTS_MISS = Counter(
    "pdplane_planner_all_layouts_miss_total",
    "Planning cycles that held because every layout was predicted to miss the targets",
)
