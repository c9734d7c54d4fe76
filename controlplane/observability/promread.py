"""Read fleet latency from Prometheus (when ``PROMETHEUS_URL`` is set).

Pure of Django: the planner's glue passes the URL in. Each query is bounded by a timeout,
results are cached for one planning cycle, and every failure — Prometheus down, a query
error, or simply no data yet — comes back as ``None`` so the caller falls back to the
figures the agents computed. Both the current and the older vLLM metric names are asked
for in one expression with PromQL ``or``.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

from prometheus_api_client import PrometheusConnect
from urllib3.util.retry import Retry

from controlplane.telemetry.histograms import DECODE_SIDE, PREFILL_SIDE, FleetEngineStats

log = logging.getLogger(__name__)

# Histogram families, newest name first (shared/reference/ENGINES.md).
TTFT_BUCKETS = ("vllm:time_to_first_token_seconds_bucket",)
ITL_BUCKETS = (
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:time_per_output_token_seconds_bucket",
)
PREFIX_QUERIES = ("vllm:prefix_cache_queries_total", "vllm:gpu_prefix_cache_queries_total")
PREFIX_HITS = ("vllm:prefix_cache_hits_total", "vllm:gpu_prefix_cache_hits_total")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")

# The gateway's routing decisions by reason (gateway.router, label ``model`` = the served
# model's name). On the aggregated path a request either followed its cached prefix
# ("kv_prefix") or was placed by load (the others); a retry ("retry_<reason>") counts as
# its reason. The P/D reasons ("pd_*") say nothing about the aggregated pool: not counted.
ROUTING_DECISIONS = "pdplane_gateway_routing_decisions_total"
AFFINITY_REASONS = frozenset({"kv_prefix"})
POOLED_REASONS = frozenset({"kv_aware", "only_candidate", "fallback_prefill_only"})
# Fewer aggregated-path decisions than this in the window: a share of a handful of
# requests is noise, not a routing mix (None = the cost model's estimate).
MIN_DECISIONS = 20.0
# The P/D path's decisions (conditional or disaggregated mode): prefilled on the decode
# worker because the part not cached was at most local_prefill_max_tokens
# ("pd_local_prefill"), or not ("pd_remote_prefill"; "pd_no_prefill_worker": long, but no
# prefill worker left, so the decode worker prefilled it anyway — not a short prompt).
# "pd_no_kv_params" is counted on top of a remote decision for the same request: left out.
LOCAL_PREFILL_REASONS = frozenset({"pd_local_prefill"})
PD_REASONS = frozenset({"pd_local_prefill", "pd_remote_prefill", "pd_no_prefill_worker"})


@dataclass(frozen=True)
class LatencyFigures:
    """What Prometheus says about one served model or one worker over a window."""

    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_p50_s: float | None
    itl_p95_s: float | None
    request_rate: float | None
    prompt_tokens_per_s: float | None
    generation_tokens_per_s: float | None
    prefix_hit_rate: float | None
    kv_usage: float | None
    source: str = "prometheus"

    @property
    def has_latency(self) -> bool:
        return self.ttft_p95_s is not None or self.itl_p95_s is not None


def _selector(labels: dict[str, str], extra: str = "") -> str:
    def quote(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    matchers = [f'{k}="{quote(v)}"' for k, v in sorted(labels.items())]
    return "{" + ",".join([*matchers, extra] if extra else matchers) + "}"


def _either(names: tuple[str, ...], labels: dict[str, str], template: str,
            extra: str = "") -> str:
    """``template`` applied to each metric name, joined with ``or`` (old and new names)."""
    sel = _selector(labels, extra)
    return " or ".join(f"({template.format(m=name + sel)})" for name in names)


def quantile_query(q: float, names: tuple[str, ...], labels: dict[str, str], window: str) -> str:
    inner = _either(names, labels, f"sum by (le) (rate({{m}}[{window}]))")
    return f"histogram_quantile({q}, {inner})"


def rate_query(names: tuple[str, ...], labels: dict[str, str], window: str) -> str:
    return _either(names, labels, f"sum(rate({{m}}[{window}]))")


def _side(names: tuple[str, ...], labels: dict[str, str], roles: tuple[str, ...],
          template: str, role_template: str = "") -> str:
    """``template`` over the engines of those roles (the ``role`` label pdplane's service
    discovery attaches; ``role_template`` there when given), or over every engine when no
    series carries that label."""
    with_role = _either(names, labels, role_template or template,
                        f'role=~"{"|".join(roles)}"')
    return f"({with_role}) or ({_either(names, labels, template)})"


def prefill_halves_query(labels: dict[str, str], window: str) -> str:
    """Per second, the prefill halves "both" engines finished for requests decoded
    elsewhere, while any engine is prefill- or decode-only (mid-move); 0 otherwise — the
    agents' rule (controlplane.telemetry.histograms.without_prefill_halves) in PromQL.

    Each half is a finished request with one generated token (vLLM's P/D prefill runs with
    ``max_tokens=1``) that the decode engine finishes again: counted as it is, it doubles
    those requests and pulls the answer length down. A "both" engine's one-token finishes
    (its generation histogram's le=1 bucket) are taken for such halves; in an all-"both"
    (aggregated) fleet a one-token answer is a real one and stays."""
    ones = _selector(labels, 'role="both",le=~"1|1.0"')
    split = _selector(labels, 'role=~"prefill|decode"')
    return (f"scalar((sum(rate(vllm:request_generation_tokens_bucket{ones}[{window}])) "
            f"and on() count(vllm:request_success_total{split})) or vector(0))")


def affinity_query(model_name: str, window: str) -> str:
    return (f"sum by (reason) (increase({ROUTING_DECISIONS}"
            f"{_selector({'model': model_name})}[{window}]))")


def affinity_share_from(result) -> float | None:
    """Share of the aggregated path's decisions that followed a prefix, from the vector
    answer to :func:`affinity_query` (``[{"metric": {"reason": ...}, "value": [t, "n"]}]``);
    None when the answer is malformed or holds under :data:`MIN_DECISIONS` decisions."""
    counts = _reason_counts(result)
    followed = sum(counts.get(r, 0.0) for r in AFFINITY_REASONS)
    total = followed + sum(counts.get(r, 0.0) for r in POOLED_REASONS)
    return followed / total if total >= MIN_DECISIONS else None


def _reason_counts(result) -> dict[str, float]:
    """reason → decisions from the vector answer to :func:`affinity_query`, a retry
    ("retry_<reason>") counted as its reason; malformed or negative series skipped."""
    counts: dict[str, float] = {}
    if not isinstance(result, list):
        return counts
    for series in result:
        try:
            reason = str(series["metric"].get("reason", "")).removeprefix("retry_")
            value = float(series["value"][1])
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            continue
        if math.isfinite(value) and value >= 0:
            counts[reason] = counts.get(reason, 0.0) + value
    return counts


def local_prefill_share_from(result) -> float | None:
    """Share of the model's P/D decisions that prefilled on the decode worker
    ("pd_local_prefill" ÷ :data:`PD_REASONS`), from the same answer as
    :func:`affinity_share_from`. None when malformed or under :data:`MIN_DECISIONS` P/D
    decisions (an aggregated fleet makes none: the share is then unknown here)."""
    counts = _reason_counts(result)
    total = sum(counts.get(r, 0.0) for r in PD_REASONS)
    local = sum(counts.get(r, 0.0) for r in LOCAL_PREFILL_REASONS)
    return local / total if total >= MIN_DECISIONS else None


def prom_duration(seconds: float) -> str:
    """A Prometheus duration: integer milliseconds ("3.0s" is refused as bad_data)."""
    return f"{max(round(seconds * 1000), 1)}ms"


_readers: dict[str, FleetLatencyReader] = {}


def reader_for(url: str) -> FleetLatencyReader:
    """One reader (and its cache) per Prometheus URL in this process."""
    reader = _readers.get(url)
    if reader is None:
        reader = _readers[url] = FleetLatencyReader(url)
    return reader


class FleetLatencyReader:
    """Queries Prometheus for per-model and per-worker figures, cached for ``cache_s``."""

    def __init__(self, url: str, *, timeout_s: float = 3.0, cache_s: float = 30.0,
                 window: str = "5m"):
        self.url = url
        self.timeout_s = timeout_s
        self.cache_s = cache_s
        self.window = window
        # No retries: the client's default (3, with backoff) turns "Prometheus is down" into
        # seconds of stall per planning cycle; one failed query is enough to fall back.
        self._client = PrometheusConnect(url=url, disable_ssl=True, timeout=timeout_s,
                                         retry=Retry(total=0))
        self._cache: dict[tuple, tuple[float, object]] = {}

    def model_figures(self, model_name: str) -> LatencyFigures | None:
        return self._figures({"model_name": model_name})

    def worker_figures(self, model_name: str, worker: str) -> LatencyFigures | None:
        """``worker`` is the target label pdplane's service discovery attaches."""
        return self._figures({"model_name": model_name, "worker": worker})

    def engine_stats(self, model_name: str, window_s: float) -> FleetEngineStats | None:
        """The agents' fleet figures (controlplane.telemetry.histograms) from Prometheus:
        the same counters and buckets, merged by ``sum by (le)``. None on any failure or
        when Prometheus has no requests for the model in the window."""
        return self._cached(
            ("engine_stats", model_name, window_s),
            lambda: self._engine_stats({"model_name": model_name}, prom_duration(window_s),
                                       window_s),
            "prometheus query failed (%s); falling back to agent figures")

    def affinity_share(self, model_name: str, window_s: float) -> float | None:
        """Share of the model's aggregated-path routing decisions over ``window_s`` that
        followed a cached prefix (:func:`affinity_share_from`); None on any failure."""
        return affinity_share_from(self._decisions(model_name, window_s))

    def local_prefill_share(self, model_name: str, window_s: float) -> float | None:
        """Share of the model's P/D routing decisions over ``window_s`` that prefilled on
        the decode worker (:func:`local_prefill_share_from`); None on any failure."""
        return local_prefill_share_from(self._decisions(model_name, window_s))

    def _decisions(self, model_name: str, window_s: float):
        """The routing decisions by reason (one query, cached: both shares read it)."""
        return self._cached(
            ("decisions", model_name, window_s),
            lambda: self._client.custom_query(
                affinity_query(model_name, prom_duration(window_s)),
                params={"timeout": prom_duration(self.timeout_s)}),
            "prometheus routing-decision query failed (%s); routing shares unknown")

    def _engine_stats(self, labels: dict[str, str], w: str, window_s: float
                      ) -> FleetEngineStats | None:
        rate = f"sum(rate({{m}}[{w}]))"
        buckets = f"sum by (le) (rate({{m}}[{w}]))"

        def q(names, roles, template):
            return self._scalar(_side(names, labels, roles, template))

        def quantiles(family: tuple[str, ...], roles) -> tuple[float | None, float | None]:
            names = tuple(n + "_bucket" for n in family)
            return tuple(q(names, roles, f"histogram_quantile({p}, {buckets})")
                         for p in (0.5, 0.95))

        def mean(family: str, roles) -> float | None:
            total = q((family + "_sum",), roles, rate)
            count = q((family + "_count",), roles, rate)
            return total / count if total is not None and count else None

        # The decode side less the prefill halves "both" engines finished mid-move (each
        # one request and one generated token): the request rate, and the answer lengths'
        # count, sum and every bucket (vLLM's token buckets start at 1).
        less = prefill_halves_query(labels, w).replace("{", "{{").replace("}", "}}")
        dec_rate = f"(sum(rate({{m}}[{w}])) - {less})"

        def decode_side(names, template, role_template):
            return self._scalar(_side(names, labels, DECODE_SIDE, template, role_template))

        requests = decode_side(("vllm:request_success_total",), rate, dec_rate)
        if not requests or requests <= 0:
            return None
        # Prompts where requests finish (histograms' module docstring: the prefill side
        # misses conditional P/D's local prefills).
        prompt = quantiles(("vllm:request_prompt_tokens",), DECODE_SIDE)
        gen = tuple(decode_side(
            ("vllm:request_generation_tokens_bucket",), f"histogram_quantile({p}, {buckets})",
            f"histogram_quantile({p}, clamp_min(sum by (le) (rate({{m}}[{w}])) - {less}, 0))")
            for p in (0.5, 0.95))
        gen_sum = decode_side(("vllm:request_generation_tokens_sum",), rate, dec_rate)
        gen_count = decode_side(("vllm:request_generation_tokens_count",), rate, dec_rate)
        ttft = quantiles(tuple(n.removesuffix("_bucket") for n in TTFT_BUCKETS), PREFILL_SIDE)
        itl = quantiles(tuple(n.removesuffix("_bucket") for n in ITL_BUCKETS), DECODE_SIDE)
        return FleetEngineStats(
            source="prometheus", window_s=window_s, request_rate=requests,
            prompt_tokens_per_s=q(("vllm:prompt_tokens_total",), DECODE_SIDE, rate),
            generation_tokens_per_s=q(("vllm:generation_tokens_total",), DECODE_SIDE, rate),
            prompt_tokens_p50=prompt[0], prompt_tokens_p95=prompt[1],
            prompt_tokens_mean=mean("vllm:request_prompt_tokens", DECODE_SIDE),
            generation_tokens_p50=gen[0], generation_tokens_p95=gen[1],
            generation_tokens_mean=(gen_sum / gen_count if gen_sum is not None and gen_count
                                    and gen_count > 0 else None),
            ttft_p50_s=ttft[0], ttft_p95_s=ttft[1], itl_p50_s=itl[0], itl_p95_s=itl[1],
        )

    def _figures(self, labels: dict[str, str]) -> LatencyFigures | None:
        return self._cached(tuple(sorted(labels.items())), lambda: self._query_all(labels),
                            "prometheus query failed (%s); falling back to agent figures")

    def _cached(self, key: tuple, compute, failure: str):
        """``compute()``'s answer, kept for ``cache_s``; a failure (requests, JSON and
        Prometheus errors alike) is logged with ``failure`` and kept as None, so a down
        Prometheus costs one failed query per key and interval, not one per caller."""
        cached = self._cache.get(key)
        now = time.monotonic()
        if cached and now - cached[0] < self.cache_s:
            return cached[1]
        try:
            value = compute()
        except Exception as exc:
            log.warning(failure, exc)
            value = None
        self._cache[key] = (now, value)
        return value

    def _scalar(self, query: str) -> float | None:
        result = self._client.custom_query(query, params={"timeout": prom_duration(self.timeout_s)})
        if not result:
            return None
        value = float(result[0]["value"][1])
        return value if math.isfinite(value) else None

    def _query_all(self, labels: dict[str, str]) -> LatencyFigures | None:
        w = self.window
        ttft95 = self._scalar(quantile_query(0.95, TTFT_BUCKETS, labels, w))
        itl95 = self._scalar(quantile_query(0.95, ITL_BUCKETS, labels, w))
        queries = self._scalar(rate_query(PREFIX_QUERIES, labels, w))
        hits = self._scalar(rate_query(PREFIX_HITS, labels, w))
        figures = LatencyFigures(
            ttft_p50_s=self._scalar(quantile_query(0.5, TTFT_BUCKETS, labels, w)),
            ttft_p95_s=ttft95,
            itl_p50_s=self._scalar(quantile_query(0.5, ITL_BUCKETS, labels, w)),
            itl_p95_s=itl95,
            request_rate=self._scalar(
                rate_query(("vllm:request_success_total",), labels, w)
            ),
            prompt_tokens_per_s=self._scalar(rate_query(("vllm:prompt_tokens_total",), labels, w)),
            generation_tokens_per_s=self._scalar(
                rate_query(("vllm:generation_tokens_total",), labels, w)
            ),
            prefix_hit_rate=(hits / queries) if hits is not None and queries else None,
            kv_usage=self._scalar(_either(KV_USAGE, labels, "avg({m})")),
        )
        # "No data" is not "zero": with no latency samples the caller uses the agents.
        return figures if figures.has_latency else None
