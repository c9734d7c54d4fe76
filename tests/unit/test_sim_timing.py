"""Timing model vs the calibration table, and KV transfer links."""

from __future__ import annotations

import pytest

from workers_agent.sim import links
from workers_agent.sim.engine import EngineSpec
from workers_agent.sim.profiles import (
    HARDWARE,
    MODELS,
    UnknownProfileError,
    get_hardware,
    get_model,
)
from workers_agent.sim.timing import TimingModel

# ../shared/reference/CALIBRATION.md, "Timings" (NVIDIA AIConfigurator 0.10, vLLM, BF16).
# (model, GPU, TP): ({prompt tokens: prefill ms}, {(batch, context): decode step ms})
CALIBRATION = [
    ("llama-3.1-8b", "H100", 1, {2048: 44.5, 8192: 201, 32768: 1009},
     {(1, 2048): 6.4, (16, 2048): 7.8, (64, 2048): 12.8, (256, 2048): 31.5}),
    ("llama-3.1-8b", "H200", 1, {2048: 43.0, 8192: 176, 32768: 838},
     {(1, 2048): 5.1, (16, 2048): 5.9, (64, 2048): 9.3, (256, 2048): 23.7}),
    # "Llama 3.1 70B" rows: same geometry as our Llama 3.3 70B BF16 profile.
    ("llama-3.3-70b-bf16", "H100", 4, {2048: 128, 8192: 547},
     {(1, 2048): 15.4, (32, 2048): 18.9, (128, 2048): 26.2}),
    ("llama-3.3-70b-bf16", "H200", 4, {2048: 126, 8192: 535},
     {(1, 2048): 11.9, (32, 2048): 14.7, (128, 2048): 20.3}),
]


@pytest.mark.parametrize(("model", "gpu", "tp", "prefill", "decode"), CALIBRATION)
def test_within_25_percent_of_calibration(model, gpu, tp, prefill, decode):
    timing = TimingModel.for_names(model, gpu, tp)
    for tokens, expected_ms in prefill.items():
        got = timing.prefill_seconds(tokens) * 1000
        assert got == pytest.approx(expected_ms, rel=0.25), (model, gpu, "prefill", tokens)
    for (batch, context), expected_ms in decode.items():
        got = timing.decode_step_seconds(batch, context) * 1000
        assert got == pytest.approx(expected_ms, rel=0.25), (model, gpu, "decode", batch)


def test_every_profile_pair_is_sane():
    for model in MODELS.values():
        for hw in HARDWARE.values():
            timing = TimingModel(model, hw, 1)
            assert timing.prefill_seconds(4096) > timing.prefill_seconds(1024) > 0
            assert timing.decode_step_seconds(64, 4096) > timing.decode_step_seconds(1, 4096)
    # Faster parts are faster; FP8 prefills faster than BF16.
    for gpu in ("H200", "H100", "RTX PRO 6000", "L40S"):
        t = TimingModel.for_names("llama-3.1-8b", gpu)
        assert t.decode_step_seconds(1, 2048) < TimingModel.for_names("llama-3.1-8b", "L4") \
            .decode_step_seconds(1, 2048)
    fp8 = TimingModel.for_names("llama-3.3-70b-fp8", "H200")
    bf16 = TimingModel.for_names("llama-3.3-70b-bf16", "H200", 2)
    assert fp8.prefill_seconds(4096) < TimingModel.for_names(
        "llama-3.3-70b-bf16", "H200").prefill_seconds(4096)
    assert bf16.decode_step_seconds(1, 2048) > 0


def test_tp_speeds_up_prefill():
    one = TimingModel.for_names("llama-3.3-70b-bf16", "H100", 2).prefill_seconds(4096)
    four = TimingModel.for_names("llama-3.3-70b-bf16", "H100", 4).prefill_seconds(4096)
    assert four < one


def test_profile_lookup_aliases_and_errors():
    assert get_hardware("h200").name == "H200 SXM"
    assert get_hardware("H200 NVL").name == "H200 NVL"
    assert get_hardware("RTX PRO 6000 Blackwell Server").name == "RTX PRO 6000"
    assert get_model("Llama-3.3-70B-FP8").name == "llama-3.3-70b-fp8"
    with pytest.raises(UnknownProfileError):
        get_hardware("A100")
    with pytest.raises(UnknownProfileError):
        get_model("mistral")


def test_kv_geometry_and_memory():
    assert get_model("llama-3.3-70b-bf16").kv_bytes_per_token == 320 * 1024
    assert get_model("llama-3.3-70b-fp8").kv_bytes_per_token == 160 * 1024
    assert get_model("llama-3.1-8b").kv_bytes_per_token == 128 * 1024
    spec = EngineSpec("e", "llama-3.3-70b-fp8", "RTX PRO 6000")
    kv_bytes = spec.kv_cache_memory_bytes
    # One 96 GB card holds 70B FP8 plus roughly a dozen 8K conversations (CALIBRATION.md).
    assert 8 <= kv_bytes / (8192 * 160 * 1024) <= 14
    with pytest.raises(ValueError):
        EngineSpec("e", "llama-3.3-70b-bf16", "L4").derived_num_gpu_blocks()


def test_transfer_time_by_link():
    """Llama 3.3 70B FP8, 4,000 tokens ≈ 0.66 GB (DESIGN.md): NVLink < PCIe Gen5 x16
    (~10 ms) < 400 G (~13 ms) < 200 G (~26 ms) < 25 G (~0.2 s)."""
    num_bytes = 4000 * get_model("llama-3.3-70b-fp8").kv_bytes_per_token
    assert num_bytes == pytest.approx(0.66e9, rel=0.02)
    nvlink = links.nvlink().transfer_seconds(num_bytes)
    pcie = links.pcie(5, 16).transfer_seconds(num_bytes)
    g400 = links.nic(400).transfer_seconds(num_bytes)
    g200 = links.nic(200).transfer_seconds(num_bytes)
    g25 = links.nic(25).transfer_seconds(num_bytes)
    assert nvlink < pcie < g400 < g200 < g25
    # The brief's figures are at 100% line rate; ours include efficiency (≤ +30%).
    for got, rough in ((pcie, 0.010), (g400, 0.013), (g200, 0.026), (g25, 0.2)):
        assert rough * 0.9 <= got <= rough * 1.3
    assert nvlink < 0.003
    assert links.nic(25, rdma=False).transfer_seconds(num_bytes) > 2 * g25
    assert links.pcie(4, 16).transfer_seconds(num_bytes) > pcie
    assert links.LOCAL.transfer_seconds(num_bytes) == 0.0
