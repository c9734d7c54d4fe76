"""Online calibration that a phase change cannot poison.

Pure. Each factor is an EWMA of measured ÷ predicted p95 (TTFT and ITL separately), with
three guards (issue 16, item 4):

* **same window, same mix** — a prediction is compared with a measurement only when the
  workload the prediction was made for is the one the measurement saw: the load must have
  stayed in the same bucket and within :data:`STABLE_SHIFT` of the previous cycle's (a
  windowed p95 still holds the last phase's requests right after a shift);
* **per workload bucket** — factors are kept per bucket of prompt and answer length (a
  RAG-phase factor is not applied to the quiet phase), so a mix shift switches factors
  instead of dragging one across; and per octave of request rate, because the model's error
  depends on the operating point (service time at low load, queueing near capacity): the
  bench's demo learnt a TTFT factor of 2.0 and an ITL factor of 1.13 in its quiet phase (1.8
  req/s of chat-length prompts) and applied them to chat at 10 req/s, where they made 4P:4D
  look short of the ITL target (69 % within targets; the simulator: as good as any layout)
  and moved it to 2P:6D, back in the next RAG phase (issue 17);
* **bounded, loudly** — a factor that wants to leave [:data:`MIN_FACTOR`,
  :data:`MAX_FACTOR`] is held at the bound *and* reported as a model error (explanation,
  metric): past a factor of 2 the cost model is wrong, not uncalibrated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .costmodel import CostParams

MIN_FACTOR = 0.5
MAX_FACTOR = 2.0
STABLE_SHIFT = 0.25  # largest relative change of rate/lengths between cycles to compare
_ISL_EDGES = (512, 2048, 8192, 32768)


def first_token_shift(first_token_isl, isl_mean: float) -> float | None:
    """How far the mean prompt of the requests whose first token came in the window is from
    the load's (finished requests'), relative to the load's; None when either is unknown.
    Past :data:`STABLE_SHIFT`, a mix is still arriving: the finished requests trail it."""
    if not (isinstance(first_token_isl, int | float) and math.isfinite(first_token_isl)
            and first_token_isl > 0 and isl_mean > 0):
        return None
    return abs(first_token_isl - isl_mean) / isl_mean
_OSL_EDGES = (128, 512, 2048)


@dataclass(frozen=True)
class Calibration:
    ttft_factor: float = 1.0
    itl_factor: float = 1.0
    samples: int = 0
    # The unbounded EWMA: where the factor would go if it were not held in range.
    ttft_wanted: float = 1.0
    itl_wanted: float = 1.0

    def apply(self, params: CostParams) -> CostParams:
        return replace(params, ttft_factor=self.ttft_factor, itl_factor=self.itl_factor)

    def as_dict(self) -> dict:
        return {"ttft_factor": self.ttft_factor, "itl_factor": self.itl_factor,
                "samples": self.samples, "ttft_wanted": self.ttft_wanted,
                "itl_wanted": self.itl_wanted}

    @classmethod
    def from_dict(cls, d: dict | None) -> Calibration:
        if not isinstance(d, dict):
            return cls()
        try:
            return cls(*(float(d.get(k, 1.0)) for k in ("ttft_factor", "itl_factor")),
                       int(d.get("samples", 0)),
                       float(d.get("ttft_wanted", d.get("ttft_factor", 1.0))),
                       float(d.get("itl_wanted", d.get("itl_factor", 1.0))))
        except (TypeError, ValueError):
            return cls()

    def model_errors(self) -> list[dict]:
        """The factors that want out of range: the cost model misses by more than 2×."""
        out = []
        for metric, wanted in (("TTFT", self.ttft_wanted), ("ITL", self.itl_wanted)):
            if self.samples and not MIN_FACTOR <= wanted <= MAX_FACTOR:
                out.append({"metric": metric, "wanted": round(wanted, 4),
                            "held_at": MAX_FACTOR if wanted > MAX_FACTOR else MIN_FACTOR})
        return out


def _ratio(measured: float | None, predicted: float | None) -> float | None:
    ok = (
        measured is not None and predicted is not None
        and math.isfinite(measured) and math.isfinite(predicted)
        and measured > 0 and predicted > 0
    )
    return measured / predicted if ok else None


def update(
    cal: Calibration,
    predicted_ttft: float | None,
    measured_ttft: float | None,
    predicted_itl: float | None,
    measured_itl: float | None,
    alpha: float = 0.2,
) -> Calibration:
    """New factors after one comparison. ``predicted_*`` are the *uncalibrated* p95s (the
    prediction divided by the factor in force), so the factor converges to measured ÷ model.
    Missing or non-finite values leave that factor as it was."""

    def step(wanted: float, ratio: float | None) -> float:
        if ratio is None:
            return wanted
        # The unbounded EWMA is itself kept within a wide band so one absurd scrape cannot
        # park it where it takes hundreds of cycles to come back.
        return min(max((1 - alpha) * wanted + alpha * ratio, MIN_FACTOR / 4), MAX_FACTOR * 4)

    r_ttft = _ratio(measured_ttft, predicted_ttft)
    r_itl = _ratio(measured_itl, predicted_itl)
    if r_ttft is None and r_itl is None:
        return cal
    tw, iw = step(cal.ttft_wanted, r_ttft), step(cal.itl_wanted, r_itl)
    return Calibration(_bound(tw), _bound(iw), cal.samples + 1, tw, iw)


def _bound(x: float) -> float:
    return min(max(x, MIN_FACTOR), MAX_FACTOR)


def _edge_bucket(x: float, edges: tuple[int, ...]) -> int:
    return sum(1 for e in edges if x >= e)


def bucket_of(isl_mean: float, osl_mean: float, rate_rps: float | None = None) -> str:
    """Workload bucket: prompt length (<512, <2k, <8k, <32k, more) × answer length, and
    with ``rate_rps`` its octave (``r3``: 8 to 16 req/s; ``r-4`` holds everything under
    1/8 req/s; ``idle`` no traffic)."""
    key = f"isl{_edge_bucket(isl_mean, _ISL_EDGES)}-osl{_edge_bucket(osl_mean, _OSL_EDGES)}"
    if rate_rps is None:
        return key
    if not (isinstance(rate_rps, int | float) and math.isfinite(rate_rps) and rate_rps > 0):
        return f"{key}-idle"
    return f"{key}-r{max(math.floor(math.log2(rate_rps)), -4)}"


@dataclass(frozen=True)
class LoadPoint:
    rate_rps: float
    isl_mean: float
    osl_mean: float

    def shift_from(self, other: LoadPoint | None) -> float:
        if other is None:
            return math.inf

        def rel(a: float, b: float) -> float:
            return abs(a - b) / max(abs(b), 1e-9) if a or b else 0.0

        return max(rel(self.rate_rps, other.rate_rps), rel(self.isl_mean, other.isl_mean),
                   rel(self.osl_mean, other.osl_mean))


@dataclass
class CalibrationBook:
    """Factors per workload bucket and the load of the previous cycle (JSON in the planner
    state)."""

    buckets: dict[str, Calibration]
    last: LoadPoint | None = None
    last_bucket: str = ""
    skipped: str = ""  # why the last cycle did not compare (for the record)

    @classmethod
    def from_dict(cls, d: dict | None) -> CalibrationBook:
        if not isinstance(d, dict):
            return cls({})
        buckets = {str(k): Calibration.from_dict(v)
                   for k, v in (d.get("buckets") or {}).items() if isinstance(v, dict)}
        last = d.get("last")
        point = None
        if isinstance(last, dict):
            try:
                point = LoadPoint(float(last["rate_rps"]), float(last["isl_mean"]),
                                  float(last["osl_mean"]))
            except (KeyError, TypeError, ValueError):
                point = None
        return cls(buckets, point, str(d.get("last_bucket", "")), str(d.get("skipped", "")))

    def as_dict(self) -> dict:
        return {
            "buckets": {k: v.as_dict() for k, v in sorted(self.buckets.items())},
            "last": None if self.last is None else dict(self.last.__dict__),
            "last_bucket": self.last_bucket,
            "skipped": self.skipped,
        }

    def factors_for(self, isl_mean: float, osl_mean: float,
                    rate_rps: float) -> tuple[str, Calibration]:
        key = bucket_of(isl_mean, osl_mean, rate_rps)
        return key, self.buckets.get(key, Calibration())

    def observe(
        self, load: LoadPoint, raw_ttft: float | None, measured_ttft: float | None,
        raw_itl: float | None, measured_itl: float | None,
        measured_isl: float | None = None, backlog: str = "",
    ) -> Calibration:
        """One cycle: compare only if this window's mix matches the previous one's and the
        requests the measured p95 counted had the load's prompts (``measured_isl``: the
        mean prompt of the requests whose first token came in the window, when known) and
        the window is a steady state (``backlog``: why not — a backlog filling or draining,
        whose queueing the steady-state model does not price; derive.with_arrivals);
        always remember this window's load. Returns the bucket's (possibly updated)
        factors."""
        key = bucket_of(load.isl_mean, load.osl_mean, load.rate_rps)
        cal = self.buckets.get(key, Calibration())
        shift = load.shift_from(self.last)
        arriving = first_token_shift(measured_isl, load.isl_mean) or 0.0
        if key != self.last_bucket:
            self.skipped = f"mix shift ({self.last_bucket or 'none'} → {key})"
        elif arriving > STABLE_SHIFT:
            # The finished requests (the load) trail the first tokens (the measured TTFT)
            # by a request's life: on the window after chat → RAG the load still read chat
            # prompts while the TTFT p95 was RAG's, and one comparison parked the chat
            # factor at 2.0 (issue 17).
            self.skipped = (f"a mix still arriving: first tokens came from prompts of "
                            f"{measured_isl:,.0f} tokens, the load's are {load.isl_mean:,.0f}")
        elif backlog:
            self.skipped = backlog
        elif shift > STABLE_SHIFT:
            self.skipped = f"load moved {shift:.0%} since the last window"
        elif load.rate_rps <= 0:
            self.skipped = "no traffic"
        else:
            self.skipped = ""
            cal = update(cal, raw_ttft, measured_ttft, raw_itl, measured_itl)
            self.buckets[key] = cal
        self.last, self.last_bucket = load, key
        return cal
