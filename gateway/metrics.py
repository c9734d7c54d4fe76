"""Prometheus metrics of one gateway (own registry, so several gateways can share a process).

The request path counts into plain Python numbers (:class:`Counter`, :class:`Gauge`,
:class:`Histogram` below: no lock, no validation, no allocation once a label set's child
exists); they are turned into Prometheus families only when ``/metrics`` is scraped. With
``prometheus_client``'s own metric classes each of the ~10 updates per request took a lock
and a validity check. The exposition is the same (``_total`` counters, ``_bucket`` /
``_sum`` / ``_count`` histograms), minus the ``_created`` series.
"""

from __future__ import annotations

from bisect import bisect_left

from prometheus_client import CollectorRegistry
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0,
)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
               0.75, 1.0, 2.5, 5.0)


class _Value:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)


class _Buckets:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class _Family:
    """A metric with labels; ``labels(*values)`` gives the child to count into. A family
    without labels is its own child (``.set()``, ``.inc()`` directly)."""

    kind = "counter"

    def __init__(self, name: str, doc: str, labelnames=(), registry=None, buckets=()):
        self.name, self.doc, self.labelnames = name, doc, tuple(labelnames)
        self.buckets = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], object] = {}
        self._own = None if self.labelnames else self.labels()
        if registry is not None:
            registry.register(self)

    def _new_child(self):
        return _Value()

    def labels(self, *values: str):
        if len(values) != len(self.labelnames):
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected")
        key = tuple(str(v) for v in values)
        child = self.children.get(key)
        if child is None:
            child = self.children[key] = self._new_child()
        return child

    def inc(self, amount: float = 1.0) -> None:
        self._own.inc(amount)

    def set(self, value: float) -> None:
        self._own.set(value)

    def collect(self):
        family_type = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = family_type(self.name, self.doc, labels=self.labelnames)
        for key, child in list(self.children.items()):
            family.add_metric(list(key), child.value)
        yield family


class Children(dict):
    """A family's children by their last label values, the first ones fixed
    (``Children(family, "m")["a"]`` is ``family.labels("m", "a")``; with two labels left,
    ``[…][…]``): what the request path counts into costs one dict lookup per label, no
    tuple building or conversion after the first time."""

    __slots__ = ("family", "fixed")

    def __init__(self, family: _Family, *fixed: str) -> None:
        super().__init__()
        self.family, self.fixed = family, fixed

    def __missing__(self, value):
        labels = (*self.fixed, value)
        child = (Children(self.family, *labels) if len(labels) < len(self.family.labelnames)
                 else self.family.labels(*labels))
        self[value] = child
        return child


class Counter(_Family):
    kind = "counter"


class Gauge(_Family):
    kind = "gauge"


class Histogram(_Family):
    kind = "histogram"

    def _new_child(self):
        return _Buckets(self.buckets)

    def collect(self):
        family = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for key, child in list(self.children.items()):
            cumulative, total = [], 0
            for bound, count in zip((*self.buckets, float("inf")), child.counts, strict=True):
                total += count
                cumulative.append(("+Inf" if bound == float("inf") else repr(bound), total))
            family.add_metric(list(key), cumulative, child.sum)
        yield family


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
        # Read from the gateway's load table when scraped (watch_loads): nothing is set
        # on the request path (two gauge updates a request before).
        self.in_flight = _InFlightCollector(None)
        r.register(self.in_flight)
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
        self.route_rules = Counter(
            "pdplane_gateway_route_rules", "Requests by the rule that decided their route "
            "(affinity, cost, balance, local_prefill, fallback)", ["model", "rule"], registry=r,
        )
        self.avoidable_prefill_tokens = Counter(
            "pdplane_gateway_avoidable_prefill_tokens",
            "Prompt tokens prefilled on one worker while another eligible worker was believed "
            "to hold a longer prefix", ["model"], registry=r,
        )
        self.prompt_tokens = Counter(
            "pdplane_gateway_estimated_prompt_tokens", "Prompt tokens (estimated) routed",
            ["model"], registry=r,
        )
        self.pair_failures = Counter(
            "pdplane_gateway_pd_pair_failures", "Prefill→decode pair failures before the "
            "first byte (prefill_failed, transfer_refused)", ["prefill", "decode", "kind"],
            registry=r,
        )
        self._children: dict = {}
        self._models: dict[str, ModelMetrics] = {}
        # Per worker (by id): the request path's children, one lookup each.
        self.worker_requests_of = Children(self.worker_requests)  # [worker][stage]
        self._pair_collector = _PairCollector(None)
        r.register(self._pair_collector)
        self._kv_collector = _KvStreamCollector({})
        r.register(self._kv_collector)

    def child(self, metric, *labels: str):
        """``metric.labels(*labels)``, memoised on the label values as given (no string
        conversion or tuple building on the request path after the first time)."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def model(self, name: str) -> ModelMetrics:
        """The children one model's requests count into (made on first use)."""
        found = self._models.get(name)
        if found is None:
            found = self._models[name] = ModelMetrics(self, name)
        return found

    def watch_loads(self, loads) -> None:
        """Export each worker's requests in flight (worker id → ``WorkerLoad``, the table
        the router books into) at scrape time."""
        self.in_flight.loads = loads

    def watch_pairs(self, pairs) -> None:
        self._pair_collector.pairs = pairs

    def watch_kv_streams(self, streams: dict) -> None:
        """Export the KV-event streams' state (worker id → kvstream.KvStream) at scrape
        time: nothing is counted per event or per request."""
        self._kv_collector.streams = streams


class ModelMetrics:
    """One model's metric children: what a request of that model updates, resolved once."""

    __slots__ = ("avoidable_prefill_tokens", "decisions", "e2e", "errors", "itl",
                 "prefix_hit_tokens", "prompt_tokens", "requests", "retries", "route_rules",
                 "ttft")

    def __init__(self, metrics: GatewayMetrics, model: str) -> None:
        self.requests = Children(metrics.requests, model)  # [endpoint][status]
        self.errors = Children(metrics.errors, model)  # [kind]
        self.retries = Children(metrics.retries, model)  # [stage]
        self.decisions = Children(metrics.decisions, model)  # [reason]
        self.route_rules = Children(metrics.route_rules, model)  # [rule]
        self.ttft = metrics.ttft.labels(model)
        self.itl = metrics.itl.labels(model)
        self.e2e = metrics.e2e.labels(model)
        self.prefix_hit_tokens = metrics.prefix_hit_tokens.labels(model)
        self.prompt_tokens = metrics.prompt_tokens.labels(model)
        self.avoidable_prefill_tokens = metrics.avoidable_prefill_tokens.labels(model)


class _KvStreamCollector:
    COUNTERS = (("restarts", "Engine restarts seen (sequence went back): blocks dropped"),
                ("strays", "Stray frames with an implausible sequence jump, ignored"),
                ("jumps", "Confirmed sequence jumps beyond any replay buffer: started over"),
                ("lost", "Batches lost (not recoverable by replay)"),
                ("replayed_batches", "Batches recovered by replay"),
                ("stalls", "Times the stream was marked stalled"),
                ("decode_errors", "Undecodable frames or payloads"))

    def __init__(self, streams: dict):
        self.streams = streams

    def collect(self):
        stalled = GaugeMetricFamily(
            "pdplane_gateway_kv_stream_stalled",
            "1 while a worker's KV-event stream is stalled and the gateway routes it on the "
            "approximate index", labels=["worker", "reason"])
        complete = GaugeMetricFamily(
            "pdplane_gateway_kv_stream_complete",
            "1 when the stream was followed from sequence 0 (the index is the whole cache)",
            labels=["worker"])
        counters = {name: CounterMetricFamily(f"pdplane_gateway_kv_stream_{name}", doc,
                                              labels=["worker"])
                    for name, doc in self.COUNTERS}
        for worker, stream in list(self.streams.items()):
            stalled.add_metric([worker, stream.stall_reason], 1.0 if stream.stalled else 0.0)
            complete.add_metric([worker], 1.0 if stream.complete else 0.0)
            for name, family in counters.items():
                family.add_metric([worker], getattr(stream, name))
        yield stalled
        yield complete
        yield from counters.values()


class _InFlightCollector:
    def __init__(self, loads):
        self.loads = loads

    def collect(self):
        family = GaugeMetricFamily("pdplane_gateway_worker_in_flight",
                                   "Requests in flight per worker", labels=["worker"])
        if self.loads is not None:
            for worker, load in list(self.loads.items()):
                family.add_metric([worker], float(load.in_flight))
        yield family


class _PairCollector:
    def __init__(self, pairs):
        self.pairs = pairs

    def collect(self):
        family = GaugeMetricFamily(
            "pdplane_gateway_pd_pair_state", "1 for the state each prefill→decode pair that "
            "has failed is in (healthy, unhealthy, probing)", labels=["prefill", "decode",
                                                                       "state"])
        if self.pairs is not None:
            for (prefill, decode), pair in list(self.pairs.pairs.items()):
                family.add_metric([prefill, decode, pair.state], 1.0)
        yield family
