"""The what-if advisor as a form: the planner's pure ``whatif()`` behind a GET form."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import render

from controlplane.planner.whatif import WhatIfError, WhatIfQuery, whatif

GPU_CHOICES = ("H200 NVL", "H200 SXM", "H100 SXM", "RTX PRO 6000", "L40S", "L4")
MODEL_PRESETS = {
    "llama-3.3-70b-fp8": {"layers": 80, "kv_heads": 8, "head_dim": 128, "kv_dtype_bytes": 1,
                          "params_b": 70.6, "weight_dtype_bytes": 1},
    "llama-3.3-70b-bf16": {"layers": 80, "kv_heads": 8, "head_dim": 128, "kv_dtype_bytes": 2,
                           "params_b": 70.6, "weight_dtype_bytes": 2},
    "llama-3.1-8b": {"layers": 32, "kv_heads": 8, "head_dim": 128, "kv_dtype_bytes": 2,
                     "params_b": 8.0, "weight_dtype_bytes": 2},
}
FORM_FIELDS = ("gpu", "nodes", "gpus_per_node", "tp", "nvlink_group_size", "nic_gbps", "rdma",
               "isl", "osl", "prefix_hit", "rate_rps", "ttft_slo_ms", "itl_slo_ms",
               "inflight_peak")


@login_required
def whatif_fragment_view(request):
    """Renders the answer (or inline errors) for the form on the models page."""
    data = {k: v for k, v in request.GET.items() if k in FORM_FIELDS and v != ""}
    if "rdma" not in request.GET:
        data["rdma"] = False
    preset = MODEL_PRESETS.get(request.GET.get("model", ""))
    if preset:
        data.update(preset, model=request.GET["model"])
    context = {"errors": None, "answer": None}
    try:
        context["answer"] = whatif(WhatIfQuery.from_dict(data))
    except WhatIfError as exc:
        context["errors"] = exc.errors
    return render(request, "dashboard/_whatif_answer.html", context)


def form_context() -> dict:
    return {"gpu_choices": GPU_CHOICES, "model_presets": list(MODEL_PRESETS),
            "defaults": WhatIfQuery()}
