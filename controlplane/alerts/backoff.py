"""Retry timing for webhook deliveries. Pure."""

from __future__ import annotations

import random
from collections.abc import Sequence
from datetime import UTC
from email.utils import parsedate_to_datetime

# Standard Webhooks' example schedule: the delay before attempt n+1 (attempt 1 is
# immediate). Ten attempts over a little more than 3 days in all.
DEFAULT_SCHEDULE_S: tuple[float, ...] = (
    0,
    5,
    300,
    1800,
    7200,
    18000,
    36000,
    50400,
    72000,
    86400,
)
JITTER = 0.2  # ±20 %, so a fleet of failed deliveries does not retry in lock-step
MAX_RETRY_AFTER_S = 86400.0


def next_delay(
    attempts_made: int,
    schedule: Sequence[float] = DEFAULT_SCHEDULE_S,
    retry_after: float | None = None,
    rng: random.Random | None = None,
) -> float | None:
    """Seconds until the next attempt after ``attempts_made`` attempts; None: give up.

    ``retry_after`` (from a 429/503 answer) is honoured as a floor, never as a way to
    retry sooner than the schedule says.
    """
    if attempts_made >= len(schedule):
        return None
    base = schedule[attempts_made]
    rng = rng or random.Random()
    delay = base * (1 + rng.uniform(-JITTER, JITTER)) if base else 0.0
    if retry_after is not None:
        delay = max(delay, min(retry_after, MAX_RETRY_AFTER_S))
    return delay


def parse_retry_after(value: str | None, now: float) -> float | None:
    """``Retry-After`` as seconds from now: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, when.timestamp() - now)
