"""Engine /metrics scraper for vLLM (current and older names) and SGLang.

Usage as a plain class::

    collector = EngineMetricsCollector("http://127.0.0.1:8000/metrics")
    sample = collector.scrape()          # EngineSample; call again for windowed figures
    sample.running, sample.kv_blocks_used, sample.ttft_p95_s, ...

Instant figures (running, waiting, KV usage) come from gauges. Rates, the prefix hit rate
and the TTFT/ITL quantiles are *windowed*: the difference between this scrape's cumulative
counters/buckets and an earlier scrape's (``window_s`` ago), the quantile interpolated
inside its bucket as PromQL ``histogram_quantile(rate(...))`` does. A counter going
backwards (engine restart) restarts the window.

Each sample also carries the engine's *cumulative* counters and histogram buckets as the
engine exports them (``counters``, ``histograms``): the control plane keeps two of them per
engine and merges buckets across engines for fleet percentiles (controlplane/telemetry/
histograms.py), the way ``histogram_quantile`` over ``sum by (le)`` does.
"""

from __future__ import annotations

import math
import re
import time
import urllib.request
from collections import deque
from dataclasses import asdict, dataclass

# Each figure: the metric names that carry it, preferred first (ENGINES.md).
RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
KV_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
CACHE_INFO = ("vllm:cache_config_info", "sglang:cache_config_info")
PREFIX_QUERIES = ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries")
PREFIX_HITS = ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits")
PROMPT_TOKENS = ("vllm:prompt_tokens", "sglang:prompt_tokens")
GENERATION_TOKENS = ("vllm:generation_tokens", "sglang:generation_tokens")
PREEMPTIONS = ("vllm:num_preemptions",)
REQUEST_SUCCESS = ("vllm:request_success",)  # summed over finished_reason
TTFT = ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds")
ITL = (
    "vllm:inter_token_latency_seconds",
    "vllm:time_per_output_token_seconds",
    "sglang:inter_token_latency_seconds",
    "sglang:time_per_output_token_seconds",
)
REQUEST_PROMPT_TOKENS = ("vllm:request_prompt_tokens",)
REQUEST_GENERATION_TOKENS = ("vllm:request_generation_tokens",)
COUNTERS = {"prefix_queries": PREFIX_QUERIES, "prefix_hits": PREFIX_HITS,
            "prompt_tokens": PROMPT_TOKENS, "generation_tokens": GENERATION_TOKENS,
            "preemptions": PREEMPTIONS, "request_success": REQUEST_SUCCESS}
HISTOGRAMS = {"ttft": TTFT, "itl": ITL, "prompt_tokens": REQUEST_PROMPT_TOKENS,
              "generation_tokens": REQUEST_GENERATION_TOKENS}
# Report names of the cumulative histograms (protocol: engine ``histograms``).
REPORT_HISTOGRAMS = {"ttft": "ttft_s", "itl": "itl_s", "prompt_tokens": "prompt_tokens",
                     "generation_tokens": "generation_tokens"}

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


def parse_prometheus_text(text: str) -> dict[str, list[tuple[dict, float]]]:
    """name → [(labels, value)]; comments and unparsable lines are skipped."""
    out: dict[str, list[tuple[dict, float]]] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _LINE.match(line)
        if not m:
            continue
        name, labels_raw, value_raw = m.groups()
        try:
            value = float(value_raw)
        except ValueError:
            continue
        labels = {}
        if labels_raw:
            for k, v in _LABEL.findall(labels_raw):
                labels[k] = v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
        out.setdefault(name, []).append((labels, value))
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Quantile ``q`` of a histogram given cumulative ``(upper bound, count)`` buckets.

    Linear interpolation inside the bucket holding the rank, lower bound 0 for the first
    bucket, and the highest finite bound when the rank falls in the +Inf bucket — the
    rules of Prometheus ``histogram_quantile``. None when the histogram is empty.
    """
    if not buckets:
        return None
    buckets = sorted(buckets)
    total = buckets[-1][1]
    if not math.isinf(buckets[-1][0]) or total <= 0:
        return None
    rank = q * total
    prev_le, prev_count = 0.0, 0.0
    for i, (le, count) in enumerate(buckets):
        if count >= rank:
            if math.isinf(le):
                return buckets[i - 1][0] if i > 0 else None
            if i == 0 and le <= 0:
                return le
            in_bucket = count - prev_count
            if in_bucket <= 0:
                return le
            return prev_le + (le - prev_le) * (rank - prev_count) / in_bucket
        prev_le, prev_count = le, count
    return None


def _first(samples: dict, names: tuple[str, ...], suffix: str = "") -> list[tuple[dict, float]]:
    for name in names:
        found = samples.get(name + suffix)
        if found:
            return found
    return []


def _counter(samples: dict, names: tuple[str, ...]) -> float | None:
    """Sum over series; counters appear with ``_total`` (current) or without (old text)."""
    for name in names:
        for candidate in (name + "_total", name):
            found = samples.get(candidate)
            if found:
                return sum(v for _, v in found)
    return None


def _histogram(samples: dict, names: tuple[str, ...]) -> dict[float, float] | None:
    """Cumulative count per upper bound, summed over every series (engines, DP ranks);
    the sum of observations under the key ``"sum"`` when the engine exports it."""
    for name in names:
        found = samples.get(name + "_bucket")
        if found:
            merged: dict = {}
            for labels, value in found:
                try:
                    le = float(labels.get("le", "nan").replace("Inf", "inf"))
                except ValueError:
                    continue
                if not math.isnan(le):
                    merged[le] = merged.get(le, 0.0) + value
            if merged and samples.get(name + "_sum"):
                merged["sum"] = sum(v for _, v in samples[name + "_sum"])
            return merged or None
    return None


def report_histogram(h: dict) -> dict | None:
    """Protocol shape of a cumulative histogram: finite bounds ``le`` (ascending), counts
    per bound plus the +Inf count last, and the sum of observations."""
    bounds = sorted(k for k in h if k != "sum" and not math.isinf(k))
    if math.inf not in h:
        return None
    return {"le": bounds, "counts": [h[b] for b in bounds] + [h[math.inf]],
            "sum": h.get("sum", 0.0)}


@dataclass
class EngineSample:
    up: bool
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    kv_blocks_used: int | None = None
    kv_blocks_total: int | None = None
    block_size: int | None = None
    prefix_hit_rate: float | None = None
    prompt_tokens_per_s: float | None = None
    generation_tokens_per_s: float | None = None
    ttft_p50_s: float | None = None
    ttft_p95_s: float | None = None
    itl_p50_s: float | None = None
    itl_p95_s: float | None = None
    preemptions: int | None = None
    # Cumulative, as exported: {"request_success": n, "prompt_tokens": n, …} and
    # {"ttft_s": {"le": [...], "counts": [...], "sum": x}, …} (docs/agent-protocol.md).
    counters: dict | None = None
    histograms: dict | None = None
    error: str | None = None

    def as_report(self) -> dict:
        out = asdict(self)
        out.pop("block_size")
        out.pop("error")
        for optional in ("counters", "histograms"):
            if out[optional] is None:
                del out[optional]  # an old control plane never sees an unknown empty field
        return out


@dataclass
class _Snapshot:
    t: float
    counters: dict[str, float]
    histograms: dict[str, dict[float, float]]


def _clamp01(x: float | None) -> float | None:
    if x is None or math.isnan(x):
        return None
    return min(1.0, max(0.0, x))


class EngineMetricsCollector:
    """Scrapes one engine's /metrics and turns it into an :class:`EngineSample`."""

    def __init__(self, metrics_url: str, *, window_s: float = 30.0, rate_window_s: float = 10.0,
                 timeout_s: float = 2.0, num_gpu_blocks: int | None = None,
                 cumulative_every_s: float = 10.0):
        self.metrics_url = metrics_url
        self.window_s = window_s
        self.rate_window_s = rate_window_s
        # The cumulative counters and buckets go out at most this often (a few hundred
        # numbers per engine: ~5× less ingest work at a 2 s report interval); the control
        # plane keeps one snapshot per 10 s anyway.
        self.cumulative_every_s = cumulative_every_s
        self._cumulative_at: float | None = None
        self.timeout_s = timeout_s
        self.num_gpu_blocks = num_gpu_blocks  # fallback when cache_config_info is absent
        self.history: deque[_Snapshot] = deque(maxlen=512)

    def fetch(self) -> str:
        if not self.metrics_url.startswith(("http://", "https://")):
            raise ValueError(f"metrics URL must be http(s): {self.metrics_url!r}")
        req = urllib.request.Request(  # noqa: S310 (scheme checked above)
            self.metrics_url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:  # noqa: S310
            return resp.read().decode("utf-8", "replace")

    def scrape(self, now: float | None = None) -> EngineSample:
        """Fetch and parse; an unreachable engine gives ``EngineSample(up=False, error=…)``."""
        try:
            text = self.fetch()
        except Exception as exc:
            return EngineSample(up=False, error=f"{type(exc).__name__}: {exc}"[:200])
        return self.parse(text, now)

    def parse(self, text: str, now: float | None = None) -> EngineSample:
        now = time.monotonic() if now is None else now
        samples = parse_prometheus_text(text)
        s = EngineSample(up=True)
        running = _first(samples, RUNNING)
        waiting = _first(samples, WAITING)
        s.running = int(sum(v for _, v in running)) if running else None
        s.waiting = int(sum(v for _, v in waiting)) if waiting else None
        usage = _first(samples, KV_USAGE)
        if usage:
            s.kv_usage = _clamp01(sum(v for _, v in usage) / len(usage))
        total, block_size = self._cache_config(samples)
        s.kv_blocks_total, s.block_size = total, block_size
        if total is not None and s.kv_usage is not None:
            s.kv_blocks_used = min(total, round(s.kv_usage * total))
        snap = _Snapshot(
            now,
            {k: v for k, names in COUNTERS.items() if (v := _counter(samples, names)) is not None},
            {k: h for k, names in HISTOGRAMS.items() if (h := _histogram(samples, names))},
        )
        if "preemptions" in snap.counters:
            s.preemptions = int(snap.counters["preemptions"])
        if self._cumulative_at is None or now - self._cumulative_at >= self.cumulative_every_s:
            self._cumulative(s, snap, now)
        self._windowed(s, snap)
        self.history.append(snap)
        return s

    def _cumulative(self, s: EngineSample, snap: _Snapshot, now: float) -> None:
        if snap.counters:
            s.counters = {k: int(v) if float(v).is_integer() else v
                          for k, v in snap.counters.items()}
        reported = {REPORT_HISTOGRAMS[k]: r for k, h in snap.histograms.items()
                    if (r := report_histogram(h)) is not None}
        s.histograms = reported or None
        if s.counters or s.histograms:
            self._cumulative_at = now

    def _cache_config(self, samples) -> tuple[int | None, int | None]:
        for labels, _ in _first(samples, CACHE_INFO):
            blocks = labels.get("num_gpu_blocks") or labels.get("num_pages")
            size = labels.get("block_size") or labels.get("page_size")
            try:
                total = int(float(blocks)) if blocks not in (None, "", "None") else None
                bsize = int(float(size)) if size not in (None, "", "None") else None
            except ValueError:
                continue
            if total is not None:
                return total, bsize
        return self.num_gpu_blocks, None

    def _base(self, now: float, window: float) -> _Snapshot | None:
        """The newest earlier snapshot at least ``window`` old, else the oldest one kept."""
        base = None
        for snap in self.history:
            if snap.t <= now - window:
                base = snap
            else:
                break
        if base is None and self.history:
            base = self.history[0]
        return base

    def _windowed(self, s: EngineSample, cur: _Snapshot) -> None:
        # Drop history from before a counter reset: the engine restarted.
        if self.history and any(
            cur.counters.get(k, 0) < v for k, v in self.history[-1].counters.items()
        ):
            self.history.clear()
        rate_base = self._base(cur.t, self.rate_window_s)
        if rate_base is not None and cur.t > rate_base.t:
            dt = cur.t - rate_base.t
            for key, attr in (("prompt_tokens", "prompt_tokens_per_s"),
                              ("generation_tokens", "generation_tokens_per_s")):
                if key in cur.counters and key in rate_base.counters:
                    setattr(s, attr, max(0.0, cur.counters[key] - rate_base.counters[key]) / dt)
        base = self._base(cur.t, self.window_s)
        if base is None:
            return
        dq = cur.counters.get("prefix_queries", 0) - base.counters.get("prefix_queries", 0)
        dh = cur.counters.get("prefix_hits", 0) - base.counters.get("prefix_hits", 0)
        if "prefix_queries" in cur.counters and dq > 0:
            s.prefix_hit_rate = _clamp01(dh / dq)
        for key in ("ttft", "itl"):
            now_h, then_h = cur.histograms.get(key), base.histograms.get(key, {})
            if not now_h:
                continue
            delta = [(le, max(0.0, c - then_h.get(le, 0.0))) for le, c in now_h.items()
                     if le != "sum"]
            setattr(s, f"{key}_p50_s", histogram_quantile(0.5, delta))
            setattr(s, f"{key}_p95_s", histogram_quantile(0.95, delta))
