"""Conditional P/D in the cost model (issue 17, fifth pass): the gateway's router prefills a
prompt on its decode worker when the part not cached there is at most the policy's
``local_prefill_max_tokens``, so a split's decode pool is an aggregated pool for those."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.planner.costmodel import ModelSpec, WorkerShape, Workload, gpu_profile_for
from controlplane.planner.dispatch import prompt_points
from controlplane.planner.distributions import length_points, local_share_points
from controlplane.planner.layouts import predict_aggregated, predict_split
from controlplane.planner.placement import NicInput, NodeLinks, Topology, WorkerInput
from controlplane.planner.planner import LoadInput, workload_for
from controlplane.policies.effective import EffectivePolicy

L70_FP8 = ModelSpec("llama-3.3-70b-fp8", 80, 8, 128, 1, 70.6, 70.6e9)
RTX_TP2 = WorkerShape(gpu_profile_for("RTX PRO 6000"), 2)
# The demo's chat: 1,000-token prompts, half a shared prefix: 500 uncached tokens each.
CHAT = Workload(rate_rps=10.8, isl_mean=1000, osl_mean=300, prefix_hit=0.5, isl_p95=1000,
                ttft_slo_s=2.5, itl_slo_s=0.05)


def _paths(n_prefill: int, n: int = 8):
    workers = [WorkerInput(i, f"w{i}", f"n{i // 4}", None) for i in range(n)]
    links = {f"n{i}": NodeLinks(nics=(NicInput("fabric", 400, True),)) for i in range(2)}
    return Topology(workers, links).paths(n_prefill)


def test_short_prompts_make_the_decode_pool_aggregated():
    # Every prompt's uncached part (500) is under the threshold: the prefill pool idles and
    # five prefill + three decode workers serve like three aggregated workers.
    w = replace(CHAT, local_prefill_max_tokens=512)
    split = predict_split(L70_FP8, RTX_TP2, 5, 3, w, _paths(5))
    agg3 = predict_aggregated(L70_FP8, RTX_TP2, 3, w)
    assert split.local_prefill_share == 1.0
    assert split.goodput_rps == pytest.approx(agg3.goodput_rps)
    assert split.itl_p95_s == pytest.approx(agg3.itl_p95_s)
    assert (split.layout, split.n_prefill, split.n_decode) == ("5P:3D", 5, 3)
    assert split.gpus == 16
    # Without conditional P/D the same split decodes undisturbed and looks far better.
    remote = predict_split(L70_FP8, RTX_TP2, 5, 3, CHAT, _paths(5))
    assert remote.local_prefill_share == 0.0
    assert remote.itl_p95_s < split.itl_p95_s
    assert remote.attainment > split.attainment


def test_long_prompts_still_go_to_the_prefill_pool():
    rag = replace(CHAT, rate_rps=6.4, isl_mean=4000, isl_p95=4000, prefix_hit=0.3,
                  local_prefill_max_tokens=512)
    assert predict_split(L70_FP8, RTX_TP2, 4, 4, rag, _paths(4)) == predict_split(
        L70_FP8, RTX_TP2, 4, 4, replace(rag, local_prefill_max_tokens=0), _paths(4))


def test_workload_takes_the_threshold_only_in_conditional_mode():
    load = LoadInput(5.0, 5.0, 1000, 1000, 300, 0.5)
    assert workload_for(load, EffectivePolicy(), 5.0).local_prefill_max_tokens == 512
    off = EffectivePolicy(disaggregation_mode="disaggregated")
    assert workload_for(load, off, 5.0).local_prefill_max_tokens == 0


@settings(max_examples=50, deadline=None)
@given(st.floats(0.5, 30.0), st.floats(300, 6000), st.floats(1.0, 3.0), st.floats(0.0, 0.8),
       st.sampled_from([0, 256, 512, 2048]), st.integers(1, 7))
def test_a_mixed_split_stays_a_share_and_local_prefill_only_adds_stalls(
        rate, isl, spread, hit, lim, n_prefill):
    w = replace(CHAT, rate_rps=rate, isl_mean=isl, isl_p95=isl * spread, prefix_hit=hit)
    base = predict_split(L70_FP8, RTX_TP2, n_prefill, 8 - n_prefill, w, _paths(n_prefill))
    p = predict_split(L70_FP8, RTX_TP2, n_prefill, 8 - n_prefill,
                      replace(w, local_prefill_max_tokens=lim), _paths(n_prefill))
    assert 0.0 <= p.attainment <= 1.0
    assert 0.0 <= p.local_prefill_share <= 1.0
    assert (p.local_prefill_share > 0) <= (lim > 0)
    assert p.overloaded or math.isfinite(p.ttft_p95_s)
    if p.local_prefill_share > 0 and not p.overloaded:
        # Prefill chunks in decode steps only lengthen them: never faster than the same
        # decode pool with nothing to prefill (on the same step arithmetic).
        idle = predict_aggregated(L70_FP8, RTX_TP2, 8 - n_prefill, replace(w, prefix_hit=1.0))
        assert p.itl_mean_s >= idle.itl_mean_s * (1 - 1e-9)
    elif lim == 0:
        assert p == base


def test_prefix_hit_is_weighted_by_prompt_tokens_over_every_role():
    from controlplane.planner.derive import derive_load

    # Chat on 5P:3D under conditional P/D: the decode workers prefill nearly every prompt
    # (half cached); the prefill workers saw a few cold ones.
    states = [{"worker_id": i, "prefix_hit_rate": 0.0, "prompt_tokens_per_s": 30.0,
               "requests_per_s": 0.03} for i in range(5)]
    states += [{"worker_id": 5 + i, "prefix_hit_rate": 0.5, "prompt_tokens_per_s": 3600.0,
                "requests_per_s": 3.6, "generation_tokens_per_s": 1080.0} for i in range(3)]
    roles = {i: "prefill" for i in range(5)} | {5 + i: "decode" for i in range(3)}
    d = derive_load(states, roles, 256)
    assert d.prefix_hit == pytest.approx(0.5 * 10800 / (10800 + 150))
    # Without token rates the workers' rates are averaged as they are.
    bare = [{"worker_id": 0, "prefix_hit_rate": 0.2}, {"worker_id": 1, "prefix_hit_rate": 0.4}]
    assert derive_load(bare, {0: "both", 1: "both"}, 256).prefix_hit == pytest.approx(0.3)


def test_a_prompt_waits_for_the_decode_step_in_progress():
    # Light chat on aggregated workers: nobody queues, but a worker with sequences in its
    # batch is mid-step when a prompt arrives; the TTFT p95 adds most of a step.
    from controlplane.planner.costmodel import Timing

    w = replace(CHAT, rate_rps=0.5)
    p = predict_aggregated(L70_FP8, RTX_TP2, 8, w)
    t_d = Timing.of(L70_FP8, RTX_TP2.gpu, 2).step(p.decode_batch, w.context_mean)
    busy = 1 - math.exp(-p.decode_batch)
    assert p.ttft_p95_s == pytest.approx(p.prefill_s + t_d * (1 - 0.05 / busy), rel=0.05)
    idle = predict_aggregated(L70_FP8, RTX_TP2, 8, replace(w, rate_rps=1e-6))
    assert idle.ttft_p95_s == pytest.approx(idle.prefill_s, rel=0.01)  # an empty batch


# --- The measured local-prefill share shapes the quantile prompts (issue 16, H4) ----------

# Mooncake-like: mean 12.9k, p95 43k; 40 % of the prompts are ≤ 512 tokens, which the
# mean + p95 lognormal does not place (none of its eight points is below 1.4k).
MOONCAKE = Workload(rate_rps=0.2, isl_mean=12908, osl_mean=300, prefix_hit=0.06,
                    isl_p95=43012, ttft_slo_s=5.0, itl_slo_s=0.05,
                    local_prefill_max_tokens=512)


@settings(max_examples=200, deadline=None)
@given(mean=st.floats(100, 40000), ratio=st.floats(1.01, 3.8), hit=st.floats(0, 0.9),
       limit=st.integers(1, 4096), share=st.floats(0, 1))
def test_local_share_points_keep_the_mean_and_place_the_share(mean, ratio, hit, limit, share):
    work = [(x * (1 - hit), x * hit) for x in length_points(mean, mean * ratio)]
    out = local_share_points(work, float(limit), share)
    assert len(out) == len(work)
    assert all(u >= 0 and c >= 0 for u, c in out)
    # The mean prompt holds.
    assert sum(u + c for u, c in out) == pytest.approx(sum(u + c for u, c in work), rel=1e-9)
    if out is not work:  # reshaped: exactly round(8 × share) points are local
        assert sum(1 for u, _c in out if u <= limit) == round(len(work) * share)


def test_without_a_measured_share_nothing_changes():
    isl, _ctx, work = prompt_points(MOONCAKE)
    assert isl == length_points(12908, 43012)
    assert sum(1 for u, _c in work if u <= 512) == 0
    same = replace(MOONCAKE, local_prefill_share=0.0)
    assert prompt_points(same)[2] == work


def test_a_measured_share_sends_the_short_prompts_to_the_decode_pool():
    w = replace(MOONCAKE, local_prefill_share=0.395)
    isl, ctx, work = prompt_points(w)
    assert sum(1 for u, _c in work if u <= 512) == 3  # round(8 × 0.395)
    assert sum(isl) / len(isl) == pytest.approx(12908)
    assert ctx == tuple(x + 150 for x in isl)
    split = predict_split(L70_FP8, RTX_TP2, 4, 4, w, _paths(4))
    assert split.local_prefill_share == pytest.approx(3 / 8)
    assert predict_split(L70_FP8, RTX_TP2, 4, 4, MOONCAKE, _paths(4)).local_prefill_share == 0
    # Without conditional P/D the share is no input: every prompt goes to the prefill pool.
    off = replace(w, local_prefill_max_tokens=0)
    assert prompt_points(off) == prompt_points(replace(MOONCAKE, local_prefill_max_tokens=0))
    assert math.isfinite(split.capacity_rps)
    # An aggregated pool keeps the fitted points: no routing there turns on the threshold.
    assert predict_aggregated(L70_FP8, RTX_TP2, 8, w) == predict_aggregated(
        L70_FP8, RTX_TP2, 8, MOONCAKE)
    assert prompt_points(w, split=False) == prompt_points(MOONCAKE)

