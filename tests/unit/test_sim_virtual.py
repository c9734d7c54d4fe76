"""The virtual-time fleet: routing, P/D transfers, role-change drains, summaries."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.routing_baselines import DynamoCostRouter, LeastLoadedRouter, RoundRobinRouter
from workers_agent.sim import links
from workers_agent.sim.engine import EngineSpec
from workers_agent.sim.gateway_routing import GatewayRouter
from workers_agent.sim.report import percentile, summarize
from workers_agent.sim.virtual import (
    FleetEngine,
    LinkModel,
    RoleChange,
    VirtualFleet,
    cluster_fleet,
    uniform_fleet,
)
from workers_agent.sim.workload import synthetic

MODEL = "llama-3.3-70b-fp8"


def chat(num: int = 40, rate: float = 4.0, isl: int = 2000, osl: int = 40, prefixes: int = 1,
         fraction: float = 0.5, seed: int = 1):
    return synthetic(
        {"isl": isl, "osl": osl, "shared_prefix_fraction": fraction}, num, rate, seed=seed,
        num_prefixes=prefixes,
    )


def pd_fleet(link_nodes_same: bool, nvlink: bool, router=None, nic=None):
    p = FleetEngine(EngineSpec("p", MODEL, "H200"), "n1", "g1" if nvlink else None, "prefill")
    d = FleetEngine(
        EngineSpec("d", MODEL, "H200"), "n1" if link_nodes_same else "n2",
        "g1" if nvlink else None, "decode",
    )
    return VirtualFleet([p, d], LinkModel(nic=nic or links.nic(400)), router=router)


def test_aggregated_fleet_serves_everything():
    fleet = VirtualFleet(uniform_fleet(2, MODEL, "H200"))
    result = fleet.run(chat())
    assert len(result.results) == 40
    assert all(r.error is None and r.output_tokens == 40 for r in result.results)
    assert all(r.ttft > 0 and len(r.itls) == 39 for r in result.results)
    assert all(not r.disaggregated for r in result.results)
    assert result.sim_seconds > 10 and result.num_gpus == 2
    summary = result.summary(slo_ttft_ms=2000, slo_itl_ms=50)
    assert summary.completed == 40 and summary.prefix_hit_rate > 0.3
    assert sum(s.requests_finished for s in result.engine_stats.values()) == 40


def test_pd_charges_transfer_and_decode_does_not_prefill_it():
    workload = chat(num=10, rate=0.5, fraction=0.0)
    slow = pd_fleet(False, False, nic=links.nic(25)).run(workload)
    fast = pd_fleet(True, True).run(workload)
    for result in (slow, fast):
        assert all(r.disaggregated and r.error is None for r in result.results)
        decode = result.engine_stats["d"]
        prefill = result.engine_stats["p"]
        # The decode engine computed one prompt token per request; the rest was transferred.
        assert decode.prompt_tokens_local_compute == 10
        assert decode.prompt_tokens_external == 10 * 1999
        assert prefill.prompt_tokens_local_compute == 10 * 2000
        assert prefill.num_held == 0 and prefill.num_used_blocks == 0
    expected = links.nic(25).transfer_seconds(2000 * 160 * 1024)
    assert slow.results[0].transfer_seconds == pytest.approx(expected)
    assert fast.results[0].transfer_seconds < expected / 50
    slow_ttft = sum(r.ttft for r in slow.results) / 10
    fast_ttft = sum(r.ttft for r in fast.results) / 10
    assert slow_ttft - fast_ttft == pytest.approx(expected, rel=0.2)


def test_link_model_picks_link_by_placement():
    model = LinkModel(nic=links.nic(200), node_nics={"slow": links.nic(25, rdma=False)})
    spec = EngineSpec("x", MODEL, "H200")
    a = FleetEngine(spec, "n1", "g1")
    assert model.between(a, FleetEngine(spec, "n1", "g1")).kind == "nvlink"
    assert model.between(a, FleetEngine(spec, "n1", "g2")).kind == "pcie"
    assert model.between(a, FleetEngine(spec, "n2", None)).label == "200G RDMA"
    assert model.between(a, FleetEngine(spec, "slow", None)).kind == "tcp"


def test_role_change_drains_before_switching():
    engines = uniform_fleet(3, MODEL, "H200", roles=["prefill", "decode", "decode"])
    changes = []

    def controller(now, snapshot):
        assert {e.engine_id for e in snapshot.engines} == {"e0", "e1", "e2"}
        if not changes and snapshot.engines[0].inflight_prefill > 0:
            changes.append(now)
            return [RoleChange("e0", "decode", reason="test")]
        return []

    fleet = VirtualFleet(engines, controller=controller, control_interval_s=1.0)
    result = fleet.run(chat(num=60, rate=6.0, osl=20))
    assert changes, "the controller never saw prefill work in flight"
    record = result.role_changes[0]
    assert (record.engine_id, record.old_role, record.new_role) == ("e0", "prefill", "decode")
    # It finished the prefills it had, so it switched after the request, not at once.
    assert record.completed_at is not None and record.completed_at > record.requested_at
    assert record.outcome == "done"
    assert fleet.member("e0").role == "decode"
    late_prefills = [
        r for r in result.results
        if r.prefill_engine == "e0" and r.decode_engine != "e0"
        and r.arrival > record.requested_at
    ]
    assert late_prefills == []
    # With no prefill engine left, later requests are served whole by the decode engines.
    late = [r for r in result.results if r.arrival > record.completed_at]
    assert late and all(not r.disaggregated for r in late)
    assert all(r.error is None for r in result.results)


def test_kv_aware_routing_beats_round_robin_on_hits():
    workload = chat(num=80, rate=3.0, isl=3000, osl=10, prefixes=4, fraction=0.8)
    rates = {}
    for name, router in (("rr", RoundRobinRouter()), ("dynamo", DynamoCostRouter()),
                         ("ll", LeastLoadedRouter()), ("pdplane", None),
                         ("pdplane-events", GatewayRouter(precise=True))):
        fleet = VirtualFleet(uniform_fleet(4, MODEL, "H200"), router=router)
        result = fleet.run(workload)
        assert all(r.error is None for r in result.results)
        rates[name] = result.summary(2000, 50).prefix_hit_rate
    assert rates["dynamo"] > rates["rr"]
    # The fleet's default is the gateway's own router, and it finds the prefixes too.
    assert rates["pdplane"] > rates["rr"] and rates["pdplane"] > 0.6
    assert rates["pdplane-events"] > 0.6


def test_gateway_router_keeps_the_gateways_books():
    """Loads are reserved at dispatch and fully released when requests leave; the table
    is the control plane's and is rebuilt when a role changes."""
    router = GatewayRouter()
    engines = uniform_fleet(3, MODEL, "H200", roles=["prefill", "decode", "decode"])
    fleet = VirtualFleet(engines, router=router)
    result = fleet.run(chat(num=30, rate=2.0, fraction=0.2))
    assert all(r.error is None for r in result.results)
    assert router.model.mode == "conditional"
    assert any(r.disaggregated for r in result.results)
    assert all(load.in_flight == 0 and load.prefill_blocks == 0 and load.decode_blocks == 0
               for load in router.loads.values())
    assert not router._reservations
    version = router.table["version"]
    fleet.apply_role_change(RoleChange("e0", "both"))
    fleet.run(chat(num=5, rate=2.0, seed=3))
    assert router.table["version"] > version
    assert router.model.mode == "aggregated"


def test_summarize_percentiles_and_goodput():
    def rec(ttft, itls, error=None):
        return SimpleNamespace(ttft=ttft, itls=itls, prompt_tokens=100, cached_tokens=50,
                               output_tokens=len(itls) + 1, error=error)

    records = [rec(0.1, [0.01] * 9), rec(0.3, [0.02] * 9), rec(2.0, [0.01] * 9),
               rec(0.2, [0.2] * 9), rec(None, [], error="boom")]
    summary = summarize(records, slo_ttft_ms=1000, slo_itl_ms=50, attainment=0.5,
                        num_gpus=2, duration=10)
    assert summary.requests == 5 and summary.completed == 4 and summary.failed == 1
    assert summary.goodput_rps == pytest.approx(0.2)
    assert summary.goodput_rps_per_gpu == pytest.approx(0.1)
    assert summary.slo_attainment == pytest.approx(0.4) and not summary.slo_met
    assert summary.ttft_ms["p50"] == pytest.approx(250)
    assert summary.prefix_hit_rate == pytest.approx(0.5)
    assert percentile([3, 1, 2], 50) == 2 and percentile([], 50) is None
    assert summary.lines()[0].startswith("requests 5")


def test_decode_bursts_match_step_by_step():
    workload = chat(num=60, rate=5.0, isl=1500, osl=60, prefixes=3)
    runs = []
    for bursts in (False, True):
        fleet = VirtualFleet(
            uniform_fleet(3, MODEL, "H200", roles=["prefill", "decode", "both"]),
            decode_bursts=bursts, controller=lambda now, snap: [], control_interval_s=2.0,
        )
        runs.append(fleet.run(workload))
    slow, fast = runs
    assert fast.num_events < slow.num_events / 2
    for a, b in zip(slow.results, fast.results, strict=True):
        assert (a.request_id, a.decode_engine, a.prefill_engine, a.output_tokens) == (
            b.request_id, b.decode_engine, b.prefill_engine, b.output_tokens)
        assert a.ttft == pytest.approx(b.ttft, abs=1e-9)
        assert a.itls == pytest.approx(b.itls, abs=1e-9)
    assert slow.engine_stats["e2"].generation_tokens == fast.engine_stats["e2"].generation_tokens


def test_link_model_defaults_come_from_hardware():
    model = LinkModel()
    h200 = EngineSpec("a", MODEL, "H200")
    l40s = EngineSpec("b", "llama-3.1-8b", "L40S")
    assert model.between(FleetEngine(h200, "n", "g"), FleetEngine(h200, "n", "g")).kind == "nvlink"
    pcie = model.between(FleetEngine(h200, "n", None), FleetEngine(l40s, "n", None))
    assert pcie.label == "PCIe Gen4 x16"  # the slower end
    assert model.between(FleetEngine(l40s, "n", "g"), FleetEngine(l40s, "n", "g")).kind == "pcie"
    assert LinkModel.lanes(links.nic(400), 4, 4) == 1
    assert LinkModel.lanes(links.nvlink(), 4, 2) == 2
    assert all(e.nvlink_group is None for e in uniform_fleet(2, "llama-3.1-8b", "L40S"))


def test_nic_transfers_queue_behind_each_other():
    workload = chat(num=30, rate=50.0, isl=4000, osl=5, fraction=0.0)
    slow_nic = links.nic(25, rdma=False)
    one = links.nic(25, rdma=False).transfer_seconds(4000 * 160 * 1024)

    def fleet(contention):
        engines = [
            FleetEngine(EngineSpec(f"p{i}", MODEL, "H200"), "n1", None, "prefill")
            for i in range(4)
        ] + [FleetEngine(EngineSpec("d", MODEL, "H200"), "n2", None, "decode")]
        return VirtualFleet(engines, LinkModel(nic=slow_nic), nic_contention=contention)

    queued = fleet(True).run(workload).results
    free = fleet(False).run(workload).results
    assert max(r.transfer_seconds for r in free) == pytest.approx(one)
    assert max(r.transfer_seconds for r in queued) > 3 * one
    assert all(r.error is None for r in queued)


def test_cluster_fleet_from_scenarios(shared_dir):
    import json

    clusters = json.loads((shared_dir / "data" / "scenarios.json").read_text())["clusters"]
    engines, link_model = cluster_fleet(clusters["four-h200nvl-servers"], MODEL)
    assert len(engines) == 32 and engines[0].spec.hardware.name == "H200 NVL"
    assert engines[0].nvlink_group == engines[3].nvlink_group != engines[4].nvlink_group
    assert link_model.between(engines[0], engines[8]).label == "400G RDMA"
    engines, link_model = cluster_fleet(clusters["two-rtxpro-servers"], MODEL, tp=2)
    assert len(engines) == 8 and all(e.nvlink_group is None for e in engines)
    assert link_model.between(engines[0], engines[1]).kind == "pcie"
    assert link_model.between(engines[0], engines[4]).label == "100G TCP"
    with pytest.raises(ValueError):
        cluster_fleet(clusters["l40s-small"], MODEL, tp=3)


# --- Deadline shedding (queue_deadline_s) --------------------------------------------------


def _overload(num: int = 120, rate: float = 40.0):
    # 4k prompts at 40 req/s on one H200: far beyond what it prefills, so a queue builds.
    return chat(num=num, rate=rate, isl=4000, osl=20, fraction=0.0, seed=3)


def test_shedding_is_off_by_default():
    result = VirtualFleet(uniform_fleet(1, MODEL, "H200")).run(_overload())
    assert all(r.error is None for r in result.results)
    assert max(r.ttft for r in result.results) > 30.0  # the backlog is served, late


def test_deadline_sheds_queued_requests_and_serves_the_rest_in_time():
    fleet = VirtualFleet(uniform_fleet(1, MODEL, "H200"), queue_deadline_s=2.0)
    result = fleet.run(_overload())
    assert len(result.results) == 120
    shed = [r for r in result.results if r.error is not None]
    served = [r for r in result.results if r.error is None]
    assert shed and served
    assert fleet.num_shed == len(shed)
    assert all(r.error.startswith("deadline exceeded") for r in shed)
    assert all(r.first_token_time is None and r.output_tokens == 0 for r in shed)
    # Only requests admitted before their deadline are served: the latest first token
    # comes a few (chunk-shared) prefills after the deadline, not behind the whole backlog
    # (~55 s without shedding).
    assert max(r.ttft for r in served) < 6.0
    assert all(r.output_tokens == 20 for r in served)
    # Every block comes back: nothing leaks from aborted queue entries.
    stats = result.engine_stats["e0"]
    assert stats.kv_usage == 0.0
    assert stats.num_running == 0 and stats.num_waiting == 0


def test_deadline_sheds_in_pd_and_releases_held_prefill_blocks():
    engines = uniform_fleet(2, MODEL, "H200", roles=["prefill", "decode"])
    fleet = VirtualFleet(engines, queue_deadline_s=1.0)
    result = fleet.run(_overload(num=80, rate=30.0))
    shed = [r for r in result.results if r.error is not None]
    assert shed and all(r.error.startswith("deadline exceeded") for r in shed)
    assert len(result.results) == 80
    for stats in result.engine_stats.values():
        assert stats.num_running == 0 and stats.num_waiting == 0
        assert stats.kv_usage == 0.0
    for m in fleet.order:
        assert m.inflight_prefill == 0 and m.inflight_decode == 0 and m.incoming_pd == 0


def test_deadline_does_not_touch_a_fleet_that_keeps_up():
    workload = chat(num=20, rate=1.0)
    plain = VirtualFleet(uniform_fleet(2, MODEL, "H200")).run(workload)
    shed = VirtualFleet(uniform_fleet(2, MODEL, "H200"), queue_deadline_s=2.0).run(workload)
    assert [r.ttft for r in plain.results] == [r.ttft for r in shed.results]
    assert all(r.error is None for r in shed.results)


def test_deadline_must_be_positive():
    with pytest.raises(ValueError):
        VirtualFleet(uniform_fleet(1, MODEL, "H200"), queue_deadline_s=0)
