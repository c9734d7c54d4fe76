"""The live planner plans for the load arriving (issue 17, item 3): with hot state in Redis,
gather_cluster adds the change in the requests the engines hold since the last cycle (its
stored inputs) to the finished rate when a backlog fills or drains, says so in the
record's notes, and marks the window so that calibration does not compare it."""

from __future__ import annotations

import datetime as dt
import time

import pytest
from django.utils import timezone

from controlplane.planner.inputs import gather_cluster
from controlplane.planner.models import ModelPlannerState
from controlplane.topology.models import Worker

# A private hot-state prefix, no Prometheus (autouse where imported).
from tests.integration.test_local_prefill_share_live import redis_prefix  # noqa: F401
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
