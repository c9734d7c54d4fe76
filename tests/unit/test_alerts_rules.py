"""Alert rules over plain snapshots: each rule fires on its condition and only then."""

from controlplane.alerts import rules
from controlplane.alerts.rules import (
    EndpointFacts,
    FleetSnapshot,
    GatewayFacts,
    GpuFacts,
    NicFacts,
    NodeFacts,
    PlanFacts,
    RuleConfig,
    WorkerFacts,
    evaluate,
)


def names(result):
    return sorted(o.rule for o in result.observations)


def node(**kw):
    return NodeFacts(**{"cluster": "c1", "node": "n1", "last_report_age_s": 2.0, **kw})


def worker(**kw):
    return WorkerFacts(**{"cluster": "c1", "node": "n1", "model": "m", "worker": "w1", **kw})


def test_healthy_fleet_is_quiet():
    snap = FleetSnapshot(
        now=100,
        nodes=(node(gpus=(GpuFacts(0, 10, 100),)),),
        workers=(
            worker(
                kv_usage=0.5,
                ttft_p95_ms=200,
                ttft_slo_ms=1000,
                itl_p95_ms=20,
                itl_slo_ms=50,
                has_traffic=True,
                prefix_hit_rate=0.4,
            ),
        ),
        gateways=(GatewayFacts("c1", "gw", applied_version=7, latest_version=7),),
        plans=(PlanFacts("c1", "m", "ok"),),
    )
    assert evaluate(snap).observations == []


def test_node_offline_and_its_workers_not_judged():
    snap = FleetSnapshot(
        now=100,
        nodes=(node(last_report_age_s=300, gpus=(GpuFacts(0, 100, 100),)),),
        workers=(worker(kv_usage=1.0),),
    )
    result = evaluate(snap)
    assert names(result) == ["NodeOffline"]
    obs = result.observations[0]
    assert obs.severity == "critical" and obs.labels == {"cluster": "c1", "node": "n1"}
    assert obs.all_labels["alertname"] == "NodeOffline"


def test_maintenance_node_is_not_offline():
    snap = FleetSnapshot(now=100, nodes=(node(last_report_age_s=None, maintenance=True),))
    assert evaluate(snap).observations == []


def test_gpu_memory_high_labels_the_gpu():
    snap = FleetSnapshot(now=1, nodes=(node(gpus=(GpuFacts(0, 50, 100), GpuFacts(3, 99, 100))),))
    (obs,) = evaluate(snap).observations
    assert obs.rule == "GpuMemoryHigh" and obs.labels["gpu"] == "3"


def test_kv_and_latency_rules_with_policy_slo():
    w = worker(kv_usage=0.99, ttft_p95_ms=1500, ttft_slo_ms=1000, itl_p95_ms=49, itl_slo_ms=50)
    result = evaluate(FleetSnapshot(now=1, workers=(w,)))
    assert names(result) == ["KvCacheUsageHigh", "TtftP95OverSlo"]
    assert all(o.for_s == 300 for o in result.observations)
    assert result.observations[0].labels == {
        "cluster": "c1",
        "node": "n1",
        "model": "m",
        "worker": "w1",
    }


def test_stale_worker_is_not_judged():
    w = worker(kv_usage=0.99, stale=True)
    assert evaluate(FleetSnapshot(now=1, workers=(w,))).observations == []


def test_nic_errors_rising_needs_two_samples_and_ignores_counter_resets():
    nic = lambda total: node(nics=(NicFacts("eth0", errors_total=total, drops_total=0),))  # noqa: E731
    r1 = evaluate(FleetSnapshot(now=0, nodes=(nic(100),)))
    assert r1.observations == []
    r2 = evaluate(FleetSnapshot(now=10, nodes=(nic(200),)), memory=r1.memory)
    assert names(r2) == ["NicErrorsRising"]
    r3 = evaluate(FleetSnapshot(now=20, nodes=(nic(5),)), memory=r2.memory)  # agent restart
    assert r3.observations == []
    r4 = evaluate(FleetSnapshot(now=30, nodes=(nic(6),)), memory=r3.memory)  # 0.1/s: fine
    assert r4.observations == []


def test_kv_events_stalled_tracks_sequence_numbers():
    def snap(t, seq, traffic=True):
        return FleetSnapshot(now=t, workers=(worker(kv_events_seq=seq, has_traffic=traffic),))

    mem = {}
    for t, seq in ((0, 5), (60, 9), (170, 9)):
        result = evaluate(snap(t, seq), memory=mem)
        mem = result.memory
        assert result.observations == []
    result = evaluate(snap(200, 9), memory=mem)  # unchanged since t=60: 140 s > 120 s
    assert names(result) == ["KvEventsStalled"]
    assert evaluate(snap(300, 9, traffic=False), memory=result.memory).observations == []


def test_cache_hit_rate_collapse_against_baseline():
    mem = {}
    for t in range(5):
        mem = evaluate(
            FleetSnapshot(now=t, workers=(worker(prefix_hit_rate=0.6, has_traffic=True),)),
            memory=mem,
        ).memory
    result = evaluate(
        FleetSnapshot(now=6, workers=(worker(prefix_hit_rate=0.0, has_traffic=True),)),
        memory=mem,
    )
    assert names(result) == ["CacheHitRateCollapsed"]
    # A worker that never had hits does not alert.
    cold = FleetSnapshot(now=1, workers=(worker(prefix_hit_rate=0.0, has_traffic=True),))
    assert evaluate(cold).observations == []


def test_gateway_push_failing_and_lagging():
    snap = FleetSnapshot(
        now=1,
        gateways=(
            GatewayFacts(
                "c1", "gw1", 3, 9, push_error="connection refused", consecutive_push_failures=2
            ),
            GatewayFacts("c1", "gw2", 8, 9),
            GatewayFacts("c1", "gw3", 0, None),  # routing not there: no lag judged
        ),
    )
    result = evaluate(snap)
    assert sorted((o.rule, o.labels["gateway"]) for o in result.observations) == [
        ("GatewayLagging", "gw1"),
        ("RoutingPushFailing", "gw1"),
    ]


def test_plan_failed_or_infeasible():
    snap = FleetSnapshot(
        now=1,
        plans=(
            PlanFacts("c1", "a", "ok"),
            PlanFacts("c1", "b", "infeasible", "not enough decode KV capacity"),
            PlanFacts("c1", "c", "failed"),
            PlanFacts("c1", "d", "all-layouts-miss", "every layout misses the ITL target"),
        ),
    )
    result = evaluate(snap)
    assert [o.labels["model"] for o in result.observations] == ["b", "c", "d"]
    assert "all-layouts-miss" in result.observations[2].annotations["summary"]
    assert "decode KV capacity" in result.observations[0].annotations["summary"]


def test_agent_protocol_and_major_version_skew():
    snap = FleetSnapshot(
        now=1,
        nodes=(
            node(node="ok", agent_protocol=1, agent_version="0.1.3"),
            node(node="proto", agent_protocol=2, agent_version="0.1.0"),
            node(node="major", agent_protocol=1, agent_version="1.0.0"),
        ),
        expected_agent_protocol=1,
        expected_agent_version="0.1.0",
    )
    assert sorted(o.labels["node"] for o in evaluate(snap).observations) == ["major", "proto"]


def test_disabled_endpoint_notice():
    snap = FleetSnapshot(now=1, disabled_endpoints=(EndpointFacts("hook", "410 Gone"),))
    (obs,) = evaluate(snap).observations
    assert obs.rule == "WebhookEndpointDisabled" and obs.labels == {"endpoint": "hook"}


def test_overrides_disable_and_retune():
    w = worker(kv_usage=0.9)
    snap = FleetSnapshot(now=1, workers=(w,))
    assert evaluate(snap).observations == []
    tuned = {rules.KV_CACHE_HIGH: RuleConfig(severity="critical", for_s=10, threshold=0.8)}
    (obs,) = evaluate(snap, tuned).observations
    assert obs.severity == "critical" and obs.for_s == 10
    off = {rules.KV_CACHE_HIGH: RuleConfig(enabled=False, threshold=0.1)}
    assert evaluate(snap, off).observations == []


def test_merge_rule_config_validates():
    import pytest

    base = rules.DEFAULT_RULES[rules.KV_CACHE_HIGH]
    assert rules.merge_rule_config(base, {"threshold": 0.5, "severity": None}).threshold == 0.5
    with pytest.raises(rules.RuleConfigError):
        rules.merge_rule_config(base, {"severity": "loud"})
    with pytest.raises(rules.RuleConfigError):
        rules.merge_rule_config(base, {"thresold": 1})


def test_evaluation_is_deterministic():
    snap = FleetSnapshot(
        now=5, nodes=(node(last_report_age_s=999), node(node="n2", last_report_age_s=999))
    )
    assert evaluate(snap) == evaluate(snap)
