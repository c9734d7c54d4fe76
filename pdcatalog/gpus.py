"""GPU catalog: datasheet figures and kernel efficiencies per part, keyed by NVML's name.

Sources. ``/work/shared/reference/CALIBRATION.md`` ("GPUs (vendor datasheets)") gives memory,
memory bandwidth, dense BF16/FP8 TFLOPS and GPU–GPU links of the H200 SXM, H200 NVL, H100
SXM, RTX PRO 6000 Blackwell Server, L40S and L4. The H100 PCIe/NVL, A100 and B200 rows come
from NVIDIA's product datasheets, which are *not* in shared/reference: each row says so
in ``source``; dense figures are half the "with sparsity" ones those datasheets print.
Vendor figures are peaks; the efficiency fields say what share real kernels reach:

* H100 SXM and H200 SXM efficiencies are fitted to NVIDIA AIConfigurator 0.10 estimates
  (CALIBRATION.md "Timings": Llama 3.1 8B TP1 prefill 2k/8k/32k and decode at batch
  1/16/64/256; Llama 3.1 70B TP4). ``tests/unit/test_sim_timing.py`` keeps the simulator
  within ±25 % of every row with these numbers.
* Every other part uses a fitted part's efficiencies lowered where it is PCIe-only, clocked
  lower or uses GDDR: estimates, marked ``efficiency_basis = "estimated"``.

``nvlink_gbs`` is per GPU and per direction (half the datasheet's bidirectional total).
Product names are what ``nvidia-smi --query-gpu=name`` / ``nvmlDeviceGetName`` print.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

GB = 1e9  # vendor datasheets use decimal gigabytes


@dataclass(frozen=True)
class GpuSpec:
    name: str  # short name used in configs and forms ("H100 SXM")
    nvml_name: str  # what NVML reports ("NVIDIA H100 80GB HBM3"): the catalog key
    family: str  # lower-case family token ("h100"): the fallback for unknown variants
    memory_gb: float
    memory_bandwidth_gbs: float
    bf16_tflops: float  # dense peak
    fp8_tflops: float | None  # dense peak; None where FP8 tensor cores are absent
    nvlink_gbs: float | None = None  # per GPU, one direction; None = no NVLink
    pcie_generation: int = 5
    pcie_width: int = 16
    tdp_w: float = 700.0  # board power limit
    # Shares of peak that kernels reach, and fixed costs (see the module docstring).
    mfu: float = 0.78  # prefill matmuls
    attention_efficiency: float = 0.78
    fp8_mfu_factor: float = 0.7  # FP8 kernels reach a lower share of their higher peak
    bandwidth_efficiency: float = 0.9  # decode streaming weights and KV
    step_overhead_s: float = 0.0010  # scheduler, sampling, kernel launches per iteration
    per_seq_layer_s: float = 0.30e-6  # per running sequence per layer
    tp_alpha: float = 1 / 9  # compute scales by tp / (1 + tp_alpha (tp − 1))
    allreduce_latency_s: float = 16e-6  # two per layer per step when tp > 1
    gpu_memory_utilization: float = 0.9  # vLLM's default share of memory it may use
    activation_overhead_gb: float = 2.0  # activations, CUDA graphs, NCCL buffers
    aliases: tuple[str, ...] = ()
    source: str = ""
    efficiency_basis: str = "estimated"  # "fitted" (AIConfigurator) or "estimated"

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * GB

    @property
    def pcie_gbs(self) -> float:
        """One direction of the host link: ~2 GB/s per lane at Gen4, doubling per generation."""
        return 0.25 * 2 ** (self.pcie_generation - 1) * self.pcie_width


@dataclass(frozen=True)
class GpuLookup:
    """A catalog answer. ``estimated`` is True whenever ``spec`` is not the exact entry of
    the name asked for; ``reason`` then says what was assumed, for operators to read."""

    query: str
    spec: GpuSpec
    estimated: bool = False
    reason: str = ""
    matched_by: str = "catalog"  # catalog | closest name | family | generic


_CALIBRATION = "shared/reference/CALIBRATION.md (GPUs table, vendor datasheets)"
_AICONF = "efficiencies fitted to AIConfigurator 0.10 (CALIBRATION.md, Timings)"
_NOT_IN_REF = "NVIDIA datasheet (not in shared/reference; dense = half the sparse figure)"
# Efficiencies of PCIe cards and parts without calibration rows: the H100's fitted values
# lowered (estimates). Hopper PCIe/NVL cards pair over NVLink bridges, slower all-reduce.
_HOPPER_CARD = dict(mfu=0.74, attention_efficiency=0.77, bandwidth_efficiency=0.88,
                    step_overhead_s=0.0011, tp_alpha=0.15, allreduce_latency_s=25e-6)
_AMPERE = dict(mfu=0.7, attention_efficiency=0.7, bandwidth_efficiency=0.88,
               step_overhead_s=0.0012, per_seq_layer_s=0.33e-6, fp8_mfu_factor=1.0)

_GPUS = [
    # H200 SXM: 141 GB HBM3e, 4.8 TB/s, ~989 BF16 / ~1,979 FP8 dense, NVLink 900 GB/s.
    GpuSpec("H200 SXM", "NVIDIA H200", "h200", 141, 4800, 989, 1979, nvlink_gbs=450,
            tdp_w=700, mfu=0.86, attention_efficiency=0.95, bandwidth_efficiency=0.9,
            step_overhead_s=0.0012, per_seq_layer_s=0.33e-6, allreduce_latency_s=15e-6,
            aliases=("h200", "h200-sxm", "h200-sxm5", "h200-141gb-hbm3e"),
            source=f"{_CALIBRATION}; {_AICONF}", efficiency_basis="fitted"),
    # H200 NVL (PCIe card): same memory and bandwidth, lower clocks (600 W): the datasheet's
    # 1,671 / 3,341 sparse TFLOPS are ~85 % of SXM. NVLink bridge 900 GB/s per GPU.
    GpuSpec("H200 NVL", "NVIDIA H200 NVL", "h200", 141, 4800, 835, 1671, nvlink_gbs=450,
            tdp_w=600, mfu=0.84, attention_efficiency=0.9, bandwidth_efficiency=0.88,
            step_overhead_s=0.0013, per_seq_layer_s=0.33e-6, allreduce_latency_s=18e-6,
            aliases=("h200-nvl",), source=_CALIBRATION),
    # H100 SXM: 80 GB HBM3, 3.35 TB/s, ~989 / ~1,979 dense, NVLink 900 GB/s.
    GpuSpec("H100 SXM", "NVIDIA H100 80GB HBM3", "h100", 80, 3350, 989, 1979, nvlink_gbs=450,
            tdp_w=700, mfu=0.77, attention_efficiency=0.8, bandwidth_efficiency=0.9,
            step_overhead_s=0.0010, per_seq_layer_s=0.30e-6, allreduce_latency_s=16e-6,
            aliases=("h100", "h100-sxm", "h100-sxm5", "h100-sxm5-80gb"),
            source=f"{_CALIBRATION}; {_AICONF}", efficiency_basis="fitted"),
    # H100 PCIe: 80 GB HBM2e, 2.0 TB/s, 756 / 1,513 dense (1,513 / 3,026 sparse), 350 W,
    # NVLink bridge 600 GB/s between pairs.
    GpuSpec("H100 PCIe", "NVIDIA H100 PCIe", "h100", 80, 2000, 756, 1513, nvlink_gbs=300,
            tdp_w=350, **_HOPPER_CARD, aliases=("h100-pcie", "h100-pcie-80gb"),
            source=_NOT_IN_REF),
    # H100 NVL: 94 GB HBM3, 3.9 TB/s, 835 / 1,671 dense (1,671 / 3,341 sparse), 400 W,
    # NVLink bridge 600 GB/s.
    GpuSpec("H100 NVL", "NVIDIA H100 NVL", "h100", 94, 3900, 835, 1671, nvlink_gbs=300,
            tdp_w=400, **_HOPPER_CARD, aliases=("h100-nvl", "h100-nvl-94gb"),
            source=_NOT_IN_REF),
    # B200 (HGX): 180 GB HBM3e, 8 TB/s, ~2,250 BF16 / ~4,500 FP8 dense, NVLink 5 1.8 TB/s,
    # 1,000 W. Efficiencies: the H200's lowered (no calibration rows yet).
    GpuSpec("B200", "NVIDIA B200", "b200", 180, 8000, 2250, 4500, nvlink_gbs=900, tdp_w=1000,
            mfu=0.75, attention_efficiency=0.85, bandwidth_efficiency=0.9,
            step_overhead_s=0.0012, per_seq_layer_s=0.33e-6, allreduce_latency_s=12e-6,
            aliases=("b200", "b200-sxm", "hgx-b200"), source=_NOT_IN_REF),
    # A100: 312 dense BF16 TFLOPS, no FP8; NVLink 3 600 GB/s (SXM4: NVSwitch; PCIe: bridge
    # pairs); PCIe Gen4. Bandwidth: SXM4 40GB 1,555, SXM4 80GB 2,039, PCIe 80GB 1,935 GB/s.
    GpuSpec("A100 80GB SXM4", "NVIDIA A100-SXM4-80GB", "a100", 80, 2039, 312, None,
            nvlink_gbs=300, pcie_generation=4, tdp_w=400, **_AMPERE,
            aliases=("a100-80gb", "a100-sxm4-80gb", "a100-sxm-80gb"), source=_NOT_IN_REF),
    GpuSpec("A100 40GB SXM4", "NVIDIA A100-SXM4-40GB", "a100", 40, 1555, 312, None,
            nvlink_gbs=300, pcie_generation=4, tdp_w=400, **_AMPERE,
            aliases=("a100-40gb", "a100-sxm4-40gb", "a100-sxm-40gb"), source=_NOT_IN_REF),
    GpuSpec("A100 80GB PCIe", "NVIDIA A100 80GB PCIe", "a100", 80, 1935, 312, None,
            nvlink_gbs=300, pcie_generation=4, tdp_w=300, **_AMPERE,
            aliases=("a100-pcie-80gb",), source=_NOT_IN_REF),
    GpuSpec("A100 40GB PCIe", "NVIDIA A100-PCIE-40GB", "a100", 40, 1555, 312, None,
            nvlink_gbs=300, pcie_generation=4, tdp_w=250, **_AMPERE,
            aliases=("a100-pcie-40gb",), source=_NOT_IN_REF),
    # RTX PRO 6000 Blackwell Server Edition: 96 GB GDDR7, ~1.6 TB/s, no NVLink, PCIe Gen5
    # x16, 600 W. The datasheet quotes sparse FP4 only: ~500 BF16 / ~1,000 FP8 dense is an
    # estimate. Lower efficiencies: GDDR7 and all-reduce over PCIe.
    GpuSpec("RTX PRO 6000", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "rtx-pro-6000",
            96, 1597, 500, 1000, tdp_w=600, mfu=0.7, attention_efficiency=0.7,
            bandwidth_efficiency=0.85, step_overhead_s=0.0014, per_seq_layer_s=0.35e-6,
            tp_alpha=0.2, allreduce_latency_s=40e-6,
            aliases=("rtx-pro-6000", "rtx-pro-6000-blackwell", "rtx-pro-6000-blackwell-server",
                     "rtx-pro-6000-server"),
            source=_CALIBRATION + "; dense TFLOPS estimated"),
    # L40S: 48 GB GDDR6, 864 GB/s, ~362 / ~733 dense, PCIe Gen4 x16, 350 W.
    GpuSpec("L40S", "NVIDIA L40S", "l40s", 48, 864, 362, 733, pcie_generation=4, tdp_w=350,
            mfu=0.65, attention_efficiency=0.65, bandwidth_efficiency=0.85,
            step_overhead_s=0.0015, per_seq_layer_s=0.35e-6, tp_alpha=0.25,
            allreduce_latency_s=50e-6, aliases=("l40s",), source=_CALIBRATION),
    # L4: 24 GB GDDR6, 300 GB/s, ~121 / ~242 dense, PCIe Gen4 x16, 72 W.
    GpuSpec("L4", "NVIDIA L4", "l4", 24, 300, 121, 242, pcie_generation=4, tdp_w=72,
            mfu=0.6, attention_efficiency=0.6, bandwidth_efficiency=0.85,
            step_overhead_s=0.0018, per_seq_layer_s=0.4e-6, tp_alpha=0.25,
            allreduce_latency_s=50e-6, activation_overhead_gb=1.0, aliases=("l4",),
            source=_CALIBRATION),
]

GPUS: dict[str, GpuSpec] = {spec.nvml_name: spec for spec in _GPUS}

# Order of preference when only the family is known (the most common variant first).
_FAMILY_DEFAULT = {}
for _spec in _GPUS:
    _FAMILY_DEFAULT.setdefault(_spec.family, _spec)


def normalise(name: str) -> str:
    """Lower case, runs of spaces/underscores/slashes as one dash, no "nvidia-" prefix."""
    key = re.sub(r"[\s_/]+", "-", (name or "").strip().lower())
    return key.removeprefix("nvidia-")


_INDEX: dict[str, GpuSpec] = {}
for _spec in _GPUS:
    for _key in (_spec.nvml_name, _spec.name, *_spec.aliases):
        _INDEX.setdefault(normalise(_key), _spec)


def _contains(tokens: list[str], part: list[str]) -> bool:
    n = len(part)
    return any(tokens[i:i + n] == part for i in range(len(tokens) - n + 1))


def gpu_choices() -> tuple[str, ...]:
    """Short names for forms, in catalog order."""
    return tuple(spec.name for spec in _GPUS)


def lookup_gpu(
    name: str,
    *,
    memory_bytes: float | None = None,
    memory_bandwidth_gbs: float | None = None,
) -> GpuLookup:
    """The catalog entry for ``name`` (NVML product name, short name or alias).

    Unknown names still get a spec, marked estimated: the closest entry by name (a known
    name inside the unknown one, e.g. a MIG slice of a known part), else the family's
    usual part, else a generic profile scaled from ``memory_bandwidth_gbs``.
    """
    query = (name or "").strip()
    key = normalise(query)
    spec = _INDEX.get(key)
    if spec is not None:
        return GpuLookup(query, spec)
    tokens = [t for t in key.split("-") if t]
    best = None
    for known, candidate in _INDEX.items():
        part = known.split("-")
        if _contains(tokens, part) and (best is None or len(part) > len(best[0])):
            best = (part, candidate)
    if best is not None:
        spec = best[1]
        return GpuLookup(query, spec, True, (
            f"GPU {query!r} is not in the hardware catalog; using the closest entry by name, "
            f"{spec.name} ({spec.nvml_name}), as an estimate"), "closest name")
    family = next((_FAMILY_DEFAULT[t] for t in tokens if t in _FAMILY_DEFAULT), None)
    if family is not None:
        return GpuLookup(query, family, True, (
            f"GPU {query!r} is not in the hardware catalog; using the {family.family.upper()} "
            f"family's {family.name} figures as an estimate"), "family")
    return _generic(query, memory_bytes, memory_bandwidth_gbs)


def _generic(query: str, memory_bytes: float | None, bandwidth: float | None) -> GpuLookup:
    bw = float(bandwidth) if bandwidth else 1000.0
    memory_gb = float(memory_bytes) / GB if memory_bytes else 24.0
    # ~0.2 dense BF16 TFLOPS per GB/s of memory bandwidth: the ratio of recent parts;
    # efficiencies lowered to stay on the safe side.
    spec = replace(
        _GENERIC, name=query or "unknown GPU", nvml_name=query or "unknown GPU",
        memory_gb=memory_gb, memory_bandwidth_gbs=bw, bf16_tflops=0.2 * bw,
        fp8_tflops=0.4 * bw,
    )
    what = f"GPU {query!r} is not in the hardware catalog" if query else "No GPU product name known"
    basis = "its reported" if bandwidth else "an assumed"
    return GpuLookup(query, spec, True, (
        f"{what}: compute estimated from {basis} memory bandwidth ({bw:,.0f} GB/s × 0.2 "
        f"TFLOPS per GB/s), {memory_gb:,.0f} GB; add the part to pdcatalog/gpus.py"), "generic")


_GENERIC = GpuSpec("unknown GPU", "unknown GPU", "", 24, 1000, 200, 400, mfu=0.6,
                   attention_efficiency=0.8, bandwidth_efficiency=0.8,
                   source="estimate: no datasheet")
