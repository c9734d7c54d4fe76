"""The load the planner plans for is the load arriving, and a settled window is read as such.

Issue 17, item 3 (control on fresh inputs). Finished requests trail the offered load: in a
surge past capacity they are the fleet's pace, after it the backlog being worked off.
``derive.with_arrivals`` adds the change in the requests the engines hold (conservation);
``gate.mix_settled`` tells a first window whose prompts have arrived from one still
carrying the old mix; an all-miss hold does not freeze a move under way half-done.
"""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from controlplane.planner.calibration import CalibrationBook, LoadPoint
from controlplane.planner.derive import (
    BACKLOG_SHIFT,
    BACKLOG_SIGMAS,
    PEAK_DECAY,
    in_system,
    with_arrivals,
)
from controlplane.planner.gate import headroom_only, mix_settled
from controlplane.planner.placement import WorkerInput
from controlplane.planner.planner import LoadInput, plan_model
from controlplane.planner.record import Regime
from tests.unit.test_planner_extend import NOW
from tests.unit.test_planner_finish_move import _mid_move
from tests.unit.test_planner_invariants import hold_and_target_scores


def test_in_system_counts_running_and_waiting_everywhere():
    workers = [WorkerInput(1, "a", "n", running=3, waiting=2),
               WorkerInput(2, "b", "n", role="prefill", running=1, waiting=7),
               WorkerInput(3, "c", "n", role="decode", running=-4)]
    assert in_system(workers) == 13


@settings(max_examples=300, deadline=None)
@given(rate=st.floats(0.01, 200), before=st.integers(0, 5000), now=st.integers(0, 5000),
       window=st.floats(1, 120), peak=st.floats(0, 300))
def test_arrivals_are_the_finished_plus_the_change_in_what_is_held(rate, before, now, window,
                                                                   peak):
    load = LoadInput(rate, rate, 1000, None, 200, 0.0)
    out, note = with_arrivals(load, now, before, window, peak)
    arriving = max(rate + (now - before) / window, 0.0)
    if abs(arriving - rate) <= BACKLOG_SHIFT * rate or abs(now - before) <= \
            BACKLOG_SIGMAS * math.sqrt(2 * rate * window):
        # Within the shift, or within the count noise of a steady window, the finished
        # rate stands: a few requests more or less held is noise beside it.
        assert out is load and note == ""
        return
    assert out.rate_rps == pytest.approx(arriving)
    assert out.rate_rps >= 0.0
    # The peak follows the arrivals: a drained backlog does not leave a surge behind it.
    assert out.peak_rps == pytest.approx(max(arriving, peak * PEAK_DECAY))
    assert out.peak_rps >= out.rate_rps
    assert ("filling" if now > before else "draining") in note
    # Nothing else about the load changes.
    assert replace(out, rate_rps=rate, peak_rps=rate) == load


def test_a_burst_within_the_count_noise_is_not_a_backlog():
    # The demo's RAG at ~6 req/s, a 20 s window: 126 finished, 36 more held.
    load = LoadInput(126 / 20, 126 / 20, 4000, None, 300, 0.3)
    assert with_arrivals(load, 69, 33, 20.0, 6.0) == (load, "")
    # The same window with 60 more held is a backlog.
    assert with_arrivals(load, 93, 33, 20.0, 6.0)[1]


def test_arrivals_need_a_previous_count_a_window_and_traffic():
    load = LoadInput(5.0, 5.0, 1000, None, 200, 0.0)
    assert with_arrivals(load, 500, None, 30.0, 5.0) == (load, "")
    assert with_arrivals(load, 500, 10, 0.0, 5.0) == (load, "")
    idle = replace(load, rate_rps=0.0)
    assert with_arrivals(idle, 500, 10, 30.0, 5.0) == (idle, "")


def test_the_h200_surge_reads_at_its_arriving_rate():
    # Four H200 servers, aggregated, 4× Mooncake (bench/planner_shift.py, 30 s windows):
    # 324 finished, 470 arrived; the engines held 146 more at the end of the window.
    load = LoadInput(324 / 30, 324 / 30, 9570, None, 170, 0.05)
    out, note = with_arrivals(load, 252, 106, 30.0, 4.3)
    assert out.rate_rps == pytest.approx(470 / 30)
    assert "arrive at 15.67/s" in note and "10.80/s" in note


def test_a_backlog_window_is_not_compared_by_calibration():
    book = CalibrationBook({})
    point = LoadPoint(10.0, 1000.0, 200.0)
    book.observe(point, 0.2, 0.2, 0.02, 0.02)
    before = book.as_dict()["buckets"]
    book.observe(point, 0.2, 0.9, 0.02, 0.05, None, "a backlog filling")
    assert book.skipped == "a backlog filling"
    assert book.as_dict()["buckets"] == before


@given(isl=st.floats(100, 50_000), ratio=st.floats(0.2, 3.0))
def test_a_mix_is_settled_when_the_first_tokens_are_the_loads_prompts(isl, ratio):
    assume(abs(abs(ratio - 1.0) - 0.25) > 1e-6)  # not on the bound itself
    load = LoadInput(5.0, 5.0, isl, None, 200, 0.0, first_token_isl=isl * ratio)
    assert mix_settled(load) == (abs(ratio - 1.0) <= 0.25)
    assert not mix_settled(replace(load, first_token_isl=None))


def _headroom_case(first_token_isl: float | None, cycles: int):
    load = LoadInput(10.4, 10.4, 1000, None, 300, 0.5, first_token_isl=first_token_isl)
    inp = SimpleNamespace(load=load, policy=SimpleNamespace(attainment=0.9))
    obs = SimpleNamespace(rate_rps=10.4, plan_rate_rps=12.5,
                          layout=SimpleNamespace(label=lambda: "4P:4D"))
    ref_now = SimpleNamespace(fits=True, overloaded=False, attainment=0.997, rate_rps=10.4,
                              goodput_rps=10.37)
    regime = Regime(270.0, 300.0, (10.4, 1000, 300, 0.5, 0, 0), cycles)
    return headroom_only(inp, obs, ref_now, regime)


def test_a_gain_at_the_planned_load_alone_waits_for_a_settled_window():
    # The demo's chat after quiet, first window: the prompts arriving are the load's
    # (1,000 tokens), so a layout that keeps the targets now is kept.
    assert "does not start one" in _headroom_case(1000.0, 1)
    # The first RAG window: finished requests still read 2,210-token prompts while
    # 3,950-token ones arrive — the rule waits (the move may be the one RAG needs).
    assert _headroom_case(3950.0 / 2210.0 * 1000.0, 1) == ""
    assert _headroom_case(None, 1) == ""
    # Past the first window the rule reads the load as it is, as before.
    assert "does not start one" in _headroom_case(None, 2)


heavy_st = st.builds(
    lambda rate, isl, osl: LoadInput(rate, rate, isl, None, osl, 0.0, inflight=int(rate * 4),
                                     inflight_peak=int(rate * 5)),
    rate=st.floats(3, 40), isl=st.floats(6000, 16000), osl=st.floats(100, 600),
)


@settings(max_examples=80, deadline=None)
@given(load=heavy_st, reached=st.integers(1, 4), extra=st.integers(1, 3))
def test_an_all_miss_hold_does_not_freeze_a_move_under_way(load, reached, extra):
    """Every layout misses, a move is under way in its regime and its target is scored at
    least as well as holding: the planner does not hold on "all-layouts-miss" (that keeps a
    half-done mix no cycle chose); the move's own rules decide, and say every layout
    misses."""
    target = reached + extra
    inp = _mid_move(load, reached, target, 120.0, 1.0, False)
    d = plan_model(inp, NOW)
    assume(d.record.choice is not None and d.record.choice.all_miss)
    hold, target_score = hold_and_target_scores(inp, target)
    if target_score >= hold:
        assert d.reason != "all-layouts-miss", d.explanation
    # Whatever decided, the alert fires and the explanation says every layout misses.
    assert d.record.alert == "all-layouts-miss"
    assert ("every layout is predicted to miss" in d.explanation.lower()
            or "no layout is predicted to keep 90%" in d.explanation), d.explanation
    if d.action == "change":
        # Never a step toward a target scored below holding.
        hold_s, t_s = hold_and_target_scores(inp, d.target.n_prefill)
        assert t_s >= hold_s, d.explanation
