"""The what-if advisor as a form: the planner's pure ``whatif()`` behind a GET form."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import HttpResponseForbidden
from django.shortcuts import render

import pdcatalog as catalog
from controlplane.accounts.access import can_anywhere
from controlplane.planner.whatif import WhatIfError, WhatIfQuery, whatif

# Both from the one hardware and model catalog (pdcatalog).
GPU_CHOICES = catalog.gpu_choices()
MODEL_PRESETS = {
    m.name: {"layers": m.layers, "kv_heads": m.kv_heads, "head_dim": m.head_dim,
             "kv_dtype_bytes": m.kv_bytes_per_element, "params_b": m.params_b,
             "weight_dtype_bytes": m.weight_bytes_per_param}
    for m in catalog.MODELS.values()
}
FORM_FIELDS = ("gpu", "nodes", "gpus_per_node", "tp", "nvlink_group_size", "nic_gbps", "rdma",
               "isl", "osl", "prefix_hit", "rate_rps", "ttft_slo_ms", "itl_slo_ms",
               "inflight_peak")


@login_required
def whatif_fragment_view(request):
    """Renders the answer (or inline errors) for the form on the models page."""
    if not can_anywhere(request.user, "read"):  # a read role on any cluster will do
        return HttpResponseForbidden("Your role does not allow 'read'.")
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
