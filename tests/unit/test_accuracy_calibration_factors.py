"""prediction_accuracy's calibration factors are what the online calibration compares."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

pa = pytest.importorskip("prediction_accuracy")


def _cell(sim: dict, pred: dict) -> dict:
    base_sim = {"share": 1.0, "requests": 200, "window_s": 100.0, "lifetime_s": 1.0,
                "ttft_growth_s": 0.0, "ttft_growth_rate": 0.0, "goodput_rps": 2.0}
    base_pred = {"share": 1.0, "overloaded": False, "goodput_rps": 2.0, "capacity_rps": 4.0}
    return {"cluster": "c", "workload": "w", "load": 1.0, "layout": "aggregated",
            "slo": {"ttft_ms": 2000, "itl_ms": 50}, "sim": base_sim | sim,
            "pred": base_pred | pred}


def test_itl_is_compared_on_the_mean_gap_as_the_calibration_does():
    # A knife-edge ITL p95 (a chunk-carrying step) 20× the prediction, means level: the
    # calibration (service._calibrate) compares means, so its factor settles at 1.1.
    c = _cell({"ttft_p95_s": 0.5, "itl_p95_s": 0.4, "itl_mean_s": 0.022},
              {"ttft_p95_s": 0.5, "itl_p95_s": 0.02, "itl_mean_s": 0.020})
    out = pa.summarise([c])
    assert c["calibration_factors"] == pytest.approx({"ttft": 1.0, "itl": 1.1})
    assert out["calibration_factor_range"] == pytest.approx([1.0, 1.1])
    assert out["calibration_factors_in_band"] == out["calibration_factors"] == 2
    assert out["p95_ratio_range"] == pytest.approx([1.0, 20.0])


def test_a_cell_without_mean_gaps_scores_ttft_only():
    c = _cell({"ttft_p95_s": 0.9, "itl_p95_s": 0.02}, {"ttft_p95_s": 0.5, "itl_p95_s": 0.02})
    out = pa.summarise([c])
    assert set(c["calibration_factors"]) == {"ttft"}
    assert out["calibration_factor_range"] == pytest.approx([1.8, 1.8])
    assert out["calibration_factors_in_band"] == 0


def test_a_censored_run_gives_no_factor():
    # The window is shorter than one request's life: a transient, not a steady state.
    c = _cell({"ttft_p95_s": 1.4, "itl_p95_s": 0.4, "itl_mean_s": 0.19, "window_s": 1.3,
               "lifetime_s": 57.0},
              {"ttft_p95_s": 1.5, "itl_p95_s": 0.02, "itl_mean_s": 0.04})
    out = pa.summarise([c])
    assert c["calibration_factors"] == {}
    assert out["calibration_factor_range"] is None
    assert out["p95_ratio_range"] == pytest.approx([1.4 / 1.5, 20.0])
