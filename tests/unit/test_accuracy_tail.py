"""The prediction benchmark's cool-down tail (bench/prediction_accuracy.py, issue 16): the
measured requests live their whole lives under steady arrivals, and the tail is simulated
but never measured."""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

pa = pytest.importorskip("prediction_accuracy")

RTX, H200 = "two-rtxpro-servers", "four-h200nvl-servers"


@pytest.mark.parametrize("cluster,name", [(RTX, "azure-conv"), (H200, "rag-4k")])
def test_the_tail_is_the_next_arrivals_for_one_life_at_the_targets(cluster, name):
    if name not in pa.TRACES and name not in pa.scenarios():
        pytest.skip(f"no workload {name}")
    m = 40
    plain, _ = pa.make_workload(pa.CLUSTERS[cluster], name, 1.0, m)
    wl, slo, tail = pa.with_tail(pa.CLUSTERS[cluster], name, 1.0, m)
    head = [r for r in wl.requests if r.request_id not in tail]
    # The measured arrivals are exactly the ones the run without a tail had.
    assert [(r.request_id, r.arrival) for r in head] == [
        (r.request_id, r.arrival) for r in sorted(plain.requests, key=lambda r: r.arrival)]
    measured = head[int(m * pa.WARMUP_SHARE):]
    life = (slo["ttft_ms"] + sum(r.output_length for r in measured) / len(measured)
            * slo["itl_ms"]) / 1000
    t_m = head[-1].arrival
    later = [r for r in wl.requests if r.request_id in tail]
    assert tail and len(later) == len(tail) <= pa.TAIL_MAX * len(measured)
    assert all(t_m <= r.arrival <= t_m + life for r in later)


def test_the_tail_is_simulated_but_not_measured():
    cluster = pa.CLUSTERS[H200]
    m = 40
    plain, slo = pa.make_workload(cluster, "azure-conv", 1.0, m)
    wl, _slo, tail = pa.with_tail(cluster, "azure-conv", 1.0, m)
    before = pa.simulate(cluster, plain, slo, 0, trace=True)
    after = pa.simulate(cluster, wl, slo, 0, trace=True, tail=tail)
    # The model's inputs come from the same measured requests.
    for k in ("requests", "rate_rps", "window_s", "isl_mean", "osl_mean", "arrival_cv2",
              "burst_rate_rps", "local_prefill_share"):
        assert after[k] == pytest.approx(before[k]), k
    # The simulator is causal: the gaps in the measured window, hence ITL p95 and the
    # request life that sets the lengthening, do not see the tail.
    for k in ("itl_p95_s", "lifetime_s", "share_window_measured"):
        assert after[k] == before[k], k
    assert after["tail_requests"] == len(tail) and before["tail_requests"] == 0
    assert after["tail_s"] > 0 and 0.0 <= after["finished_under_load"] <= 1.0
    # Without a tail the new rule is the old one.
    assert before["share"] == before["share_window_measured"]


def test_a_trace_tail_keeps_the_measured_windows_gaps():
    # Azure code's requests after the 200th arrive in a burst (10-30x the rate of the
    # measured window): the tail replays the window's gaps instead of that burst.
    cluster = pa.CLUSTERS[RTX]
    m = 200
    wl, _slo, tail = pa.with_tail(cluster, "azure-code", 2.0, m)
    head = [r for r in wl.requests if r.request_id not in tail]
    measured = head[int(m * pa.WARMUP_SHARE):]
    gaps = [b.arrival - a.arrival for a, b in itertools.pairwise(measured)]
    later = [head[-1], *(r for r in wl.requests if r.request_id in tail)]
    got = [b.arrival - a.arrival for a, b in itertools.pairwise(later)]
    assert got == pytest.approx(gaps[:len(got)])
