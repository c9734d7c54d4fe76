"""Step-time model of one engine iteration (prefill chunks and decode tokens together).

    compute = Σ 2·params·tokens / matmul rate + Σ attention FLOPs of prefill chunks / attention rate
    memory  = (weights + KV bytes read) / (bandwidth × efficiency)
    step    = max(compute, memory) + overhead + per-sequence cost

A step is bound by whichever of compute (prefill: many tokens per weight read) or memory
bandwidth (decode: every weight and every cached KV byte read once per step) is slower.
Tensor parallelism splits weights, KV and FLOPs over ``tp`` GPUs; compute scales sublinearly
and each step pays two all-reduces per layer. Efficiencies and overheads live in
:mod:`workers_agent.sim.profiles` with their sources.
"""

from __future__ import annotations

from dataclasses import dataclass

from .profiles import HardwareProfile, ModelProfile, get_hardware, get_model


@dataclass(frozen=True)
class TimingModel:
    model: ModelProfile
    hardware: HardwareProfile
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError("tp must be at least 1")
        scale = self.hardware.tp_compute_scale(self.tp)
        object.__setattr__(self, "_matmul_rate", self.hardware.matmul_flops(
            self.model.fp8_compute) * scale)
        object.__setattr__(self, "_attn_rate", self.hardware.attention_flops_rate() * scale)
        object.__setattr__(self, "_bandwidth", self.hardware.memory_bandwidth_gbs * 1e9
                           * self.hardware.bandwidth_efficiency * self.tp)
        overhead = self.hardware.step_overhead_s
        if self.tp > 1:
            overhead += 2 * self.model.layers * self.hardware.allreduce_latency_s
        object.__setattr__(self, "_overhead", overhead)
        object.__setattr__(self, "_per_seq", self.hardware.per_seq_layer_s * self.model.layers)
        object.__setattr__(self, "_attn_coeff", 4.0 * self.model.layers * self.model.hidden)

    @classmethod
    def for_names(cls, model: str, hardware: str, tp: int = 1) -> TimingModel:
        return cls(get_model(model), get_hardware(hardware), tp)

    def step_seconds(
        self,
        prefill_chunks: list[tuple[int, int]] | tuple = (),
        decode_seqs: int = 0,
        decode_context_tokens: int = 0,
    ) -> float:
        """Duration of one iteration.

        ``prefill_chunks``: (new tokens, tokens already in KV before them) per prefilling
        sequence. ``decode_seqs`` sequences decode one token each, reading
        ``decode_context_tokens`` KV tokens in total.
        """
        new_tokens = decode_seqs
        attn_flops = 0.0
        kv_read_tokens = decode_context_tokens
        coeff = self._attn_coeff
        for new, context in prefill_chunks:
            new_tokens += new
            attn_flops += coeff * new * (context + new / 2)
            kv_read_tokens += context + new
        if new_tokens == 0:
            return 0.0
        compute = new_tokens * self.model.flops_per_token / self._matmul_rate
        compute += attn_flops / self._attn_rate
        memory = (self.model.weight_bytes + kv_read_tokens * self.model.kv_bytes_per_token) / (
            self._bandwidth
        )
        return max(compute, memory) + self._overhead + self._per_seq * (
            decode_seqs + len(prefill_chunks)
        )

    def decode_seconds(self, batch: int, context_tokens: int) -> float:
        """``step_seconds((), batch, context_tokens)``, faster (the virtual fleet's decode
        bursts call it once per step)."""
        if batch == 0:
            return 0.0
        compute = batch * self.model.flops_per_token / self._matmul_rate
        memory = (self.model.weight_bytes + context_tokens * self.model.kv_bytes_per_token) / (
            self._bandwidth
        )
        return (compute if compute > memory else memory) + self._overhead + self._per_seq * batch

    def prefill_seconds(self, tokens: int, cached_tokens: int = 0, chunk: int = 0) -> float:
        """Time to prefill ``tokens`` prompt tokens of which ``cached_tokens`` hit the prefix
        cache, alone on the engine, in chunks of ``chunk`` tokens (0 = one pass)."""
        remaining = max(tokens - cached_tokens, 0)
        context = cached_tokens
        total = 0.0
        step = chunk if chunk > 0 else max(remaining, 1)
        while remaining > 0:
            n = min(step, remaining)
            total += self.step_seconds([(n, context)])
            context += n
            remaining -= n
        return total

    def decode_step_seconds(self, batch: int, context_tokens: int) -> float:
        """One decode step for ``batch`` sequences each holding ``context_tokens`` of KV."""
        return self.step_seconds((), batch, batch * context_tokens)
