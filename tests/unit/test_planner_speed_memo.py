"""The cost model's memos (issue 17, planning-cycle speed) give what computing afresh gives:
keyed on their inputs' identity, never on equality (1 and 1.0, 0.0 and -0.0 are equal keys
whose predictions need not print the same), and handing out nothing a caller could change
under the next one."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from controlplane.planner.costmodel import (
    DEFAULT_PARAMS,
    ModelSpec,
    WorkerShape,
    Workload,
    gpu_profile_for,
)
from controlplane.planner.dispatch import IdMemo, prompt_points
from controlplane.planner.horizon import with_bursts
from controlplane.planner.layouts import _aggregated, predict_aggregated

MODEL = ModelSpec("llama-3.3-70b-fp8", 80, 8, 128, 1, 70.6, 70.6e9)
SHAPE = WorkerShape(gpu_profile_for("H200 NVL"), 1)


def _workload(r: random.Random) -> Workload:
    isl = r.choice([200.0, 2000.0, 8000.0])
    return Workload(
        rate_rps=r.choice([0.5, 5.0, 50.0, 200.0]), isl_mean=isl,
        osl_mean=r.choice([50.0, 300.0, 1500.0]), prefix_hit=r.choice([0.0, 0.3, 0.8]),
        isl_p95=r.choice([None, isl * 2.5]), ttft_slo_s=r.choice([1.0, 2.5]),
        burst_rate_rps=r.choice([None, None, 400.0]),
    )


@pytest.mark.parametrize("seed", range(25))
def test_predict_aggregated_is_what_computing_afresh_gives(seed):
    r = random.Random(seed)
    w = _workload(r)
    workers = r.choice([1, 4, 160])
    fresh = with_bursts(w, lambda x: _aggregated(MODEL, SHAPE, workers, x, DEFAULT_PARAMS)[0])
    first = predict_aggregated(MODEL, SHAPE, workers, w)
    assert repr(first) == repr(fresh)
    assert predict_aggregated(MODEL, SHAPE, workers, w) is first  # the same objects: memo
    twin = replace(w)  # equal, not the same object: computed again, same numbers
    assert twin is not w
    assert repr(predict_aggregated(MODEL, SHAPE, workers, twin)) == repr(fresh)


def test_predict_aggregated_keys_on_the_workers_type():
    w = Workload(rate_rps=5.0, isl_mean=1000.0, osl_mean=200.0)
    as_int = predict_aggregated(MODEL, SHAPE, 8, w)
    as_float = predict_aggregated(MODEL, SHAPE, 8.0, w)
    assert as_int is not as_float


def test_id_memo_keys_on_identity_not_equality():
    memo = IdMemo(4)
    calls = []

    def compute(v):
        calls.append(v)
        return repr(v)

    a, b = 0.0, -0.0
    assert memo.get((a,), lambda: compute(a)) == "0.0"
    assert memo.get((b,), lambda: compute(b)) == "-0.0"  # equal to a, not the same object
    assert memo.get((a,), lambda: compute(a)) == "0.0"
    assert calls == [0.0, -0.0]
    for i in range(10):  # bounded: it empties itself past its size
        memo.get((object(),), lambda i=i: i)
    assert len(memo.entries) <= 4


def test_prompt_points_hand_out_a_fresh_work_list():
    w = Workload(rate_rps=5.0, isl_mean=3000.0, osl_mean=200.0, prefix_hit=0.4, isl_p95=9000.0)
    isl, ctx, work = prompt_points(w)
    kept = list(work)
    work.clear()
    again = prompt_points(w)
    assert again[2] == kept and again[0] == isl and again[1] == ctx
