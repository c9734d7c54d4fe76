"""The workloads of bench/planner_shift.py: the demo's chat → RAG → quiet cycles and the
public traces under a rate curve (Azure conversation 0.5× → 3× → 0.5×, Mooncake 1× → 4× → 1×),
as virtual-time request lists with their phases and SLOs. Seeds do not depend on the process
(the planner's run and every static layout's see the same arrivals)."""

from __future__ import annotations

import random
import zlib

from prediction_accuracy import SHARED, TRACES, base_rate, scenarios

from workers_agent.sim.workload import PromptFactory, Workload, WorkloadRequest, load_trace


def _poisson(rng, t0, dur, rate):
    t, out = t0, []
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= t0 + dur:
            return out
        out.append(t)
    return out


def _seed(*parts) -> int:
    """A seed from the parts, the same in every process: ``hash()`` of a string is salted
    per process, so the planner's run and each static layout's (pool workers) would see
    different prefix groups and different requests."""
    return zlib.crc32(repr(parts).encode())


DEMO_SCALE = {"value": 1.0}  # --demo-scale: multiplies the demo's chat and RAG rates


def build_workload(cluster: dict, name: str, phase_s: float, cycles: int,
                   demo_phases: dict | None = None):
    """(Workload, phases [(name, start, end)], SLO). ``demo_phases``: the demo's seconds per
    phase by name (chat, rag, quiet), e.g. the launcher's own; missing names get
    ``phase_s``."""
    rng = random.Random(17)
    reqs, phases = [], []
    t = 0.0
    if name == "demo":
        sc = scenarios()
        chat = {"isl": 1000, "osl": 300, "shared_prefix_fraction": 0.5}
        # Rates from the fixed arithmetic of prediction_accuracy.base_rate (not the cost
        # model): RAG at load 1, chat at 0.3 (its short prompts make load 1 decode-heavy),
        # quiet at a twentieth of chat's load 1.
        k = DEMO_SCALE["value"]
        plan = [("chat", chat, 0.3 * k * base_rate(cluster, chat)),
                ("rag", sc["rag-4k"], k * base_rate(cluster, sc["rag-4k"])),
                ("quiet", chat, 0.05 * base_rate(cluster, chat))]
        slo = {"ttft_ms": 2500, "itl_ms": 50}
        for c in range(cycles):
            for pname, spec, rate in plan:
                shared = int(spec["isl"] * spec.get("shared_prefix_fraction", 0.0))
                dur = float((demo_phases or {}).get(pname, phase_s))
                for i, at in enumerate(_poisson(rng, t, dur, rate)):
                    reqs.append(dict(arrival=at, input_length=spec["isl"],
                                     output_length=spec["osl"], shared_prefix_len=shared,
                                     prefix_seed=_seed(pname, rng.randrange(8)),
                                     seed=_seed(name, c, pname, i)))
                phases.append((f"{pname}{c + 1}", t, t + dur))
                t += dur
    else:
        trace = "azure-conv" if name == "azure-diurnal" else "mooncake"
        path, slo = TRACES[trace]
        src = load_trace(SHARED / "data" / path).requests
        native = len(src) / max(src[-1].arrival - src[0].arrival, 1e-9)
        if trace == "mooncake" and cluster["hardware"] == "RTX PRO 6000":
            native *= 0.25
        curve = (0.5, 3.0, 0.5) if trace == "azure-conv" else (1.0, 4.0, 1.0)
        k = 0
        for pname, m in zip(("low", "high", "low2"), curve, strict=True):
            for at in _poisson(rng, t, phase_s, native * m):
                r = src[k % len(src)]
                k += 1
                reqs.append(dict(arrival=at, input_length=r.input_length,
                                 output_length=r.output_length, hash_ids=r.hash_ids,
                                 seed=r.seed))
            phases.append((f"{pname}×{m:g}", t, t + phase_s))
            t += phase_s
    requests = [WorkloadRequest(request_id=f"{name}-{i}", **r) for i, r in enumerate(reqs)]
    return Workload(name, requests, PromptFactory()), phases, slo
