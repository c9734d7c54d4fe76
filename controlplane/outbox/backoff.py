"""When to try a message again: a schedule of delays, jitter, and a Retry-After floor. Pure.

One policy type serves every kind of message: webhooks use the Standard Webhooks
schedule, routing pushes an exponential one (:meth:`Backoff.exponential`). The jitter is a
multiplier drawn uniformly from ``jitter``, so a fleet of failed messages does not retry
in lock-step.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC
from email.utils import parsedate_to_datetime

MAX_RETRY_AFTER_S = 86400.0


@dataclass(frozen=True)
class Backoff:
    """``schedule[n]``: the delay before attempt n+1, once n attempts were made (attempt 1
    is due at once, so ``schedule[0]`` is usually 0). ``len(schedule)`` attempts in all."""

    schedule: tuple[float, ...]
    jitter: tuple[float, float] = (0.8, 1.2)

    def __post_init__(self):
        low, high = self.jitter
        if not 0 <= low <= high:
            raise ValueError(f"jitter {self.jitter}: need 0 <= low <= high")
        if any(d < 0 for d in self.schedule):
            raise ValueError("a schedule holds no negative delays")

    @classmethod
    def exponential(
        cls, base_s: float, cap_s: float, attempts: int, jitter=(0.5, 1.0)
    ) -> Backoff:
        """``base · 2^(n-1)`` seconds after the n-th failed attempt, capped at ``cap_s``."""
        return cls(
            (0.0, *(min(cap_s, base_s * 2 ** (n - 1)) for n in range(1, attempts))), jitter
        )

    @property
    def max_attempts(self) -> int:
        return len(self.schedule)

    def delay(
        self,
        attempts_made: int,
        retry_after: float | None = None,
        rng: random.Random | None = None,
    ) -> float | None:
        """Seconds until the next attempt after ``attempts_made`` attempts; None: give up.

        ``retry_after`` (from a 429/503 answer) is honoured as a floor, never as a way to
        retry sooner than the schedule says.
        """
        if attempts_made >= len(self.schedule):
            return None
        base = self.schedule[max(attempts_made, 0)]
        rng = rng or random.Random()
        delay = base * rng.uniform(*self.jitter) if base else 0.0
        if retry_after is not None:
            delay = max(delay, min(max(retry_after, 0.0), MAX_RETRY_AFTER_S))
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
