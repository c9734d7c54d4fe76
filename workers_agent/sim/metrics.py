"""`/metrics` of a simulated engine, with vLLM 0.3x names, labels and histogram buckets.

Every family carries the labels ``model_name`` (the served model name) and ``engine``
(vLLM's engine-core index, ``"0"`` for a single-engine server, as real vLLM prints).
Counters are exposed with the ``_total`` suffix by prometheus_client, as vLLM's are.
Bucket lists are vLLM's (vllm/v1/metrics/loggers.py and the NIXL connector's metrics).

Gauges and engine-level counters are read from the engine's stats at scrape time (one
consistent snapshot per scrape); request-level histograms are observed by the server as
requests progress. One CollectorRegistry per engine, so several engines share a process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

TTFT_BUCKETS = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
]  # fmt: skip
ITL_BUCKETS = [
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
]  # fmt: skip
REQUEST_LATENCY_BUCKETS = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
]  # fmt: skip
ITERATION_TOKEN_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384]
# NIXL connector: transfer time buckets (its list without the first entry) and bytes
# "uniform 2 KB to 16 GB" (powers of two, every other one).
NIXL_XFER_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0]
NIXL_BYTES_BUCKETS = [2 ** (10 + i) for i in range(1, 25, 2)]

FINISH_REASONS = ("stop", "length", "abort")
TOKEN_SOURCES = ("local_compute", "local_cache_hit", "external_kv_transfer")


def build_1_2_5_buckets(max_value: int) -> list[int]:
    """1, 2, 5, 10, 20, 50, … up to max_value (vLLM's token-count buckets)."""
    buckets: list[int] = []
    exponent = 0
    while True:
        for mantissa in (1, 2, 5):
            value = mantissa * 10**exponent
            if value > max_value:
                return buckets
            buckets.append(value)
        exponent += 1


@dataclass
class ServerCounters:
    """Counters the server keeps itself (the engine model does not know about them)."""

    request_success: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0)
    )
    external_queries: int = 0
    external_hits: int = 0
    nixl_failed_transfers: int = 0
    nixl_expired_requests: int = 0


@dataclass
class CacheConfigInfo:
    block_size: int
    num_gpu_blocks: int
    enable_prefix_caching: bool
    kv_cache_memory_bytes: int
    cache_dtype: str = "auto"
    gpu_memory_utilization: float = 0.9

    def labels(self) -> dict[str, str]:
        # vLLM prints every CacheConfig field as a string (None as "None").
        return {
            "block_size": str(self.block_size),
            "cache_dtype": self.cache_dtype,
            "calculate_kv_scales": "False",
            "cpu_offload_gb": "0",
            "enable_prefix_caching": str(self.enable_prefix_caching),
            "gpu_memory_utilization": str(self.gpu_memory_utilization),
            "is_attention_free": "False",
            "kv_cache_memory_bytes": str(self.kv_cache_memory_bytes),
            "num_cpu_blocks": "None",
            "num_gpu_blocks": str(self.num_gpu_blocks),
            "num_gpu_blocks_override": "None",
            "prefix_caching_hash_algo": "sha256",
            "sliding_window": "None",
            "swap_space": "4",
        }


class _EngineStateCollector(Collector):
    """Gauges and counters read at scrape time from the engine's stats and the server."""

    def __init__(self, metrics: EngineMetrics) -> None:
        self.m = metrics

    def collect(self):
        m = self.m
        labels = ["model_name", "engine"]
        values = [m.model_name, m.engine_label]
        stats = m.stats_fn()

        def gauge(name: str, doc: str, value: float):
            fam = GaugeMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            return fam

        def counter(name: str, doc: str, value: float):
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, value)
            return fam

        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
                    stats.num_running)
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
                    stats.num_waiting)
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
                    stats.kv_usage)
        info = GaugeMetricFamily(
            "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
            labels=[*m.cache_info.labels().keys(), "engine"],
        )
        info.add_metric([*m.cache_info.labels().values(), m.engine_label], 1)
        yield info
        yield counter("vllm:prefix_cache_queries",
                      "Prefix cache queries, in terms of number of queried tokens.",
                      stats.prefix_cache_queries)
        yield counter("vllm:prefix_cache_hits",
                      "Prefix cache hits, in terms of number of cached tokens.",
                      stats.prefix_cache_hits)
        c = m.counters
        yield counter("vllm:external_prefix_cache_queries",
                      "External prefix cache queries from KV connector cross-instance cache "
                      "sharing, in terms of number of queried tokens.", c.external_queries)
        yield counter("vllm:external_prefix_cache_hits",
                      "External prefix cache hits from KV connector cross-instance cache "
                      "sharing, in terms of number of cached tokens.", c.external_hits)
        yield counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.",
                      stats.num_preemptions)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                      stats.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.",
                      stats.generation_tokens)
        sources = {
            "local_compute": stats.prompt_tokens_local_compute,
            "local_cache_hit": stats.prompt_tokens_cached,
            "external_kv_transfer": stats.prompt_tokens_external,
        }
        yield counter("vllm:prompt_tokens_cached",
                      "Number of cached prompt tokens (local + external).",
                      sources["local_cache_hit"] + sources["external_kv_transfer"])
        by_source = CounterMetricFamily("vllm:prompt_tokens_by_source",
                                        "Number of prompt tokens by source.",
                                        labels=[*labels, "source"])
        for source in TOKEN_SOURCES:
            by_source.add_metric([*values, source], sources[source])
        yield by_source
        success = CounterMetricFamily("vllm:request_success",
                                      "Count of successfully processed requests.",
                                      labels=[*labels, "finished_reason"])
        for reason in FINISH_REASONS:
            success.add_metric([*values, reason], c.request_success[reason])
        yield success
        if m.with_nixl:
            yield counter("vllm:nixl_num_failed_transfers",
                          "Number of failed NIXL KV Cache transfers.", c.nixl_failed_transfers)
            yield counter("vllm:nixl_num_kv_expired_reqs",
                          "Number of requests that had their KV expire.",
                          c.nixl_expired_requests)


class EngineMetrics:
    def __init__(
        self,
        *,
        model_name: str,
        stats_fn: Callable[[], Any],
        cache_info: CacheConfigInfo,
        max_model_len: int,
        engine_label: str = "0",
        with_nixl: bool = True,
    ) -> None:
        self.model_name = model_name
        self.engine_label = engine_label
        self.stats_fn = stats_fn
        self.cache_info = cache_info
        self.with_nixl = with_nixl
        self.counters = ServerCounters()
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineStateCollector(self))

        labels = ["model_name", "engine"]

        def histogram(name: str, doc: str, buckets) -> Any:
            hist = Histogram(name, doc, labelnames=labels, buckets=buckets, registry=self.registry)
            return hist.labels(model_name, engine_label)

        tokens = build_1_2_5_buckets(max_model_len)
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "Histogram of time to first token in seconds.", TTFT_BUCKETS)
        self.itl = histogram("vllm:inter_token_latency_seconds",
                             "Histogram of inter-token latency in seconds.", ITL_BUCKETS)
        self.tpot = histogram("vllm:request_time_per_output_token_seconds",
                              "Histogram of time_per_output_token_seconds per request.",
                              ITL_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.",
                             REQUEST_LATENCY_BUCKETS)
        self.queue = histogram("vllm:request_queue_time_seconds",
                               "Histogram of time spent in WAITING phase for request.",
                               REQUEST_LATENCY_BUCKETS)
        self.inference = histogram("vllm:request_inference_time_seconds",
                                   "Histogram of time spent in RUNNING phase for request.",
                                   REQUEST_LATENCY_BUCKETS)
        self.prefill = histogram("vllm:request_prefill_time_seconds",
                                 "Histogram of time spent in PREFILL phase for request.",
                                 REQUEST_LATENCY_BUCKETS)
        self.decode = histogram("vllm:request_decode_time_seconds",
                                "Histogram of time spent in DECODE phase for request.",
                                REQUEST_LATENCY_BUCKETS)
        self.prompt_tokens = histogram("vllm:request_prompt_tokens",
                                       "Number of prefill tokens processed.", tokens)
        self.generation_tokens = histogram("vllm:request_generation_tokens",
                                           "Number of generation tokens processed.", tokens)
        self.max_tokens = histogram("vllm:request_params_max_tokens",
                                    "Histogram of the max_tokens request parameter.", tokens)
        self.iteration_tokens = histogram("vllm:iteration_tokens_total",
                                          "Histogram of number of tokens per engine_step.",
                                          ITERATION_TOKEN_BUCKETS)
        if with_nixl:
            self.nixl_xfer = histogram("vllm:nixl_xfer_time_seconds",
                                       "Histogram of transfer duration for NIXL KV Cache "
                                       "transfers.", NIXL_XFER_BUCKETS)
            self.nixl_bytes = histogram("vllm:nixl_bytes_transferred",
                                        "Histogram of bytes transferred per NIXL KV Cache "
                                        "transfers.", NIXL_BYTES_BUCKETS)

    def record_finished(
        self,
        *,
        reason: str,
        e2e: float,
        queued: float,
        prefill: float,
        decode: float,
        prompt_tokens: int,
        generation_tokens: int,
        max_tokens: int,
    ) -> None:
        reason = reason if reason in FINISH_REASONS else "stop"
        self.counters.request_success[reason] += 1
        self.e2e.observe(max(e2e, 0.0))
        self.queue.observe(max(queued, 0.0))
        self.inference.observe(max(prefill + decode, 0.0))
        self.prefill.observe(max(prefill, 0.0))
        self.decode.observe(max(decode, 0.0))
        self.prompt_tokens.observe(prompt_tokens)
        self.generation_tokens.observe(generation_tokens)
        self.max_tokens.observe(max_tokens)
        if generation_tokens > 1:
            self.tpot.observe(max(decode, 0.0) / (generation_tokens - 1))

    def record_transfer(self, *, seconds: float, nbytes: int, tokens: int) -> None:
        self.counters.external_queries += tokens
        self.counters.external_hits += tokens
        if self.with_nixl:
            self.nixl_xfer.observe(seconds)
            self.nixl_bytes.observe(nbytes)

    def render(self) -> bytes:
        return generate_latest(self.registry)
