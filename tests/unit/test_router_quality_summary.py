"""bench/router_quality.py's summary: the spread goal and when the hit rate pays for it."""

from bench.router_quality import summarize_rows


def row(router, goodput, hit, spread, engines=8, trace="t", load=4.0):
    return {"trace": trace, "engines": engines, "load": load, "router": router,
            "goodput_rps": goodput, "hit_rate": hit, "spread_max_over_mean": spread}


def cell(rows):
    return summarize_rows(rows)["t@4x"]


def test_a_spread_within_the_limit_meets_the_goal():
    s = cell([row("pdplane", 1.0, 0.0, 1.5), row("round-robin", 1.2, 0.0, 1.0)])
    assert s["spread_goal_met"] and not s["by_engines"][8]["spread_paid_by_hit_rate"]


def test_a_wider_spread_is_paid_only_by_more_reuse_and_no_less_goodput():
    baselines = [row("round-robin", 1.0, 0.01, 1.0), row("dynamo-cost", 0.9, 0.10, 1.3)]
    paid = cell([row("pdplane", 1.1, 0.12, 2.0), *baselines])
    assert paid["spread_goal_met"] and paid["by_engines"][8]["spread_paid_by_hit_rate"]
    # Reuse no higher than the best baseline's (no reuse at all: 0 = 0) pays for nothing.
    assert not cell([row("pdplane", 1.1, 0.10, 2.0), *baselines])["spread_goal_met"]
    # More reuse but less goodput than the best baseline: not paid.
    assert not cell([row("pdplane", 0.95, 0.12, 2.0), *baselines])["spread_goal_met"]


def test_the_goal_holds_only_when_it_holds_for_every_fleet_size():
    rows = [row("pdplane", 1.0, 0.0, 1.2), row("round-robin", 1.0, 0.0, 1.0),
            row("pdplane", 1.0, 0.0, 1.6, engines=32), row("round-robin", 1.0, 0.0, 1.0,
                                                             engines=32)]
    s = cell(rows)
    assert not s["spread_goal_met"]
    assert s["by_engines"][8]["spread_goal_met"] and not s["by_engines"][32]["spread_goal_met"]
    assert s["pdplane_vs_best_baseline"] == 1.0 and s["pdplane_max_spread"] == 1.6


def test_the_honest_router_is_the_streamed_learner_and_the_unstreamed_one_is_judged_too():
    from bench.router_quality import HEADLINE, HONEST, ROUTERS, UNSTREAMED

    # The headline honest router is what the product's gateway does for a streamed answer.
    assert HONEST == "pdplane-out128-learn-stream" and HEADLINE["honest_router"] == HONEST
    assert UNSTREAMED == "pdplane-out128-learn" and {HONEST, UNSTREAMED} <= set(ROUTERS)
    s = cell([row("pdplane", 1.0, 0.05, 1.2), row(HONEST, 0.99, 0.04, 1.6),
              row(UNSTREAMED, 1.02, 0.06, 1.6), row("dynamo-cost", 1.0, 0.05, 1.1)])
    assert s["pdplane_vs_best_baseline"] == 1.0
    assert s["honest_vs_best_baseline"] == 0.99
    assert s["honest_hit_rate_minus_best_baseline"] == -0.01
    assert not s["honest_spread_goal_met"]  # 1.6 and less goodput: not paid
    assert s["unstreamed_vs_best_baseline"] == 1.02
    assert s["unstreamed_spread_goal_met"]  # more reuse and more goodput: paid


def test_start_replays_a_later_slice_of_the_trace():
    from bench.router_quality import load_trace
    whole = load_trace("azure-conv", 30)
    later = load_trace("azure-conv", 10, start=20)
    assert [r.request_id for r in later.requests] == [
        r.request_id for r in whole.requests[20:30]]
    assert [r.request_id for r in load_trace("azure-conv", 10, start=0).requests] == [
        r.request_id for r in whole.requests[:10]]
