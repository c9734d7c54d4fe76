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

GB = 1e9


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


# --- Parameters ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CostParams:
    chunk_tokens: int = 8192  # chunked-prefill token budget per step (vLLM V1 default)
    # Link efficiency: share of nominal bandwidth a KV transfer achieves (the simulator's
    # links use the same figures: RDMA 0.87 from Mooncake, TCP 0.40, DMA 0.8–0.85).
    nvlink_efficiency: float = 0.8
    pcie_efficiency: float = 0.85
    rdma_efficiency: float = 0.87
    tcp_efficiency: float = 0.40
    # Per-transfer set-up latency (handshake, descriptor exchange).
    nvlink_latency_s: float = 10e-6
    pcie_latency_s: float = 20e-6
    rdma_latency_s: float = 50e-6
    tcp_latency_s: float = 500e-6
    # Calibration factors (measured ÷ predicted p95, see calibration.py).
    ttft_factor: float = 1.0
    itl_factor: float = 1.0


DEFAULT_PARAMS = CostParams()


# --- Links --------------------------------------------------------------------------------

LINK_KINDS = ("local", "nvlink", "pcie", "rdma", "tcp")


@dataclass(frozen=True)
class Link:
    """One path a KV transfer can take. ``gbs`` is the nominal one-way rate in GB/s."""

    kind: str  # local | nvlink | pcie | rdma | tcp
    gbs: float
    label: str = ""

    @classmethod
    def nic(cls, line_rate_gbps: float, rdma: bool, label: str = "") -> Link:
        kind = "rdma" if rdma else "tcp"
        text = label or f"{line_rate_gbps:g} G {'RDMA' if rdma else 'TCP'}"
        return cls(kind, line_rate_gbps / 8.0, text)

    @classmethod
    def pcie(cls, generation: int = 5, width: int = 16) -> Link:
        gbs = 0.25 * 2 ** (generation - 1) * width
        return cls("pcie", gbs, f"PCIe Gen{generation} x{width}")

    @classmethod
    def nvlink(cls, gbs: float = 900.0) -> Link:
        return cls("nvlink", gbs, f"NVLink {gbs:g} GB/s")

    def describe(self) -> str:
        return self.label or f"{self.kind} {self.gbs:g} GB/s"


def link_efficiency(kind: str, params: CostParams = DEFAULT_PARAMS) -> float:
    return {
        "local": 1.0,
        "nvlink": params.nvlink_efficiency,
        "pcie": params.pcie_efficiency,
        "rdma": params.rdma_efficiency,
        "tcp": params.tcp_efficiency,
    }.get(kind, params.tcp_efficiency)


def link_latency_s(kind: str, params: CostParams = DEFAULT_PARAMS) -> float:
    return {
        "local": 0.0,
        "nvlink": params.nvlink_latency_s,
        "pcie": params.pcie_latency_s,
        "rdma": params.rdma_latency_s,
        "tcp": params.tcp_latency_s,
    }.get(kind, params.tcp_latency_s)


def effective_gbs(link: Link, params: CostParams = DEFAULT_PARAMS) -> float:
    return link.gbs * link_efficiency(link.kind, params)


def transfer_time_s(
    nbytes: float, link: Link, params: CostParams = DEFAULT_PARAMS, nominal: bool = False
) -> float:
    """Seconds to move ``nbytes`` over ``link``. ``nominal`` uses the bare line rate (the
    brief's back-of-envelope arithmetic); otherwise efficiency and set-up latency apply."""
    if nbytes <= 0 or link.kind == "local":
        return 0.0
    if link.gbs <= 0:
        return math.inf
    if nominal:
        return nbytes / (link.gbs * GB)
    return link_latency_s(link.kind, params) + nbytes / (effective_gbs(link, params) * GB)


def best_link(candidates: list[Link], params: CostParams = DEFAULT_PARAMS) -> Link | None:
    """The fastest of several paths (highest effective rate); ties: the cheaper kind first."""
    if not candidates:
        return None
    order = {kind: i for i, kind in enumerate(LINK_KINDS)}
    return max(candidates, key=lambda lk: (effective_gbs(lk, params), -order.get(lk.kind, 9)))


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


# --- Queueing -----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueueWait:
    """Waiting time in an M/G/c queue (Sakasegawa's approximation, exponential tail)."""

    utilisation: float
    p_wait: float
    mean_s: float
    p95_s: float

    def p_wait_over(self, seconds: float) -> float:
        """Share of arrivals that wait longer than ``seconds``."""
        if self.utilisation >= 1:
            return 1.0
        if self.p_wait <= 0 or self.mean_s <= 0:
            return 0.0
        if seconds <= 0:
            return self.p_wait
        return self.p_wait * math.exp(-seconds * self.p_wait / self.mean_s)


def mgc_wait(
    rate: float, service_s: float, servers: int, service_cv2: float = 1.0
) -> QueueWait:
    """M/G/c waiting time: Wq ≈ ρ^(√(2(c+1))−1) / (c(1−ρ)) × (1+cs²)/2 × S.

    Poisson arrivals (ca² = 1). The probability of waiting is the Erlang-C term of the same
    approximation; given a wait, it is taken as exponential, which yields the p95."""
    if rate <= 0 or service_s <= 0 or servers <= 0:
        return QueueWait(0.0, 0.0, 0.0, 0.0)
    rho = rate * service_s / servers
    if rho >= 1:
        return QueueWait(rho, 1.0, math.inf, math.inf)
    p_wait = min(1.0, rho ** (math.sqrt(2.0 * (servers + 1)) - 1.0))
    mean = p_wait / (servers * (1.0 - rho)) * (1.0 + service_cv2) / 2.0 * service_s
    p95 = 0.0
    if p_wait > 0.05 and mean > 0:
        p95 = (mean / p_wait) * math.log(p_wait / 0.05)
    return QueueWait(rho, p_wait, mean, p95)


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


def _capacity(rate: float, util: float) -> float:
    if util <= 0 or math.isinf(util) or math.isnan(util):
        return 0.0 if util and util > 0 else math.inf
    return rate / util


def _clamp(x: float, lo: float, hi: float) -> float:
    return lo if x < lo else hi if x > hi else x


def _finite(v):
    """JSON-safe: infinities become None (shown as "unbounded"), floats are rounded."""
    if isinstance(v, float):
        if math.isinf(v) or math.isnan(v):
            return None
        return round(v, 6)
    return v


def _normal_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def _p_within(value: float, target: float) -> float:
    """Share of requests meeting a target when ``value`` is (nearly) deterministic: 1 at or
    under the target, decaying fast above it (so layouts still rank by how far they miss)."""
    if value <= target:
        return 1.0
    if math.isinf(value):
        return 0.0
    return math.exp(-(value - target) / (0.05 * target))


def layout_name(n_prefill: int, n_decode: int) -> str:
    return "aggregated" if n_prefill == 0 else f"{n_prefill}P:{n_decode}D"


def combine_pools(
    layout: str, n_prefill: int, n_decode: int, n_both: int, rate_rps: float,
    parts: list[tuple[float, Prediction]],
) -> Prediction:
    """One prediction for a fleet whose traffic splits over pools that do not share work,
    e.g. mid-move: 'both' workers serving whole requests in place (an aggregated pool) beside
    a P:D split. ``parts`` are (share of the traffic, the pool's prediction at that share).
    Goodput adds up; the tails are the worst tail of any pool carrying ≥ 5 % of requests
    (a p95 of a mixture is at most the largest p95 of its parts); the fleet saturates when
    its first pool does."""
    live = [(s, p) for s, p in parts if s > 0]
    tails = [p for s, p in live if s >= 0.05] or [p for _s, p in live]
    goodput = sum(p.goodput_rps for _s, p in live)
    caps = [p.capacity_rps / s for s, p in live if s > 0]
    busiest = max(live, key=lambda sp: sp[1].utilisation)[1] if live else None

    def worst(attr: str) -> float:
        return max((getattr(p, attr) for p in tails), default=0.0)

    def mean(attr: str) -> float:
        return sum(s * getattr(p, attr) for s, p in live)

    return Prediction(
        layout=layout, n_prefill=n_prefill, n_decode=n_decode, n_both=n_both,
        rate_rps=rate_rps,
        ttft_p95_s=worst("ttft_p95_s"), itl_p95_s=worst("itl_p95_s"),
        itl_mean_s=mean("itl_mean_s"), prefill_s=worst("prefill_s"),
        queue_p95_s=worst("queue_p95_s"), transfer_s=worst("transfer_s"),
        transfer_mean_s=mean("transfer_mean_s"), decode_batch=mean("decode_batch"),
        kv_capacity_seqs=sum(p.kv_capacity_seqs for _s, p in live),
        kv_used=max((p.kv_used for _s, p in live), default=0.0),
        utilisation=busiest.utilisation if busiest else 0.0,
        bottleneck=busiest.bottleneck if busiest else "",
        attainment=_clamp(goodput / rate_rps, 0.0, 1.0) if rate_rps > 0 else 0.0,
        goodput_rps=goodput, gpus=sum(p.gpus for _s, p in parts),
        mixed_step_share=max((p.mixed_step_share for _s, p in live), default=0.0),
        chunk_s=max((p.chunk_s for _s, p in live), default=0.0),
        network_share=max((p.network_share for _s, p in live), default=0.0),
        network_link=next((p.network_link for _s, p in live if p.network_link), ""),
        transfer_bytes=max((p.transfer_bytes for _s, p in live), default=0.0),
        capacity_rps=min(caps) if caps else math.inf,
        overloaded=any(p.overloaded for _s, p in live),
        fits=all(p.fits for _s, p in parts),
    )


def _overloaded(
    layout: str, np_: int, nd: int, w: Workload, util: float, where: str, gpus: int, **extra
) -> Prediction:
    # Overloaded: queues grow without bound, so in the long run nearly nothing meets the
    # targets. Goodput 0; layouts still rank among themselves by capacity_rps.
    base = {
        "layout": layout,
        "n_prefill": np_,
        "n_decode": nd,
        "rate_rps": w.rate_rps,
        "ttft_p95_s": math.inf,
        "itl_p95_s": extra.pop("itl_p95_s", math.inf),
        "itl_mean_s": extra.pop("itl_mean_s", math.inf),
        "prefill_s": extra.pop("prefill_s", 0.0),
        "queue_p95_s": math.inf,
        "transfer_s": extra.pop("transfer_s", 0.0),
        "transfer_mean_s": extra.pop("transfer_mean_s", 0.0),
        "decode_batch": extra.pop("decode_batch", 0.0),
        "kv_capacity_seqs": extra.pop("kv_capacity_seqs", 0),
        "kv_used": extra.pop("kv_used", 1.0),
        "utilisation": util,
        "bottleneck": where,
        "attainment": 0.0,
        "goodput_rps": 0.0,
        "gpus": gpus,
        "capacity_rps": _capacity(w.rate_rps, util),
        "overloaded": True,
    }
    base.update(extra)
    return Prediction(**base)


def predict_aggregated(
    model: ModelSpec,
    shape: WorkerShape,
    workers: int,
    w: Workload,
    params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """Every worker prefills (in chunks mixed into decode steps) and decodes."""
    gpus = workers * shape.tp
    cap_tokens = kv_capacity_tokens(model, shape.gpu, shape.tp, params)
    cap_seqs = int(workers * (cap_tokens // max(w.context_full, 1.0)))
    name = "aggregated"
    if cap_tokens <= 0 or workers <= 0:
        return _overloaded(name, 0, workers, w, math.inf, "weights do not fit", gpus, fits=False)
    r = w.rate_rps / workers
    u = w.uncached_mean
    cached = max(w.isl_mean - u, 0.0)
    timing = Timing.of(model, shape.gpu, shape.tp)
    ctx = w.context_mean
    chunk_tokens = min(u, float(params.chunk_tokens))
    n_chunks = max(u / params.chunk_tokens, 1.0) if u > 0 else 0.0
    chunk_ctx = cached + max(u - chunk_tokens, 0.0) / 2.0
    batch = 0.0
    t_d = timing.step(0, ctx)
    t_c = 0.0
    rho_p = f = 0.0
    itl_mean = t_d
    for _ in range(12):
        t_d = timing.step(batch, ctx)
        t_c = timing.step(batch, ctx, chunk_tokens, chunk_ctx) - t_d if u > 0 else 0.0
        rho_p = r * n_chunks * (t_d + t_c)
        if rho_p >= 1:
            break
        mixed = rho_p / (t_d + t_c) if t_d + t_c > 0 else 0.0
        pure = (1.0 - rho_p) / t_d
        f = mixed / (mixed + pure) if mixed + pure > 0 else 0.0
        itl_mean = t_d + f * t_c
        batch = r * w.osl_mean * itl_mean
    kv_need = batch * w.context_mean + r * n_chunks * (t_d + t_c) * w.isl_mean
    kv_used = kv_need / cap_tokens
    util = max(rho_p, kv_used)
    extra = {
        "kv_capacity_seqs": cap_seqs,
        "decode_batch": batch,
        "mixed_step_share": f,
        "chunk_s": t_c,
        "itl_mean_s": itl_mean * params.itl_factor,
    }
    if rho_p >= 1 or kv_used >= 1:
        where = "prefill (chunks mixed into decode steps)" if rho_p >= kv_used else "KV cache"
        return _overloaded(name, 0, workers, w, max(util, 1.0), where, gpus, **extra)
    service_mean = n_chunks * (t_d + t_c)
    tail_uncached = w.isl_tail * (1.0 - _clamp(w.prefix_hit, 0.0, 1.0))
    service_p95 = max(tail_uncached / params.chunk_tokens, 1.0) * (t_d + t_c) if u > 0 else 0
    cv2 = _service_cv2(w)
    wait = mgc_wait(w.rate_rps, service_mean, workers, cv2)
    k = params.ttft_factor
    ttft_p95 = (wait.p95_s + service_p95 + t_d) * k
    ttft_fixed = (service_mean + t_d) * k
    p_ttft = 0.0 if ttft_fixed >= w.ttft_slo_s else 1.0 - wait.p_wait_over(
        (w.ttft_slo_s - ttft_fixed) / k
    )
    itl_p95 = (t_d + t_c if f > 0.05 else t_d) * params.itl_factor
    # A request misses ITL when its answer sees too many mixed steps: K ~ Poisson(osl × f).
    t_d_k, t_c_k = t_d * params.itl_factor, t_c * params.itl_factor
    if t_d_k >= w.itl_slo_s:
        p_itl = _p_within(t_d_k, w.itl_slo_s)
    elif f <= 0 or t_c_k <= 0:
        p_itl = 1.0
    else:
        allowed = (w.itl_slo_s - t_d_k) * max(w.osl_mean, 1.0) / t_c_k
        m = max(w.osl_mean, 1.0) * f
        p_itl = 1.0 - _normal_tail((allowed - m) / math.sqrt(m))
    attainment = _clamp(p_ttft * p_itl, 0.0, 1.0)
    return Prediction(
        layout=name,
        n_prefill=0,
        n_decode=workers,
        rate_rps=w.rate_rps,
        ttft_p95_s=ttft_p95,
        itl_p95_s=itl_p95,
        itl_mean_s=itl_mean * params.itl_factor,
        prefill_s=service_p95 * k,
        queue_p95_s=wait.p95_s * k,
        transfer_s=0.0,
        transfer_mean_s=0.0,
        decode_batch=batch,
        kv_capacity_seqs=cap_seqs,
        kv_used=kv_used,
        utilisation=util,
        bottleneck="prefill" if rho_p >= kv_used else "KV cache",
        attainment=attainment,
        goodput_rps=w.rate_rps * attainment,
        gpus=gpus,
        mixed_step_share=f,
        chunk_s=t_c,
        capacity_rps=_capacity(w.rate_rps, util),
    )


def _service_cv2(w: Workload) -> float:
    """Squared coefficient of variation of prompt lengths, from mean and p95 (exponential-
    like tails give ~1; fixed lengths 0)."""
    if not w.isl_p95 or w.isl_mean <= 0:
        return 1.0
    # For an exponential, p95 ≈ 3 × mean; scale between fixed (p95 = mean) and that.
    spread = _clamp((w.isl_p95 / w.isl_mean - 1.0) / 2.0, 0.0, 1.5)
    return spread * spread


def predict_split(
    model: ModelSpec,
    shape: WorkerShape,
    n_prefill: int,
    n_decode: int,
    w: Workload,
    paths: PathMix,
    params: CostParams = DEFAULT_PARAMS,
) -> Prediction:
    """``n_prefill`` workers prefill whole prompts, ship the KV, ``n_decode`` workers decode."""
    name = layout_name(n_prefill, n_decode)
    gpus = (n_prefill + n_decode) * shape.tp
    cap_tokens = kv_capacity_tokens(model, shape.gpu, shape.tp, params)
    cap_seqs = int(n_decode * (cap_tokens // max(w.context_full, 1.0)))
    if cap_tokens <= 0:
        return _overloaded(name, n_prefill, n_decode, w, math.inf, "weights do not fit", gpus,
                           fits=False)
    if n_prefill <= 0 or n_decode <= 0:
        return _overloaded(name, n_prefill, n_decode, w, math.inf, "empty pool", gpus,
                           kv_capacity_seqs=cap_seqs)
    u = w.uncached_mean
    cached = max(w.isl_mean - u, 0.0)
    hit = _clamp(w.prefix_hit, 0.0, 1.0)
    timing = Timing.of(model, shape.gpu, shape.tp)
    service_mean = timing.prefill(u, cached, params.chunk_tokens)
    tail_u = w.isl_tail * (1.0 - hit)
    service_p95 = timing.prefill(tail_u, w.isl_tail * hit, params.chunk_tokens)
    wait = mgc_wait(w.rate_rps, service_mean, n_prefill, _service_cv2(w))
    # KV transfer of the whole prompt to the decode worker.
    kvb = model.kv_bytes_per_token
    nbytes_mean = w.isl_mean * kvb
    nbytes_tail = w.isl_tail * kvb
    t_mean = 0.0
    t_tail = 0.0
    tail_share = 0.0
    link_util = 0.0
    # Slowest paths first: the p95 transfer is the slowest path carrying > 5 % of transfers.
    for share, link in reversed(paths.shares()):
        if share <= 0:
            continue
        if link is None or link.gbs <= 0:
            return _overloaded(name, n_prefill, n_decode, w, math.inf, "no KV path", gpus,
                               kv_capacity_seqs=cap_seqs)
        inflate = 1.0
        if link.kind in ("rdma", "tcp"):
            per_nic = w.rate_rps * share * nbytes_mean / max(paths.network_nodes, 1)
            link_util = per_nic / (effective_gbs(link, params) * GB)
            if link_util >= 1:
                t_one = transfer_time_s(nbytes_tail, link, params)
                return _overloaded(name, n_prefill, n_decode, w,
                                   max(link_util, wait.utilisation),
                                   f"KV transfer over {link.describe()}", gpus,
                                   network_share=paths.network, network_link=link.describe(),
                                   transfer_s=t_one, transfer_mean_s=t_one,
                                   transfer_bytes=nbytes_mean, kv_capacity_seqs=cap_seqs)
            inflate = 1.0 / (1.0 - link_util)
        t_mean += share * transfer_time_s(nbytes_mean, link, params) * inflate
        if tail_share < 0.05:
            t_tail = max(t_tail, transfer_time_s(nbytes_tail, link, params) * inflate)
        tail_share += share
    # Decode pool: batch b solves b = r × osl × step(b) (Little's law).
    r = w.rate_rps / n_decode
    step = timing.decode_affine(w.context_mean)
    load = r * w.osl_mean * step.per_seq_s
    rho_pre = wait.utilisation
    common = {
        "prefill_s": service_p95 * params.ttft_factor,
        "transfer_s": t_tail,
        "transfer_mean_s": t_mean,
        "kv_capacity_seqs": cap_seqs,
        "network_share": paths.network,
        "network_link": paths.network_link.describe() if paths.network_link else "",
        "transfer_bytes": nbytes_mean,
    }
    if load >= 1:
        return _overloaded(name, n_prefill, n_decode, w, max(load, rho_pre, 1.0), "decode",
                           gpus, **common)
    batch = r * w.osl_mean * step.fixed_s / (1.0 - load)
    t_d = step.at(batch)
    kv_used = batch * w.context_mean / cap_tokens
    if rho_pre >= 1 or kv_used >= 1:
        where = "prefill" if rho_pre >= kv_used else "decode KV cache"
        return _overloaded(name, n_prefill, n_decode, w, max(rho_pre, kv_used), where, gpus,
                           decode_batch=batch, kv_used=kv_used, itl_p95_s=t_d,
                           itl_mean_s=t_d, **common)
    k = params.ttft_factor
    ttft_p95 = (wait.p95_s + service_p95 + t_d) * k + t_tail
    ttft_fixed = (service_mean + t_d) * k + t_mean
    p_ttft = 0.0 if ttft_fixed >= w.ttft_slo_s else 1.0 - wait.p_wait_over(
        (w.ttft_slo_s - ttft_fixed) / k
    )
    itl = t_d * params.itl_factor
    # Per-request mean ITL scatters around the mean step as the batch rises and falls with
    # arrivals: ~6 % (fitted to the simulator's P/D runs).
    p_itl = 1.0 - _normal_tail((w.itl_slo_s - itl) / max(0.06 * itl, 1e-9))
    attainment = _clamp(p_ttft * p_itl, 0.0, 1.0)
    util = max(rho_pre, load, kv_used, link_util)
    bottleneck = max(
        [("prefill", rho_pre), ("decode", load), ("decode KV cache", kv_used),
         ("KV transfer", link_util)],
        key=lambda x: x[1],
    )[0]
    return Prediction(
        layout=name,
        n_prefill=n_prefill,
        n_decode=n_decode,
        rate_rps=w.rate_rps,
        ttft_p95_s=ttft_p95,
        itl_p95_s=itl,
        itl_mean_s=itl,
        queue_p95_s=wait.p95_s * k,
        decode_batch=batch,
        kv_used=kv_used,
        utilisation=util,
        bottleneck=bottleneck,
        attainment=attainment,
        goodput_rps=w.rate_rps * attainment,
        gpus=gpus,
        capacity_rps=_capacity(w.rate_rps, util),
        **common,
    )
