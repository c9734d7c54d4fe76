"""A change in the kind of traffic is planned for as the requests starting show it.

Issue 17, item 3: the load the planner predicts for must be the load arriving. Finished
requests trail a change of mix by a request's life; ``derive.with_arriving_mix`` plans on
the requests whose first token came in the window when their prompts differ from the
finished ones' by more than sampling noise, at the rate they arrive.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.derive import (
    MIX_SHIFT,
    MIX_SIGMAS,
    FirstTokens,
    prompt_sd,
    with_arriving_mix,
)
from controlplane.planner.planner import LoadInput

# Chat's prompts finishing, as the demo's first RAG window read them (20 s cycles).
CHAT = LoadInput(rate_rps=8.6, peak_rps=10.2, isl_mean=1047, isl_p95=2200, osl_mean=180,
                 isl_p50=900)


def test_the_first_window_of_rag_is_planned_as_rag():
    first = FirstTokens(rate_rps=6.7, prompt_mean=3933, window_s=20, finished=172,
                        waiting_change=-5)
    load, note = with_arriving_mix(CHAT, first)
    assert load.isl_mean == 3933
    # The rate requests arrive at: those started, plus the change in those queued.
    assert load.rate_rps == pytest.approx(6.7 - 5 / 20)
    # The finished prompts' spread is chat's: the new load has the mean only.
    assert load.isl_p50 is None and load.isl_p95 is None
    assert load.peak_rps == CHAT.peak_rps  # the recent peak is kept
    assert load.osl_mean == CHAT.osl_mean
    assert "3,933 tokens" in note and "1,047 tokens" in note


def test_a_wide_spread_reads_a_gap_as_noise():
    """Mooncake-like prompts (p95 ≈ 4× the median): two windows of ~60 requests differ by
    30 % in their means by chance. Nothing changes."""
    wide = LoadInput(rate_rps=2.0, peak_rps=2.0, isl_mean=8000, isl_p95=30000, osl_mean=300,
                     isl_p50=4000)
    first = FirstTokens(rate_rps=2.0, prompt_mean=10500, window_s=30, finished=60)
    assert with_arriving_mix(wide, first) == (wide, "")


def test_a_small_gap_or_missing_figures_change_nothing():
    near = FirstTokens(rate_rps=8.0, prompt_mean=1047 * (1 + MIX_SHIFT) - 1, window_s=20,
                       finished=170)
    assert with_arriving_mix(CHAT, near) == (CHAT, "")
    rag = FirstTokens(rate_rps=6.7, prompt_mean=3933, window_s=20, finished=172)
    # No spread to judge the noise by (agents without the prompt histogram): no change.
    no_spread = LoadInput(rate_rps=8.6, peak_rps=10.2, isl_mean=1047, osl_mean=180)
    assert with_arriving_mix(no_spread, rag) == (no_spread, "")
    assert with_arriving_mix(CHAT, None) == (CHAT, "")
    assert with_arriving_mix(CHAT, FirstTokens(6.7, 3933, 20, finished=1)) == (CHAT, "")
    # Everything queued left the queue and nothing started: no rate to plan on.
    assert with_arriving_mix(CHAT, FirstTokens(0.05, 3933, 20, 172, waiting_change=-40)) \
        == (CHAT, "")


def test_prompt_sd_is_the_lognormal_fit():
    sigma = math.log(2200 / 900) / 1.645
    assert prompt_sd(CHAT) == pytest.approx(1047 * math.sqrt(math.exp(sigma ** 2) - 1))
    assert prompt_sd(LoadInput(isl_mean=1000)) is None


@settings(max_examples=400, deadline=None)
@given(rate=st.floats(0.01, 100), peak=st.floats(0, 200), mean=st.floats(10, 50_000),
       spread=st.floats(1.0, 8.0), ft_rate=st.floats(0, 100), ft_mean=st.floats(1, 100_000),
       window=st.floats(1, 120), finished=st.floats(0, 5000),
       waiting=st.one_of(st.none(), st.integers(-2000, 2000)))
def test_the_load_is_left_alone_or_is_the_starting_requests(rate, peak, mean, spread, ft_rate,
                                                             ft_mean, window, finished,
                                                             waiting):
    load = LoadInput(rate_rps=rate, peak_rps=max(peak, rate), isl_mean=mean,
                     isl_p50=mean * 0.8, isl_p95=mean * 0.8 * spread, osl_mean=200)
    first = FirstTokens(ft_rate, ft_mean, window, finished, waiting)
    out, note = with_arriving_mix(load, first)
    if not note:
        assert out is load
        return
    started = ft_rate * window
    noise = prompt_sd(load) * math.sqrt(1 / started + 1 / finished)
    # Only past both limits: a quarter of the mean and three standard errors.
    assert abs(ft_mean - mean) > MIX_SHIFT * mean
    assert abs(ft_mean - mean) > MIX_SIGMAS * noise
    assert out.isl_mean == ft_mean and out.isl_p50 is None and out.isl_p95 is None
    arriving = ft_rate + (waiting or 0) / window
    assert out.rate_rps == pytest.approx(arriving) and out.rate_rps > 0
    assert math.isfinite(out.rate_rps) and out.peak_rps >= max(load.peak_rps, out.rate_rps)
    assert (out.osl_mean, out.prefix_hit) == (load.osl_mean, load.prefix_hit)
