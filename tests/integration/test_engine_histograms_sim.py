"""Fleet percentiles and request rate from the engines' own counters and buckets, against
simulated engine servers (real HTTP /metrics, the agent's collector, the protocol check,
ingest's Redis commands on the real Redis, the control plane's merge).

The reference side is computed from each engine's /metrics text with prometheus_client's
parser and a plain bucket walk (not pdplane's code): the fleet p95 must lie in the bucket
that holds the pooled p95 rank. The request rate is compared with the rate the load
generator offered.
"""

from __future__ import annotations

import math
import random
import threading
import time
import uuid

import pytest

from controlplane.telemetry import enginestats, hotstate
from controlplane.telemetry.ingest import NodeContext, report_commands
from tests.integration.sim.client import post, scrape, start_fleet
from workers_agent.collectors.engine_metrics import EngineMetricsCollector
from workers_agent.protocol import Inventory, validate_report

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

MODEL = "llama-3.1-8b"
ENGINES = ("e0", "e1", "e2")
RATE = 6.0  # requests per second offered, evenly spaced
FAMILIES = {  # protocol histogram name → family in /metrics
    "ttft_s": "vllm:time_to_first_token_seconds",
    "itl_s": "vllm:inter_token_latency_seconds",
    "prompt_tokens": "vllm:request_prompt_tokens",
    "generation_tokens": "vllm:request_generation_tokens",
}


def fleet_config() -> dict:
    return {
        "time_scale": 1.0,
        "nodes": [{"hostname": "hist-1", "gpu": "H200", "gpu_count": len(ENGINES),
                   "nvlink_group_size": len(ENGINES), "nics": [], "telemetry_port": 0}],
        "engines": [{"id": eid, "node": "hist-1", "model": MODEL, "gpus": [i], "role": "both",
                     "http_port": 0, "kv_events_port": 0, "kv_replay_port": 0}
                    for i, eid in enumerate(ENGINES)],
    }


def own_buckets(metrics_urls: list[str]) -> dict[str, dict[float, float]]:
    """family → {le: cumulative count summed over engines}, parsed independently."""
    out: dict[str, dict[float, float]] = {}
    for url in metrics_urls:
        families = scrape(url)
        for name, family in FAMILIES.items():
            for s in families[family].samples:
                if s.name == family + "_bucket":
                    le = float(s.labels["le"])
                    out.setdefault(name, {})[le] = out.get(name, {}).get(le, 0.0) + s.value
    return out


def bucket_of_rank(before: dict, after: dict, q: float) -> tuple[float, float]:
    """(lower, upper) bound of the bucket holding rank q × count of the window's samples."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    rank = q * delta[-1]
    lower = 0.0
    for bound, count in zip(bounds, delta, strict=True):
        if count >= rank:
            return lower, bound
        lower = bound
    raise AssertionError("rank beyond the +Inf bucket")


class Load(threading.Thread):
    """Open loop: one request every 1/RATE s to a random engine, lengths spread widely."""

    def __init__(self, api_urls: list[str]):
        super().__init__(daemon=True)
        self.api_urls, self.stop, self.sent = api_urls, threading.Event(), []
        self.rng = random.Random(5)

    def send(self, url, body):
        try:
            post(url, body)
        except OSError:  # the fleet stopped under a request still in flight
            if not self.stop.is_set():
                raise

    def run(self):
        start = time.monotonic()
        k = 0
        while not self.stop.is_set():
            due = start + k / RATE
            if (wait := due - time.monotonic()) > 0:
                time.sleep(wait)
            words = int(self.rng.lognormvariate(5.0, 0.9))
            body = {"model": MODEL, "prompt": " ".join(f"w{self.rng.randrange(9999)}"
                                                       for _ in range(max(words, 4))),
                    "max_tokens": self.rng.choice([4, 16, 64, 128])}
            url = self.rng.choice(self.api_urls) + "/v1/completions"
            threading.Thread(target=self.send, args=(url, body), daemon=True).start()
            self.sent.append(time.monotonic())
            k += 1


def test_fleet_percentiles_and_rate_from_simulated_engines(tmp_path, settings):
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_REDIS_PREFIX = prefix
    settings.PROMETHEUS_URL = None
    fleet = start_fleet(fleet_config(), tmp_path, "--in-process")
    engines = {e["id"]: e for e in fleet.endpoints["engines"]}
    workers = {eid: 100 + i for i, eid in enumerate(ENGINES)}
    ctx = NodeContext(node_id=1, cluster_id=1, hostname="hist-1", gen=1, interval_s=2.0,
                      workers=dict(workers))
    # Cumulative figures in every report, so both sides' windows are the same two instants.
    collectors = {eid: EngineMetricsCollector(engines[eid]["metrics_url"], cumulative_every_s=0)
                  for eid in ENGINES}
    inventory = Inventory(engine_ids=frozenset(ENGINES))
    keys = hotstate.Keys()
    redis = hotstate.sync_redis()
    seq = [0]

    def report_once() -> float:
        """One agent report through the protocol check and ingest into Redis."""
        seq[0] += 1
        engines_part = [{"id": eid, **collectors[eid].scrape().as_report()} for eid in ENGINES]
        msg = {"type": "report", "seq": seq[0], "ts": time.time(), "engines": engines_part}
        assert validate_report(msg, inventory) == []
        pipe = redis.pipeline(transaction=False)
        for cmd in report_commands(ctx, msg, time.time(), keys, lambda key, now: True):
            pipe.execute_command(*cmd)
        pipe.execute()
        return msg["ts"]

    load = Load([engines[eid]["api_url"] for eid in ENGINES])
    try:
        load.start()
        time.sleep(4.0)  # past the start-up transient
        urls = [engines[eid]["metrics_url"] for eid in ENGINES]
        own_t0 = time.time()
        before = own_buckets(urls)
        t0 = report_once()
        for _ in range(12):  # a report every 2 s, as agents send them
            time.sleep(2.0)
            t1 = report_once()
        after = own_buckets(urls)
        own_t1 = time.time()
        window = t1 - t0
        load.stop.set()

        stats = enginestats.fleet_engine_stats(MODEL, dict.fromkeys(workers.values(), "both"),
                                               window_s=window - 0.5)
        assert stats.source == "agents" and stats.engines == len(ENGINES)
        # Request rate from counter deltas, against the true rate: what the engines' own
        # /metrics counted as finished over the same window (on a starved box the load
        # generator falls behind its 6/s, so the offered rate is only a sanity bound).
        finished = (max(after["prompt_tokens"].values())
                    - max(before["prompt_tokens"].values()))
        true_rate = finished / (own_t1 - own_t0)
        assert stats.request_rate == pytest.approx(true_rate, rel=0.05), (true_rate, stats)
        assert stats.request_rate == pytest.approx(RATE, rel=0.5), stats
        # Fleet p95 (and p50) within one bucket of the engines' own /metrics.
        for name, p50, p95 in (
            ("ttft_s", stats.ttft_p50_s, stats.ttft_p95_s),
            ("itl_s", stats.itl_p50_s, stats.itl_p95_s),
            ("prompt_tokens", stats.prompt_tokens_p50, stats.prompt_tokens_p95),
            ("generation_tokens", stats.generation_tokens_p50, stats.generation_tokens_p95),
        ):
            for q, got in ((0.5, p50), (0.95, p95)):
                lo, hi = bucket_of_rank(before[name], after[name], q)
                assert got is not None and lo <= got <= (hi if math.isfinite(hi) else lo), (
                    name, q, got, lo, hi)
        assert stats.prompt_tokens_mean and stats.generation_tokens_mean
        assert stats.generation_tokens_per_s > 0 and stats.prompt_tokens_per_s > 0
        # Two or more snapshots per engine are kept in hot state.
        assert all(len(s) >= 2 for s in enginestats.read_snapshots(workers.values()).values())
    finally:
        load.stop.set()
        fleet.stop()
        found = list(redis.scan_iter(prefix + "*"))
        if found:
            redis.delete(*found)
