"""Online calibration: scale predictions by how far they missed what was later measured.

Pure. Each factor is an EWMA of measured ÷ predicted p95 (TTFT and ITL separately),
clamped so a bad scrape cannot swing the model by more than a factor of 4 either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .costmodel import CostParams

MIN_FACTOR = 0.25
MAX_FACTOR = 4.0


@dataclass(frozen=True)
class Calibration:
    ttft_factor: float = 1.0
    itl_factor: float = 1.0
    samples: int = 0

    def apply(self, params: CostParams) -> CostParams:
        return replace(params, ttft_factor=self.ttft_factor, itl_factor=self.itl_factor)

    def as_dict(self) -> dict:
        return {"ttft_factor": self.ttft_factor, "itl_factor": self.itl_factor,
                "samples": self.samples}


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
    def step(old: float, ratio: float | None) -> float:
        if ratio is None:
            return old
        new = (1 - alpha) * old + alpha * ratio
        return min(max(new, MIN_FACTOR), MAX_FACTOR)

    r_ttft = _ratio(measured_ttft, predicted_ttft)
    r_itl = _ratio(measured_itl, predicted_itl)
    if r_ttft is None and r_itl is None:
        return cal
    return Calibration(
        step(cal.ttft_factor, r_ttft), step(cal.itl_factor, r_itl), cal.samples + 1
    )
