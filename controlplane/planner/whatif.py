"""What-if advisor: for given hardware, links, model and traffic, how would each layout do?

Pure. Answers the brief's question — aggregate or split, in what ratio — with the
arithmetic shown, for a fleet that need not exist yet.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from .costmodel import (
    DEFAULT_PARAMS,
    Link,
    ModelSpec,
    Timing,
    WorkerShape,
    gpu_profile_for,
    kv_capacity_tokens,
    transfer_time_s,
)
from .explain import gbytes, secs
from .placement import NicInput, NodeLinks, Topology, WorkerInput
from .planner import LoadInput, ModelInput, predict, workload_for
from .steps import rank_prediction

KV_PATHS = ("auto", "nvlink", "pcie", "nic")


class WhatIfError(ValueError):
    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{k}: {v}" for k, v in errors.items()))
        self.errors = errors


@dataclass(frozen=True)
class WhatIfQuery:
    gpu: str = "H200 NVL"
    nodes: int = 1
    gpus_per_node: int = 8
    tp: int = 1
    nvlink_group_size: int = 0  # GPUs per NVLink group; 0 = no NVLink
    nic_gbps: float = 100.0
    rdma: bool = False
    pcie_generation: int = 5
    # Model geometry (defaults: Llama 3.3 70B FP8)
    model: str = "llama-3.3-70b-fp8"
    layers: int = 80
    kv_heads: int = 8
    head_dim: int = 128
    kv_dtype_bytes: float = 1.0
    params_b: float = 70.6
    weight_dtype_bytes: float = 1.0
    # Traffic and targets
    isl: float = 4000
    osl: float = 300
    prefix_hit: float = 0.0
    rate_rps: float = 1.0
    ttft_slo_ms: float = 2500
    itl_slo_ms: float = 50
    inflight_peak: int = 0  # 0: unknown, the KV check uses each layout's preemption risk
    # Prompt-length spread: p50 and p95 (0 = unknown; with only the mean, every prompt is
    # taken to be that long and the tail that sets TTFT p95 is invisible).
    isl_p50: float = 0
    isl_p95: float = 0
    # The KV path between the prefill and decode pools: "auto" (placement picks NVLink,
    # PCIe or the NIC), or every transfer over "nvlink", "pcie" or "nic"; kv_link_gbps
    # overrides that path's rate (Gb/s; 0 = from the hardware fields above).
    kv_path: str = "auto"
    kv_link_gbps: float = 0

    @classmethod
    def from_dict(cls, data: dict) -> WhatIfQuery:
        """Parse and check a JSON/GET mapping; unknown or bad fields raise WhatIfError."""
        known = {f.name: f for f in fields(cls)}
        errors: dict[str, str] = {}
        values = {}
        for key, raw in (data or {}).items():
            if key not in known:
                errors[key] = "unknown field"
                continue
            kind = type(getattr(cls(), key))
            try:
                if kind is bool:
                    values[key] = raw if isinstance(raw, bool) else str(raw).lower() in (
                        "1", "true", "yes", "on")
                elif kind is str:
                    values[key] = str(raw)[:100]
                else:
                    v = kind(raw)
                    if isinstance(v, float) and not math.isfinite(v):
                        raise ValueError
                    values[key] = v
            except (TypeError, ValueError):
                errors[key] = f"must be a {kind.__name__}"
        q = cls(**values)
        errors.update({k: v for k, v in q.validate().items() if k not in errors})
        if errors:
            raise WhatIfError(errors)
        return q

    def validate(self) -> dict[str, str]:
        e = {}
        for name in ("nodes", "gpus_per_node", "tp", "layers", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                e[name] = "must be at least 1"
        if self.nodes * self.gpus_per_node > 4096:
            e["nodes"] = "at most 4,096 GPUs"
        if self.tp > self.gpus_per_node:
            e["tp"] = "cannot exceed GPUs per node"
        for name in ("nic_gbps", "kv_dtype_bytes", "params_b", "weight_dtype_bytes",
                     "ttft_slo_ms", "itl_slo_ms"):
            if getattr(self, name) <= 0:
                e[name] = "must be positive"
        for name in ("isl", "osl", "rate_rps", "inflight_peak"):
            if getattr(self, name) < 0:
                e[name] = "must not be negative"
        if not 0 <= self.prefix_hit <= 1:
            e["prefix_hit"] = "must be in [0, 1]"
        if self.nvlink_group_size < 0:
            e["nvlink_group_size"] = "must not be negative"
        if self.pcie_generation not in (3, 4, 5, 6):
            e["pcie_generation"] = "must be 3, 4, 5 or 6"
        if self.kv_path not in KV_PATHS:
            e["kv_path"] = "must be one of " + ", ".join(KV_PATHS)
        if self.kv_link_gbps < 0:
            e["kv_link_gbps"] = "must not be negative"
        for name in ("isl_p50", "isl_p95"):
            if getattr(self, name) < 0:
                e[name] = "must not be negative"
        if self.isl_p95 and self.isl_p95 < self.isl:
            e["isl_p95"] = "must be at least the mean prompt length (isl)"
        if self.isl_p50 and self.isl_p95 and self.isl_p50 > self.isl_p95:
            e["isl_p50"] = "must not exceed isl_p95"
        return e


@dataclass
class WhatIfAnswer:
    query: WhatIfQuery
    candidates: list[dict]
    best: str
    arithmetic: list[str] = field(default_factory=list)
    explanation: str = ""
    gpu_estimate: str = ""  # why the GPU's profile is estimated; "" when it is catalogued
    # Why no layout works, binding constraint first; [] when one does.
    infeasible: list[str] = field(default_factory=list)
    # What is wrong with the shape asked for though layouts of it may still meet the
    # targets (a TP that leaves GPUs idle); [] when nothing is.
    shape: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {
            "query": dict(self.query.__dict__),
            "best": self.best,
            "candidates": self.candidates,
            "arithmetic": self.arithmetic,
            "explanation": self.explanation,
            "gpu_estimate": self.gpu_estimate,
            "infeasible": self.infeasible,
            "shape": self.shape,
        }


def whatif(q: WhatIfQuery) -> WhatIfAnswer:
    from controlplane.policies.effective import EffectivePolicy

    errors = q.validate()
    if errors:
        raise WhatIfError(errors)
    model = ModelSpec(
        q.model, q.layers, q.kv_heads, q.head_dim, q.kv_dtype_bytes, q.params_b,
        q.params_b * 1e9 * q.weight_dtype_bytes,
    )
    gpu = gpu_profile_for(q.gpu)
    workers = []
    per_node = q.gpus_per_node // q.tp
    links = {}
    group_size = q.nvlink_group_size
    if q.kv_path == "nvlink":
        group_size = q.gpus_per_node  # every transfer inside one NVLink domain
    elif q.kv_path in ("pcie", "nic"):
        group_size = 0
    for n in range(q.nodes):
        node = f"node-{n}"
        links[node] = _node_links(q, gpu, group_size)
        for k in range(per_node):
            group = (k * q.tp) // group_size if group_size > 1 else None
            workers.append(WorkerInput(len(workers), f"{node}/w{k}", node, group))
    policy = EffectivePolicy(ttft_p95_ms=q.ttft_slo_ms, itl_p95_ms=q.itl_slo_ms)
    load = LoadInput(q.rate_rps, q.rate_rps, q.isl, q.isl_p95 or None, q.osl, q.prefix_hit,
                     q.inflight_peak, q.inflight_peak, isl_p50=q.isl_p50 or None)
    inp = ModelInput(0, model, WorkerShape(gpu, q.tp), tuple(workers), load, policy, links)
    w = workload_for(load, policy, q.rate_rps)
    topo = Topology(workers, links)
    preds = [predict(inp, p, w, topo) for p in range(0, len(workers))]
    peak = q.inflight_peak
    rows = []
    for p in preds:
        row = p.as_dict()
        # Known peak: it must fit the decode pool; unknown: the predicted KV occupancy must
        # not risk preemption (the cost model's tail of the decode pool's held tokens).
        row["holds_inflight_peak"] = (peak <= p.kv_capacity_seqs if peak > 0
                                      else p.fits and p.preempt_risk < 0.05)
        rows.append(row)
    ok = [p for p, r in zip(preds, rows, strict=True) if r["holds_inflight_peak"]] or preds
    # The planner's own order (goodput share to 0.1 %, capacity to 1 %, fewer prefill): a
    # what-if must not call a layout best on a difference the planner treats as a tie
    # (aggregated at 99.999 % within targets lost to 7P:1D at 100 % on the sixth decimal).
    best = max(ok, key=rank_prediction)
    arith = _arithmetic(q, model, gpu, w)
    agg = preds[0]
    infeasible = _infeasible(q, model, gpu, w, preds, best, policy.attainment)
    shape = _shape_problems(q)
    expl = (
        f"Best: {best.layout} — goodput {best.goodput_rps:,.2f} of {q.rate_rps:,.2f} req/s "
        f"({best.goodput_per_gpu:,.3f} per GPU); TTFT p95 {secs(best.ttft_p95_s)}, ITL p95 "
        f"{secs(best.itl_p95_s)}. Aggregated: goodput {agg.goodput_rps:,.2f} req/s, TTFT p95 "
        f"{secs(agg.ttft_p95_s)}, ITL p95 {secs(agg.itl_p95_s)}."
    )
    if infeasible:  # the binding reason leads; the table below is only the detail
        lead = "No layout meets the targets: " + "; ".join(infeasible) + "."
        expl = lead if not best.fits else f"{lead} {expl}"
    if shape:  # wasteful, not impossible: said first, without claiming no layout works
        expl = "Invalid shape: " + "; ".join(shape) + f". {expl}"
    if gpu.estimate:  # an unknown GPU: say so first, the figures below rest on a guess
        expl = f"Estimated GPU profile: {gpu.estimate_reason}. {expl}"
    return WhatIfAnswer(q, rows, best.layout, arith, expl, gpu.estimate_reason, infeasible,
                        shape)


def _node_links(q: WhatIfQuery, gpu, group_size: int) -> NodeLinks:
    """One node's links, shaped by the chosen KV path."""
    override = q.kv_link_gbps / 8.0 if q.kv_link_gbps > 0 else 0.0
    nic_rate = q.kv_link_gbps if q.kv_path == "nic" and q.kv_link_gbps > 0 else q.nic_gbps
    nics = (NicInput("net", nic_rate, q.rdma),)
    pcie = Link.pcie(q.pcie_generation, 16)
    if q.kv_path == "pcie" and override:
        pcie = Link("pcie", override, f"PCIe {override:g} GB/s")
    if q.kv_path == "nic":
        # Every transfer takes the NIC, also between GPUs of one node.
        pcie = Link.nic(nic_rate, q.rdma)
    nvl = None
    if group_size > 1:
        rate = override if q.kv_path == "nvlink" and override else (gpu.nvlink_gbs or 450)
        nvl = Link.nvlink(rate)
    return NodeLinks(pcie, nvl, nics)


def _shape_problems(q: WhatIfQuery) -> list[str]:
    idle = q.gpus_per_node % q.tp
    if not idle:
        return []
    return [f"TP{q.tp} leaves {idle} of {q.gpus_per_node} GPUs per node idle "
            f"({q.gpus_per_node // q.tp} workers of {q.tp} GPUs each)"]


def _infeasible(q: WhatIfQuery, model: ModelSpec, gpu, w, preds, best, attainment) -> list[str]:
    """The constraints that bind, most basic first: the weights, the decode floor, then
    the best layout's own bottleneck."""
    out = []
    if kv_capacity_tokens(model, gpu, q.tp) <= 0:
        per_gpu = model.weight_bytes / q.tp / 1e9
        usable = (gpu.memory_bytes * gpu.gpu_memory_utilization - gpu.activation_bytes) / 1e9
        out.append(f"the weights do not fit: {per_gpu:,.1f} GB per GPU at TP{q.tp} against "
                   f"{usable:,.1f} GB usable on a {gpu.name}")
        return out
    floor = Timing.of(model, gpu, q.tp).step(1, w.context_mean)
    if floor > q.itl_slo_ms / 1000:
        out.append(f"the ITL target {secs(q.itl_slo_ms / 1000)} is below the batch-1 decode "
                   f"step ({secs(floor)} at TP{q.tp} on a {gpu.name}): no layout can meet it")
    if not any(p.fits and not p.overloaded and p.attainment >= attainment for p in preds):
        why = "the weights do not fit" if not best.fits else best.bottleneck
        out.append(f"at {q.rate_rps:,.2f} req/s even the best layout, {best.layout}, keeps only "
                   f"{best.attainment:.0%} within targets (binding: {why})")
    return out


def _kv_paths(q: WhatIfQuery, gpu) -> list[Link]:
    """The links the arithmetic prices a prompt's KV over: with ``kv_path`` "auto" every
    link the hardware fields give (placement picks among them); else only the form's path
    at its rate (``kv_link_gbps`` when set), the one the layouts above were priced on — a
    25 Gb/s path must not be shown as the node's 400 G NIC."""
    if q.kv_path == "auto":
        paths = [Link.nic(q.nic_gbps, q.rdma), Link.pcie(q.pcie_generation, 16)]
        if q.nvlink_group_size > 1:
            paths.append(Link.nvlink(gpu.nvlink_gbs or 450))
        return paths
    links = _node_links(q, gpu, q.gpus_per_node if q.kv_path == "nvlink" else 0)
    if q.kv_path == "nvlink" and links.nvlink is not None:
        return [links.nvlink]
    return [links.pcie]  # "pcie", or "nic" (every transfer over the NIC, see _node_links)


def _arithmetic(q: WhatIfQuery, model: ModelSpec, gpu, w) -> list[str]:
    kvb = model.kv_bytes_per_token
    nbytes = q.isl * kvb
    lines = [
        f"KV per token = 2 × {q.layers} layers × {q.kv_heads} KV heads × {q.head_dim} × "
        f"{q.kv_dtype_bytes:g} B = {kvb:,} B ({kvb / 1024:,.0f} KiB)",
        f"a {q.isl:,.0f}-token prompt holds {gbytes(nbytes)} of KV",
    ]
    for link in _kv_paths(q, gpu):
        lines.append(
            f"over {link.describe()}: {secs(transfer_time_s(nbytes, link, nominal=True))} at "
            f"line rate, {secs(transfer_time_s(nbytes, link, DEFAULT_PARAMS))} at the usual "
            "efficiency"
        )
    cap = kv_capacity_tokens(model, gpu, q.tp)
    ctx = q.isl + q.osl
    lines.append(
        f"one worker ({q.tp}× {gpu.name}, {gpu.memory_bytes / 1e9:,.0f} GB each) keeps "
        f"{cap:,.0f} tokens of KV after {model.weight_bytes / 1e9:,.1f} GB of weights: "
        f"{int(cap // ctx) if ctx else 0} sequences of {ctx:,.0f} tokens"
    )
    t = Timing.of(model, gpu, q.tp)
    u = w.uncached_mean
    lines.append(
        f"prefill of {u:,.0f} uncached tokens: {secs(t.prefill(u, q.isl - u, 8192))}; decode "
        f"step at batch 1 / 32: {secs(t.step(1, w.context_mean))} / "
        f"{secs(t.step(32, w.context_mean))}"
    )
    return lines
