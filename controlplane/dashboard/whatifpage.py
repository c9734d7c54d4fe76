"""The what-if advisor as a form: the planner's pure ``whatif()`` behind a GET form.

The form's fields are declared once here (label, unit, help, bounds) and the template
draws them from that list, so the labels in an error and the labels on the form agree.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden
from django.shortcuts import render

import pdcatalog as catalog
from controlplane.accounts.access import can_anywhere
from controlplane.planner.whatif import KV_PATHS, WhatIfError, WhatIfQuery, whatif

# Both from the one hardware and model catalog (pdcatalog).
GPU_CHOICES = catalog.gpu_choices()
MODEL_PRESETS = {
    m.name: {"layers": m.layers, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
             "kv_dtype_bytes": m.kv_bytes_per_element, "params_b": m.params_b,
             "weight_dtype_bytes": m.weight_bytes_per_param}
    for m in catalog.MODELS.values()
}
KV_PATH_CHOICES = (
    ("auto", "auto — placement picks NVLink, PCIe or the NIC per pair"),
    ("nvlink", "NVLink — every transfer inside one NVLink domain"),
    ("pcie", "PCIe — every transfer over the host's PCIe"),
    ("nic", "network — every transfer over the NIC, also inside a node"),
)
assert tuple(k for k, _ in KV_PATH_CHOICES) == KV_PATHS  # the planner's list, in order
PCIE_GENERATIONS = (3, 4, 5, 6)


@dataclass(frozen=True)
class Field:
    name: str  # the WhatIfQuery field
    label: str
    unit: str = ""
    help: str = ""
    kind: str = "number"  # number | checkbox | kv_path | pcie
    min: float | None = None
    max: float | None = None
    step: str = "1"
    optional: bool = False  # blank = unknown (the query's 0)

    def value(self, defaults: WhatIfQuery):
        v = getattr(defaults, self.name)
        if self.optional and not v:
            return ""
        if isinstance(v, float) and v.is_integer():
            return int(v)
        return v


GROUPS: tuple[tuple[str, tuple[Field, ...]], ...] = (
    ("Hardware", (
        Field("nodes", "nodes", "", "servers in the fleet", min=1),
        Field("gpus_per_node", "GPUs per node", "GPUs", "GPUs in each server", min=1),
        Field("tp", "TP", "GPUs per worker", "tensor-parallel size; a TP that does not divide "
              "GPUs per node leaves GPUs idle", min=1),
        Field("nvlink_group_size", "NVLink group", "GPUs",
              "GPUs per NVLink domain; 0 = no NVLink", min=0),
        Field("nic_gbps", "NIC", "Gb/s", "each node's network rate", min=0, step="any"),
        Field("rdma", "RDMA", "", "the NIC does RDMA (GPUDirect); else TCP", kind="checkbox"),
        Field("pcie_generation", "PCIe", "generation", "x16 links", kind="pcie"),
    )),
    ("KV path between prefill and decode", (
        Field("kv_path", "KV path", "", "the path the KV cache takes from a prefill to a "
              "decode worker", kind="kv_path"),
        Field("kv_link_gbps", "KV link rate", "Gb/s", "that path's rate; blank = from the "
              "hardware above (needs a path other than auto)", min=0, step="any",
              optional=True),
    )),
    ("Traffic", (
        Field("isl", "prompt tokens (mean)", "tokens", "mean prompt length", min=0),
        Field("isl_p50", "prompt p50", "tokens", "median prompt length; blank = unknown",
              min=0, optional=True),
        Field("isl_p95", "prompt p95", "tokens", "95th-percentile prompt length, at least "
              "the mean; blank = every prompt taken as the mean (TTFT p95 optimistic)",
              min=0, optional=True),
        Field("osl", "answer tokens", "tokens", "mean answer length", min=0),
        Field("prefix_hit", "prefix reuse", "0–1", "share of prompt tokens found in the "
              "prefix cache", min=0, max=1, step="0.05"),
        Field("rate_rps", "request rate", "req/s", "requests arriving per second", min=0,
              step="any"),
        Field("inflight_peak", "in-flight peak", "requests", "most requests at once; blank = "
              "unknown (the KV check uses each layout's preemption risk)", min=0,
              optional=True),
    )),
    ("Targets", (
        Field("ttft_slo_ms", "TTFT p95 target", "ms", "time to first token, 95th percentile",
              min=1),
        Field("itl_slo_ms", "ITL p95 target", "ms", "inter-token latency, 95th percentile",
              min=1),
    )),
)
FIELDS = {f.name: f for _, group in GROUPS for f in group}
FORM_FIELDS = ("gpu", *FIELDS)
LABELS = {"gpu": "GPU", "model": "model",
          **{f.name: f"{f.label} ({f.unit})" if f.unit else f.label for f in FIELDS.values()}}


def parse(get) -> tuple[dict, dict[str, str]]:
    """The form's GET mapping → (the query's data, the form's own errors by field)."""
    data = {k: v.strip() for k, v in get.items() if k in FORM_FIELDS and v.strip() != ""}
    errors: dict[str, str] = {}
    if "rdma" not in get:
        data["rdma"] = False
    name = get.get("model", "")
    if name:
        if name not in MODEL_PRESETS:
            errors["model"] = f"{name[:60]} is not in the catalog; pick one from the list"
        else:
            data.update(MODEL_PRESETS[name], model=name)
    if data.get("kv_link_gbps") and data.get("kv_path", "auto") == "auto":
        errors["kv_link_gbps"] = ("a rate is for one path: choose NVLink, PCIe or network "
                                  "as the KV path, or leave the rate blank")
    return data, errors


def assumptions(q: WhatIfQuery) -> list[str]:
    """What the answer assumed about the inputs that shape it most, in words."""
    spread = [f"p{p} {v:,.0f}" for p, v in ((50, q.isl_p50), (95, q.isl_p95)) if v]
    prompts = (f"prompts: mean {q.isl:,.0f} tokens ({', '.join(spread)})" if spread else
               f"prompts: every one taken as {q.isl:,.0f} tokens — no p95 given, so the "
               "long-prompt tail that sets TTFT p95 is not in the answer")
    path = dict(KV_PATH_CHOICES)[q.kv_path].split(" — ")[0]
    if q.kv_link_gbps:
        path += f" at {q.kv_link_gbps:,.0f} Gb/s"
    elif q.kv_path == "nic":
        path += f" at {q.nic_gbps:,.0f} Gb/s {'RDMA' if q.rdma else 'TCP'}"
    peak = (f"in-flight peak {q.inflight_peak:,} requests" if q.inflight_peak
            else "in-flight peak unknown: the KV check uses each layout's preemption risk")
    return [prompts, f"KV path: {path}", peak]


def detail(answer) -> str:
    """The planner's explanation without what the fragment already leads with (the
    estimated-GPU warning, the shape's problems and the infeasible reasons), so nothing is
    said twice."""
    text = answer.explanation
    prefix = f"Estimated GPU profile: {answer.gpu_estimate}. "
    if answer.gpu_estimate and text.startswith(prefix):
        text = text[len(prefix):]
    shape = "Invalid shape: " + "; ".join(answer.shape) + ". "
    if answer.shape and text.startswith(shape):
        text = text[len(shape):]
    if answer.infeasible:
        start = text.find("Best: ")
        text = text[start:] if start >= 0 else ""
    return text


@login_required
def whatif_fragment_view(request):
    """Renders the answer (or inline errors) for the form on the models page."""
    if not can_anywhere(request.user, "read"):  # a read role on any cluster will do
        return HttpResponseForbidden("Your role does not allow 'read'.")
    data, errors = parse(request.GET)
    context = {"errors": None, "answer": None, "assumptions": [], "detail": ""}
    try:
        query = WhatIfQuery.from_dict(data)
    except WhatIfError as exc:
        errors = {**exc.errors, **errors}
    if errors:
        context["errors"] = [(k, LABELS.get(k, k), v) for k, v in errors.items()]
    else:
        context["answer"] = answer = whatif(query)
        context["detail"] = detail(answer)
        context["assumptions"] = assumptions(query)
    return render(request, "dashboard/_whatif_answer.html", context)


def form_context() -> dict:
    defaults = WhatIfQuery()
    groups = [(title, [(f, f.value(defaults)) for f in fields]) for title, fields in GROUPS]
    return {"gpu_choices": GPU_CHOICES, "model_presets": list(MODEL_PRESETS),
            "defaults": defaults, "groups": groups, "kv_paths": KV_PATH_CHOICES,
            "pcie_generations": PCIE_GENERATIONS}
