"""The stall weight of the aggregated cost: a stall to a request in flight counts by how
much it moves that request's mean ITL against the SLO (gateway.router.stall_weight)."""

import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.routing.builder import _slo_ratio
from gateway.router import (
    LoadReservation,
    RoutePlan,
    WorkerLoad,
    cost_of,
    plan_request,
    stall_weight,
)
from gateway.statictable import static_table
from gateway.table import TableError, parse

BS = 16


def model_of(workers, **routing):
    table = static_table("m", [{"id": w, "url": f"http://{w}:8000", "role": "both",
                                "state": "active"} for w in workers],
                         block_size=BS, routing=routing)
    return parse(table).models["m"]


def test_stall_weight_is_the_slo_ratio_over_the_answer_length_at_most_one():
    assert stall_weight(400, 0.0) == 1.0  # no ratio in the table: every stall in full
    assert stall_weight(400, 20.0) == 0.05
    assert stall_weight(20, 20.0) == 1.0 and stall_weight(5, 20.0) == 1.0
    assert stall_weight(0, 20.0) == 1.0  # an empty answer is not a division by zero


@given(out=st.integers(0, 100_000), more=st.integers(1, 1000), ratio=st.floats(0.01, 1000))
def test_stall_weight_is_a_fraction_falling_with_the_answer(out, more, ratio):
    w = stall_weight(out, ratio)
    assert 0 < w <= 1
    assert stall_weight(out + more, ratio) <= w  # a longer answer absorbs a stall better
    assert stall_weight(out, ratio + more) >= w  # a looser TTFT (or tighter ITL) target


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("AB"), st.integers(1, 4000), st.integers(0, 2000),
                          st.booleans()), min_size=1, max_size=40),
       st.floats(0, 200))
def test_reservations_keep_the_stall_weights_of_their_own_requests(requests, ratio):
    loads = defaultdict(WorkerLoad)
    held = []
    for worker, prompt, out, release_now in requests:
        plan = RoutePlan(worker, None, "kv_aware", ttft_itl_ratio=ratio)
        held.append(LoadReservation(loads, plan, prompt, out, BS))
        if release_now:
            held.pop(0).release()
        for load in loads.values():
            assert load.own_requests == load.in_flight
            assert 0 <= load.mean_stall_weight() <= 1 + 1e-9
    for r in held:
        r.release()
        r.release()  # once only
    assert all(load.own_requests == 0 and load.stall_weight_sum == 0 and load.in_flight == 0
               for load in loads.values())


def test_a_long_prompt_goes_beside_long_answers_rather_than_behind_a_queue():
    # Azure conversation at 2x (docs/benchmarks.md): A took the long prompts with short
    # answers, so it has few requests in flight but a deep prefill queue; B has twice the
    # requests, all with long answers, and no queue. A 256-block prompt stalls B's 12
    # decodes for its prefill, but over 400 output tokens each that is little ITL, while
    # behind A's queue its own first token waits 400 blocks longer.
    def fleet(ratio):
        loads = defaultdict(WorkerLoad)
        for _ in range(6):
            LoadReservation(loads, RoutePlan("A", None, "kv_aware", ttft_itl_ratio=ratio),
                            4096, 50, BS)
        for _ in range(12):
            LoadReservation(loads, RoutePlan("B", None, "kv_aware", ttft_itl_ratio=ratio),
                            1024, 400, BS).prefill_done()
        loads["A"].prefill_blocks = 400.0
        return loads

    # A: 400 + 256 + 6 × min(1, 20/50) × 256 = 1270; B: 256 + 12 × (20/400) × 256 = 410.
    plan = plan_request(model_of(["A", "B"], ttft_itl_ratio=20.0), 4096, {}, fleet(20.0),
                        random.Random(0))
    assert plan.decode == "B" and plan.ttft_itl_ratio == 20.0
    assert plan.scores[0].cost == 400 + 256 + 6 * 0.4 * 256
    # Every stall in full (no ratio): A 656 + 6 × 256 = 2192 against B 256 + 12 × 256.
    assert plan_request(model_of(["A", "B"]), 4096, {}, fleet(0.0), random.Random(0)).decode == "A"


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("ABC"), st.integers(1, 3000), st.integers(0, 20),
                          st.booleans()), max_size=30),
       st.integers(1, 5000), st.integers(0, 3))
def test_short_answers_are_routed_as_without_the_ratio(requests, prompt, seed):
    # Answers no longer than the ratio are stalled in full: the same decisions as before.
    loads = defaultdict(WorkerLoad)
    for worker, p, out, done in requests:
        r = LoadReservation(loads, RoutePlan(worker, None, "kv_aware", ttft_itl_ratio=20.0),
                            p, out, BS)
        if done:
            r.prefill_done()
    new = plan_request(model_of("ABC", ttft_itl_ratio=20.0), prompt, {}, loads,
                       random.Random(seed))
    old = plan_request(model_of("ABC"), prompt, {}, loads, random.Random(seed))
    assert (new.decode, new.reason) == (old.decode, old.reason)


@given(queued=st.integers(0, 500), in_flight=st.integers(0, 50), blocks=st.integers(1, 400),
       floor=st.floats(0, 500), weight=st.floats(0, 1))
def test_the_weight_scales_only_the_stall(queued, in_flight, blocks, floor, weight):
    def cost(wt):
        return cost_of("w", WorkerLoad(queued, 0, in_flight), blocks, 0, overlap_weight=1.0,
                       load_weight=1.0, kv_reuse=True, stall_floor=floor, stall_weight=wt)

    full, part = cost(1.0), cost(weight)
    assert part.prefill_term == full.prefill_term == queued + blocks  # own wait untouched
    assert abs(part.decode_term - weight * full.decode_term) < 1e-6
    assert part.cost <= full.cost + 1e-9


def test_builder_emits_the_slo_ratio_and_the_table_validates_it():
    assert _slo_ratio({"ttft_p95_ms": 1000.0, "itl_p95_ms": 50.0}) == {"ttft_itl_ratio": 20.0}
    assert _slo_ratio({"ttft_p95_ms": 5000.0, "itl_p95_ms": 40.0}) == {"ttft_itl_ratio": 125.0}
    assert _slo_ratio({}) == {}
    assert model_of(["A"], ttft_itl_ratio=125.0).ttft_itl_ratio == 125.0
    assert model_of(["A"]).ttft_itl_ratio == 0.0
    table = static_table("m", [{"id": "A", "url": "http://a:8000", "role": "both",
                                "state": "active"}], block_size=BS,
                         routing={"ttft_itl_ratio": -1})
    try:
        parse(table)
    except TableError as e:
        assert any("ttft_itl_ratio" in p for p in e.problems)
    else:
        raise AssertionError("a negative ratio was accepted")
