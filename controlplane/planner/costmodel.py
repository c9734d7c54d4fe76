"""The planner's cost model: pure arithmetic over hardware, links, model geometry and load.

No Django import; every function is deterministic and returns finite numbers (``math.inf``
only where a quantity is genuinely unbounded, e.g. the wait in an overloaded queue).

Figures and their sources (``shared/reference/CALIBRATION.md`` unless said otherwise):

* GPUs: the one hardware catalog, :mod:`pdcatalog` (``pdcatalog/gpus.py`` cites datasheets
  and which efficiencies are fitted or estimated); unknown parts get an estimated profile
  that says so (``GpuProfile.estimate_reason``), corrected online by
  :mod:`controlplane.planner.calibration`.
* Efficiencies: prefill reaches ~50 % of dense peak (AIConfigurator puts Llama 3.1 70B TP4
  on H200 at ~56 %, Splitwise measured ~26 % on H100 TP8 — 0.5 is the middle); decode reads
  weights and KV at ~80 % of memory bandwidth (fits the AIConfigurator decode-step table:
  8B on H200 at batch 1 ≈ 5 ms).
* Links: RDMA moves ~87 % of line rate (Mooncake: ~87 GB/s on 4×200 Gb/s RoCE); TCP far
  less once the copy through host memory and the kernel stack is paid (Mooncake: ~36–41
  GB/s over TCP on hosts with 8×400 Gb/s) — 0.35 here is generous for a single flow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pdcatalog as catalog
from controlplane.core.kvgeometry import kv_bytes_per_token as _kv_formula

from .kvlinks import (  # noqa: F401  (re-exported: the cost model's one import surface)
    DEFAULT_PARAMS,
    GB,
    LINK_KINDS,
    CostParams,
    Link,
    best_link,
    effective_gbs,
    link_efficiency,
    link_latency_s,
    transfer_time_s,
)
from .queueing import QueueWait, mgc_wait  # noqa: F401  (re-exported)

# --- Hardware -----------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuProfile:
    name: str
    memory_bytes: float
    memory_bandwidth_gbs: float  # GB/s
    tflops_bf16: float  # dense
    tflops_fp8: float  # dense
    nvlink_gbs: float = 0.0  # per GPU, one way
    pcie_gbs: float = 64.0  # one way
    # True when the GPU is not in the catalog and the figures are assumed; the reason says
    # what was assumed (shown in plan explanations, the what-if and the GpuProfileEstimated
    # alert).
    estimate: bool = False
    estimate_reason: str = ""
    # Efficiencies (shares of peak) and fixed costs, as in the simulator's profiles.
    mfu: float = 0.77  # prefill matmuls, share of dense peak
    fp8_mfu_factor: float = 0.7  # FP8 kernels reach a lower share of their higher peak
    attention_efficiency: float = 0.8
    bandwidth_efficiency: float = 0.9  # decode streaming weights and KV
    step_overhead_s: float = 0.001  # scheduler, sampling, launches per iteration
    per_seq_layer_s: float = 0.3e-6  # per running sequence per layer
    tp_alpha: float = 1 / 9  # compute scales by tp / (1 + alpha (tp − 1))
    allreduce_latency_s: float = 16e-6  # two per layer per step when tp > 1
    activation_bytes: float = 2e9  # activations, CUDA graphs, NCCL buffers
    gpu_memory_utilization: float = 0.9  # vLLM's default share of memory it may use

    def matmul_flops(self, fp8: bool) -> float:
        if fp8 and self.tflops_fp8:
            return self.tflops_fp8 * 1e12 * self.mfu * self.fp8_mfu_factor
        return self.tflops_bf16 * 1e12 * self.mfu

    def attention_flops(self) -> float:
        return self.tflops_bf16 * 1e12 * self.attention_efficiency


def _profile(spec: catalog.GpuSpec, estimate_reason: str = "") -> GpuProfile:
    """A catalog entry as the cost model's profile (datasheet peaks and efficiencies)."""
    return GpuProfile(
        spec.name,
        spec.memory_bytes,
        spec.memory_bandwidth_gbs,
        spec.bf16_tflops,
        spec.fp8_tflops or spec.bf16_tflops,
        spec.nvlink_gbs or 0.0,
        spec.pcie_gbs,
        estimate=bool(estimate_reason),
        estimate_reason=estimate_reason,
        mfu=spec.mfu,
        fp8_mfu_factor=spec.fp8_mfu_factor if spec.fp8_tflops else 1.0,
        attention_efficiency=spec.attention_efficiency,
        bandwidth_efficiency=spec.bandwidth_efficiency,
        step_overhead_s=spec.step_overhead_s,
        per_seq_layer_s=spec.per_seq_layer_s,
        tp_alpha=spec.tp_alpha,
        allreduce_latency_s=spec.allreduce_latency_s,
        activation_bytes=spec.activation_overhead_gb * GB,
        gpu_memory_utilization=spec.gpu_memory_utilization,
    )


# Every catalogued part by lower-case short name (the figures live in pdcatalog/gpus.py).
GPU_PROFILES: dict[str, GpuProfile] = {
    spec.name.lower(): _profile(spec) for spec in catalog.GPUS.values()
}


def gpu_profile_for(
    product_name: str,
    memory_bytes: float | None = None,
    memory_bandwidth_gbs: float | None = None,
    nvlink_gbs: float | None = None,
    pcie_gbs: float | None = None,
) -> GpuProfile:
    """The catalog's profile for ``product_name`` (NVML name, short name or alias), with
    the inventory's own memory/bandwidth figures taking precedence. A GPU the catalog does
    not know gets an estimated profile with ``estimate=True`` and ``estimate_reason`` set
    (see :func:`pdcatalog.lookup_gpu`): explanations, the what-if and alerts show it."""
    found = catalog.lookup_gpu(
        product_name, memory_bytes=memory_bytes, memory_bandwidth_gbs=memory_bandwidth_gbs
    )
    best = _profile(found.spec, found.reason if found.estimated else "")
    changes = {}
    if memory_bytes:
        changes["memory_bytes"] = float(memory_bytes)
    if memory_bandwidth_gbs:
        changes["memory_bandwidth_gbs"] = float(memory_bandwidth_gbs)
    if nvlink_gbs is not None:
        changes["nvlink_gbs"] = float(nvlink_gbs)
    if pcie_gbs:
        changes["pcie_gbs"] = float(pcie_gbs)
    return replace(best, **changes) if changes else best


# --- Model --------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    name: str
    layers: int
    kv_heads: int
    head_dim: int
    kv_dtype_bytes: float
    params_b: float
    weight_bytes: float
    kv_bytes_per_token_explicit: int | None = None
    q_heads: int | None = None  # attention heads; default 8 × KV heads (GQA-8)
    max_model_len: int | None = None

    @property
    def kv_bytes_per_token(self) -> int:
        return _kv_formula(
            self.layers,
            self.kv_heads,
            self.head_dim,
            self.kv_dtype_bytes,
            self.kv_bytes_per_token_explicit,
        )

    @property
    def weight_dtype_bytes(self) -> float:
        if self.params_b <= 0:
            return 2.0
        return self.weight_bytes / (self.params_b * 1e9)

    @property
    def q_dim(self) -> int:
        return (self.q_heads or 8 * self.kv_heads) * self.head_dim


def model_from_scenario(name: str, spec: dict) -> ModelSpec:
    """A :class:`ModelSpec` from a ``scenarios.json`` model entry."""
    return ModelSpec(
        name=name,
        layers=spec["layers"],
        kv_heads=spec["kv_heads"],
        head_dim=spec["head_dim"],
        kv_dtype_bytes=spec["kv_dtype_bytes"],
        params_b=spec["params_b"],
        weight_bytes=spec["params_b"] * 1e9 * spec["weight_dtype_bytes"],
    )


# Parameters and links live in .kvlinks, queueing in .queueing (re-exported here).


# --- Compute ------------------------------------------------------------------------------


_TIMING_CACHE: dict = {}


@dataclass(frozen=True)
class Timing:
    """Per-iteration costs of one worker (model × GPU × TP), the simulator's step model:
    step = max(compute, memory) + overhead + per-sequence cost."""

    matmul_s_per_token: float
    attn_s_per_flop: float
    attn_coeff: float  # 4 × layers × q_dim
    mem_bw: float  # bytes/s across the worker's GPUs
    weight_bytes: float
    kv_bytes_per_token: float
    overhead_s: float
    per_seq_s: float

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuProfile, tp: int = 1) -> Timing:
        key = (model, gpu, tp)
        hit = _TIMING_CACHE.get(key)
        if hit is None:
            if len(_TIMING_CACHE) > 256:
                _TIMING_CACHE.clear()
            hit = _TIMING_CACHE[key] = cls._build(model, gpu, tp)
        return hit

    @classmethod
    def _build(cls, model: ModelSpec, gpu: GpuProfile, tp: int) -> Timing:
        tp = max(int(tp), 1)
        scale = tp / (1.0 + gpu.tp_alpha * (tp - 1))
        fp8 = model.weight_dtype_bytes <= 1
        overhead = gpu.step_overhead_s
        if tp > 1:
            overhead += 2 * model.layers * gpu.allreduce_latency_s
        return cls(
            matmul_s_per_token=2.0 * model.params_b * 1e9 / (gpu.matmul_flops(fp8) * scale),
            attn_s_per_flop=1.0 / (gpu.attention_flops() * scale),
            attn_coeff=4.0 * model.layers * model.q_dim,
            mem_bw=gpu.memory_bandwidth_gbs * GB * gpu.bandwidth_efficiency * tp,
            weight_bytes=model.weight_bytes,
            kv_bytes_per_token=model.kv_bytes_per_token,
            overhead_s=overhead,
            per_seq_s=gpu.per_seq_layer_s * model.layers,
        )

    def step(
        self, decode_seqs: float, context: float, chunk: float = 0.0, chunk_ctx: float = 0.0
    ) -> float:
        """One iteration: ``decode_seqs`` sequences of ``context`` tokens decode one token
        each, plus an optional prefill chunk of ``chunk`` tokens after ``chunk_ctx``."""
        b = max(decode_seqs, 0.0)
        compute = (b + chunk) * self.matmul_s_per_token
        compute += self.attn_coeff * chunk * (chunk_ctx + chunk / 2.0) * self.attn_s_per_flop
        kv_tokens = b * context + (chunk_ctx + chunk if chunk > 0 else 0.0)
        memory = (self.weight_bytes + kv_tokens * self.kv_bytes_per_token) / self.mem_bw
        seqs = b + (1 if chunk > 0 else 0)
        return max(compute, memory) + self.overhead_s + self.per_seq_s * seqs

    def prefill(self, uncached: float, cached: float, chunk_tokens: int) -> float:
        """A prompt alone on the engine, in chunks of ``chunk_tokens``."""
        u = max(uncached, 0.0)
        if u <= 0:
            return 0.0
        n = max(math.ceil(u / chunk_tokens), 1)
        compute = u * self.matmul_s_per_token
        compute += self.attn_coeff * u * (cached + u / 2.0) * self.attn_s_per_flop
        memory = n * self.weight_bytes / self.mem_bw
        return max(compute, memory) + n * (self.overhead_s + self.per_seq_s)

    def decode_affine(self, context: float) -> DecodeStep:
        """Decode step as fixed + per_seq × batch (memory-bound regime)."""
        fixed = self.overhead_s + self.weight_bytes / self.mem_bw
        per = context * self.kv_bytes_per_token / self.mem_bw + self.per_seq_s
        per = max(per, self.matmul_s_per_token + self.per_seq_s)
        return DecodeStep(fixed, per)


def prefill_time_s(
    model: ModelSpec,
    gpu: GpuProfile,
    tp: int,
    uncached_tokens: float,
    cached_tokens: float = 0.0,
    params: CostParams = DEFAULT_PARAMS,
) -> float:
    """Seconds to prefill ``uncached_tokens`` after ``cached_tokens`` of cached prefix.

    Linear layers: 2 × params FLOPs per token; attention: 4 × layers × q_dim FLOPs per
    (query, key) pair, causal; bounded below by reading the weights once per chunk."""
    return Timing.of(model, gpu, tp).prefill(uncached_tokens, cached_tokens, params.chunk_tokens)


@dataclass(frozen=True)
class DecodeStep:
    """Decode step time = fixed + per_seq × batch (affine in the batch at a given context)."""

    fixed_s: float
    per_seq_s: float

    def at(self, batch: float) -> float:
        return self.fixed_s + self.per_seq_s * max(batch, 0.0)


def decode_step_s(
    model: ModelSpec,
    gpu: GpuProfile,
    tp: int,
    batch: float,
    context_tokens: float,
    params: CostParams = DEFAULT_PARAMS,
) -> float:
    """Decode is memory-bound: each step reads the weights once and every sequence's KV."""
    return Timing.of(model, gpu, tp).step(batch, context_tokens)


def kv_capacity_tokens(
    model: ModelSpec, gpu: GpuProfile, tp: int, params: CostParams = DEFAULT_PARAMS
) -> float:
    """Tokens of KV one worker holds: usable GPU memory minus weights and activations."""
    per_gpu = (
        gpu.memory_bytes * gpu.gpu_memory_utilization
        - model.weight_bytes / max(tp, 1)
        - gpu.activation_bytes
    )
    return max(per_gpu * max(tp, 1), 0.0) / model.kv_bytes_per_token


def kv_capacity_sequences(
    model: ModelSpec,
    gpu: GpuProfile,
    tp: int,
    context_tokens: float,
    params: CostParams = DEFAULT_PARAMS,
) -> int:
    """Whole sequences of ``context_tokens`` that fit in one worker's KV cache."""
    if context_tokens <= 0:
        return 0
    return int(kv_capacity_tokens(model, gpu, tp, params) // context_tokens)


# --- Layout predictions -------------------------------------------------------------------


@dataclass(frozen=True)
class Workload:
    """The load one served model sees (or is planned for)."""

    rate_rps: float
    isl_mean: float
    osl_mean: float
    prefix_hit: float = 0.0  # share of prompt tokens found in the prefix cache
    isl_p95: float | None = None
    ttft_slo_s: float = 1.0
    itl_slo_s: float = 0.05
    isl_p50: float | None = None  # with the p95, fixes the prompt-length spread
    # Squared coefficient of variation of the gaps between arrivals: 1 = Poisson (the
    # default when unknown), more = bursty (see mgc_wait).
    arrival_cv2: float = 1.0
    # p95 over requests of the prompt tokens *not* found in the prefix cache. Hits are per
    # request (a prompt finds its prefix cached or not), so the tail prompt is often a miss
    # computed in full; without it every prompt is taken to hit the mean share.
    uncached_p95: float | None = None
    # Share of requests the gateway placed by prefix affinity (its routing decisions by
    # reason, "kv_prefix"); None: the upper bound from the hit rate (see affinity_share).
    affinity_share: float | None = None
    # On how many workers a followed request's prefix was held (the gateway takes the
    # cheapest admitted holder: it joins the shortest of that many queues, not the one
    # holder's own): (holders, share of followed requests) pairs. None: one holder each.
    affinity_holders: tuple[tuple[float, float], ...] | None = None
    # Conditional P/D (the gateway's router in a split): a prompt whose part not cached on
    # its decode worker is at most this many tokens is prefilled there, in decode steps,
    # not in the prefill pool (policy ``local_prefill_max_tokens``); 0 = every prompt goes
    # to the prefill pool (``disaggregated`` mode).
    local_prefill_max_tokens: int = 0
    # The arrival rate a request sees around itself (bursts): Σ n(n − 1) ÷ (Δ Σ n) over
    # windows of Δ = the TTFT target, n the arrivals in each (the mean rate for Poisson
    # arrivals; on/off traffic, e.g. Azure code, 10–20× it). None: the mean rate. With it,
    # ``arrival_cv2`` is the SCV of the gaps within a window (see dispatch.with_bursts).
    burst_rate_rps: float | None = None
    # Share of requests whose prompt part not cached is at most local_prefill_max_tokens:
    # those conditional P/D prefills on their decode worker (the gateway's
    # "pd_local_prefill" decisions ÷ all in a split; the prompt-token histogram's mass below
    # the threshold ÷ (1 − hit) otherwise). None: counted on the fitted quantile prompts,
    # which place the low end of a two-humped distribution badly (used in splits only:
    # dispatch.prompt_points).
    local_prefill_share: float | None = None
    # A finite horizon (None: steady state): judged arrivals over [start, start + horizon_s]
    # s after load began on an idle fleet; a burst lasts burst_span_s (see .horizon).
    horizon_s: float | None = None
    horizon_start_s: float = 0.0
    burst_span_s: float | None = None

    @property
    def uncached_mean(self) -> float:
        return max(self.isl_mean, 0.0) * (1.0 - _clamp(self.prefix_hit, 0.0, 1.0))

    @property
    def isl_tail(self) -> float:
        return max(self.isl_p95 or self.isl_mean, self.isl_mean, 0.0)

    @property
    def context_mean(self) -> float:
        """Average context a decoding sequence holds: the prompt plus half the answer."""
        return max(self.isl_mean, 0.0) + max(self.osl_mean, 0.0) / 2.0

    @property
    def context_full(self) -> float:
        return max(self.isl_mean, 0.0) + max(self.osl_mean, 0.0)


@dataclass(frozen=True)
class PathMix:
    """Where KV transfers go under a placement: shares by link, and the links themselves."""

    nvlink: float = 0.0
    pcie: float = 0.0
    network: float = 0.0
    nvlink_link: Link | None = None
    pcie_link: Link | None = None
    network_link: Link | None = None
    network_nodes: int = 1  # nodes whose NICs share the cross-node traffic

    def shares(self) -> list[tuple[float, Link | None]]:
        return [
            (self.nvlink, self.nvlink_link),
            (self.pcie, self.pcie_link),
            (self.network, self.network_link),
        ]


@dataclass(frozen=True)
class WorkerShape:
    """The hardware one worker runs on (the planner takes the typical worker of a model)."""

    gpu: GpuProfile
    tp: int = 1


@dataclass(frozen=True)
class Prediction:
    layout: str
    n_prefill: int
    n_decode: int
    rate_rps: float
    ttft_p95_s: float
    itl_p95_s: float
    itl_mean_s: float
    prefill_s: float  # service time of a p95-long prompt (no queueing)
    queue_p95_s: float
    transfer_s: float  # p95 KV transfer, 0 when aggregated
    transfer_mean_s: float
    decode_batch: float  # sequences per decode-capable worker
    kv_capacity_seqs: int  # whole sequences (prompt+answer) the decode pool holds
    kv_used: float  # share of decode KV in use at this load
    utilisation: float  # of the busiest stage
    bottleneck: str
    attainment: float
    goodput_rps: float
    gpus: int
    mixed_step_share: float = 0.0  # aggregated: share of decode steps carrying a prefill chunk
    chunk_s: float = 0.0  # aggregated: time a prefill chunk adds to a step
    network_share: float = 0.0
    network_link: str = ""
    transfer_bytes: float = 0.0
    capacity_rps: float = 0.0  # rate at which the busiest stage saturates (rate ÷ utilisation)
    overloaded: bool = False
    fits: bool = True  # weights fit the worker
    n_both: int = 0  # workers serving whole requests in place beside a split (mid-move)
    preempt_risk: float = 0.0  # chance decode KV overflows (sequences preempted)
    local_prefill_share: float = 0.0  # split: requests its decode pool prefills itself

    @property
    def meets_slo(self) -> bool:
        return self.fits and not self.overloaded and self.attainment >= 0.9

    @property
    def goodput_per_gpu(self) -> float:
        return self.goodput_rps / self.gpus if self.gpus else 0.0

    def as_dict(self) -> dict:
        out = {k: _finite(v) for k, v in self.__dict__.items()}
        out["meets_slo"] = self.meets_slo
        out["goodput_per_gpu"] = _finite(self.goodput_per_gpu)
        return out


def affinity_share(prefix_hit: float, params: CostParams = DEFAULT_PARAMS) -> float:
    """Share of requests routed by prefix affinity rather than by load, bounded by the
    tokens found cached: a followed request has ≥ ``params.prefix_min_match`` of its prompt
    cached, so followed ÷ all ≤ prefix_hit ÷ min_match (the bound is taken as the share)."""
    if params.prefix_min_match <= 0:
        return 0.0
    return _clamp(prefix_hit / params.prefix_min_match, 0.0, 1.0)


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def _finite(v):
    """JSON-safe: infinities become None (shown as "unbounded"), floats are rounded."""
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return None
        return round(v, 6)
    return v


def layout_name(n_prefill: int, n_decode: int) -> str:
    return "aggregated" if n_prefill == 0 else f"{n_prefill}P:{n_decode}D"
