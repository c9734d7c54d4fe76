"""Stall weights for answers of unknown length (gateway.answer_lengths), the reservation
that books them, and the approximate prefix index following eviction by capacity."""

from collections import defaultdict
from itertools import pairwise

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.answer_lengths import DEFAULT_OUTPUT_TOKENS, IPW_CAP, AnswerLengths
from gateway.prefix_index import ApproxPrefixIndex, text_chunk_hashes
from gateway.router import LoadReservation, RoutePlan, WorkerLoad, stall_weight

RATIO = 20.0


def test_before_enough_answers_the_weight_is_that_of_max_tokens_else_the_default():
    lengths = AnswerLengths(min_samples=3)
    assert lengths.weight("m", 100, 400, RATIO) == stall_weight(400, RATIO)
    assert lengths.weight("m", 100, None, RATIO) == stall_weight(DEFAULT_OUTPUT_TOKENS, RATIO)
    lengths.observe("m", 100, 10)
    lengths.observe("m", 100, 10)
    assert lengths.weight("m", 100, 400, RATIO) == stall_weight(400, RATIO)
    lengths.observe("m", 100, 10)  # the third: learned (answers of 10 tokens: weight 1)
    assert lengths.weight("m", 100, 400, RATIO) == 1.0
    assert lengths.weight("m", 100, 400, 0.0) == 1.0  # no ratio: every stall in full


def test_the_expected_weight_is_not_the_weight_of_the_mean_length():
    lengths = AnswerLengths(min_samples=1)
    for _ in range(50):
        lengths.observe("m", 1000, 10)  # weight 1
        lengths.observe("m", 1000, 1000)  # weight 0.02
    # E[weight] = 0.51, while the mean length (505) would give 0.04.
    assert lengths.weight("m", 1000, None, RATIO) == pytest.approx(0.51, abs=0.01)


def test_max_tokens_cuts_the_learned_answers():
    lengths = AnswerLengths(min_samples=1)
    for _ in range(20):
        lengths.observe("m", 1000, 1000)
    assert lengths.weight("m", 1000, None, RATIO) == pytest.approx(0.02)
    # Allowed 40 tokens, it answers at most 40: a stall weighs at least 20 / 40.
    assert lengths.weight("m", 1000, 40, RATIO) == pytest.approx(0.5)


def test_prompt_classes_learn_apart_and_fall_back_to_the_model():
    lengths = AnswerLengths(min_samples=5)
    for _ in range(10):
        lengths.observe("m", 5000, 10)  # long prompts, short answers
        lengths.observe("m", 300, 2000)  # short prompts, long answers
    assert lengths.weight("m", 5000, None, RATIO) == 1.0
    assert lengths.weight("m", 300, None, RATIO) == pytest.approx(0.01)
    # A class never seen: the model's whole distribution (half of each).
    assert lengths.weight("m", 40, None, RATIO) == pytest.approx(0.505, abs=0.01)
    assert lengths.weight("other", 5000, None, RATIO) == stall_weight(128, RATIO)


def test_old_answers_fade():
    lengths = AnswerLengths(memory=10, min_samples=1)
    for _ in range(100):
        lengths.observe("m", 100, 1000)
    for _ in range(50):
        lengths.observe("m", 100, 10)
    assert lengths.weight("m", 100, None, RATIO) > 0.99  # the traffic changed: follow it


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(st.integers(1, 100_000), min_size=1, max_size=60),
       prompt=st.integers(0, 200_000), cap=st.one_of(st.none(), st.integers(1, 100_000)),
       ratio=st.floats(0.01, 1000))
def test_the_weight_is_a_fraction_between_the_extremes_of_what_was_seen(answers, prompt, cap,
                                                                        ratio):
    lengths = AnswerLengths(min_samples=1)
    for n in answers:
        lengths.observe("m", prompt, n)
    w = lengths.weight("m", prompt, cap, ratio)
    assert 0.0 < w <= 1.0
    cut = [min(n, cap) if cap else n for n in answers]
    # Power-of-two buckets: within a factor 2 of the range of the weights seen.
    assert min(stall_weight(n, ratio) for n in cut) / 2 - 1e-9 <= w
    assert w <= min(1.0, 2 * max(stall_weight(n, ratio) for n in cut)) + 1e-9
    if cap:  # a tighter bound never lowers the weight
        assert lengths.weight("m", prompt, max(cap // 2, 1), ratio) >= w - 1e-9


def test_with_durations_the_weight_is_that_of_a_request_found_in_flight():
    """Long answers stay in flight longer: the requests the cost adds up are mostly them."""
    lengths = AnswerLengths(min_samples=1)
    # Steady state: the learner's traffic started 10^6 s ago (another model's answer).
    lengths.observe("other", 1000, 10, duration_s=1e6, now=1e6)
    for _ in range(50):
        lengths.observe("m", 1000, 10, duration_s=1.0, now=1e6)  # weight 1, 1 s in flight
        lengths.observe("m", 1000, 1000, duration_s=100.0, now=1e6)  # 0.02, 100 s
    # Per request 0.51; per request found in flight (1 × 1 + 0.02 × 100) / 101.
    assert lengths.weight("m", 1000, None, RATIO) == pytest.approx(3 / 101, rel=0.01)
    # Without durations: the mean over the answers, as before.
    plain = AnswerLengths(min_samples=1)
    for _ in range(50):
        plain.observe("m", 1000, 10)
        plain.observe("m", 1000, 1000)
    assert plain.weight("m", 1000, None, RATIO) == pytest.approx(0.51, abs=0.01)


def test_a_young_learner_counts_up_the_answers_that_take_long():
    """Survivorship: at the start, the long answers dispatched with the short ones have not
    finished yet; each finished one stands for span / (span - duration) of its kind."""
    lengths = AnswerLengths(min_samples=1)
    lengths.observe("m", 100, 10, duration_s=1.0, now=1.0)  # the first: counts once (t0 = 0)
    lengths.observe("m", 100, 10, duration_s=1.0, now=10.0)  # counts 10 / 9
    lengths.observe("m", 100, 1000, duration_s=8.0, now=10.0)  # counts 10 / 2 = 5
    lengths.observe("m", 100, 1000, duration_s=9.99, now=10.0)  # capped at IPW_CAP
    hist = lengths._hists[("m", -1)]
    counts = [c / hist.scale for c in hist.count if c > 0]
    decay = lengths.decay
    assert counts[0] == pytest.approx(decay ** 3 + 10 / 9 * decay ** 2, rel=1e-6)
    assert counts[1] == pytest.approx(5 * decay + IPW_CAP, rel=1e-6)


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(st.tuples(st.integers(1, 100_000), st.floats(0.0, 1000.0)),
                        min_size=1, max_size=60),
       cap=st.one_of(st.none(), st.integers(1, 100_000)), ratio=st.floats(0.01, 1000))
def test_with_durations_the_weight_stays_between_the_extremes(answers, cap, ratio):
    lengths = AnswerLengths(min_samples=1)
    for n, d in answers:
        lengths.observe("m", 500, n, duration_s=d, now=1e6)  # counted up or not: any count
    w = lengths.weight("m", 500, cap, ratio)
    cut = [min(n, cap) if cap else n for n, _ in answers]
    assert 0.0 <= w <= 1.0
    if any(d > 0 for _, d in answers):  # a weighted mean of the (bucketed) weights
        assert min(stall_weight(n, ratio) for n in cut) / 2 - 1e-9 <= w
        assert w <= min(1.0, 2 * max(stall_weight(n, ratio) for n in cut)) + 1e-9


def test_a_streams_progress_conditions_the_weight_on_the_answer_going_on():
    lengths = AnswerLengths(min_samples=4)
    assert lengths.weight_after("m", 100, None, RATIO, 0) is None  # nothing learned yet
    for _ in range(10):
        lengths.observe("m", 100, 10)  # weight 1
        lengths.observe("m", 100, 1000)  # weight 0.02
    assert lengths.weight_after("m", 100, None, RATIO, 0) == pytest.approx(0.51, abs=0.01)
    # Past 15 tokens only the long answers remain possible.
    assert lengths.weight_after("m", 100, None, RATIO, 20) == pytest.approx(0.02, rel=0.01)
    # Longer than anything seen: at most the weight of what it has produced.
    assert lengths.weight_after("m", 100, None, RATIO, 5000) == pytest.approx(RATIO / 5000)
    assert lengths.weight_after("m", 100, None, 0.0, 20) == 1.0


@settings(max_examples=200, deadline=None)
@given(answers=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
       produced=st.lists(st.integers(0, 6000), min_size=2, max_size=6),
       ratio=st.floats(0.01, 1000))
def test_the_weight_after_progress_never_rises_as_tokens_stream(answers, produced, ratio):
    """More tokens streamed rule out short answers (high weights) only."""
    lengths = AnswerLengths(min_samples=1)
    for n in answers:
        lengths.observe("m", 100, n)
    weights = [lengths.weight_after("m", 100, None, ratio, p) for p in sorted(produced)]
    assert all(0.0 < w <= 1.0 for w in weights)
    assert all(b <= a + 1e-9 for a, b in pairwise(weights))


def test_reweight_moves_the_booked_weight_and_release_returns_the_new_one():
    loads = defaultdict(WorkerLoad)
    plan = RoutePlan("a", None, "kv_aware", ttft_itl_ratio=RATIO)
    first = LoadReservation(loads, plan, 160, 400, 16, weight=0.5)
    other = LoadReservation(loads, plan, 160, 400, 16, weight=0.25)
    first.reweight(0.125)
    assert loads["a"].stall_weight_sum == pytest.approx(0.375)
    first.release()
    assert loads["a"].stall_weight_sum == pytest.approx(0.25)
    first.reweight(0.9)  # released: nothing booked any more
    assert loads["a"].stall_weight_sum == pytest.approx(0.25)
    other.release()
    assert loads["a"].stall_weight_sum == 0 and loads["a"].own_requests == 0


def test_sim_gateway_router_rebooks_streaming_answers_as_they_grow():
    from workers_agent.sim.gateway_routing import GatewayRouter
    from workers_agent.sim.virtual import VirtualFleet, uniform_fleet
    from workers_agent.sim.workload import synthetic

    with pytest.raises(ValueError):
        GatewayRouter(answers="fixed:128-stream")
    router = GatewayRouter({"ttft_p95_ms": 1000, "itl_p95_ms": 50}, answers="learn-stream")
    rebooked = []
    real = LoadReservation.reweight

    def spy(self, weight):
        rebooked.append(weight)
        real(self, weight)

    LoadReservation.reweight = spy
    try:
        workload = synthetic({"isl": 500, "osl": 200}, 80, 8.0, seed=1)
        result = VirtualFleet(uniform_fleet(2, "llama-3.3-70b-fp8", "H200"),
                              router=router).run(workload)
    finally:
        LoadReservation.reweight = real
    assert all(r.error is None for r in result.results)
    assert rebooked and all(0.0 < w <= 1.0 for w in rebooked)
    assert not router._stream_bucket and not router._answer_of
    assert all(load.stall_weight_sum == 0 for load in router.loads.values())


def test_a_reservation_books_a_given_weight_and_releases_it():
    loads = defaultdict(WorkerLoad)
    plan = RoutePlan("a", None, "kv_aware", ttft_itl_ratio=RATIO)
    given_weight = LoadReservation(loads, plan, 160, 400, 16, weight=0.3)
    from_length = LoadReservation(loads, plan, 160, 400, 16)
    assert loads["a"].stall_weight_sum == pytest.approx(0.3 + stall_weight(400, RATIO))
    given_weight.release()
    from_length.release()
    assert loads["a"].stall_weight_sum == 0 and loads["a"].own_requests == 0


def test_approx_index_keeps_entries_of_a_sized_worker_until_its_lru_bound():
    index = ApproxPrefixIndex(ttl_s=10)
    index.set_capacity("w1", 6)
    first = text_chunk_hashes("f" * 96, 32)  # 3 chunks
    index.record("m", first, "w1", now=0)
    index.record("m", first, "w2", now=0)  # capacity unknown: the TTL applies
    assert index.match("m", first, now=1000) == {"w1": 3}
    index.expire(now=1000)
    assert index.match("m", first, now=1000) == {"w1": 3}
    index.record("m", text_chunk_hashes("g" * 128, 32), "w1", now=1000)  # 7 > 6
    assert index.match("m", first, now=1001) == {}  # the oldest chunk went first


def test_sim_gateway_router_learns_answer_lengths_from_finished_requests():
    """Told no lengths (``answers="learn"``), the simulated gateway books the expected weight
    and learns every finished request's length, as the gateway would from usage."""
    from workers_agent.sim.gateway_routing import GatewayRouter
    from workers_agent.sim.virtual import VirtualFleet, uniform_fleet
    from workers_agent.sim.workload import synthetic

    with pytest.raises(ValueError):
        GatewayRouter(answers="guess")
    router = GatewayRouter({"ttft_p95_ms": 1000, "itl_p95_ms": 50}, answers="learn")
    booked = []
    real = LoadReservation.__init__

    def spy(self, loads, plan, prompt_tokens, output_tokens, block_size, weight=None,
            now=None):
        booked.append((output_tokens, weight))
        real(self, loads, plan, prompt_tokens, output_tokens, block_size, weight, now)

    LoadReservation.__init__ = spy
    try:
        workload = synthetic({"isl": 500, "osl": 10}, 40, 4.0, seed=1)
        result = VirtualFleet(uniform_fleet(2, "llama-3.3-70b-fp8", "H200"),
                              router=router).run(workload)
    finally:
        LoadReservation.__init__ = real
    assert all(r.error is None for r in result.results)
    assert all(out == DEFAULT_OUTPUT_TOKENS for out, _ in booked)  # no max_tokens
    assert booked[0][1] == stall_weight(DEFAULT_OUTPUT_TOKENS, 20.0)  # nothing learned yet
    assert booked[-1][1] == 1.0  # learned: 10-token answers, every stall in full
    assert not router._answer_of
