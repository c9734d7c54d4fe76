"""The live planner's local-prefill share from hot state (issue 16): with the engines'
snapshots in Redis and no Prometheus, gather_cluster reads the share of requests
conditional P/D would prefill on their decode worker from the merged prompt-length
histogram and the prefix hit rate, and says where it came from."""

from __future__ import annotations

import time
import uuid

import pytest

from controlplane.planner import inputs as planner_inputs
from controlplane.planner.inputs import gather_cluster
from controlplane.policies.models import Policy
from controlplane.telemetry import enginestats, hotstate
from controlplane.topology.models import Worker
from tests.integration.test_planner_apply import h200_cluster, write_hot_state  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TOKEN_LE = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000]


@pytest.fixture(autouse=True)
def redis_prefix(settings):
    settings.TELEMETRY_REDIS_PREFIX = f"test:lps:{uuid.uuid4().hex[:8]}:"
    settings.PROMETHEUS_URL = None
    planner_inputs._reader = None
    yield settings.TELEMETRY_REDIS_PREFIX
    client = hotstate.sync_redis()
    for key in client.scan_iter(settings.TELEMETRY_REDIS_PREFIX + "*"):
        client.delete(key)


def _report_hist(values):
    return {"le": TOKEN_LE, "counts": [sum(1 for v in values if v <= b) for b in TOKEN_LE]
            + [len(values)], "sum": float(sum(values))}


def _engine(prompts, answers):
    return {"counters": {"request_success": float(len(answers)),
                         "prompt_tokens": float(sum(prompts)),
                         "generation_tokens": float(sum(answers))},
            "histograms": {"prompt_tokens": _report_hist(prompts),
                           "generation_tokens": _report_hist(answers)}}


def _write_snapshots(cluster, per_window, t0, window_s=60.0):
    """Two snapshots per worker, ``window_s`` apart (as ingest stores them): the second adds
    ``per_window`` (prompts, answers) to the first."""
    keys = hotstate.Keys()
    client = hotstate.sync_redis()
    pipe = client.pipeline(transaction=False)
    for w in Worker.objects.filter(node__cluster=cluster):
        prompts, answers = per_window
        for ts, (p, a) in ((t0 - window_s, ([], [])), (t0, (prompts, answers))):
            for cmd in enginestats.snapshot_commands(keys, w.pk, ts, _engine(p, a), ts,
                                                     lambda ring, now: True):
                pipe.execute_command(*cmd)
    pipe.execute()


def _hot(hit):
    return lambda w: {"running": 4, "waiting": 0, "kv_usage": 0.1, "prefix_hit_rate": hit,
                      "prompt_tokens_per_s": 1000.0, "generation_tokens_per_s": 300.0}


@pytest.fixture(autouse=True)
def _share_opted_in(settings):
    # The live share is opt-in (settings.PLANNER_LOCAL_PREFILL_SHARE); these tests read it.
    settings.PLANNER_LOCAL_PREFILL_SHARE = True


def test_the_share_is_opt_in(h200_cluster, settings):  # noqa: F811
    Policy.objects.filter(cluster=h200_cluster, served_model=None).update(
        rebalance_interval_s=60, local_prefill_max_tokens=512)
    now = time.time()
    _write_snapshots(h200_cluster, ([200] * 12 + [8000] * 8, [100] * 20), now)
    write_hot_state(h200_cluster, _hot(0.0), received_at=now)
    settings.PLANNER_LOCAL_PREFILL_SHARE = False
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share is None and inp.load.local_prefill_source == ""


def test_gather_cluster_reads_the_share_from_the_prompt_histogram(h200_cluster):  # noqa: F811
    Policy.objects.filter(cluster=h200_cluster, served_model=None).update(
        rebalance_interval_s=60, local_prefill_max_tokens=512)
    now = time.time()
    # Per worker and window: 12 chat prompts of 200 tokens, 8 documents of 8,000.
    prompts = [200] * 12 + [8000] * 8
    _write_snapshots(h200_cluster, (prompts, [100] * 20), now)
    write_hot_state(h200_cluster, _hot(0.0), received_at=now)
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share == pytest.approx(0.6)
    src = inp.load.local_prefill_source
    assert "prompt histogram (agents, 60 s)" in src and "512 tokens" in src, src
    assert "mean share" in src  # the approximation is named
    # The same prompts with 95 % of their tokens cached: 8,000 × 5 % = 400 ≤ 512.
    write_hot_state(h200_cluster, _hot(0.95), received_at=now + 1)
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.prefix_hit == pytest.approx(0.95)
    assert inp.load.local_prefill_share == pytest.approx(1.0)


def test_without_histograms_or_local_prefill_the_share_stays_unknown(h200_cluster):  # noqa: F811
    now = time.time()
    write_hot_state(h200_cluster, _hot(0.0), received_at=now)
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share is None and inp.load.local_prefill_source == ""
    # Histograms there, but the policy turns local prefill off: not read.
    Policy.objects.filter(cluster=h200_cluster, served_model=None).update(
        local_prefill_max_tokens=0)
    _write_snapshots(h200_cluster, ([200] * 20, [100] * 20), now)
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share is None


class _Reader:
    """Prometheus as the planner's glue sees it: only the routing decisions answer."""

    url = "http://prometheus.invalid"

    def __init__(self, share):
        self.share = share

    def model_figures(self, name):
        return None

    def affinity_share(self, name, window_s):
        return None

    def local_prefill_share(self, name, window_s):
        return self.share


def test_the_gateways_decisions_win_and_the_histogram_stands_in(h200_cluster,  # noqa: F811
                                                                monkeypatch):
    now = time.time()
    _write_snapshots(h200_cluster, ([200] * 12 + [8000] * 8, [100] * 20), now)
    write_hot_state(h200_cluster, _hot(0.0), received_at=now)
    monkeypatch.setattr(planner_inputs, "_prometheus", lambda: _Reader(0.42))
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share == 0.42
    assert inp.load.local_prefill_source.startswith("gateway decisions, prometheus")
    # No P/D decisions (an aggregated fleet): the engines' histogram stands in.
    monkeypatch.setattr(planner_inputs, "_prometheus", lambda: _Reader(None))
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.local_prefill_share == pytest.approx(0.6)
    assert inp.load.local_prefill_source.startswith("prompt histogram (agents")
    # Fleet figures from Prometheus carry no buckets: the agents' snapshots still do.
    from controlplane.telemetry.histograms import FleetEngineStats

    monkeypatch.setattr(planner_inputs, "_fleet_stats", lambda name, roles, window_s:
                        FleetEngineStats(source="prometheus", window_s=60.0, request_rate=4.0))
    (inp,) = gather_cluster(h200_cluster).models
    assert inp.load.rate_rps == 4.0
    assert inp.load.local_prefill_share == pytest.approx(0.6)
    assert inp.load.local_prefill_source.startswith("prompt histogram (agents")
