"""The agent's own /metrics (prometheus_client), off unless ``metrics_port`` is set.

Collector errors and collection time are counted where they happen (agent.py); the KV
event figures are read from each subscriber at scrape time, so the subscriber threads do
no extra work. Everything lives in a private registry: an agent embedded in another
Python process (tests, the demo launcher) does not leak series into that process's own
exposition.
"""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

log = logging.getLogger(__name__)

REGISTRY = CollectorRegistry(auto_describe=True)

COLLECTOR_ERRORS = Counter(
    "pdplane_agent_collector_errors_total",
    "Failed samples, by collector (gpu, links, engine)",
    ["collector"],
    registry=REGISTRY,
)
COLLECT_DURATION = Histogram(
    "pdplane_agent_collect_seconds",
    "One report's collection: GPUs, links and every engine's /metrics scrape",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
    registry=REGISTRY,
)
ENGINE_SCRAPE_DURATION = Histogram(
    "pdplane_agent_engine_scrape_seconds",
    "One engine /metrics scrape and parse",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
    registry=REGISTRY,
)


class KVEventsCollector:
    """Per-engine KV event stream counters, read from the subscribers at scrape time."""

    def __init__(self, agent):
        self.agent = agent

    def collect(self):
        fams = {
            "batches": CounterMetricFamily(
                "pdplane_agent_kv_event_batches", "KV event batches received", labels=["engine"]),
            "events": CounterMetricFamily(
                "pdplane_agent_kv_events", "KV events applied (stored + removed)",
                labels=["engine"]),
            "gaps": CounterMetricFamily(
                "pdplane_agent_kv_event_gaps", "Sequence gaps seen in the KV event stream",
                labels=["engine"]),
            "lost": CounterMetricFamily(
                "pdplane_agent_kv_event_batches_lost",
                "Batches missing after replay (gap not recovered)", labels=["engine"]),
            "replayed": CounterMetricFamily(
                "pdplane_agent_kv_event_batches_replayed", "Batches recovered by replay",
                labels=["engine"]),
            "decode_errors": CounterMetricFamily(
                "pdplane_agent_kv_event_decode_errors", "Frames that could not be decoded",
                labels=["engine"]),
        }
        blocks = GaugeMetricFamily(
            "pdplane_agent_kv_blocks", "KV blocks the agent believes the engine holds",
            labels=["engine"])
        up = GaugeMetricFamily("pdplane_agent_engines", "Engines the agent collects from")
        engines = dict(getattr(self.agent, "engines", {}))
        up.add_metric([], len(engines))
        for eid, handle in sorted(engines.items()):
            sub = handle.kv
            if sub is None:
                continue
            state = sub.state
            fams["batches"].add_metric([eid], sub.batches)
            fams["events"].add_metric([eid], state.stored_events + state.removed_events)
            fams["gaps"].add_metric([eid], sub.gaps)
            fams["lost"].add_metric([eid], sub.lost)
            fams["replayed"].add_metric([eid], sub.replayed)
            fams["decode_errors"].add_metric([eid], sub.decode_errors)
            blocks.add_metric([eid], len(state.blocks))
        yield up
        yield blocks
        yield from fams.values()


_bound = None


def serve(agent, port: int, addr: str = "0.0.0.0") -> None:
    """Start the /metrics HTTP server (a daemon thread) for ``agent``."""
    global _bound
    if _bound is not None:
        REGISTRY.unregister(_bound)
    _bound = KVEventsCollector(agent)
    REGISTRY.register(_bound)
    start_http_server(port, addr=addr, registry=REGISTRY)
    log.info("agent metrics on http://%s:%d/metrics", addr, port)
