"""Routing decisions: Dynamo-style KV-aware cost, temperature, draining, P/D threshold."""

import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.router import (
    NoWorkerError,
    Scored,
    WorkerLoad,
    blocks_for,
    cost_of,
    pick,
    plan_request,
    transfer_penalty,
)
from gateway.statictable import static_table
from gateway.table import parse

BS = 16


def model_of(workers, mode=None, threshold=512, temperature=0.0, paths=None, **routing):
    table = static_table("m", workers, mode=mode, block_size=BS,
                         local_prefill_max_tokens=threshold,
                         routing={"temperature": temperature, **routing})
    for w in table["models"][0]["workers"]:
        w["kv_paths"] = (paths or {}).get(w["id"], [])
    return parse(table).models["m"]


def w(wid, role="both", state="active"):
    return {"id": wid, "url": f"http://{wid}:8000", "role": role, "state": state}


def test_dynamo_worked_example_picks_w2():
    # Request of 4 blocks. W1: nothing cached, busy prefilling; W2: 2 cached, light load;
    # W3: 2 cached, idle prefill but heavy decode. Costs 8+10=18, 5+5=10, 2+9=11.
    loads = {"W1": WorkerLoad(4, 6), "W2": WorkerLoad(3, 1), "W3": WorkerLoad(0, 5)}
    cached = {"W1": 0, "W2": 2, "W3": 2}
    scores = {
        wid: cost_of(wid, loads[wid], 4, cached[wid], overlap_weight=1.0, load_weight=1.0)
        for wid in loads
    }
    assert (scores["W1"].prefill_term, scores["W1"].decode_term, scores["W1"].cost) == (8, 10, 18)
    assert (scores["W2"].prefill_term, scores["W2"].decode_term, scores["W2"].cost) == (5, 5, 10)
    assert (scores["W3"].prefill_term, scores["W3"].decode_term, scores["W3"].cost) == (2, 9, 11)
    assert pick(list(scores.values()), 0.0, random.Random(0)).worker_id == "W2"
    # The planner prices decode load as the stall the prompt's prefill brings to the
    # requests in flight there (each at least the fleet's mean KV per request, 12/7 here):
    # W1 8 + 3×4 = 20, W2 5 + 1×2 = 7, W3 2 + 3×2 = 8. Prefix affinity off (a match ratio
    # above 1 never qualifies), so the cost alone decides.
    loads = {"W1": WorkerLoad(4, 6, 3), "W2": WorkerLoad(3, 1, 1), "W3": WorkerLoad(0, 5, 3)}
    model = model_of([w("W1"), w("W2"), w("W3")], prefix_min_match=1.1)
    plan = plan_request(model, 4 * BS, {k: v * BS for k, v in cached.items()}, loads,
                        random.Random(0))
    assert plan.decode == "W2" and plan.prefill is None and plan.reason == "kv_aware"
    assert {s.worker_id: s.cost for s in plan.scores} == {"W1": 20, "W2": 7, "W3": 8}
    # With the default affinity W2 and W3 both hold half the prompt: the cheaper one wins.
    plan = plan_request(model_of([w("W1"), w("W2"), w("W3")]), 4 * BS,
                        {k: v * BS for k, v in cached.items()}, loads, random.Random(0))
    assert plan.decode == "W2" and plan.reason == "kv_prefix"


def test_cache_credit_never_goes_negative_and_weights_apply():
    s = cost_of("x", WorkerLoad(0, 0), 4, 10, overlap_weight=1.0, load_weight=1.0)
    assert s.prefill_term == 0 and s.cost == 4
    heavy = cost_of("x", WorkerLoad(2, 0), 4, 2, overlap_weight=2.0, load_weight=3.0)
    assert heavy.prefill_term == 3 * (6 - 4)


def test_blocks_for_rounds_up():
    assert blocks_for(0, 16) == 0 and blocks_for(1, 16) == 1 and blocks_for(33, 16) == 3


def test_ties_prefer_fewer_in_flight_then_random():
    scores = [Scored("a", 5, 0, 5, 0), Scored("b", 5, 0, 5, 0)]
    loads = {"a": WorkerLoad(in_flight=3), "b": WorkerLoad(in_flight=1)}
    assert pick(scores, 0.0, random.Random(1), loads).worker_id == "b"
    seen = {pick(scores, 0.0, random.Random(seed)).worker_id for seed in range(20)}
    assert seen == {"a", "b"}


def test_temperature_zero_is_deterministic_and_positive_samples_by_cost():
    scores = [Scored("cheap", 10, 0, 10, 0), Scored("mid", 15, 0, 15, 0),
              Scored("dear", 20, 0, 20, 0)]
    assert {pick(scores, 0.0, random.Random(s)).worker_id for s in range(50)} == {"cheap"}
    rng = random.Random(42)
    counts = Counter(pick(scores, 0.5, rng).worker_id for _ in range(4000))
    assert counts["cheap"] > counts["mid"] > counts["dear"] > 0
    # softmax(−normalised cost / T): weights 1, e^-1, e^-2 at T = 0.5.
    total = 1 + 2.718281828 ** -1 + 2.718281828 ** -2
    assert counts["cheap"] / 4000 == pytest.approx(1 / total, abs=0.03)
    hot = Counter(pick(scores, 100.0, random.Random(3)).worker_id for _ in range(3000))
    assert min(hot.values()) > 800  # very hot: nearly uniform


def test_draining_workers_get_nothing():
    model = model_of([w("a"), w("b", state="draining"), w("c")])
    rng = random.Random(0)
    chosen = {plan_request(model, 64, {"b": 64}, {}, rng).decode for _ in range(200)}
    assert chosen == {"a", "c"}


def test_draining_prefill_worker_gets_no_prefill_work():
    model = model_of([w("p1", "prefill", "draining"), w("p2", "prefill"), w("d", "decode")],
                     mode="disaggregated")
    for _ in range(50):
        plan = plan_request(model, 4096, {}, {}, random.Random(0))
        assert plan.prefill == "p2" and plan.decode == "d"


def test_no_active_worker_raises():
    model = model_of([w("a", state="draining")])
    with pytest.raises(NoWorkerError):
        plan_request(model, 10, {}, {}, random.Random(0))
    with pytest.raises(NoWorkerError):
        plan_request(model_of([w("a")]), 10, {}, {}, random.Random(0), exclude={"a"})


def test_excluded_worker_is_skipped_on_retry():
    model = model_of([w("a"), w("b")])
    plan = plan_request(model, 64, {"a": 64}, {}, random.Random(0), exclude={"a"})
    assert plan.decode == "b"


def test_conditional_mode_prefills_locally_when_uncached_part_is_small():
    model = model_of([w("p", "prefill"), w("d", "decode")], mode="conditional", threshold=256)
    rng = random.Random(0)
    small = plan_request(model, 200, {}, {}, rng)
    assert (small.decode, small.prefill, small.reason) == ("d", None, "pd_local_prefill")
    large = plan_request(model, 2000, {}, {}, rng)
    assert (large.decode, large.prefill, large.reason) == ("d", "p", "pd_remote_prefill")
    # Long prompt, but most of it is already cached on the decode worker: local again.
    cached = plan_request(model, 2000, {"d": 1800}, {}, rng)
    assert cached.prefill is None and cached.reason == "pd_local_prefill"
    # Exactly at the threshold is local; one more token is remote.
    assert plan_request(model, 256, {}, {}, rng).prefill is None
    assert plan_request(model, 257, {}, {}, rng).prefill == "p"


def test_disaggregated_mode_always_prefills_remotely():
    model = model_of([w("p", "prefill"), w("d", "decode")], mode="disaggregated", threshold=10**6)
    plan = plan_request(model, 20, {}, {}, random.Random(0))
    assert plan.prefill == "p" and plan.decode == "d"


def test_pd_falls_back_to_local_prefill_without_prefill_worker():
    model = model_of([w("p", "prefill"), w("d", "decode")], mode="disaggregated")
    plan = plan_request(model, 4096, {}, {}, random.Random(0), exclude={"p"})
    assert plan.prefill is None and plan.reason == "pd_no_prefill_worker"


def test_pd_prefers_prefill_worker_with_fast_kv_path():
    paths = {
        "p_tcp": [{"to": "d", "link": "tcp", "bandwidth_gbps": 25.0, "rdma": False}],
        "p_nvl": [{"to": "d", "link": "nvlink", "bandwidth_gbps": 7200.0, "rdma": False}],
    }
    model = model_of([w("p_tcp", "prefill"), w("p_nvl", "prefill"), w("d", "decode")],
                     mode="disaggregated", paths=paths)
    for seed in range(20):
        assert plan_request(model, 4096, {}, {}, random.Random(seed)).prefill == "p_nvl"
    p_tcp, p_nvl = model.worker("p_tcp"), model.worker("p_nvl")
    assert transfer_penalty(256, p_nvl, "d") < transfer_penalty(256, p_tcp, "d")
    # ... unless the fast one is much busier.
    loads = {"p_nvl": WorkerLoad(prefill_blocks=2000)}
    assert plan_request(model, 4096, {}, loads, random.Random(0)).prefill == "p_tcp"


def test_pd_prefill_choice_uses_prefix_cache():
    model = model_of([w("p1", "prefill"), w("p2", "prefill"), w("d", "decode")],
                     mode="disaggregated")
    plan = plan_request(model, 4096, {"p2": 4000}, {}, random.Random(0))
    assert plan.prefill == "p2"


def test_aggregated_mode_uses_prefill_workers_only_as_last_resort():
    model = model_of([w("p", "prefill"), w("b", "both")], mode="aggregated")
    assert plan_request(model, 64, {"p": 64}, {}, random.Random(0)).decode == "b"
    fallback = plan_request(model, 64, {}, {}, random.Random(0), exclude={"b"})
    assert fallback.decode == "p" and fallback.reason == "fallback_prefill_only"


def test_load_spreads_requests_without_cache():
    model = model_of([w("a"), w("b"), w("c")])
    loads = {}
    for _ in range(30):
        plan = plan_request(model, 160, {}, loads, random.Random(0))
        load = loads.setdefault(plan.decode, WorkerLoad())
        load.decode_blocks += 10
        load.in_flight += 1
    assert sorted(v.in_flight for v in loads.values()) == [10, 10, 10]


def test_long_prefix_match_wins_over_in_flight_load_difference():
    # 10-block prompt, 9 blocks cached on B, which has more KV in flight: by the cost A
    # (all idle) is cheaper (10+10=20 vs 41+1=42), but the prefix would be computed again.
    loads = {"A": WorkerLoad(0, 0, 1), "B": WorkerLoad(40, 40, 3)}
    model = model_of([w("A"), w("B")])
    plan = plan_request(model, 10 * BS, {"B": 9 * BS}, loads, random.Random(0))
    assert plan.decode == "B" and plan.reason == "kv_prefix" and plan.cached_tokens == 9 * BS
    # Affinity switched off through the table: the cost decides.
    plan = plan_request(model_of([w("A"), w("B")], prefix_min_match=1.1), 10 * BS,
                        {"B": 9 * BS}, loads, random.Random(0))
    assert plan.decode == "A" and plan.reason == "kv_aware"


def test_short_prefix_match_goes_by_cost():
    # 2 of 10 blocks cached (below the 0.3 match ratio): the cost decides.
    loads = {"A": WorkerLoad(0, 0, 1), "B": WorkerLoad(40, 40, 3)}
    plan = plan_request(model_of([w("A"), w("B")]), 10 * BS, {"B": 2 * BS}, loads,
                        random.Random(0))
    assert plan.decode == "A" and plan.reason == "kv_aware"


def test_imbalanced_load_overrides_prefix_affinity():
    model = model_of([w("A"), w("B")], imbalance_abs=4, imbalance_rel=1.5)
    busy = {"A": WorkerLoad(0, 0, 1), "B": WorkerLoad(40, 40, 6)}  # 6 − 1 > 4 and 6 > 1.5
    plan = plan_request(model, 10 * BS, {"B": 9 * BS}, busy, random.Random(0))
    assert plan.decode == "A" and plan.reason == "kv_aware"
    # Both thresholds must be exceeded: 5 − 1 = 4 is not more than 4.
    close = {"A": WorkerLoad(0, 0, 1), "B": WorkerLoad(40, 40, 5)}
    assert plan_request(model, 10 * BS, {"B": 9 * BS}, close, random.Random(0)).decode == "B"


def test_prefix_affinity_ties_go_to_the_cheaper_holder():
    loads = {"A": WorkerLoad(0, 0, 0), "B": WorkerLoad(5, 5, 1), "C": WorkerLoad(0, 2, 1)}
    cached = {"B": 8 * BS, "C": 8 * BS}
    plan = plan_request(model_of([w("A"), w("B"), w("C")]), 10 * BS, cached, loads,
                        random.Random(0))
    assert plan.decode == "C" and plan.reason == "kv_prefix"
    # The plan says how many holders of the best match it chose among (the cost model's
    # dispatch reads their mean); a decision by cost names none.
    assert plan.holders == 2
    loads["A"] = WorkerLoad(0, 0, 0)
    plan = plan_request(model_of([w("A"), w("B"), w("C")]), 10 * BS, {"B": 8 * BS,
                        "C": 4 * BS}, loads, random.Random(0))
    assert plan.reason == "kv_prefix" and plan.holders == 1
    plan = plan_request(model_of([w("A"), w("B"), w("C")]), 10 * BS, {}, loads,
                        random.Random(0))
    assert plan.reason == "kv_aware" and plan.holders == 0


def test_conditional_decode_stage_follows_prefix_too():
    workers = [w("P", role="prefill"), w("D1", role="decode"), w("D2", role="decode")]
    loads = {"D1": WorkerLoad(0, 0, 0), "D2": WorkerLoad(30, 60, 3)}
    plan = plan_request(model_of(workers, mode="conditional", threshold=64), 20 * BS,
                        {"D2": 18 * BS}, loads, random.Random(0))
    assert plan.decode == "D2" and plan.prefill is None and plan.reason == "pd_local_prefill"


def test_optional_routing_fields_are_validated():
    from gateway.table import TableError

    table = static_table("m", [w("A")], block_size=BS, routing={"prefix_min_match": -1})
    with pytest.raises(TableError, match="prefix_min_match"):
        parse(table)


def test_near_ties_go_to_the_worker_that_took_the_least_new_kv():
    # A is cheapest by 4 % (B has 5 blocks queued), B took far less new KV lately: within the
    # 10 % band B wins.
    loads = {"A": WorkerLoad(0, 100, 2), "B": WorkerLoad(5, 105, 2), "C": WorkerLoad(0, 300, 5)}
    inflow = {"A": 900.0, "B": 100.0, "C": 0.0}
    model = model_of([w("A"), w("B"), w("C")])
    plan = plan_request(model, 10 * BS, {}, loads, random.Random(0), inflow=inflow)
    assert plan.decode == "B" and plan.reason == "kv_aware"
    # C took nothing but costs far more than the band allows; without inflow: A.
    assert plan_request(model, 10 * BS, {}, loads, random.Random(0)).decode == "A"
    # The band comes from the table; 0 switches the rule off.
    off = model_of([w("A"), w("B"), w("C")], cache_balance_band=0)
    assert plan_request(off, 10 * BS, {}, loads, random.Random(0), inflow=inflow).decode == "A"
    # A followed prefix is not second-guessed by the inflow.
    plan = plan_request(model, 10 * BS, {"A": 9 * BS}, loads, random.Random(0), inflow=inflow)
    assert plan.decode == "A" and plan.reason == "kv_prefix"


def test_cache_balance_band_is_validated():
    from gateway.table import TableError

    table = static_table("m", [w("A")], block_size=BS, routing={"cache_balance_band": -0.1})
    with pytest.raises(TableError, match="cache_balance_band"):
        parse(table)


def test_affinity_bound_scales_with_the_fleet_and_its_load():
    # 8 workers under overload, every one busy; the holder H has 2× the mean in flight:
    # the fixed 64-request gap never triggers, the bound (1.5× the mean + 1) does.
    ids = [f"w{i}" for i in range(8)]
    loads = {i: WorkerLoad(200, 400, 20) for i in ids}
    loads["w0"] = WorkerLoad(200, 600, 40)
    model = model_of([w(i) for i in ids])
    plan = plan_request(model, 10 * BS, {"w0": 9 * BS}, loads, random.Random(0))
    assert plan.decode != "w0" and plan.reason == "kv_aware"
    # As busy as the rest (within the bound): the prefix is followed.
    loads["w0"] = WorkerLoad(200, 600, 24)
    plan = plan_request(model, 10 * BS, {"w0": 9 * BS}, loads, random.Random(0))
    assert plan.decode == "w0" and plan.reason == "kv_prefix"
    # A long prefill queue (> 1.5× the mean + this request) also stops it.
    loads["w0"] = WorkerLoad(400, 600, 20)
    assert plan_request(model, 10 * BS, {"w0": 9 * BS}, loads, random.Random(0)).decode != "w0"
    # The bound comes from the table; 0 turns it off (the old imbalance rule only).
    unbounded = model_of([w(i) for i in ids], affinity_load_factor=0)
    loads["w0"] = WorkerLoad(200, 600, 40)
    assert plan_request(unbounded, 10 * BS, {"w0": 9 * BS}, loads,
                        random.Random(0)).decode == "w0"


def test_a_shorter_admitted_prefix_beats_an_overloaded_longer_one():
    ids = ["a", "b", "c", "d"]
    loads = {i: WorkerLoad(0, 50, 4) for i in ids}
    loads["a"] = WorkerLoad(0, 50, 30)  # holds the longest prefix but is overloaded
    cached = {"a": 9 * BS, "b": 6 * BS}
    plan = plan_request(model_of([w(i) for i in ids]), 10 * BS, cached, loads,
                        random.Random(0))
    assert plan.decode == "b" and plan.reason == "kv_prefix" and plan.cached_tokens == 6 * BS


def test_kv_pressure_bounds_affinity():
    table = static_table("m", [w("A"), w("B")], block_size=BS, routing={"temperature": 0.0})
    for entry in table["models"][0]["workers"]:
        entry["capacity"]["kv_tokens"] = 100 * BS
    model = parse(table).models["m"]
    full = {"A": WorkerLoad(0, 10, 2), "B": WorkerLoad(0, 95, 2)}  # B: 95 % of its KV
    # Not followed for its prefix (the cost then decides: its queue is no longer, so the
    # cache credit still counts there).
    assert plan_request(model, 10 * BS, {"B": 9 * BS}, full, random.Random(0)).reason == (
        "kv_aware")
    roomy = {"A": WorkerLoad(0, 10, 2), "B": WorkerLoad(0, 60, 2)}
    plan = plan_request(model, 10 * BS, {"B": 9 * BS}, roomy, random.Random(0))
    assert plan.decode == "B" and plan.reason == "kv_prefix"


def test_cache_credit_never_offsets_queued_work():
    # With a large overlap weight the credit would once cancel B's whole queue.
    loads = {"A": WorkerLoad(0, 0), "B": WorkerLoad(50, 0)}
    a = cost_of("A", loads["A"], 10, 0, overlap_weight=5.0, load_weight=1.0)
    b = cost_of("B", loads["B"], 10, 9, overlap_weight=5.0, load_weight=1.0)
    assert b.prefill_term == 50 and a.prefill_term == 10 and a.cost < b.cost


def test_conditional_decode_ignores_a_prefix_it_would_not_prefill_locally():
    # D2 holds half of a 40-block prompt: 20 blocks (320 tokens) would still be prefilled,
    # more than the 64-token local threshold, so the prompt goes to a prefill worker anyway
    # and the decode worker is picked by load alone (D1, idle), not by the prefix.
    workers = [w("P", role="prefill"), w("D1", role="decode"), w("D2", role="decode")]
    loads = {"D1": WorkerLoad(0, 0, 0), "D2": WorkerLoad(0, 30, 2)}
    plan = plan_request(model_of(workers, mode="conditional", threshold=64), 40 * BS,
                        {"D2": 20 * BS}, loads, random.Random(0))
    assert plan.decode == "D1" and plan.prefill == "P" and plan.reason == "pd_remote_prefill"


def test_near_ties_go_first_to_the_worker_with_fewer_requests_in_flight():
    # Mean KV per request in flight 41 blocks: A costs 10 + 3×41 = 133, B (50 blocks queued)
    # 60 + 2×41 = 142, 7 % more; B runs fewer requests: within the 10 % band B wins, before
    # the inflow rule (A took less new KV lately) is consulted.
    loads = {"A": WorkerLoad(0, 100, 3), "B": WorkerLoad(50, 105, 2)}
    inflow = {"A": 0.0, "B": 900.0}
    model = model_of([w("A"), w("B")])
    assert plan_request(model, 10 * BS, {}, loads, random.Random(0), inflow=inflow).decode == "B"
    # Outside the band (B 80 blocks queued: 172, 29 % more) the cost decides.
    far = {"A": WorkerLoad(0, 100, 3), "B": WorkerLoad(80, 105, 2)}
    assert plan_request(model, 10 * BS, {}, far, random.Random(0), inflow=inflow).decode == "A"


def test_a_long_prompt_goes_where_its_prefill_stalls_fewest_decodes():
    # A has nothing queued but 6 short requests decoding; B has 20 blocks queued and 1 long
    # request. A 100-block prompt on A would stall 6 decodes for its whole prefill
    # (100 + 6×100 = 700), on B one (120 + 100 = 220): B, although Dynamo's cost, which
    # balances KV blocks, prefers A (212 vs 370).
    loads = {"A": WorkerLoad(0, 12, 6), "B": WorkerLoad(20, 150, 1)}
    plan = plan_request(model_of([w("A"), w("B")]), 100 * BS, {}, loads, random.Random(0))
    assert plan.decode == "B" and plan.reason == "kv_aware"
    dynamo = {wid: cost_of(wid, load, 100, 0, overlap_weight=1.0, load_weight=1.0).cost
              for wid, load in loads.items()}
    assert dynamo["A"] < dynamo["B"]


def test_a_cache_hit_never_makes_a_crowded_worker_look_free():
    # A holds the whole prompt but runs 10 requests; B runs 1. With affinity off, the cost:
    # A's credit removes its own prefill, yet each request in flight still counts at least
    # the mean KV per request (B wins); with affinity on, the load bound stops it too.
    loads = {"A": WorkerLoad(0, 200, 10), "B": WorkerLoad(0, 20, 1)}
    cached = {"A": 10 * BS}
    off = model_of([w("A"), w("B")], prefix_min_match=1.1)
    assert plan_request(off, 10 * BS, cached, loads, random.Random(0)).decode == "B"
    plan = plan_request(model_of([w("A"), w("B")]), 10 * BS, cached, loads, random.Random(0))
    assert plan.decode == "B" and plan.reason == "kv_aware"
    # Equally loaded, the holder wins by the cost.
    even = {"A": WorkerLoad(0, 20, 1), "B": WorkerLoad(0, 20, 1)}
    assert plan_request(off, 10 * BS, cached, even, random.Random(0)).decode == "A"


@settings(max_examples=200, deadline=None)
@given(queued=st.integers(0, 500), in_flight=st.integers(0, 50), kv=st.integers(0, 5000),
       blocks=st.integers(1, 400), cached=st.integers(0, 400), floor=st.floats(0, 500),
       more=st.integers(1, 20))
def test_stall_cost_grows_with_load_and_falls_with_cache(queued, in_flight, kv, blocks, cached,
                                                         floor, more):
    def cost(q, n, c):
        return cost_of("w", WorkerLoad(q, kv, n), blocks, c, overlap_weight=1.0,
                       load_weight=1.0, kv_reuse=True, stall_floor=floor)

    base = cost(queued, in_flight, cached)
    assert base.cost >= 0 and base.prefill_term >= queued
    assert cost(queued, in_flight + more, cached).cost >= base.cost  # more decodes to stall
    assert cost(queued + more, in_flight, cached).cost > base.cost  # more queued ahead
    assert cost(queued, in_flight, cached + more).cost <= base.cost  # more of it cached
    # The credit never offsets work queued ahead, nor the floor per request in flight.
    assert base.cost >= queued + in_flight * floor - 1e-6
