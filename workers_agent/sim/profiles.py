"""Hardware and model profiles for the simulator's timing model.

Sources (see ../shared/reference/CALIBRATION.md, which cites them):
- GPU memory, bandwidth and peak dense TFLOPS: NVIDIA datasheets (H200 SXM/NVL, H100 SXM,
  RTX PRO 6000 Blackwell Server Edition, L40S, L4). Peaks; kernels reach a fraction, which
  the efficiency fields below express.
- Efficiencies and overheads of H100 and H200 are fitted to NVIDIA AIConfigurator 0.10
  estimates (vLLM backend, BF16): Llama 3.1 8B TP1 prefill 2k/8k/32k and decode at 2k
  context for batch 1/16/64/256, Llama 3.1 70B TP4 prefill 2k/8k and decode b1/b32/b128.
  ``tests/unit/test_sim_timing.py`` keeps the model within ±25% of every one of those figures.
- Splitwise's 2023 measurements (Llama-2-70B FP16, 8×H100 TP8: prompt 512/2k/8k → 54/137/
  845 ms, token step ~30 ms at batch 1, ~50 ms at 64) are not fitted: this model predicts
  25/90/366 ms and 9.5/11.8 ms for that setup, 2–3× faster, as current kernels (the
  AIConfigurator rows) are. Treat TP8 figures as optimistic.
- GPUs without calibration rows (H200 NVL, RTX PRO 6000, L40S, L4) use the datasheet peaks
  with the H100's fitted efficiencies, lowered where the part is PCIe-only or clocked lower:
  these are estimates, stated as such.
- Model geometry: Llama 3.1 8B (32 layers, hidden 4096, 8 KV heads × 128) and Llama 3.3 70B
  (80 layers, hidden 8192, 8 KV heads × 128) from their published configs; FP8 halves weight
  and KV bytes (CALIBRATION.md "Models").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 1e9  # vendor datasheets use decimal gigabytes


class UnknownProfileError(KeyError):
    """No profile of that name; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class ModelProfile:
    name: str
    params_b: float  # billions of parameters
    layers: int
    hidden: int
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float  # 2 for BF16, 1 for FP8
    kv_bytes_per_element: float  # 2 for 16-bit KV, 1 for FP8 KV
    max_model_len: int = 131_072
    fp8_compute: bool = False  # matmuls run on FP8 tensor cores

    @property
    def kv_bytes_per_token(self) -> int:
        # 2 (K and V) × layers × KV heads × head dim × bytes per element.
        return int(2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element)

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes_per_param

    @property
    def flops_per_token(self) -> float:
        # Dense matmuls: 2 FLOPs per parameter per token.
        return 2.0 * self.params_b * 1e9

    def attention_flops(self, new_tokens: int, context_tokens: int) -> float:
        """FLOPs of QKᵀ and AV for ``new_tokens`` attending to ``context_tokens`` earlier
        tokens plus, causally, each other (on average half of the chunk)."""
        return 4.0 * self.layers * self.hidden * new_tokens * (context_tokens + new_tokens / 2)


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    memory_gb: float
    memory_bandwidth_gbs: float
    bf16_tflops: float  # dense peak
    fp8_tflops: float | None  # dense peak; None where FP8 matmuls are not supported
    # Fraction of peak dense FLOPS reached by prefill matmuls (MFU) and by attention.
    mfu: float = 0.78
    attention_efficiency: float = 0.78
    fp8_mfu_factor: float = 0.7  # FP8 kernels reach a lower fraction of their higher peak
    bandwidth_efficiency: float = 0.9  # decode's weight/KV streaming vs peak bandwidth
    step_overhead_s: float = 0.0010  # scheduler, sampling, kernel launches per iteration
    per_seq_layer_s: float = 0.30e-6  # per running sequence per layer (sampling, metadata)
    # Tensor parallelism: compute scales by tp / (1 + tp_alpha·(tp − 1)); each step pays
    # 2 all-reduces per layer.
    tp_alpha: float = 1 / 9
    allreduce_latency_s: float = 16e-6
    nvlink_gbs: float | None = None  # per GPU, one direction
    pcie_generation: int = 5
    pcie_width: int = 16
    gpu_memory_utilization: float = 0.9  # vLLM's default share of memory it may use
    activation_overhead_gb: float = 2.0  # activations, CUDA graphs, NCCL buffers

    def matmul_flops(self, fp8: bool) -> float:
        """Sustained dense matmul FLOP/s of one GPU (peak × MFU)."""
        if fp8 and self.fp8_tflops:
            return self.fp8_tflops * 1e12 * self.mfu * self.fp8_mfu_factor
        return self.bf16_tflops * 1e12 * self.mfu

    def attention_flops_rate(self) -> float:
        # Attention runs in 16-bit (FlashAttention) whatever the weight format.
        return self.bf16_tflops * 1e12 * self.attention_efficiency

    def tp_compute_scale(self, tp: int) -> float:
        return tp / (1.0 + self.tp_alpha * (tp - 1))

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB


_HARDWARE = [
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s, ~989 BF16 / ~1,979 FP8 dense TFLOPS, NVLink 900 GB/s
    # (450 each way). Efficiencies fitted to the AIConfigurator H200 rows (8B TP1, 70B TP4).
    HardwareProfile(
        "H200 SXM", 141, 4800, 989, 1979, mfu=0.86, attention_efficiency=0.95,
        bandwidth_efficiency=0.9, step_overhead_s=0.0012, per_seq_layer_s=0.33e-6,
        allreduce_latency_s=15e-6, nvlink_gbs=450,
    ),
    # H200 NVL (PCIe card): same memory and bandwidth, lower clocks/TDP (600 W vs 700 W):
    # estimated at ~85% of SXM compute. NVLink bridge 900 GB/s per GPU; PCIe Gen5 x16.
    HardwareProfile(
        "H200 NVL", 141, 4800, 835, 1671, mfu=0.84, attention_efficiency=0.9,
        bandwidth_efficiency=0.88, step_overhead_s=0.0013, per_seq_layer_s=0.33e-6,
        allreduce_latency_s=18e-6, nvlink_gbs=450,
    ),
    # H100 SXM: 80 GB HBM3, 3.35 TB/s, ~989 / ~1,979 TFLOPS, NVLink 900 GB/s. Fitted to the
    # AIConfigurator H100 rows.
    HardwareProfile(
        "H100 SXM", 80, 3350, 989, 1979, mfu=0.77, attention_efficiency=0.8,
        bandwidth_efficiency=0.9, step_overhead_s=0.0010, per_seq_layer_s=0.30e-6,
        allreduce_latency_s=16e-6, nvlink_gbs=450,
    ),
    # RTX PRO 6000 Blackwell Server: 96 GB GDDR7, ~1.6 TB/s, no NVLink, PCIe Gen5 x16.
    # Dense peaks are an estimate (datasheet quotes sparse FP4); ~500 BF16 / ~1,000 FP8.
    # Lower efficiencies: GDDR7 and PCIe-only all-reduce.
    HardwareProfile(
        "RTX PRO 6000", 96, 1597, 500, 1000, mfu=0.7, attention_efficiency=0.7,
        bandwidth_efficiency=0.85, step_overhead_s=0.0014, per_seq_layer_s=0.35e-6,
        tp_alpha=0.2, allreduce_latency_s=40e-6,
    ),
    # L40S: 48 GB GDDR6, 864 GB/s, ~362 BF16 / ~733 FP8 dense TFLOPS, PCIe Gen4 x16.
    HardwareProfile(
        "L40S", 48, 864, 362, 733, mfu=0.65, attention_efficiency=0.65,
        bandwidth_efficiency=0.85, step_overhead_s=0.0015, per_seq_layer_s=0.35e-6,
        tp_alpha=0.25, allreduce_latency_s=50e-6, pcie_generation=4,
    ),
    # L4: 24 GB GDDR6, 300 GB/s, ~121 BF16 / ~242 FP8 dense TFLOPS, PCIe Gen4 x16.
    HardwareProfile(
        "L4", 24, 300, 121, 242, mfu=0.6, attention_efficiency=0.6,
        bandwidth_efficiency=0.85, step_overhead_s=0.0018, per_seq_layer_s=0.4e-6,
        tp_alpha=0.25, allreduce_latency_s=50e-6, pcie_generation=4, activation_overhead_gb=1.0,
    ),
]

_MODELS = [
    ModelProfile("llama-3.1-8b", 8.03, 32, 4096, 8, 128, 2, 2),
    ModelProfile("llama-3.1-8b-fp8", 8.03, 32, 4096, 8, 128, 1, 1, fp8_compute=True),
    ModelProfile("llama-3.3-70b-bf16", 70.6, 80, 8192, 8, 128, 2, 2),
    ModelProfile("llama-3.3-70b-fp8", 70.6, 80, 8192, 8, 128, 1, 1, fp8_compute=True),
]

HARDWARE: dict[str, HardwareProfile] = {hw.name: hw for hw in _HARDWARE}
MODELS: dict[str, ModelProfile] = {model.name: model for model in _MODELS}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_/]+", "-", name.strip().lower())


_HARDWARE_ALIASES = {
    "h200": "H200 SXM", "h200-sxm": "H200 SXM", "nvidia-h200": "H200 SXM",
    "h200-nvl": "H200 NVL", "nvidia-h200-nvl": "H200 NVL",
    "h100": "H100 SXM", "h100-sxm": "H100 SXM", "nvidia-h100": "H100 SXM",
    "nvidia-h100-80gb-hbm3": "H100 SXM",
    "rtx-pro-6000": "RTX PRO 6000", "rtx-pro-6000-blackwell": "RTX PRO 6000",
    "rtx-pro-6000-blackwell-server": "RTX PRO 6000",
    "nvidia-rtx-pro-6000-blackwell-server-edition": "RTX PRO 6000",
    "l40s": "L40S", "nvidia-l40s": "L40S", "l4": "L4", "nvidia-l4": "L4",
}

_MODEL_ALIASES = {
    "llama-3.1-8b": "llama-3.1-8b", "llama-3.1-8b-instruct": "llama-3.1-8b",
    "meta-llama-llama-3.1-8b-instruct": "llama-3.1-8b", "llama-3.1-8b-bf16": "llama-3.1-8b",
    "llama-3.1-8b-fp8": "llama-3.1-8b-fp8",
    "llama-3.3-70b": "llama-3.3-70b-bf16", "llama-3.3-70b-bf16": "llama-3.3-70b-bf16",
    "llama-3.3-70b-instruct": "llama-3.3-70b-bf16",
    "meta-llama-llama-3.3-70b-instruct": "llama-3.3-70b-bf16",
    "llama-3.1-70b": "llama-3.3-70b-bf16",  # same geometry as 3.3
    "llama-3.3-70b-fp8": "llama-3.3-70b-fp8", "llama-3.3-70b-instruct-fp8": "llama-3.3-70b-fp8",
}


def get_hardware(name: str | HardwareProfile) -> HardwareProfile:
    if isinstance(name, HardwareProfile):
        return name
    key = _normalise(name)
    canonical = _HARDWARE_ALIASES.get(key) or next(
        (hw for hw in HARDWARE if _normalise(hw) == key), None
    )
    if canonical is None:
        raise UnknownProfileError(f"unknown GPU {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[canonical]


def get_model(name: str | ModelProfile) -> ModelProfile:
    if isinstance(name, ModelProfile):
        return name
    key = _normalise(name)
    canonical = _MODEL_ALIASES.get(key) or (key if key in MODELS else None)
    if canonical is None:
        raise UnknownProfileError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return MODELS[canonical]
