"""The measured prefix-affinity share (the gateway's routing decisions, from Prometheus)
reaches the cost model's Workload; unknown (None) keeps today's estimate exactly."""

from __future__ import annotations

from dataclasses import replace

from controlplane.planner.costmodel import affinity_share
from controlplane.planner.planner import LoadInput, plan_model
from controlplane.planner.steps import workload_for
from tests.unit.test_planner_core import fleet, model_input

# Eight aggregated H200 workers under a RAG-like load: busy enough that where a request
# queues (behind its prefix's holder, or at the least-loaded worker) moves the TTFT tail.
LOAD = LoadInput(8.0, 8.0, 4000, 4000, 300, 0.2, inflight=40, inflight_peak=60)


def _decide(load):
    workers, links = fleet(2, 4, group=4)
    return plan_model(model_input(workers, links, load, ttft_p95_ms=2500, itl_p95_ms=50), 0)


def test_unknown_share_gives_the_identical_prediction():
    d = _decide(LOAD)
    assert d.workload.affinity_share is None
    # The default is the bound from the hit rate: the same as passing that bound measured.
    bound = _decide(replace(LOAD, affinity_share=affinity_share(LOAD.prefix_hit)))
    assert d.current.ttft_p95_s == bound.current.ttft_p95_s
    assert [c.as_dict() for c in d.candidates] == [c.as_dict() for c in bound.candidates]
    assert "prefix affinity" not in d.explanation


def test_a_measured_share_reaches_the_workload_and_moves_the_ttft_tail():
    pooled = _decide(replace(LOAD, affinity_share=0.0, affinity_source="test"))
    followed = _decide(replace(LOAD, affinity_share=0.9, affinity_source="test"))
    assert pooled.workload.affinity_share == 0.0
    assert followed.workload.affinity_share == 0.9
    # Followed requests queue behind their prefix's holder (M/G/1 per worker) rather than
    # at the least-loaded worker (M/G/c): a longer TTFT tail for the same work.
    assert followed.current.ttft_p95_s > pooled.current.ttft_p95_s
    # The same work; only the decode batch moves a little (a prompt routed by load stalls
    # fewer decodes than one sent to its prefix's holder, so lives are a little shorter).
    assert abs(followed.current.utilisation - pooled.current.utilisation) < 0.01 * (
        pooled.current.utilisation)
    assert "90% routed by prefix affinity (test)" in followed.explanation


def test_workload_for_clamps_and_drops_nonsense():
    pol = model_input(*fleet(1, 2), LOAD).policy
    assert workload_for(replace(LOAD, affinity_share=1.7), pol, 1.0).affinity_share == 1.0
    assert workload_for(replace(LOAD, affinity_share=float("nan")), pol, 1.0
                        ).affinity_share is None
