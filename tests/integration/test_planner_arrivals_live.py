"""The live planner plans for the load arriving (issue 17, item 3): with hot state in Redis,
gather_cluster adds the change in the requests the engines hold since the last cycle (its
stored inputs) to the finished rate when a backlog fills or drains, plans a change of mix
on the requests starting in the window, says so in the record's notes, and marks the
window so that calibration does not compare it."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from controlplane.planner.inputs import gather_cluster
from controlplane.planner.models import ModelPlannerState
from controlplane.policies.models import Policy
from controlplane.telemetry import enginestats, hotstate
from controlplane.topology.models import Worker

# A private hot-state prefix, no Prometheus (autouse where imported).
from tests.integration.test_local_prefill_share_live import _report_hist, redis_prefix  # noqa: F401
from tests.integration.test_planner_apply import h200_cluster, write_hot_state  # noqa: F401

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _report(waiting: int):
    # Each of 32 workers finishes 0.25 req/s (8 req/s in all) of 4,000-token prompts.
    return lambda w: {"running": 6, "waiting": waiting, "kv_usage": 0.1,
                      "prefix_hit_rate": 0.0, "requests_per_s": 0.25,
                      "prompt_tokens_per_s": 0.25 * 4000, "generation_tokens_per_s": 0.25 * 300}


def _last_cycle(cluster, held_per_worker: int, seconds_ago: float) -> None:
    n = Worker.objects.filter(node__cluster=cluster).count()
    ModelPlannerState.objects.filter(served_model__cluster=cluster).update(
        last_run_at=timezone.now() - dt.timedelta(seconds=seconds_ago),
        last_inputs={"workers": [{"running": held_per_worker, "waiting": 0}] * n},
    )


def _model(cluster):
    ci = gather_cluster(cluster)
    (m,) = [m for m in ci.models if m.workers]
    return m, ci.measured[m.served_model_id]


def test_a_filling_backlog_reads_at_the_arriving_rate(h200_cluster):  # noqa: F811
    # 30 s ago the engines held 6 per worker (192); now 6 running + 3 waiting each (288):
    # 96 more in 30 s on top of the 8 req/s finished — 11.2 req/s arriving.
    _last_cycle(h200_cluster, 6, 30.0)
    write_hot_state(h200_cluster, _report(3), received_at=time.time())
    m, measured = _model(h200_cluster)
    assert m.load.rate_rps == pytest.approx(8.0 + 96 / 30.0, rel=0.02)
    assert m.load.peak_rps >= m.load.rate_rps
    assert any("a backlog filling" in n for n in m.notes), m.notes
    assert "a backlog filling" in measured.backlog


def test_a_steady_window_keeps_the_finished_rate(h200_cluster):  # noqa: F811
    _last_cycle(h200_cluster, 6, 30.0)
    write_hot_state(h200_cluster, _report(0), received_at=time.time())
    m, measured = _model(h200_cluster)
    assert m.load.rate_rps == pytest.approx(8.0, rel=0.02)
    assert measured.backlog == "" and not any("backlog" in n for n in m.notes)


def test_no_previous_cycle_keeps_the_finished_rate(h200_cluster):  # noqa: F811
    write_hot_state(h200_cluster, _report(30), received_at=time.time())
    m, measured = _model(h200_cluster)
    assert m.load.rate_rps == pytest.approx(8.0, rel=0.02)
    assert measured.backlog == ""


TTFT_LE = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]


def _mix_snapshots(cluster, finished_prompts, started_prompts, t0, window_s=20.0):
    """Per worker, one window of engine counters: requests that finished with
    ``finished_prompts`` and requests whose first token came with ``started_prompts`` (vLLM
    counts a prompt's tokens at its first token)."""
    def engine(done, started):
        ttft = [0.3] * len(started)
        return {"counters": {"request_success": float(len(done)),
                             "prompt_tokens": float(sum(started)),
                             "generation_tokens": 200.0 * len(done)},
                "histograms": {"prompt_tokens": _report_hist(done),
                               "generation_tokens": _report_hist([200] * len(done)),
                               "ttft_s": {"le": TTFT_LE, "counts": [
                                   sum(1 for v in ttft if v <= b) for b in TTFT_LE]
                                   + [len(ttft)], "sum": sum(ttft)}}}

    keys, client = hotstate.Keys(), hotstate.sync_redis()
    pipe = client.pipeline(transaction=False)
    for w in Worker.objects.filter(node__cluster=cluster):
        for ts, eng in ((t0 - window_s, engine([], [])),
                        (t0, engine(finished_prompts, started_prompts))):
            for cmd in enginestats.snapshot_commands(keys, w.pk, ts, eng, ts,
                                                     lambda ring, now: True):
                pipe.execute_command(*cmd)
    pipe.execute()


def test_a_change_of_mix_is_planned_as_the_requests_starting(h200_cluster):  # noqa: F811
    """Chat → RAG, first window: each worker finished 10 chat requests (~1,000-token
    prompts) while 8 RAG requests of 4,000 tokens got their first token. The planner plans
    for RAG at the rate it starts (32 × 8 in 20 s), says so, and calibration skips it."""
    Policy.objects.filter(cluster=h200_cluster, served_model=None).update(
        rebalance_interval_s=20)
    chat = [600, 800, 900, 1000, 1000, 1000, 1100, 1200, 1400, 1500]
    now = time.time()
    _mix_snapshots(h200_cluster, chat, [4000] * 8, now)
    write_hot_state(h200_cluster, _report(0), received_at=now)
    m, measured = _model(h200_cluster)
    assert m.load.isl_mean == pytest.approx(4000)
    assert m.load.rate_rps == pytest.approx(32 * 8 / 20.0, rel=0.02)
    assert m.load.isl_p50 is None and m.load.isl_p95 is None
    assert any("the mix changed" in n for n in m.notes), m.notes
    assert "the mix changed" in measured.backlog
    # The same window with the first tokens from chat's prompts: the finished mix stands.
    _mix_snapshots(h200_cluster, chat, chat[:8], now + 1)
    m, measured = _model(h200_cluster)
    assert m.load.isl_mean == pytest.approx(sum(chat) / len(chat))
    assert m.load.isl_p95 is not None
    assert measured.backlog == "" and not any("mix" in n for n in m.notes)
