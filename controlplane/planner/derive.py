"""Planner load inputs from what agents report: the pure half of :mod:`.inputs`.

No Django: :func:`controlplane.planner.inputs.gather_cluster` calls it on the hot-state
worker dicts, and ``bench/planner_shift.py`` calls it on agent-style reports built in
virtual time, so the benchmark exercises the product's own derivation.

Per worker, the keys read (all optional; as ingest stores an agent report): ``running``,
``prefix_hit_rate``, ``prompt_tokens_per_s``, ``generation_tokens_per_s``,
``requests_per_s`` (finished requests per second, from the engine's counter),
``finished_prompt_tokens_per_s`` and ``finished_generation_tokens_per_s`` (the sums of the
engine's per-request prompt/generation token histograms over the interval: counted when a
request finishes, like the request counter, so their ratio is a length and not a mix of
this window's prompts with the last window's finishes), ``ttft_p95_s``, ``itl_p95_s``
(windowed). Fleet-wide figures, when the control plane has them (merged histograms or
Prometheus), win over the per-worker ones.
"""

from __future__ import annotations

from dataclasses import dataclass

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

    Rate: the engines' finished-request counters when reported, else an external figure
    (Prometheus), else generated tokens/s ÷ the model's expected answer length. Prompt
    length = prompt tokens/s of the workers that prefill (a decode worker's remote prompts
    would count twice) ÷ rate; answer length = generated tokens/s ÷ rate."""
    prompt_tps = sum(_num(s, "prompt_tokens_per_s") for s in wstates
                     if roles.get(s.get("worker_id")) != "decode")
    gen_tps = sum(_num(s, "generation_tokens_per_s") for s in wstates)
    # Sequences held by decode-capable workers (prefill workers' running are prompts).
    running = int(sum(_num(s, "running") for s in wstates
                      if roles.get(s.get("worker_id")) != "prefill"))
    hits = [_num(s, "prefix_hit_rate") for s in wstates
            if s.get("prefix_hit_rate") is not None
            and roles.get(s.get("worker_id")) != "decode"]
    rate = sum(_num(s, "requests_per_s") for s in wstates
               if roles.get(s.get("worker_id")) != "prefill")
    source = "counters" if rate > 0 else "none"
    if not rate and external_rate:
        rate, source = float(external_rate), "prometheus"
    osl = float(expected_osl or 256)
    if not rate and gen_tps > 0:
        rate, source = gen_tps / osl, "tokens÷expected answer"
    elif rate > 0 and gen_tps > 0:
        osl = gen_tps / rate
    isl = prompt_tps / rate if rate > 0 else 0.0
    fin_prompt = sum(_num(s, "finished_prompt_tokens_per_s") for s in wstates
                     if roles.get(s.get("worker_id")) != "prefill")
    fin_gen = sum(_num(s, "finished_generation_tokens_per_s") for s in wstates
                  if roles.get(s.get("worker_id")) != "prefill")
    if source == "counters" and fin_prompt > 0:
        isl, osl = fin_prompt / rate, (fin_gen / rate if fin_gen > 0 else osl)
    peak = max(rate, prev_peak * PEAK_DECAY)
    return DerivedLoad(rate, peak, isl, osl, sum(hits) / len(hits) if hits else 0.0, running,
                       source)


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
