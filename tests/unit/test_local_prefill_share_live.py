"""The live local-prefill share (issue 16): the share of requests conditional P/D prefills on
its decode worker, from the gateway's decisions (Prometheus) or from the fleet's merged
prompt-length histogram and the prefix hit rate."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.observability.promread import (
    FleetLatencyReader,
    affinity_share_from,
    local_prefill_share_from,
)
from controlplane.planner.derive import LOCAL_SHARE_MIN_REQUESTS, local_prefill_share
from controlplane.telemetry.histograms import EngineDelta, Histogram, fleet_stats

# vLLM's token-count buckets (1-2-5), as the engines export them.
TOKEN_LE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


def hist(values, le=TOKEN_LE) -> Histogram:
    counts = [sum(1 for v in values if v <= b) for b in le] + [len(values)]
    return Histogram(tuple(float(b) for b in le), tuple(float(c) for c in counts),
                     float(sum(values)))


# --- Histogram.share_at_most -----------------------------------------------------------------


def test_share_at_most_is_exact_on_bounds_and_linear_inside():
    h = Histogram((10.0, 100.0), (4.0, 8.0, 10.0))  # 4 ≤ 10, 4 in (10, 100], 2 above
    assert h.share_at_most(10.0) == 0.4
    assert h.share_at_most(100.0) == 0.8
    assert h.share_at_most(5.0) == pytest.approx(0.2)  # first bucket from 0
    assert h.share_at_most(55.0) == pytest.approx(0.6)  # half of (10, 100]
    assert h.share_at_most(1e9) == 0.8  # the +Inf bucket's lengths are unknown: above
    assert h.share_at_most(math.inf) == 1.0
    assert h.share_at_most(0.0) == 0.0 and h.share_at_most(-3.0) == 0.0
    assert Histogram((10.0,), (0.0, 0.0)).share_at_most(5.0) is None
    assert h.share_at_most(float("nan")) is None


def test_share_at_most_inverts_quantile():
    rng = random.Random(3)
    h = hist([rng.lognormvariate(6, 1.2) for _ in range(2000)])
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        x = h.quantile(q)
        assert h.share_at_most(x) == pytest.approx(q, abs=1e-9)


# --- derive.local_prefill_share -----------------------------------------------------------------

lengths = st.lists(st.integers(1, 200_000), min_size=20, max_size=200)
hits = st.floats(0.0, 1.0)
limits = st.floats(0.0, 200_000.0)


@settings(max_examples=200, deadline=None)
@given(lengths, hits, limits, limits)
def test_share_is_a_probability_monotone_in_the_limit(values, hit, a, b):
    h = hist(values)
    lo, hi = sorted((a, b))
    s_lo, s_hi = local_prefill_share(h, hit, lo), local_prefill_share(h, hit, hi)
    assert 0.0 <= s_lo <= s_hi <= 1.0


@settings(max_examples=200, deadline=None)
@given(lengths, hits, hits, st.floats(1.0, 200_000.0))
def test_share_grows_with_the_hit_rate(values, a, b, limit):
    h = hist(values)
    lo, hi = sorted((a, b))
    assert local_prefill_share(h, lo, limit) <= local_prefill_share(h, hi, limit) <= 1.0


@settings(max_examples=100, deadline=None)
@given(lengths, st.sampled_from(TOKEN_LE), st.sampled_from((0.0, 0.5, 0.75, 0.9)))
def test_share_is_exact_on_a_bucket_bound(values, bound, hit):
    # The limit ÷ (1 − hit) on a bound: exactly the observations there or below.
    h = hist(values)
    limit = bound * (1.0 - hit)
    expected = sum(1 for v in values if v <= bound) / len(values)
    assert local_prefill_share(h, hit, limit) == pytest.approx(expected, abs=1e-12)


def test_share_edges():
    h = hist([100] * 30 + [5000] * 10)
    assert local_prefill_share(h, 0.0, 512) == pytest.approx(
        (30 + 10 * 0) / 40 + 0.0, abs=0.01)  # (500, 1000] is empty: nothing to interpolate
    assert local_prefill_share(h, 0.0, 0) == 0.0  # no local prefill
    assert local_prefill_share(h, 1.0, 512) == 1.0  # every prompt fully cached
    assert local_prefill_share(h, 0.9, 512) == 1.0  # 5,000 × 10 % = 500 ≤ 512
    assert local_prefill_share(None, 0.0, 512) is None
    assert local_prefill_share(hist([100] * 5), 0.0, 512) is None  # too few to say
    assert local_prefill_share(hist([100] * int(LOCAL_SHARE_MIN_REQUESTS)), 0.0, 512) == 1.0
    assert local_prefill_share(h, float("nan"), 512) is None
    assert local_prefill_share(h, -0.5, 512) == local_prefill_share(h, 0.0, 512)


def test_a_two_humped_trace_is_read_within_the_bucket():
    # Mooncake-like: 40 % short chat prompts, 60 % long documents. The lognormal fit the
    # cost model falls back on places none of its points under 512; the histogram, read at
    # the limit, is off only by the interpolation inside (500, 1000].
    rng = random.Random(11)
    values = ([int(rng.uniform(50, 480)) for _ in range(400)]
              + [int(rng.lognormvariate(9, 0.6)) for _ in range(600)])
    true = sum(1 for v in values if v <= 512) / len(values)
    got = local_prefill_share(hist(values), 0.0, 512)
    in_bucket = sum(1 for v in values if 500 < v <= 1000) / len(values)
    assert abs(got - true) <= in_bucket + 1e-9
    assert got == pytest.approx(true, abs=0.02)


# --- fleet_stats: every request's prompt once -------------------------------------------------


def _delta(prompts, gens, seconds=60.0):
    return EngineDelta(seconds, {"request_success": float(len(gens))},
                       {"prompt_tokens": hist(prompts), "generation_tokens": hist(gens)})


def test_the_prompt_histogram_for_the_share_is_the_decode_sides():
    # Conditional split: the decode engine finishes every request and observes its whole
    # prompt (30 short ones it prefilled itself, 10 long ones received); the prefill engine
    # saw only the 10 long ones (their prefill halves, one token each).
    short, long_ = [200] * 30, [8000] * 10
    stats = fleet_stats([("prefill", _delta(long_, [1] * 10)),
                         ("decode", _delta(short + long_, [100] * 40))], 60.0)
    assert stats.request_prompt_tokens.count == 40
    assert local_prefill_share(stats.request_prompt_tokens, 0.0, 512) == 0.75
    assert stats.request_rate == pytest.approx(40 / 60)  # each request once
    # The prompt figures are every request's too (read on the prefill side they were the
    # remote prompts alone: mean 8,000, p50 7,500).
    assert stats.prompt_tokens_mean == pytest.approx(2150.0)
    assert stats.prompt_tokens_p50 <= 200
    # A window whose prompts all stayed local still has prompt lengths.
    local = fleet_stats([("prefill", EngineDelta(60.0, {"request_success": 0.0}, {})),
                         ("decode", _delta(short, [100] * 30))], 60.0)
    assert local.prompt_tokens_mean == pytest.approx(200.0)
    # Aggregated: every engine is both sides.
    agg = fleet_stats([("both", _delta(short, [50] * 30)), ("both", _delta(long_, [50] * 10))],
                      60.0)
    assert local_prefill_share(agg.request_prompt_tokens, 0.0, 512) == 0.75


# --- the gateway's decisions (Prometheus) ----------------------------------------------------


def _vector(**counts):
    return [{"metric": {"reason": r}, "value": [1700000000.0, str(v)]} for r, v in counts.items()]


def test_local_share_counts_the_pd_decisions_only():
    answer = _vector(pd_local_prefill=38.0, retry_pd_local_prefill=2.0, pd_remote_prefill=50.0,
                     pd_no_prefill_worker=10.0, pd_no_kv_params=7.0, kv_aware=300.0,
                     kv_prefix=100.0)
    assert local_prefill_share_from(answer) == pytest.approx(0.4)
    # The same answer still gives the aggregated path's affinity share.
    assert affinity_share_from(answer) == pytest.approx(0.25)
    assert local_prefill_share_from(_vector(pd_remote_prefill=100.0)) == 0.0


def test_local_share_thin_or_bad_answers_are_unknown():
    assert local_prefill_share_from(None) is None
    assert local_prefill_share_from({"error": "x"}) is None
    assert local_prefill_share_from(_vector(kv_aware=500.0)) is None  # aggregated: no P/D
    assert local_prefill_share_from(_vector(pd_local_prefill=5.0, pd_remote_prefill=5.0)) is None
    junk = [{"metric": {}, "value": [0, "NaN"]}, {"value": [0]}, "x",
            {"metric": {"reason": "pd_local_prefill"}, "value": [0, "-5"]}]
    assert local_prefill_share_from(
        junk + _vector(pd_local_prefill=10.0, pd_remote_prefill=30.0)) == 0.25


def test_both_shares_read_one_cached_query():
    reader = FleetLatencyReader("http://127.0.0.1:9", timeout_s=0.5)
    asked = []

    class Client:
        def custom_query(self, query, params=None):
            asked.append(query)
            return _vector(pd_local_prefill=30.0, pd_remote_prefill=70.0, kv_prefix=10.0,
                           kv_aware=30.0)

    reader._client = Client()
    assert reader.local_prefill_share("m", 60.0) == pytest.approx(0.3)
    assert reader.affinity_share("m", 60.0) == pytest.approx(0.25)
    assert len(asked) == 1 and "pdplane_gateway_routing_decisions_total" in asked[0]


def test_unreachable_prometheus_means_unknown():
    assert FleetLatencyReader("http://127.0.0.1:9", timeout_s=0.5).local_prefill_share(
        "m", 60.0) is None


def test_from_values_is_what_an_engine_exports():
    values = [3, 10, 10, 70, 600, 20000]
    h = Histogram.from_values(values, TOKEN_LE)
    assert h == hist(values)
    assert Histogram.from_values([], (1, 2)).count == 0
