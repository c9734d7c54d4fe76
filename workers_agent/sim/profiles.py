"""The simulator's hardware and model profiles, built from the one catalog (:mod:`pdcatalog`).

The figures and their sources live in ``pdcatalog/gpus.py`` and ``pdcatalog/models.py``
(datasheets, and efficiencies fitted to AIConfigurator for H100/H200: ``tests/unit/
test_sim_timing.py`` keeps this model within ±25 % of every calibration row). Splitwise's
2023 measurements (Llama-2-70B FP16, 8×H100 TP8: prompt 512/2k/8k → 54/137/845 ms, token
step ~30 ms at batch 1, ~50 ms at 64) are not fitted: this model predicts 25/90/366 ms and
9.5/11.8 ms for that setup, 2–3× faster, as current kernels (the AIConfigurator rows) are.
Treat TP8 figures as optimistic. What is simulator-specific here is the arithmetic below
(FLOPs, TP scaling); the cost model keeps its own.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pdcatalog as catalog


class UnknownProfileError(catalog.UnknownNameError):
    """No profile of that name (or only an estimated one); the message lists the known names."""


@dataclass(frozen=True)
class ModelProfile(catalog.ModelEntry):
    """A catalogued model with the simulator's arithmetic."""

    @property
    def kv_bytes_per_token(self) -> int:
        # 2 (K and V) × layers × KV heads × head dim × bytes per element.
        return int(2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes_per_element)

    @property
    def flops_per_token(self) -> float:
        # Dense matmuls: 2 FLOPs per parameter per token.
        return 2.0 * self.params_b * 1e9

    def attention_flops(self, new_tokens: int, context_tokens: int) -> float:
        """FLOPs of QKᵀ and AV for ``new_tokens`` attending to ``context_tokens`` earlier
        tokens plus, causally, each other (on average half of the chunk)."""
        return 4.0 * self.layers * self.hidden * new_tokens * (context_tokens + new_tokens / 2)


@dataclass(frozen=True)
class HardwareProfile(catalog.GpuSpec):
    """A catalogued GPU with the simulator's arithmetic. Tensor parallelism: compute scales
    by tp / (1 + tp_alpha·(tp − 1)); each step pays 2 all-reduces per layer."""

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


def _hardware(spec: catalog.GpuSpec) -> HardwareProfile:
    return HardwareProfile(**{f.name: getattr(spec, f.name) for f in fields(spec)})


def _model(entry: catalog.ModelEntry) -> ModelProfile:
    return ModelProfile(**{f.name: getattr(entry, f.name) for f in fields(entry)})


HARDWARE: dict[str, HardwareProfile] = {s.name: _hardware(s) for s in catalog.GPUS.values()}
MODELS: dict[str, ModelProfile] = {m.name: _model(m) for m in catalog.MODELS.values()}


def get_hardware(name: str | HardwareProfile) -> HardwareProfile:
    """The catalog's part of that name; the simulator refuses an estimated one (it needs
    real figures to be a check on anything)."""
    if isinstance(name, HardwareProfile):
        return name
    found = catalog.lookup_gpu(name)
    if found.estimated:
        raise UnknownProfileError(f"unknown GPU {name!r}; known: {', '.join(HARDWARE)}")
    return HARDWARE[found.spec.name]


def get_model(name: str | ModelProfile) -> ModelProfile:
    if isinstance(name, ModelProfile):
        return name
    try:
        return MODELS[catalog.lookup_model(name).name]
    except catalog.UnknownModelError as exc:
        raise UnknownProfileError(str(exc)) from None
