"""Prometheus metrics of one gateway (own registry, so several gateways can share a process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0)


class GatewayMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "pdplane_gateway_requests", "Requests answered, by model, endpoint and HTTP status",
            ["model", "endpoint", "status"], registry=r,
        )
        self.errors = Counter(
            "pdplane_gateway_errors", "Errors by kind (upstream, no_worker, bad_request, …)",
            ["model", "kind"], registry=r,
        )
        self.retries = Counter(
            "pdplane_gateway_upstream_retries", "Requests retried on another worker before "
            "the first byte", ["model", "stage"], registry=r,
        )
        self.decisions = Counter(
            "pdplane_gateway_routing_decisions", "Routing decisions by reason",
            ["model", "reason"], registry=r,
        )
        self.worker_requests = Counter(
            "pdplane_gateway_worker_requests", "Requests sent to each worker, by stage",
            ["worker", "stage"], registry=r,
        )
        self.ttft = Histogram(
            "pdplane_gateway_time_to_first_token_seconds",
            "Time to first token seen at the gateway (streaming requests)",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            "pdplane_gateway_inter_token_latency_seconds",
            "Time between streamed chunks seen at the gateway", ["model"],
            buckets=ITL_BUCKETS, registry=r,
        )
        self.e2e = Histogram(
            "pdplane_gateway_request_duration_seconds", "Whole request at the gateway",
            ["model"], buckets=LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(
            "pdplane_gateway_worker_in_flight", "Requests in flight per worker", ["worker"],
            registry=r,
        )
        self.table_version = Gauge(
            "pdplane_gateway_routing_table_version", "Version of the applied routing table",
            registry=r,
        )
        self.table_updates = Counter(
            "pdplane_gateway_table_updates", "Table updates received, by result and source",
            ["result", "source"], registry=r,
        )
        self.kv_events = Counter(
            "pdplane_gateway_kv_events", "KV-cache event batches received per worker",
            ["worker"], registry=r,
        )
        self.kv_event_gaps = Counter(
            "pdplane_gateway_kv_event_gaps", "Sequence gaps in KV-event streams", ["worker"],
            registry=r,
        )
        self.prefix_hit_tokens = Counter(
            "pdplane_gateway_predicted_cached_tokens",
            "Prompt tokens the router believed cached on the chosen worker", ["model"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "pdplane_gateway_estimated_prompt_tokens", "Prompt tokens (estimated) routed",
            ["model"], registry=r,
        )
