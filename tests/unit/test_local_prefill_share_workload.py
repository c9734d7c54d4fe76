"""The live local-prefill share reaches the planner's Workload (issue 16): a split's
prediction follows the measured share; unknown (None) keeps today's prediction exactly."""

from __future__ import annotations

from dataclasses import replace

from controlplane.planner.planner import LoadInput, plan_model
from controlplane.planner.steps import predict, workload_for
from tests.unit.test_planner_core import fleet, model_input

# Mooncake-like: mean 12.9k, p95 43k; 40 % of the prompts ≤ 512 tokens (the lognormal fit
# places none of its points there).
LOAD = LoadInput(0.5, 0.5, 12908, 43012, 300, 0.06, inflight=10, inflight_peak=20)
ROLES = ["prefill"] * 4 + ["decode"] * 4


def _input(load):
    workers, links = fleet(2, 4, group=4, roles=ROLES)
    return model_input(workers, links, load, ttft_p95_ms=5000, itl_p95_ms=50)


def test_workload_for_passes_the_share_clamped_and_drops_nonsense():
    pol = _input(LOAD).policy
    assert workload_for(LOAD, pol, 1.0).local_prefill_share is None
    assert workload_for(replace(LOAD, local_prefill_share=0.395), pol, 1.0
                        ).local_prefill_share == 0.395
    assert workload_for(replace(LOAD, local_prefill_share=1.7), pol, 1.0
                        ).local_prefill_share == 1.0
    assert workload_for(replace(LOAD, local_prefill_share=-0.2), pol, 1.0
                        ).local_prefill_share == 0.0
    assert workload_for(replace(LOAD, local_prefill_share=float("nan")), pol, 1.0
                        ).local_prefill_share is None


def test_a_splits_prediction_follows_the_share():
    base = _input(LOAD)
    shared = _input(replace(LOAD, local_prefill_share=0.395, local_prefill_source="test"))
    w0 = workload_for(base.load, base.policy, 0.5)
    w1 = workload_for(shared.load, shared.policy, 0.5)
    p0, p1 = predict(base, 4, w0), predict(shared, 4, w1)
    assert p0.local_prefill_share == 0.0  # the fit places no prompt under 512
    assert p1.local_prefill_share == 3 / 8  # round(8 × 0.395) points prefill locally
    assert p1.ttft_p95_s != p0.ttft_p95_s
    # An aggregated layout keeps the fitted points: no routing there turns on the threshold.
    assert predict(base, 0, w0) == predict(shared, 0, w1)
    # The planning cycle hands the share to its workload and predicts the split with it.
    d0, d1 = plan_model(base, 0), plan_model(shared, 0)
    assert d0.workload.local_prefill_share is None
    assert d1.workload.local_prefill_share == 0.395
    assert d1.current_now.local_prefill_share == 3 / 8
    assert d0.current_now.local_prefill_share == 0.0


def test_the_explanation_names_the_share_and_its_source():
    d = plan_model(_input(replace(LOAD, local_prefill_share=0.395,
                                  local_prefill_source="gateway decisions, prometheus, 60 s")), 0)
    assert ("40% short enough to prefill where they decode (gateway decisions, prometheus, "
            "60 s)") in d.explanation
    assert d.record.as_dict()["observe"]["local_prefill_source"].startswith("gateway")
    assert "prefill where they decode" not in plan_model(_input(LOAD), 0).explanation
