"""Data-plane health reaching the operator: the agent's KV-stream stall flag and the
gateway's P/D pair state become alerts (pure rules) and show on the pages."""

from types import SimpleNamespace

from django.template.loader import render_to_string

from controlplane.alerts import gateway_health
from controlplane.alerts.inputs import _worker_facts
from controlplane.alerts.rules import (
    FleetSnapshot,
    GatewayFacts,
    PdPairFacts,
    RuleConfig,
    WorkerFacts,
    evaluate,
)


def worker(**kw):
    return WorkerFacts(**{"cluster": "c1", "node": "n1", "model": "m", "worker": "w1", **kw})


def names(result):
    return sorted(o.rule for o in result.observations)


def test_agent_stall_flag_fires_kv_events_stalled_once():
    stalled = evaluate(FleetSnapshot(now=1, workers=(worker(kv_events_stalled=True),)))
    assert names(stalled) == ["KvEventsStalled"]
    assert "stalled" in stalled.observations[0].annotations["summary"]
    # Both the age rule and the flag: one observation, not two.
    both = evaluate(FleetSnapshot(now=1, workers=(worker(
        kv_events_stalled=True, kv_events_age_s=500, has_traffic=True),)))
    assert names(both) == ["KvEventsStalled"]
    quiet = evaluate(FleetSnapshot(now=1, workers=(worker(kv_events_stalled=False),
                                                   worker(worker="w2"))))
    assert quiet.observations == []
    off = evaluate(FleetSnapshot(now=1, workers=(worker(kv_events_stalled=True),)),
                   rules={"KvEventsStalled": RuleConfig(enabled=False)})
    assert off.observations == []


def test_agent_report_stall_flag_reaches_the_worker_facts():
    w = SimpleNamespace(node=SimpleNamespace(hostname="n1"), name="w1", state="active",
                        served_model=SimpleNamespace(name="m"))
    cluster = SimpleNamespace(name="c1")
    state = {"kv_events": {"last_seq": 7, "stalled": True}, "running": 1}
    assert _worker_facts(cluster, w, state, (None, None)).kv_events_stalled is True
    assert _worker_facts(cluster, w, {"kv_events": {"stalled": "yes"}},
                         (None, None)).kv_events_stalled is None  # not a bool: not trusted
    assert _worker_facts(cluster, w, {"running": 0}, (None, None)).kv_events_stalled is None


def test_unhealthy_and_probing_pairs_alert_healthy_ones_do_not():
    gw = GatewayFacts("c1", "gw1", 3, 3, pd_pairs=(
        PdPairFacts("p1", "d", "unhealthy", 2, "prefill_failed"),
        PdPairFacts("p2", "d", "probing", 1, "transfer_refused"),
        PdPairFacts("p3", "d", "healthy", 4, "prefill_failed"),
    ))
    result = evaluate(FleetSnapshot(now=1, gateways=(gw,)))
    assert sorted((o.rule, o.labels["prefill"], o.labels["decode"])
                  for o in result.observations) == [
        ("PdPairUnhealthy", "p1", "d"), ("PdPairUnhealthy", "p2", "d")]
    first = next(o for o in result.observations if o.labels["prefill"] == "p1")
    assert first.labels["gateway"] == "gw1" and first.for_s == 60
    assert "prefill_failed" in first.annotations["summary"]
    # threshold = failures needed before it pages
    strict = evaluate(FleetSnapshot(now=1, gateways=(gw,)),
                      rules={"PdPairUnhealthy": RuleConfig(threshold=2, for_s=0)})
    assert [o.labels["prefill"] for o in strict.observations] == ["p1"]


def test_gateway_health_answer_is_parsed_defensively():
    health = {"pd_pairs": [
        {"prefill": "p1", "decode": "d", "state": "unhealthy", "failures": 3,
         "last_failure": "prefill_failed"},
        {"prefill": ["x"], "decode": "d", "state": "unhealthy"},  # hostile: skipped
        {"prefill": "p2", "decode": "d", "state": "probing", "failures": -4},
        "junk",
    ]}
    assert gateway_health.pair_facts(health) == (
        PdPairFacts("p1", "d", "unhealthy", 3, "prefill_failed"),
        PdPairFacts("p2", "d", "probing", 0, ""),
    )
    assert gateway_health.pair_facts(None) == ()
    assert gateway_health.pair_facts({"pd_pairs": {"a": 1}}) == ()


def test_unreachable_gateway_is_not_asked_again_for_a_minute(monkeypatch):
    calls = []

    def fake_fetch(url, secret, timeout_s=2.0):
        calls.append(url)

    monkeypatch.setattr(gateway_health, "fetch", fake_fetch)
    gw = SimpleNamespace(pk=987654, url="http://127.0.0.1:9", secret="s")
    assert gateway_health.refresh(gw, now=1000.0) is None
    assert gateway_health.refresh(gw, now=1030.0) is None
    assert len(calls) == 1
    gateway_health.refresh(gw, now=1061.0)
    assert len(calls) == 2


def test_engine_card_shows_a_stalled_kv_stream():
    def card(kv_events):
        engine = SimpleNamespace(
            worker=SimpleNamespace(id=1, name="w1", served_model=SimpleNamespace(name="m"),
                                   tp_size=1, get_engine_kind_display="vLLM",
                                   desired_role="both", state="active", observed_role=""),
            state="active", gpus=[0], live={"kv_events": kv_events}, slo={}, sparks=[])
        return render_to_string("dashboard/_engines_live.html",
                                {"engines": [engine], "node": SimpleNamespace(id=1)})

    assert "KV events stalled" in card({"stalled": True, "last_seq": 3})
    assert "KV events stalled" not in card({"stalled": False})


def test_gateway_side_kv_stall_is_fetched_kept_and_alerts(monkeypatch):
    raw = {"pd_pairs": [], "kv_streams": {
        "w1": {"stalled": True, "stall_reason": "no events after work was sent"},
        "w2": {"stalled": False, "stall_reason": ""},
        "w3": "junk"}}
    monkeypatch.setattr(gateway_health, "fetch", lambda url, secret, timeout_s=2.0: raw)
    kept = gateway_health.refresh(SimpleNamespace(pk=987655, url="http://gw", secret="s"),
                                  now=5.0)
    stalled = gateway_health.stalled_streams(kept)
    assert stalled == (("w1", "no events after work was sent"),)
    result = evaluate(FleetSnapshot(now=1, gateways=(
        GatewayFacts("c1", "gw1", 1, 1, stalled_kv_streams=stalled),)))
    assert names(result) == ["KvEventsStalled"]
    assert result.observations[0].labels == {"cluster": "c1", "gateway": "gw1", "worker": "w1"}
    assert "gw1" in result.observations[0].annotations["summary"]
