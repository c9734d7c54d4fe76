"""bench/planner_shift.py's per-cycle inputs: the first-token prompt length of a window and
the --live-load loop (each window's load as the live path derives it, no smoother)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import planner_shift


def _result(prompt: int, first_token_at: float | None):
    return SimpleNamespace(prompt_tokens=prompt, first_token_time=first_token_at)


def test_first_token_prompt_length_counts_the_requests_that_started_in_the_window():
    # Window [30, 60): a chat request that finished in it but got its first token before
    # (not counted), a RAG one finished in it, and one still in flight; one not started.
    snap = SimpleNamespace(
        interval_s=30.0,
        recent_results=[_result(1000, 25.0), _result(4000, 41.0)],
        inflight_results=[_result(4000, 58.0), _result(4000, None)],
    )
    assert planner_shift._first_token_isl(snap, 60.0) == 4000
    empty = SimpleNamespace(interval_s=30.0, recent_results=[_result(1000, 10.0)],
                            inflight_results=[])
    assert planner_shift._first_token_isl(empty, 60.0) is None


def test_live_load_plans_on_each_window_as_derived():
    run = planner_shift.run_one(("two-rtxpro-servers", "demo", None, 30.0, 1, 30.0, 1.0,
                                 False))
    log = run["log"]
    assert log
    for e in log:
        if e["derived"][0] > 0 and not e["mix"]:  # a window with finishes: planned on as
            # derived (at the arriving rate where a backlog filled or drained:
            # derive.with_arrivals)
            assert e["load"][1:] == e["derived"][1:], e
            assert e["load"][0] == e["derived"][0] or e["backlog"], e
        elif e["mix"]:  # a new mix: the requests starting in the window (with_arriving_mix)
            assert e["load"][1] == e["first_token_isl"], e
        assert not e["worse"]


def test_the_ceiling_stitches_each_phases_best_static_over_the_best_single_one():
    """phase_oracle_vs_best_static: each phase's best static layout over its seconds, ÷ the
    best single static layout's whole run (weighted by the phases' lengths)."""
    secs = {"a": 100.0, "b": 300.0}

    def run(static, a, b, whole):
        return {"cluster": "c", "workload": "w", "static": static, "whole": whole,
                "phases": {"a": a, "b": b}, "phase_seconds": secs, "role_changes": 0}

    runs = [run(None, 2.0, 1.0, 1.25), run(0, 2.0, 0.5, 0.875), run(1, 1.0, 1.0, 1.0)]
    row = planner_shift.summarise(runs)["workloads"]["c/w"]
    assert row["best_static"] == 1
    # Stitched: 2.0 × 100 + 1.0 × 300 over 400 s = 1.25 req/s, ÷ 1.0.
    assert abs(row["phase_oracle_vs_best_static"] - 1.25) < 1e-12
    assert row["goodput_vs_best_static"] == 1.25


def test_demo_phases_set_each_phases_length():
    from shift_workloads import build_workload

    cluster = planner_shift.CLUSTERS["two-rtxpro-servers"]
    _wl, phases, _slo = build_workload(cluster, "demo", 90.0, 1,
                                       {"chat": 60.0, "rag": 300.0})
    assert [(n, b - a) for n, a, b in phases] == [("chat1", 60.0), ("rag1", 300.0),
                                                   ("quiet1", 90.0)]
