"""The prompt-length fit pins the mean and the p95 (what the predictions rest on); a p50
sets σ only where no lognormal has that mean and p95; the points always average to the
mean."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.distributions import (
    _MID,
    MEAN_P95_MAX_RATIO,
    POINTS,
    Z95,
    length_points,
    median_sets_sigma,
)


def p50_points(mean: float, p95: float, p50: float) -> list[float]:
    """The fit with σ from p95 ÷ p50, rescaled to the mean."""
    sigma = math.log(p95 / p50) / Z95
    pts = [math.exp(sigma * z) for z in _MID]
    scale = mean / (sum(pts) / POINTS)
    return [x * scale for x in pts]


def test_the_bound_is_where_the_mean_p95_fit_stops():
    # p95 ÷ mean = exp(Z σ − σ² ÷ 2) peaks at σ = Z with exp(Z² ÷ 2).
    best = max(math.exp(Z95 * s - s * s / 2) for s in (Z95 * k / 1000 for k in range(2001)))
    assert best == pytest.approx(MEAN_P95_MAX_RATIO, rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(1.001, 0.999 * MEAN_P95_MAX_RATIO), st.floats(0.01, 0.99))
def test_where_a_lognormal_has_the_mean_and_p95_the_median_changes_nothing(mean, ratio, share):
    p95 = mean * ratio
    assert not median_sets_sigma(mean, p95, p95 * share)
    assert length_points(mean, p95, p95 * share) == length_points(mean, p95)


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(MEAN_P95_MAX_RATIO, 50.0), st.floats(0.01, 0.99))
def test_where_none_has_them_the_median_sets_sigma(mean, ratio, share):
    p95, p50 = mean * ratio, mean * ratio * share
    assert median_sets_sigma(mean, p95, p50)
    assert length_points(mean, p95, p50) == pytest.approx(p50_points(mean, p95, p50), rel=1e-12)


def test_a_median_at_or_above_the_p95_is_not_used():
    assert not median_sets_sigma(1000.0, 8000.0, 8000.0)
    assert length_points(1000.0, 8000.0, 9000.0) == length_points(1000.0, 8000.0)


def test_mooncake_like_window_keeps_the_mean_p95_fit():
    # Mooncake's first 400 prompts: median ~5.3k against a mean ~12.8k. σ from p50 ÷ p95
    # (1.24) would move the tail off the p95 once rescaled to the mean; the fit keeps σ 1.01.
    mean, p95, p50 = 12_800.0, 12_800.0 * math.exp(Z95 * 1.01 - 1.01 ** 2 / 2), 5_300.0
    assert length_points(mean, p95, p50) == length_points(mean, p95)


@settings(max_examples=300, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(1.0, 20.0), st.one_of(st.none(), st.floats(0.05, 1.2)))
def test_points_average_to_the_mean(mean, spread, p50_share):
    p95 = mean * spread
    p50 = None if p50_share is None else p95 * p50_share
    pts = length_points(mean, p95, p50)
    assert len(pts) == POINTS
    assert sum(pts) / POINTS == pytest.approx(mean, rel=1e-9)
    assert all(x >= 0 for x in pts)
