"""The one retry policy of the outbox: bounds, jitter, give-up and Retry-After floors."""

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.outbox.backoff import MAX_RETRY_AFTER_S, Backoff, parse_retry_after

delays = st.floats(min_value=0, max_value=1e6, allow_nan=False)
schedules = st.lists(delays, min_size=1, max_size=30).map(tuple)
jitters = st.tuples(st.floats(0, 2), st.floats(0, 2)).map(sorted).map(tuple)


@given(schedules, jitters, st.integers(min_value=0, max_value=40),
       st.none() | st.floats(min_value=-10, max_value=1e7, allow_nan=False),
       st.integers(0, 2**32))
def test_delay_stays_within_jitter_bounds_and_never_under_retry_after(
    schedule, jitter, attempts, retry_after, seed
):
    policy = Backoff(schedule, jitter)
    delay = policy.delay(attempts, retry_after=retry_after, rng=random.Random(seed))
    if attempts >= len(schedule):
        assert delay is None
        return
    base = schedule[attempts]
    floor = min(max(retry_after, 0.0), MAX_RETRY_AFTER_S) if retry_after is not None else 0.0
    low, high = jitter
    assert delay >= floor
    assert delay <= max(base * high, floor) * (1 + 1e-9)
    if retry_after is None:
        assert base * low * (1 - 1e-9) <= delay


@given(st.floats(0.01, 10), st.floats(10, 1000), st.integers(2, 40), st.integers(0, 2**32))
def test_exponential_doubles_up_to_the_cap_and_gives_up_after_the_last_attempt(
    base, cap, attempts, seed
):
    policy = Backoff.exponential(base, cap, attempts)
    rng = random.Random(seed)
    assert policy.max_attempts == attempts
    assert policy.delay(0, rng=rng) == 0  # the first attempt is due at once
    for made in range(1, attempts):
        ceiling = min(cap, base * 2 ** (made - 1))
        assert ceiling * 0.5 * (1 - 1e-9) <= policy.delay(made, rng=rng) <= ceiling * (1 + 1e-9)
    assert policy.delay(attempts, rng=rng) is None


def test_jitter_spreads_retries():
    policy = Backoff.exponential(1, 300, 25)
    rng = random.Random(1)
    assert len({round(policy.delay(6, rng=rng), 6) for _ in range(200)}) > 100


def test_bad_policies_are_refused():
    with pytest.raises(ValueError):
        Backoff((1, -1))
    with pytest.raises(ValueError):
        Backoff((1,), jitter=(1.2, 0.8))


def test_parse_retry_after():
    assert parse_retry_after("30", 0) == 30
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", 1445412470) == 10
    assert parse_retry_after("soon", 0) is None
    assert parse_retry_after(None, 0) is None
