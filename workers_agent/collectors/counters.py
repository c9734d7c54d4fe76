"""Turning cumulative byte counters into rates."""

from __future__ import annotations


class RateTracker:
    """Per-key rate in Gb/s from cumulative byte counters; None on the first sample or
    after a counter went backwards (reset)."""

    def __init__(self):
        self._last: dict[str, tuple[float, float]] = {}

    def gbps(self, key: str, counter_bytes: float | None, now: float) -> float | None:
        if counter_bytes is None:
            return None
        prev = self._last.get(key)
        self._last[key] = (now, counter_bytes)
        if prev is None or now <= prev[0] or counter_bytes < prev[1]:
            return None
        return (counter_bytes - prev[1]) * 8 / (now - prev[0]) / 1e9
