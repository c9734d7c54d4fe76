"""Fleet rates and percentiles from the engines' own cumulative counters and histograms.

Pure: no Django, no I/O. Agents report, per engine, the cumulative counters and histogram
buckets the engine exports (``vllm:request_success_total``, ``vllm:request_prompt_tokens``,
``vllm:request_generation_tokens``, TTFT and inter-token histograms; see
docs/agent-protocol.md). Over a window this module takes each engine's difference of two
snapshots, then

* rates: Σ over engines of Δcounter ÷ that engine's Δt — PromQL ``sum(rate(c[w]))``;
* percentiles: Δbuckets summed per upper bound across engines, then the quantile
  interpolated inside the bucket holding the rank — PromQL
  ``histogram_quantile(q, sum by (le) (rate(h_bucket[w])))``. The interpolation is the
  agent's :func:`~workers_agent.collectors.engine_metrics.histogram_quantile` (one copy).

A counter that went down means the engine restarted: the window restarts after it.
Histograms of different bucket layouts (engine versions) merge on their common bounds.
Which engines count for what, when prefill and decode are split: requests finish, tokens
are generated and inter-token gaps happen on decode-capable engines (role decode or both);
the first token is timed on prefill-capable ones (prefill or both). A disaggregated
request's TTFT as the client sees it also includes the KV transfer and the decode engine's
first step, which no single engine measures. Prompt lengths are read where requests
finish, on the decode side too: a decode engine observes every request's whole prompt
(prefilled there, or received: vLLM counts external KV as prompt tokens), while the
prefill side never sees the short prompts conditional P/D prefills on decode engines
(gateway "pd_local_prefill") — read there, a conditional split's prompts looked as long
as its remote ones alone, and a window whose prompts all stayed local had none at all.

Mid-move a fleet holds prefill, decode and "both" engines at once, and a "both" engine then
also serves the prefill halves of P/D requests decoded elsewhere. Each half is a finished
request with one generated token (vLLM's P/D prefill runs with ``max_tokens=1``), so counted
as it is it would add a request the decode engine counts again and pull the answer length
down. While any engine is prefill- or decode-only, a "both" engine's one-token finishes
(its generation histogram's ``le=1`` bucket) are taken for such halves and left out of the
request rate and answer lengths; a real one-token answer on it is left out too.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field

from workers_agent.collectors.engine_metrics import histogram_quantile

# Report names (protocol) of the histograms and counters this module reads.
TTFT, ITL, PROMPT, GENERATION = "ttft_s", "itl_s", "prompt_tokens", "generation_tokens"
REQUESTS = "request_success"
PREFILL_SIDE = ("prefill", "both")
DECODE_SIDE = ("decode", "both")


@dataclass(frozen=True)
class Histogram:
    """Cumulative buckets: ``counts[i]`` observations ≤ ``le[i]``; ``counts[-1]`` is +Inf."""

    le: tuple[float, ...]
    counts: tuple[float, ...]
    sum: float = 0.0

    @classmethod
    def from_report(cls, data: Mapping) -> Histogram:
        return cls(tuple(float(b) for b in data["le"]), tuple(float(n) for n in data["counts"]),
                   float(data.get("sum") or 0.0))

    @classmethod
    def from_values(cls, values: Iterable[float], le: Iterable[float]) -> Histogram:
        """The histogram an engine would export after observing ``values`` on the finite
        bounds ``le`` (for benchmarks and tests that hold the observations themselves)."""
        vals, bounds = sorted(float(v) for v in values), tuple(sorted(float(b) for b in le))
        counts = tuple(float(bisect.bisect_right(vals, b)) for b in bounds)
        return cls(bounds, (*counts, float(len(vals))), float(sum(vals)))

    @property
    def count(self) -> float:
        return self.counts[-1] if self.counts else 0.0

    def on(self, bounds: tuple[float, ...]) -> Histogram:
        """The same histogram on a subset of its bounds (cumulative counts stay exact)."""
        if bounds == self.le:
            return self
        at = dict(zip(self.le, self.counts, strict=False))
        return Histogram(bounds, (*(at[b] for b in bounds), self.count), self.sum)

    def minus(self, earlier: Histogram) -> Histogram | None:
        """Observations made between ``earlier`` and this one; None after a reset."""
        common = tuple(sorted(set(self.le) & set(earlier.le)))
        a, b = self.on(common), earlier.on(common)
        delta = tuple(x - y for x, y in zip(a.counts, b.counts, strict=True))
        if any(d < 0 for d in delta):
            return None
        return Histogram(common, delta, max(0.0, self.sum - earlier.sum))

    def quantile(self, q: float) -> float | None:
        buckets = [*zip(self.le, self.counts, strict=False), (math.inf, self.count)]
        return histogram_quantile(q, buckets)

    def mean(self) -> float | None:
        return self.sum / self.count if self.count > 0 else None

    def share_at_most(self, x: float) -> float | None:
        """Share of the observations ≤ ``x``: exact on a bucket's upper bound, linear inside
        a bucket (lower bound 0 for the first) — the inverse of :meth:`quantile`'s rule.
        Observations in the +Inf bucket count as above any finite ``x`` (their lengths are
        unknown; the longest bound is all that is known). None when empty."""
        total = self.count
        if total <= 0 or x != x:
            return None
        if x == math.inf:
            return 1.0
        prev_le, prev = 0.0, 0.0
        for le, n in zip(self.le, self.counts, strict=False):
            if x <= le:
                if x <= prev_le or le <= prev_le:
                    return min(max(prev / total, 0.0), 1.0)
                inside = prev + (n - prev) * (x - prev_le) / (le - prev_le)
                return min(max(inside / total, 0.0), 1.0)
            prev_le, prev = le, n
        return min(max(prev / total, 0.0), 1.0)


def merge(histograms: Iterable[Histogram]) -> Histogram | None:
    """Sum by upper bound over histograms (on their common bounds); None if none."""
    hs = [h for h in histograms if h is not None]
    if not hs:
        return None
    common = set(hs[0].le)
    for h in hs[1:]:
        common &= set(h.le)
    bounds = tuple(sorted(common))
    on = [h.on(bounds) for h in hs]
    counts = tuple(sum(col) for col in zip(*(h.counts for h in on), strict=True))
    return Histogram(bounds, counts, sum(h.sum for h in hs))


@dataclass(frozen=True)
class EngineSnapshot:
    """One engine's cumulative counters and histograms at time ``t`` (agent clock, s).

    Stored as ``{"t": …, "c": {counter: value}, "h": {name: {"le", "counts", "sum"}}}``."""

    t: float
    counters: Mapping[str, float] = field(default_factory=dict)
    histograms: Mapping[str, Histogram] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping) -> EngineSnapshot:
        return cls(float(data["t"]), {k: float(v) for k, v in data.get("c", {}).items()},
                   {k: Histogram.from_report(v) for k, v in data.get("h", {}).items()})

    def resets_since(self, earlier: EngineSnapshot) -> bool:
        return any(self.counters.get(k, v) < v for k, v in earlier.counters.items()) or any(
            h.count < earlier.histograms[k].count
            for k, h in self.histograms.items() if k in earlier.histograms
        )


@dataclass(frozen=True)
class EngineDelta:
    seconds: float
    counters: Mapping[str, float]
    histograms: Mapping[str, Histogram]


def window_delta(snapshots: list[EngineSnapshot], window_s: float) -> EngineDelta | None:
    """The newest snapshot minus the newest one at least ``window_s`` older (else the
    oldest usable one), never reaching back across an engine restart. ``snapshots`` are
    oldest first. None when fewer than two usable snapshots exist."""
    if len(snapshots) < 2:
        return None
    latest = snapshots[-1]
    usable = [latest]
    for snap in reversed(snapshots[:-1]):
        if snap.t >= usable[-1].t or usable[-1].resets_since(snap):
            break
        usable.append(snap)
    if len(usable) < 2:
        return None
    base = next((s for s in usable[1:] if s.t <= latest.t - window_s), usable[-1])
    counters = {k: v - base.counters[k] for k, v in latest.counters.items()
                if k in base.counters}
    hists = {}
    for k, h in latest.histograms.items():
        if k in base.histograms and (d := h.minus(base.histograms[k])) is not None:
            hists[k] = d
    return EngineDelta(latest.t - base.t, counters, hists)


@dataclass(frozen=True)
class FleetEngineStats:
    """What the planner reads about a served model's traffic over a window.

    Rates per second; token figures per request; latencies in seconds. ``None`` means
    "no data", never zero. ``source`` is "agents" or "prometheus"."""

    source: str
    window_s: float  # the window asked for
    engines: int = 0
    # Seconds the deltas actually cover (longest engine): shorter than ``window_s`` while
    # an engine's history is younger than the window (start-up, restart). None from
    # Prometheus, whose rate() extrapolates to the window.
    span_s: float | None = None
    request_rate: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    prompt_tokens_p50: float | None = None
    prompt_tokens_p95: float | None = None
    prompt_tokens_mean: float | None = None
    generation_tokens_p50: float | None = None
    generation_tokens_p95: float | None = None
    generation_tokens_mean: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    # Mean token gap (the ITL histogram's sum ÷ count): what a request's mean ITL averages
    # to, and what calibration compares (a gap p95 sits on the knife edge between pure and
    # prefill-carrying steps; the mean does not).
    itl_mean_s: float | None = None
    # Every finished request's prompt length once: the decode side's prompt histogram,
    # the one the prompt figures above come from (module docstring). Agents only (None
    # from Prometheus); read for the local-prefill share (derive.local_prefill_share).
    # Mid-move a "both" engine's prefill halves are in it too (a histogram cannot tell
    # their prompts from its own requests'): those remote prompts count twice, and the
    # share reads a little low for that window.
    request_prompt_tokens: Histogram | None = None
    # Mean prompt of the requests whose first token came in the window — the ones the TTFT
    # histogram above counted: the prefill side's prompt-token counter (vLLM counts a
    # request's prompt at its first token) ÷ its TTFT count. Right after a mix shift it
    # leads the finished requests' prompt length by a window; calibration compares only
    # when the two agree (planner.calibration).
    first_token_prompt_mean: float | None = None
    # Requests that got their first token, per second (the prefill side's TTFT count ÷ the
    # span its deltas cover): the rate the fleet starts requests at.
    first_token_rate: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _side(deltas: list[tuple[str, EngineDelta]], roles: tuple[str, ...]) -> list[EngineDelta]:
    picked = [d for role, d in deltas if role in roles]
    return picked or [d for _, d in deltas]  # roles unknown: every engine counts


def _rate(deltas: list[EngineDelta], counter: str) -> float | None:
    parts = [d.counters[counter] / d.seconds for d in deltas
             if counter in d.counters and d.seconds > 0]
    return max(0.0, sum(parts)) if parts else None


def _hist(deltas: list[EngineDelta], name: str) -> Histogram | None:
    merged = merge(d.histograms[name] for d in deltas if name in d.histograms)
    return merged if merged is not None and merged.count > 0 else None


def _q(h: Histogram | None, q: float) -> float | None:
    return h.quantile(q) if h is not None else None


def without_prefill_halves(delta: EngineDelta) -> EngineDelta:
    """A "both" engine's window less its one-token finishes (module docstring)."""
    gen = delta.histograms.get(GENERATION)
    if gen is None or not gen.le or gen.le[0] > 1.0:
        return delta  # no bucket that tells one-token answers apart: nothing to take out
    ones = sum(n for b, n in zip(gen.le, gen.counts, strict=False) if b == 1.0) or 0.0
    if ones <= 0:
        return delta
    kept = Histogram(gen.le, tuple(max(0.0, n - ones) for n in gen.counts),
                     max(0.0, gen.sum - ones))
    counters = dict(delta.counters)
    if REQUESTS in counters:
        counters[REQUESTS] = max(0.0, counters[REQUESTS] - ones)
    return EngineDelta(delta.seconds, counters, {**delta.histograms, GENERATION: kept})


def fleet_stats(engines: Iterable[tuple[str, EngineDelta | None]], window_s: float
                ) -> FleetEngineStats:
    """Fleet figures from (role, delta) per engine; engines without a delta are skipped."""
    deltas = [(role, d) for role, d in engines if d is not None]
    if any(role in ("prefill", "decode") for role, _ in deltas):
        deltas = [(role, without_prefill_halves(d) if role == "both" else d)
                  for role, d in deltas]
    pre, dec = _side(deltas, PREFILL_SIDE), _side(deltas, DECODE_SIDE)
    prompt, gen = _hist(dec, PROMPT), _hist(dec, GENERATION)
    ttft, itl = _hist(pre, TTFT), _hist(dec, ITL)
    rate = _rate(dec, REQUESTS)
    if rate is None and gen is not None:  # no request counter: finished requests observed
        seconds = max((d.seconds for d in dec), default=0.0)
        rate = gen.count / seconds if seconds > 0 else None
    return FleetEngineStats(
        source="agents", window_s=window_s, engines=len(deltas),
        span_s=max((d.seconds for _, d in deltas), default=None), request_rate=rate,
        prompt_tokens_per_s=_rate(dec, PROMPT), generation_tokens_per_s=_rate(dec, GENERATION),
        prompt_tokens_p50=_q(prompt, 0.5), prompt_tokens_p95=_q(prompt, 0.95),
        prompt_tokens_mean=prompt.mean() if prompt else None,
        generation_tokens_p50=_q(gen, 0.5), generation_tokens_p95=_q(gen, 0.95),
        generation_tokens_mean=gen.mean() if gen else None,
        ttft_p50_s=_q(ttft, 0.5), ttft_p95_s=_q(ttft, 0.95),
        itl_p50_s=_q(itl, 0.5), itl_p95_s=_q(itl, 0.95),
        itl_mean_s=itl.mean() if itl and itl.sum > 0 else None,
        request_prompt_tokens=prompt,
        first_token_prompt_mean=_per_first_token(pre, ttft),
        first_token_rate=_per_second(pre, ttft),
    )


def _per_second(deltas: list[EngineDelta], h: Histogram | None) -> float | None:
    seconds = max((d.seconds for d in deltas), default=0.0)
    return h.count / seconds if h is not None and seconds > 0 else None


def _per_first_token(pre: list[EngineDelta], ttft: Histogram | None) -> float | None:
    tokens = [d.counters[PROMPT] for d in pre if PROMPT in d.counters]
    if not tokens or ttft is None or ttft.count <= 0:
        return None
    return max(sum(tokens), 0.0) / ttft.count
