"""Latency percentiles and goodput of a run, shared by the virtual fleet and the player.

Goodput follows DistServe: the requests per second that meet *both* the TTFT target and the
per-token target. A request's per-token latency is its mean inter-token latency (TPOT);
``attainment`` says what fraction of requests must meet both for the run as a whole to count
as meeting its SLO (``slo_met``). ITL percentiles are over every inter-token gap.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Protocol


class LatencyRecord(Protocol):
    ttft: float | None  # seconds; None if no token came back
    itls: Sequence[float]  # seconds between successive tokens
    prompt_tokens: int
    cached_tokens: int
    output_tokens: int
    error: str | None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0–100) of unsorted ``values``; None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    if len(ordered) == 1:
        return float(ordered[0])
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return float(ordered[low] + (ordered[high] - ordered[low]) * (rank - low))


@dataclass
class Summary:
    requests: int
    completed: int
    failed: int
    duration_s: float
    ttft_ms: dict[str, float | None] = field(default_factory=dict)  # p50/p95/p99/mean
    itl_ms: dict[str, float | None] = field(default_factory=dict)
    tpot_ms: dict[str, float | None] = field(default_factory=dict)  # per-request mean ITL
    slo_ttft_ms: float = 0.0
    slo_itl_ms: float = 0.0
    attainment_target: float = 0.9
    slo_attainment: float = 0.0  # fraction of all requests meeting both targets
    slo_met: bool = False
    goodput_rps: float = 0.0
    goodput_rps_per_gpu: float = 0.0
    throughput_rps: float = 0.0
    output_tokens_per_s: float = 0.0
    prefix_hit_rate: float | None = None  # cached prompt tokens / prompt tokens
    num_gpus: int = 1

    def to_dict(self) -> dict:
        return asdict(self)

    def lines(self) -> list[str]:
        def fmt(stats: dict[str, float | None]) -> str:
            return " ".join(
                f"{key}={value:.1f}" if value is not None else f"{key}=-"
                for key, value in stats.items()
            )

        hit = "-" if self.prefix_hit_rate is None else f"{self.prefix_hit_rate:.1%}"
        return [
            f"requests {self.requests} completed {self.completed} failed {self.failed} "
            f"over {self.duration_s:.1f} s",
            f"TTFT ms  {fmt(self.ttft_ms)}",
            f"ITL ms   {fmt(self.itl_ms)}",
            f"TPOT ms  {fmt(self.tpot_ms)}",
            f"SLO TTFT≤{self.slo_ttft_ms:g} ms ITL≤{self.slo_itl_ms:g} ms: "
            f"{self.slo_attainment:.1%} of requests (target {self.attainment_target:.0%}, "
            f"{'met' if self.slo_met else 'missed'})",
            f"goodput {self.goodput_rps:.3f} req/s ({self.goodput_rps_per_gpu:.3f} per GPU "
            f"× {self.num_gpus}); throughput {self.throughput_rps:.3f} req/s, "
            f"{self.output_tokens_per_s:.0f} output tok/s",
            f"prefix-cache hit rate {hit}",
        ]


def _stats(values_s: Sequence[float]) -> dict[str, float | None]:
    if not values_s:
        return {"p50": None, "p95": None, "p99": None, "mean": None}
    return {
        "p50": percentile(values_s, 50) * 1000,
        "p95": percentile(values_s, 95) * 1000,
        "p99": percentile(values_s, 99) * 1000,
        "mean": sum(values_s) / len(values_s) * 1000,
    }


def summarize(
    results: Iterable[LatencyRecord],
    slo_ttft_ms: float,
    slo_itl_ms: float,
    attainment: float = 0.9,
    num_gpus: int = 1,
    duration: float | None = None,
    prefix_hit_rate: float | None = None,
) -> Summary:
    """Percentiles and goodput of ``results``.

    ``duration`` (seconds) defaults to first arrival → last finish when the records carry
    ``arrival`` and ``finish_time``; ``prefix_hit_rate`` defaults to cached / prompt tokens
    of the records (pass the engines' own counters when you have them).
    """
    records = list(results)
    ttfts: list[float] = []
    itls: list[float] = []
    tpots: list[float] = []
    good = 0
    completed = 0
    failed = 0
    prompt = cached = out_tokens = 0
    ttft_limit = slo_ttft_ms / 1000.0
    itl_limit = slo_itl_ms / 1000.0
    for rec in records:
        if rec.error is not None or rec.ttft is None:
            failed += 1
            continue
        completed += 1
        ttfts.append(rec.ttft)
        itls.extend(rec.itls)
        tpot = sum(rec.itls) / len(rec.itls) if rec.itls else 0.0
        if rec.itls:
            tpots.append(tpot)
        if rec.ttft <= ttft_limit and tpot <= itl_limit:
            good += 1
        prompt += rec.prompt_tokens
        cached += rec.cached_tokens
        out_tokens += rec.output_tokens
    if duration is None:
        starts = [getattr(r, "arrival", None) for r in records]
        ends = [getattr(r, "finish_time", None) for r in records]
        starts = [s for s in starts if s is not None]
        ends = [e for e in ends if e is not None]
        duration = (max(ends) - min(starts)) if starts and ends else 0.0
    duration = max(duration, 1e-9)
    total = len(records)
    share = good / total if total else 0.0
    if prefix_hit_rate is None and prompt:
        prefix_hit_rate = cached / prompt
    return Summary(
        requests=total,
        completed=completed,
        failed=failed,
        duration_s=duration,
        ttft_ms=_stats(ttfts),
        itl_ms=_stats(itls),
        tpot_ms=_stats(tpots),
        slo_ttft_ms=slo_ttft_ms,
        slo_itl_ms=slo_itl_ms,
        attainment_target=attainment,
        slo_attainment=share,
        slo_met=total > 0 and share >= attainment,
        goodput_rps=good / duration,
        goodput_rps_per_gpu=good / duration / max(num_gpus, 1),
        throughput_rps=completed / duration,
        output_tokens_per_s=out_tokens / duration,
        prefix_hit_rate=prefix_hit_rate,
        num_gpus=num_gpus,
    )
