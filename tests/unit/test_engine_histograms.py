"""Fleet rates and percentiles from engines' cumulative counters and histogram buckets."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.telemetry.histograms import (
    EngineSnapshot,
    Histogram,
    fleet_stats,
    merge,
    window_delta,
)
from workers_agent.collectors.engine_metrics import EngineMetricsCollector, report_histogram
from workers_agent.protocol import Inventory, validate_report

TTFT_LE = (0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
TOKEN_LE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)


def hist(le, values) -> Histogram:
    counts = [sum(1 for v in values if v <= b) for b in le] + [len(values)]
    return Histogram(tuple(float(b) for b in le), tuple(float(c) for c in counts),
                     float(sum(values)))


def snap(t, requests, ttfts, prompts, gens, itls=()) -> EngineSnapshot:
    return EngineSnapshot(t, {"request_success": requests, "prompt_tokens": sum(prompts),
                              "generation_tokens": sum(gens)},
                          {"ttft_s": hist(TTFT_LE, ttfts), "prompt_tokens": hist(TOKEN_LE, prompts),
                           "generation_tokens": hist(TOKEN_LE, gens),
                           "itl_s": hist(TTFT_LE, itls)})


def bucket_of(le, value) -> tuple[float, float]:
    lo = 0.0
    for b in le:
        if value <= b:
            return lo, b
        lo = b
    return lo, math.inf


def test_merge_is_sum_by_le_and_matches_pooled_observations():
    rng = random.Random(7)
    engines = [[rng.lognormvariate(-2, 1) for _ in range(rng.randint(50, 400))] for _ in range(4)]
    merged = merge(hist(TTFT_LE, e) for e in engines)
    pooled = sorted(v for e in engines for v in e)
    expected = hist(TTFT_LE, pooled)
    assert merged.counts == expected.counts and merged.sum == pytest.approx(expected.sum)
    true_p95 = pooled[math.ceil(0.95 * len(pooled)) - 1]
    lo, hi = bucket_of(TTFT_LE, true_p95)
    assert lo <= merged.quantile(0.95) <= hi  # within the bucket holding the true p95


def test_different_bucket_layouts_merge_on_common_bounds():
    a = hist((0.1, 0.5, 1.0), [0.05, 0.3, 0.7, 2.0])
    b = hist((0.1, 1.0), [0.2, 0.9])
    m = merge([a, b])
    assert m.le == (0.1, 1.0) and m.counts == (1.0, 5.0, 6.0)


def test_rates_and_quantiles_over_a_window_with_a_restart():
    rng = random.Random(3)
    series, requests, ttfts, prompts, gens = [], 0, [], [], []
    for t in range(0, 130, 10):
        if t == 60:  # engine restart: counters start again from zero
            requests, ttfts, prompts, gens = 0, [], [], []
        for _ in range(50):  # 5 req/s
            requests += 1
            ttfts.append(rng.uniform(0.02, 0.4))
            prompts.append(rng.randint(100, 3000))
            gens.append(rng.randint(10, 300))
        series.append(snap(float(t), requests, ttfts, prompts, gens))
    d = window_delta(series, 60)
    assert d.seconds == 60 and d.counters["request_success"] == 300
    # Asking for more than there is since the restart: back to the restart, not across it.
    d = window_delta(series, 300)
    assert d.seconds == 60
    stats = fleet_stats([("both", d)], 60)
    assert stats.span_s == 60
    assert stats.request_rate == pytest.approx(5.0)
    assert stats.source == "agents" and stats.engines == 1
    assert 100 <= stats.prompt_tokens_p50 <= stats.prompt_tokens_p95 <= 5000
    assert stats.prompt_tokens_mean == pytest.approx(sum(prompts[-300:]) / 300)
    assert window_delta(series[:1], 60) is None


def test_roles_decide_which_engines_count_for_what():
    # A prefill engine finishes its max_tokens=1 half of every request; counting it would
    # double the request rate of a split fleet.
    pre0, pre1 = snap(0, 0, [], [], []), snap(10, 100, [0.2] * 100, [4000] * 100, [1] * 100)
    dec0 = snap(0, 0, [], [], [], [])
    dec1 = snap(10, 100, [0.01] * 100, [4000] * 100, [300] * 100, [0.03] * 3000)
    stats = fleet_stats([("prefill", window_delta([pre0, pre1], 10)),
                         ("decode", window_delta([dec0, dec1], 10))], 10)
    assert stats.request_rate == pytest.approx(10.0)
    assert 2000 < stats.prompt_tokens_p50 <= 5000
    assert 200 < stats.generation_tokens_p50 <= 500  # decode side only
    assert 0.1 < stats.ttft_p95_s <= 0.25  # prefill side only
    assert 0.02 < stats.itl_p95_s <= 0.05
    assert stats.generation_tokens_per_s == pytest.approx(3000.0)
    # The mean token gap is exact (sum ÷ count), whatever the buckets.
    assert stats.itl_mean_s == pytest.approx(0.03)


def test_mid_move_both_engines_prefill_halves_are_not_counted_twice():
    # Mid-move: P prefills 100 requests that D decodes; B serves 50 of its own and
    # prefills 50 more that D decodes too. 200 requests in 10 s, whatever the roles.
    empty = snap(0, 0, [], [], [])
    pre = snap(10, 100, [0.2] * 100, [4000] * 100, [1] * 100)
    dec = snap(10, 150, [0.01] * 150, [4000] * 150, [300] * 150, [0.03] * 4500)
    both = snap(10, 100, [0.2] * 100, [4000] * 100, [300] * 50 + [1] * 50, [0.03] * 1500)
    engines = [("prefill", window_delta([empty, pre], 10)),
               ("decode", window_delta([empty, dec], 10)),
               ("both", window_delta([empty, both], 10))]
    stats = fleet_stats(engines, 10)
    assert stats.request_rate == pytest.approx(20.0)
    assert stats.generation_tokens_mean == pytest.approx(300.0)
    # Every engine "both" (aggregated): a one-token answer is a real answer and counts.
    aggregated = fleet_stats([("both", window_delta([empty, both], 10))], 10)
    assert aggregated.request_rate == pytest.approx(10.0)


def test_request_rate_from_counters_is_within_5_percent_of_the_true_rate():
    """A Poisson stream over four engines, reported every 2 s: the rate derived from the
    counters over 60 s matches the stream's own rate, where the token-rate guess the planner
    used before (generated tokens/s ÷ 256) is off by the answer-length ratio."""
    rng = random.Random(11)
    rate, engines = 12.0, 4
    t, arrivals = 0.0, []
    while t < 70:
        t += rng.expovariate(rate)
        arrivals.append((t, rng.randrange(engines), rng.randint(20, 900)))
    series = {e: [] for e in range(engines)}
    for now in [2.0 * k for k in range(1, 36)]:
        for e in range(engines):
            done = [a for a in arrivals if a[1] == e and a[0] <= now]
            series[e].append(snap(now, len(done), [0.1] * len(done), [100] * len(done),
                                  [a[2] for a in done]))
    stats = fleet_stats([("both", window_delta(s, 60)) for s in series.values()], 60)
    true_rate = sum(1 for a in arrivals if 10 < a[0] <= 70) / 60
    assert stats.request_rate == pytest.approx(true_rate, rel=0.05)
    assert stats.request_rate == pytest.approx(rate, rel=0.15)  # and of the process itself
    assert stats.generation_tokens_per_s / 256 == pytest.approx(true_rate * 460 / 256,
                                                                rel=0.15)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.floats(0.001, 10.0), min_size=1, max_size=60), min_size=1,
                max_size=5), st.sampled_from([0.5, 0.9, 0.95, 0.99]))
def test_fleet_quantile_lies_in_the_bucket_of_the_pooled_quantile(engines, q):
    merged = merge(hist(TTFT_LE, e) for e in engines)
    pooled = sorted(v for e in engines for v in e)
    rank = max(1, math.ceil(q * len(pooled)))
    lo, hi = bucket_of(TTFT_LE, pooled[rank - 1])
    got = merged.quantile(q)
    if math.isinf(hi):
        assert got == TTFT_LE[-1]  # Prometheus: the highest finite bound
    else:
        assert lo <= got <= hi


VLLM_TEXT = """
vllm:request_success_total{{engine="0",finished_reason="stop",model_name="m"}} {stop}
vllm:request_success_total{{engine="0",finished_reason="length",model_name="m"}} 3.0
vllm:prompt_tokens_total{{engine="0",model_name="m"}} 5000.0
vllm:request_prompt_tokens_bucket{{engine="0",le="100.0",model_name="m"}} 4.0
vllm:request_prompt_tokens_bucket{{engine="0",le="1000.0",model_name="m"}} 10.0
vllm:request_prompt_tokens_bucket{{engine="0",le="+Inf",model_name="m"}} 10.0
vllm:request_prompt_tokens_sum{{engine="0",model_name="m"}} 5000.0
vllm:request_prompt_tokens_count{{engine="0",model_name="m"}} 10.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1",model_name="m"}} 9.0
vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf",model_name="m"}} 10.0
vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} 1.5
"""


def test_collector_reports_cumulative_counters_and_buckets_the_protocol_accepts():
    c = EngineMetricsCollector("http://unused/metrics")
    sample = c.parse(VLLM_TEXT.format(stop=7.0), now=0.0)
    report = sample.as_report()
    assert report["counters"]["request_success"] == 10  # summed over finished_reason
    assert report["counters"]["prompt_tokens"] == 5000
    assert report["histograms"]["prompt_tokens"] == {
        "le": [100.0, 1000.0], "counts": [4.0, 10.0, 10.0], "sum": 5000.0}
    assert report["histograms"]["ttft_s"]["counts"] == [9.0, 10.0]
    msg = {"type": "report", "seq": 1, "ts": 1.0, "engines": [{"id": "e0", **report}]}
    assert validate_report(msg, Inventory(engine_ids=frozenset({"e0"}))) == []
    # An old engine without the families: the fields are absent, not empty.
    bare = c.parse('vllm:num_requests_running{model_name="m"} 1\n', now=1.0).as_report()
    assert "counters" not in bare and "histograms" not in bare
    assert report_histogram({1.0: 2.0}) is None  # no +Inf bucket: not a histogram

    # At most every cumulative_every_s (10 s): the reports in between stay small.
    text = VLLM_TEXT.format(stop=7.0)
    timed = EngineMetricsCollector("http://unused/metrics")
    assert "counters" in timed.parse(text, now=100.0).as_report()
    assert "counters" not in timed.parse(text, now=104.0).as_report()
    assert "histograms" in timed.parse(text, now=110.0).as_report()


@pytest.mark.parametrize(("field", "value", "path"), [
    ("counters", [1, 2], "counters"),
    ("counters", {"request_success": -1}, "counters.request_success"),
    ("counters", {"x": float("nan")}, "counters.x"),
    ("histograms", {"ttft_s": {"le": [0.1, 0.05], "counts": [1, 2, 3]}}, "histograms.ttft_s.le"),
    ("histograms", {"ttft_s": {"le": [0.1], "counts": [3, 2]}}, "histograms.ttft_s.counts"),
    ("histograms", {"ttft_s": {"le": [0.1], "counts": [1]}}, "histograms.ttft_s"),
    ("histograms", {"ttft_s": {"le": [0.1] * 65, "counts": [1] * 66}}, "histograms.ttft_s"),
    ("histograms", {"ttft_s": {"le": [0.1], "counts": [1, 2], "sum": "x"}},
     "histograms.ttft_s.sum"),
    ("histograms", {"ttft_s": 3}, "histograms.ttft_s"),
])
def test_bad_counters_and_histograms_get_typed_errors(field, value, path):
    msg = {"type": "report", "seq": 1, "ts": 1.0, "engines": [{"id": "e0", field: value}]}
    errors = validate_report(msg, Inventory(engine_ids=frozenset({"e0"})))
    assert errors and errors[0].path == f"report.engines[0].{path}"
    assert errors[0].code in ("bad_schema", "out_of_range")


def test_prometheus_engine_stats_asks_the_same_quantities_by_role():
    from controlplane.observability.promread import FleetLatencyReader

    reader = FleetLatencyReader("http://127.0.0.1:9", cache_s=60)
    asked = []

    def scalar(query):
        asked.append(query)
        return 0.25 if "histogram_quantile" in query else 4.0

    reader._scalar = scalar
    stats = reader.engine_stats("m", 60.0)
    assert stats.source == "prometheus" and stats.window_s == 60.0
    assert stats.request_rate == 4.0 and stats.ttft_p95_s == 0.25
    assert stats.prompt_tokens_mean == 1.0  # rate of _sum ÷ rate of _count
    rate = next(q for q in asked if "request_success_total" in q)
    assert 'role=~"decode|both"' in rate and "[60000ms]" in rate and " or " in rate
    ttft = next(q for q in asked if "time_to_first_token_seconds_bucket" in q)
    assert "histogram_quantile(0.95, sum by (le)" in ttft or "histogram_quantile(0.5" in ttft
    assert any('role=~"decode|both"' in q for q in asked if "request_prompt_tokens" in q)
    assert any('role=~"prefill|both"' in q for q in asked if "time_to_first_token" in q)
    n = len(asked)
    assert reader.engine_stats("m", 60.0) is stats and len(asked) == n  # cached per cycle

    reader._scalar = lambda query: None  # no requests in the window: no figures
    assert reader.engine_stats("other", 60.0) is None


def test_first_token_prompt_mean_counts_the_requests_the_ttft_histogram_counted():
    """Right after chat → RAG: the window's first tokens were RAG prompts (the prompt-token
    counter counts a prompt at its first token) while the requests that finished were
    chat's. The first-token mean reads RAG; the finished prompts still read chat."""
    empty = EngineSnapshot(0, {"request_success": 0, "prompt_tokens": 0}, {
        "ttft_s": hist(TTFT_LE, []), "prompt_tokens": hist(TOKEN_LE, [])})
    now = EngineSnapshot(20, {"request_success": 40, "prompt_tokens": 30 * 4000}, {
        "ttft_s": hist(TTFT_LE, [0.5] * 30), "prompt_tokens": hist(TOKEN_LE, [1000] * 40)})
    stats = fleet_stats([("both", window_delta([empty, now], 20))], 20)
    assert stats.first_token_prompt_mean == pytest.approx(4000.0)
    assert stats.prompt_tokens_mean == pytest.approx(1000.0)
    # 30 first tokens in 20 s: the rate requests started at (40 finished).
    assert stats.first_token_rate == pytest.approx(1.5)
    assert stats.request_prompt_tokens.count == 40
    # No TTFT observations (or no counter): unknown, never zero.
    quiet = EngineSnapshot(20, {"request_success": 0, "prompt_tokens": 0}, {
        "ttft_s": hist(TTFT_LE, []), "prompt_tokens": hist(TOKEN_LE, [])})
    assert fleet_stats([("both", window_delta([empty, quiet], 20))], 20) \
        .first_token_prompt_mean is None
