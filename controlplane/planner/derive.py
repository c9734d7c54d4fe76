"""Planner load inputs from what agents report: the pure half of :mod:`.inputs`.

No Django: :func:`controlplane.planner.inputs.gather_cluster` calls it on the hot-state
worker dicts, and ``bench/planner_shift.py`` calls it on agent-style reports built in
virtual time, so the benchmark exercises the product's own derivation.

Per worker, the keys read (all optional; as ingest stores an agent report): ``running``,
``prefix_hit_rate``, ``prompt_tokens_per_s``, ``generation_tokens_per_s``,
``requests_per_s`` (finished requests per second, from the engine's counter),
``prefill_only_requests_per_s`` (of those, prefill halves of P/D requests decoded elsewhere),
``finished_prompt_tokens_per_s`` and ``finished_generation_tokens_per_s`` (the sums of the
engine's per-request prompt/generation token histograms over the interval: counted when a
request finishes, like the request counter, so their ratio is a length and not a mix of
this window's prompts with the last window's finishes), ``ttft_p95_s``, ``itl_p95_s``
(windowed). Fleet-wide figures, when the control plane has them (merged histograms or
Prometheus), win over the per-worker ones.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

PEAK_DECAY = 0.9  # per planning cycle: a peak fades to a third in ~10 cycles


def _num(state: dict | None, key: str) -> float:
    v = (state or {}).get(key)
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else 0.0


@dataclass(frozen=True)
class DerivedLoad:
    rate_rps: float
    peak_rps: float
    isl_mean: float
    osl_mean: float
    prefix_hit: float
    inflight: int
    rate_source: str  # counters | prometheus | tokens÷expected answer | none


def derive_load(
    wstates: list[dict],
    roles: dict,
    expected_osl: float,
    prev_peak: float = 0.0,
    external_rate: float | None = None,
) -> DerivedLoad:
    """Request rate and lengths from the agents' token rates and request counters.

    Rate: the engines' finished-request counters of the decode-capable workers when
    reported, else an external figure (Prometheus), else generated tokens/s ÷ the model's
    expected answer length. Prompt length: with counters, every worker's prompt tokens ÷
    every worker's finished requests (role-free, see below); else prompt tokens/s of the
    workers that prefill (a decode worker's remote prompts would count twice) ÷ rate.
    Answer length = generated tokens/s ÷ rate."""
    prompt_tps = sum(_num(s, "prompt_tokens_per_s") for s in wstates
                     if roles.get(s.get("worker_id")) != "decode")
    gen_tps = sum(_num(s, "generation_tokens_per_s") for s in wstates)
    # Sequences held by decode-capable workers (prefill workers' running are prompts).
    running = int(sum(_num(s, "running") for s in wstates
                      if roles.get(s.get("worker_id")) != "prefill"))
    # Prefix hit: every worker's hit rate weighted by the prompt tokens it saw, whatever its
    # role. Under the gateway's conditional P/D a decode worker prefills short prompts
    # itself, so leaving decode workers out (and averaging workers unweighted) read the
    # demo's chat on 5P:3D as 0–25 % cached — the prefill workers' few cold prompts — where
    # every prompt found half of itself cached (issue 17, fifth pass).
    hits = [(_num(s, "prefix_hit_rate"), _num(s, "prompt_tokens_per_s")) for s in wstates
            if s.get("prefix_hit_rate") is not None]
    weight = sum(n for _h, n in hits)
    hit = (sum(h * n for h, n in hits) / weight if weight > 0
           else sum(h for h, _n in hits) / len(hits) if hits else 0.0)
    # A request finishes once where its answer streams. Under P/D its prefill half also
    # finishes (after one token) where it was prefilled: on a 'prefill' worker (not
    # counted) or, mid-move under the gateway's router, on a 'both' worker prefilling for a
    # 'decode' one — counted twice unless the report says how many of its finishes were
    # such halves (``prefill_only_requests_per_s``: the engine's generation-token histogram
    # bucket le=1). Uncorrected, "2P + 1D + 9 both" read 14 req/s for 8 offered, and the
    # apparent load shift rolled a split back inside one RAG phase (issue 17).
    rate = sum(max(_num(s, "requests_per_s") - _num(s, "prefill_only_requests_per_s"), 0.0)
               for s in wstates if roles.get(s.get("worker_id")) != "prefill")
    source = "counters" if rate > 0 else "none"
    if not rate and external_rate:
        rate, source = float(external_rate), "prometheus"
    osl = float(expected_osl or 256)
    if not rate and gen_tps > 0:
        rate, source = gen_tps / osl, "tokens÷expected answer"
    elif rate > 0 and gen_tps > 0:
        osl = gen_tps / rate
    isl = prompt_tps / rate if rate > 0 else 0.0
    if source == "counters":
        # Prompt tokens ÷ finished requests over *every* worker: under P/D both halves of a
        # request count its prompt (the prefill engine computes it, the decode engine
        # counts it on arrival by transfer) and both finish it (the prefill half after one
        # token), so the ratio is exact whatever the roles. Per-role sums are not: a 'both'
        # worker that decodes a request prefilled elsewhere counted its prompt a second time
        # on the prefill side, and one that prefills for a decode worker counted a second
        # finish on the decode side (mid-move, under the gateway's router).
        all_prompt = sum(_num(s, "prompt_tokens_per_s") for s in wstates)
        all_fin = sum(_num(s, "requests_per_s") for s in wstates)  # halves included
        if all_prompt > 0 and all_fin > 0:
            isl = all_prompt / all_fin
    fin_prompt = sum(_num(s, "finished_prompt_tokens_per_s") for s in wstates
                     if roles.get(s.get("worker_id")) != "prefill")
    fin_gen = sum(_num(s, "finished_generation_tokens_per_s") for s in wstates
                  if roles.get(s.get("worker_id")) != "prefill")
    if source == "counters" and fin_prompt > 0:
        isl, osl = fin_prompt / rate, (fin_gen / rate if fin_gen > 0 else osl)
    peak = max(rate, prev_peak * PEAK_DECAY)
    return DerivedLoad(rate, peak, isl, osl, hit, running, source)


# Fewer finished requests than this in the window: a share of a handful of prompts is
# noise, not a mix (None: the cost model places the share on its fitted prompts).
LOCAL_SHARE_MIN_REQUESTS = 20.0


class _PromptHistogram(Protocol):
    @property
    def count(self) -> float: ...

    def share_at_most(self, x: float) -> float | None: ...


def local_prefill_share(prompts: _PromptHistogram | None, prefix_hit: float,
                        max_tokens: float,
                        min_requests: float = LOCAL_SHARE_MIN_REQUESTS) -> float | None:
    """Share of requests conditional P/D prefills on their decode worker — those whose part
    not cached, (1 − hit) × prompt length, is at most ``max_tokens`` (gateway.router,
    "pd_local_prefill") — from the fleet's merged prompt-length histogram (the engines'
    ``vllm:request_prompt_tokens``, every finished request once; :class:`~controlplane.
    telemetry.histograms.Histogram` or anything with ``count`` and ``share_at_most``).

    The histogram's share at or below ``max_tokens ÷ (1 − hit)``, linear inside the bucket
    (exact on a bucket bound). Approximation: every prompt is taken to find the fleet's
    mean share cached. Hits are per request (a prompt finds its prefix or not), so where
    some prompts hit fully and others not at all this misplaces the share — the gateway's
    own decisions (Prometheus) do not, and win when there. vLLM's token buckets are coarse
    (1-2-5: the limit 512 falls in 500–1000), so the interpolation is the rest of the
    error. None when the histogram is missing, holds under ``min_requests`` requests, or
    the inputs are not numbers; 0 when ``max_tokens`` ≤ 0 (every prompt goes remote)."""
    if prompts is None or not prompts.count >= min_requests:
        return None
    if math.isnan(max_tokens) or math.isnan(prefix_hit):
        return None
    if max_tokens <= 0:
        return 0.0
    hit = min(max(float(prefix_hit), 0.0), 1.0)
    limit = math.inf if hit >= 1.0 else float(max_tokens) / (1.0 - hit)
    share = prompts.share_at_most(limit)
    return None if share is None else min(max(share, 0.0), 1.0)


# The workload mix: what a window's finished requests say about prompts and answers.
MIX_KEYS = ("isl_mean", "isl_p50", "isl_p95", "osl_mean", "osl_p95", "prefix_hit")
L = TypeVar("L")


def carry_mix(load: L, previous: dict | None) -> tuple[L, str]:
    """(load, note): a window that finished no request says nothing about prompt or answer
    lengths, so the planned load (the decaying peak) is priced with the last window's mix
    that had traffic — ``previous``, the load the planner was given last cycle — instead of
    zero-token prompts. ``load`` is any dataclass with the :data:`MIX_KEYS` fields (the
    planner's ``LoadInput``); returned unchanged when it has its own mix or nothing is
    known (the note then is "").

    The demo's 8B model, idle from the first RAG window on, was planned for its chat peak
    with 0-token prompts (every layout "TTFT 4.9 ms") and split to 1P:11D (issue 17)."""
    rate = getattr(load, "rate_rps", 0.0) or 0.0
    if rate > 0 and (getattr(load, "isl_mean", 0.0) or 0.0) > 0:
        return load, ""
    prev = previous if isinstance(previous, dict) else {}
    if not isinstance(prev.get("isl_mean"), int | float) or prev["isl_mean"] <= 0:
        return load, ""
    mix = {}
    for k in MIX_KEYS:
        v = prev.get(k)
        if k in ("isl_mean", "osl_mean", "prefix_hit"):
            mix[k] = float(v) if isinstance(v, int | float) and v >= 0 else getattr(load, k)
        else:
            mix[k] = float(v) if isinstance(v, int | float) and v > 0 else None
    carried = replace(load, **mix)
    why = "finished no request" if rate <= 0 else "reported no prompt lengths"
    return carried, (
        f"this window {why}: prompts {mix['isl_mean']:,.0f} tokens and answers "
        f"{mix['osl_mean']:,.0f} are the last window's with traffic")


def worst_p95(wstates: list[dict]) -> tuple[float | None, float | None]:
    """(TTFT p95 s, ITL p95 s): the worst windowed p95 the agents reported (a stand-in until
    fleet histograms are merged; a worst worker over-states the fleet's p95)."""

    def worst(key):
        values = [s.get(key) for s in wstates
                  if isinstance(s.get(key), int | float) and not isinstance(s.get(key), bool)]
        return max(values) if values else None

    return worst("ttft_p95_s"), worst("itl_p95_s")


@dataclass(frozen=True)
class LoadSmoother:
    """EWMA of rate and lengths over planning cycles that restarts on a phase change.

    One window can hold a handful of requests; averaging over a few cycles steadies the
    planner's load. A window whose rate or prompt/answer length differs from the average by
    more than ``reset_shift`` is a new phase: the average restarts from it (dragging the old
    mix along would plan, and calibrate, for a load that no longer exists)."""

    rate_rps: float = 0.0
    isl_mean: float = 0.0
    osl_mean: float = 0.0
    prefix_hit: float = 0.0
    windows: int = 0
    alpha: float = 0.5
    reset_shift: float = 0.5

    def update(self, d: DerivedLoad) -> tuple[LoadSmoother, bool]:
        """(new average, whether this window started a new phase)."""
        if d.rate_rps <= 0:
            return self, False

        def rel(a: float, b: float) -> float:
            return abs(a - b) / max(b, 1e-9)

        shifted = self.windows > 0 and max(
            rel(d.rate_rps, self.rate_rps), rel(d.isl_mean, self.isl_mean),
            rel(d.osl_mean, self.osl_mean)) > self.reset_shift
        if self.windows == 0 or shifted:
            return LoadSmoother(d.rate_rps, d.isl_mean, d.osl_mean, d.prefix_hit, 1,
                                self.alpha, self.reset_shift), shifted
        a = self.alpha

        def mix(old: float, new: float) -> float:
            return (1 - a) * old + a * new

        return LoadSmoother(mix(self.rate_rps, d.rate_rps), mix(self.isl_mean, d.isl_mean),
                            mix(self.osl_mean, d.osl_mean), mix(self.prefix_hit, d.prefix_hit),
                            self.windows + 1, a, self.reset_shift), False

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("rate_rps", "isl_mean", "osl_mean",
                                               "prefix_hit", "windows")}

    @classmethod
    def from_dict(cls, d: dict | None) -> LoadSmoother:
        if not isinstance(d, dict):
            return cls()
        try:
            return cls(float(d["rate_rps"]), float(d["isl_mean"]), float(d["osl_mean"]),
                       float(d.get("prefix_hit", 0.0)), int(d.get("windows", 0)))
        except (KeyError, TypeError, ValueError):
            return cls()


def counting_roles(workers, now: float, window_s: float) -> dict:
    """Worker id → the role its finished requests are counted under (the ``roles`` of
    :func:`derive_load` and of the engines' merged histograms): its role, but ``"both"``
    while it drains and when its role changed within the last ``window_s`` seconds.
    ``workers``: anything with ``id``, ``role``, ``state`` and ``changed_at`` (epoch seconds
    or None; the planner's ``WorkerInput``).

    A worker that is leaving decode for prefill still finishes the answers it was
    decoding, and the window's counters hold them after its drain too. Counted under its
    new role, they went missing: four workers leaving decode mid-move in the demo read 3.95
    finished requests a second for a window where 152 finished in 20 s (7.6/s), and the
    arriving rate built on it read 0. As "both" its finishes count with its prefill halves
    taken out (``prefill_only_requests_per_s``, the generation histogram's le=1 bucket),
    which is what a worker serving both kinds at once needs (issue 17)."""
    out = {}
    for w in workers:
        changed = getattr(w, "changed_at", None)
        moving = getattr(w, "state", "") == "draining" or (
            changed is not None and now - changed < window_s)
        out[w.id] = "both" if moving else w.role
    return out


def in_system(workers) -> int:
    """Requests the engines hold now, running or waiting, over every worker (anything with
    ``running`` and ``waiting``: the planner's ``WorkerInput``). Under P/D a request is
    held by one side at a time: its prefill half leaves the prefill engine as it finishes."""
    return int(sum(max(getattr(w, "running", 0) or 0, 0) + max(getattr(w, "waiting", 0) or 0, 0)
                   for w in workers))


# The offered load differs from the finished one by more than this share: the fleet is
# filling or emptying a backlog (the planner's load then follows the arrivals).
BACKLOG_SHIFT = 0.25
# ... and the count held changed by more than this many standard deviations of a steady
# state's arrivals − finishes over the window: a control chart's limit, as the test runs
# every cycle (at 2σ one steady window in twenty would read as a backlog).
BACKLOG_SIGMAS = 3.0


def with_arrivals(load: L, held_now: int, held_before: int | None, window_s: float,
                  peak_before: float, finished_rps: float | None = None) -> tuple[L, str]:
    """(load, note): the load at the rate requests *arrive*, by conservation — those that
    finished in the window plus the change in those the engines hold — when that differs
    from the load's rate by more than :data:`BACKLOG_SHIFT`. ``load`` is any dataclass
    with ``rate_rps`` and ``peak_rps`` (the planner's ``LoadInput``); ``peak_before`` is the
    decaying peak as it was before this window, so that the peak follows the arrivals too.
    ``finished_rps``: the rate requests finished at in this same window, where the load's
    rate is something else (a smoothed rate, as bench/planner_shift.py's loop keeps): the
    conservation sum is over one window, so its two terms must be that window's. Default:
    the load's rate (the live path plans on each window's rate as derived).

    Finished requests are what a fleet *serves*. In a surge past its capacity that is the
    capacity, not the load: four H200 servers at 4× Mooncake, aggregated, finished 324
    requests in a window where 470 arrived, and the planner chose 28P:4D for 10 req/s — a
    layout that cannot keep up at the 16 that were coming, whose backlog then grew to a
    TTFT p95 of 100 s. After the surge the fleet works off its backlog and finishes more
    than arrives (419 against 121), which read as a surge still on.

    A steady window stays on the finished rate. There the held count moves by arrivals −
    finishes, two counts of ~n = rate × window each, Poisson-like: a change within
    :data:`BACKLOG_SIGMAS` standard deviations of that difference, √(2n), is a burst of
    arrivals, not a backlog (the demo's RAG at 6 req/s: 153 arrived in a 20 s window
    where 126 finished, 36 more were held — under 3σ = 47 — and read as 7.9 req/s it moved
    the fleet for a phase that had not changed)."""
    rate = float(getattr(load, "rate_rps", 0.0) or 0.0)
    finished = rate if finished_rps is None else max(float(finished_rps), 0.0)
    if held_before is None or not window_s > 0 or rate <= 0 or finished <= 0:
        return load, ""
    change = held_now - held_before
    arriving = max(finished + change / window_s, 0.0)
    if abs(arriving - rate) <= BACKLOG_SHIFT * rate or (
            abs(change) <= BACKLOG_SIGMAS * math.sqrt(2.0 * finished * window_s)):
        return load, ""
    peak = max(arriving, float(peak_before or 0.0) * PEAK_DECAY)
    grew = held_now > held_before
    return replace(load, rate_rps=arriving, peak_rps=peak), (
        f"requests {'arrive' if grew else 'arrived'} at {arriving:.2f}/s, not the "
        f"{finished:.2f}/s that finished: the engines hold {held_now:,} against {held_before:,} "
        f"{window_s:g} s ago (a backlog {'filling' if grew else 'draining'})")


# The mix arriving differs from the finished one by more than this share of the load's
# mean prompt (calibration's STABLE_SHIFT: the share past which a window is not compared)
# *and* by more than MIX_SIGMAS standard errors of the two means: a control chart's limit,
# as with the backlog test above. Mooncake's prompts spread so widely (p95 ≈ 4× the mean)
# that a 25 % gap between two windows' means is routine sampling noise there.
MIX_SHIFT = 0.25
MIX_SIGMAS = 3.0


@dataclass(frozen=True)
class FirstTokens:
    """A window's requests seen at their first token, beside those seen finishing.

    ``rate_rps``: first tokens per second (the prefill side's TTFT histogram count ÷ the
    window); ``prompt_mean``: their mean prompt (its prompt-token counter ÷ that count);
    ``finished``: requests finished in the window (the count behind the load's prompt
    figures); ``waiting_change``: the change over the window in requests waiting in the
    engines' queues (not yet prefilled), None when unknown."""

    rate_rps: float
    prompt_mean: float
    window_s: float
    finished: float
    waiting_change: int | None = None


def prompt_sd(load) -> float | None:
    """Standard deviation of the load's prompts, from its mean and the lognormal fit of its
    p50 and p95 (the spread the cost model prices); None without a spread."""
    mean, p50, p95 = (getattr(load, k, None) for k in ("isl_mean", "isl_p50", "isl_p95"))
    if not (mean and p50 and p95) or p50 <= 0 or p95 < p50:
        return None
    sigma = math.log(p95 / p50) / 1.645
    return mean * math.sqrt(math.expm1(sigma * sigma))


def with_arriving_mix(load: L, first: FirstTokens | None) -> tuple[L, str]:
    """(load, note): the load as the requests *starting* in the window describe it, when
    their prompts differ from the finished requests' by more than sampling noise.

    A request is counted as it finishes, a prompt's life after it arrived. Right after the
    traffic changes kind the finished requests are still the old kind's: in the demo's
    first RAG window (20 s cycles) they read prompts of 1,047 tokens at 8.6 req/s (chat's
    backlog finishing) while the requests getting their first token had prompts of 3,933
    tokens and arrived at 6.5 req/s. Planned on the finished mix, the window holds and the
    move comes a cycle later, with a third of the RAG phase served in chat's layout.

    The first tokens lead the finishes by a request's decode time, and their count is the
    rate the fleet starts requests at; with the change in those waiting to start, it is
    the rate they arrive at (requests are conserved in the queue). The prompt spread of
    the finished requests is the old mix's, so the new load has the mean only (p50/p95
    None) until the finishes catch up, one window later. The recent peak is kept, as it is
    across any change of mix (it is the headroom the planner keeps for a surge of whatever
    arrives): restarting it at the new rate read 0.977 → 0.952 of the best static layout
    on the 90 s demo with 20 s cycles (docs/benchmarks.md)."""
    rate, mean = float(getattr(load, "rate_rps", 0.0) or 0.0), float(load.isl_mean or 0.0)
    if first is None or rate <= 0 or mean <= 0 or not first.window_s > 0:
        return load, ""
    started = first.rate_rps * first.window_s
    sd = prompt_sd(load)
    if started < 2 or first.finished < 2 or sd is None or not first.prompt_mean > 0:
        return load, ""
    gap = first.prompt_mean - mean
    noise = sd * math.sqrt(1.0 / started + 1.0 / first.finished)
    if abs(gap) <= MIX_SHIFT * mean or abs(gap) <= MIX_SIGMAS * noise:
        return load, ""
    arriving = first.rate_rps
    if first.waiting_change is not None:
        arriving = max(arriving + first.waiting_change / first.window_s, 0.0)
    if arriving <= 0:
        return load, ""
    peak = max(float(getattr(load, "peak_rps", 0.0) or 0.0), arriving)
    return replace(load, rate_rps=arriving, peak_rps=peak, isl_mean=first.prompt_mean,
                   isl_p50=None, isl_p95=None), (
        f"the mix changed: requests starting in the window had prompts of "
        f"{first.prompt_mean:,.0f} tokens and arrived at {arriving:.2f}/s, those finishing "
        f"{mean:,.0f} tokens at {rate:.2f}/s (planned on the starting ones)")
