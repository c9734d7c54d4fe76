"""The booked prefill queue drains as a worker computes it (gateway/load.py): the rate is
learned from this process's own first tokens, the affinity bound reads the drained queue,
sibling processes move the queue's start, and nothing drains without a clock."""

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.load import RATE_MEMORY
from gateway.peers import PeerBus
from gateway.router import (
    AffinityBound,
    LoadReservation,
    RoutePlan,
    Scored,
    WorkerLoad,
    follow_prefix,
)

BS = 16


def plan(worker, cached=0):
    return RoutePlan(worker, None, "kv_aware", cached_tokens=cached)


def test_without_a_learned_rate_or_a_clock_the_booked_queue_is_the_queue():
    load = WorkerLoad(prefill_blocks=100.0, prefill_since=0.0)
    assert load.queued_at(50.0) == 100.0  # no rate learned yet
    load.prefill_rate = 10.0
    assert load.queued_at(None) == 100.0  # no clock
    assert load.queued_at(3.0) == pytest.approx(70.0)
    assert load.queued_at(50.0) == 0.0  # computed: never below 0
    assert load.queued_at(-5.0) == 100.0  # a clock behind the queue's start: never above


def test_a_reservation_learns_the_rate_from_its_first_token_in_queue_order():
    loads = defaultdict(WorkerLoad)
    first = LoadReservation(loads, plan("w"), 100 * BS, 10, BS, now=0.0)
    assert loads["w"].prefill_since == 0.0  # an empty queue starts with it
    second = LoadReservation(loads, plan("w"), 50 * BS, 10, BS, now=1.0)
    assert loads["w"].prefill_since == 0.0  # queued behind the first: the start stays
    first.prefill_done(now=2.0)  # 100 blocks from 0 to 2 s
    assert loads["w"].prefill_rate == pytest.approx(50.0)
    assert loads["w"].prefill_since == 2.0 and loads["w"].prefill_blocks == 50.0
    # The second could start only when the first was done (2 s, not its dispatch at 1 s):
    # 50 blocks in 2 s, a sample of 25 blocks/s, decayed into the mean.
    second.prefill_done(now=4.0)
    assert loads["w"].prefill_rate == pytest.approx(50.0 + (25.0 - 50.0) / RATE_MEMORY)
    assert loads["w"].prefill_blocks == 0.0
    # Without a clock nothing is timed (the gateway's behaviour before).
    untimed = defaultdict(WorkerLoad)
    r = LoadReservation(untimed, plan("w"), 100 * BS, 10, BS)
    r.prefill_done()
    assert untimed["w"].prefill_rate == 0.0 and untimed["w"].prefill_since == 0.0
    # A cache hit computes nothing: no sample, but the next prefill starts at its end.
    hit = LoadReservation(loads, plan("w", cached=100 * BS), 100 * BS, 10, BS, now=5.0)
    rate = loads["w"].prefill_rate
    hit.prefill_done(now=6.0)
    assert loads["w"].prefill_rate == rate and loads["w"].prefill_since == 6.0


def test_the_affinity_bound_follows_a_holder_whose_booked_prefill_is_mostly_computed():
    # The holder booked a long prompt 1.9 s ago at 500 blocks/s: 50 of 1,000 blocks left.
    holder = WorkerLoad(prefill_blocks=1000.0, in_flight=1, prefill_since=0.0,
                        prefill_rate=500.0)
    loads = {"h": holder, "a": WorkerLoad(in_flight=1), "b": WorkerLoad(in_flight=1)}
    scores = [Scored(w, 1.0, 1.0, 0.0, 0.0) for w in ("h", "a", "b")]
    ratios = {"h": 1.0}
    kw = {"min_match": 0.3, "imbalance_abs": 64, "imbalance_rel": 1.5, "request_blocks": 100}
    stale = follow_prefix(scores, ratios, loads, bound=AffinityBound(), **kw)
    assert stale is None  # booked: 1,000 > 1.5 × 333 + 100
    drained = follow_prefix(scores, ratios, loads, bound=AffinityBound(now=1.9), **kw)
    assert drained is not None and drained.worker_id == "h"
    # Just started (0.1 s: 950 left): still refused.
    assert follow_prefix(scores, ratios, loads, bound=AffinityBound(now=0.1), **kw) is None


@settings(max_examples=200, deadline=None)
@given(booked=st.floats(0, 1e6), rate=st.floats(0, 1e5), since=st.floats(-1e3, 1e3),
       now=st.floats(-1e3, 1e3), later=st.floats(0, 1e3))
def test_the_drained_queue_stays_within_the_booked_one_and_only_falls(booked, rate, since,
                                                                     now, later):
    load = WorkerLoad(prefill_blocks=booked, prefill_since=since, prefill_rate=rate)
    left = load.queued_at(now)
    assert 0.0 <= left <= booked
    assert load.queued_at(now + later) <= left


def test_a_siblings_booking_and_finished_prefill_move_the_queues_start():
    loads = defaultdict(WorkerLoad)
    bus = PeerBus(0, 2, 9999, loads=loads, on_route=lambda *a: None)
    # ["load", worker, booked, d_prefill, d_decode, d_in_flight, finished] (gateway/peers.py)
    bus.apply(1, ["load", "w", True, 10.0, 0.0, 0, False])  # a booking starts the queue
    started = loads["w"].prefill_since
    assert started > 0 and loads["w"].prefill_blocks == 10.0
    loads["w"].prefill_since = 1.0
    bus.apply(1, ["load", "w", True, 5.0, 0.0, 0, False])  # queued behind: the start stays
    assert loads["w"].prefill_since == 1.0
    bus.apply(1, ["load", "w", False, -10.0, 0.0, 0, True])  # done: the next starts now
    assert loads["w"].prefill_since >= started and loads["w"].prefill_blocks == 5.0
    # A batch that booked and finished on the same worker (net +2 blocks): a prefill
    # finished there, so the next one's start moves too.
    loads["w"].prefill_since = 1.0
    bus.apply(1, ["load", "w", True, 2.0, 0.0, 0, True])
    assert loads["w"].prefill_since > 1.0 and loads["w"].prefill_blocks == 7.0
