"""The one hardware and model catalog (pdcatalog) and the places that read it."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pdcatalog as catalog
from controlplane.planner.costmodel import GPU_PROFILES, gpu_profile_for
from workers_agent.sim import profiles

# What nvmlDeviceGetName prints for the parts the brief names.
NVML_NAMES = (
    "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200",
    "NVIDIA H200 NVL", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA L40S",
    "NVIDIA L4", "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA B200",
)


@pytest.mark.parametrize("nvml_name", NVML_NAMES)
def test_every_named_part_is_keyed_by_its_nvml_name_with_a_source(nvml_name):
    found = catalog.lookup_gpu(nvml_name)
    assert not found.estimated and found.reason == ""
    spec = catalog.GPUS[nvml_name]
    assert found.spec is spec and spec.source
    assert spec.memory_gb > 0 and spec.memory_bandwidth_gbs > 0 and spec.bf16_tflops > 0
    if spec.fp8_tflops is not None:
        assert spec.fp8_tflops == pytest.approx(2 * spec.bf16_tflops, rel=0.02)


@pytest.mark.parametrize(
    ("alias", "short"),
    [("H100", "H100 SXM"), ("h100-sxm", "H100 SXM"), ("nvidia h100 80gb hbm3", "H100 SXM"),
     ("H200", "H200 SXM"), ("h200_nvl", "H200 NVL"), ("RTX PRO 6000", "RTX PRO 6000"),
     ("RTX PRO 6000 Blackwell Server", "RTX PRO 6000"), ("a100-80gb", "A100 80GB SXM4"),
     ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("l4", "L4"), ("L40S", "L40S")],
)
def test_aliases_and_short_names_find_the_same_entry(alias, short):
    found = catalog.lookup_gpu(alias)
    assert found.spec.name == short and not found.estimated


def test_unknown_gpus_get_an_estimate_that_says_so():
    mig = catalog.lookup_gpu("NVIDIA H100 80GB HBM3 MIG 1g.10gb")
    assert mig.estimated and mig.matched_by == "closest name" and mig.spec.name == "H100 SXM"
    assert "not in the hardware catalog" in mig.reason
    family = catalog.lookup_gpu("A100")  # 40 or 80 GB? the family's usual part, flagged
    assert family.estimated and family.matched_by == "family" and "A100" in family.reason
    generic = catalog.lookup_gpu("NVIDIA GH200 480GB", memory_bytes=96e9,
                                 memory_bandwidth_gbs=4000)
    assert generic.estimated and generic.matched_by == "generic"
    assert generic.spec.memory_bandwidth_gbs == 4000 and generic.spec.memory_gb == 96
    assert "4,000 GB/s" in generic.reason and "reported" in generic.reason
    nothing = catalog.lookup_gpu("")
    assert nothing.estimated and "No GPU product name" in nothing.reason
    # "L40" is not "L4" or "L40S": whole tokens only.
    assert catalog.lookup_gpu("NVIDIA L40").matched_by == "generic"


def test_cost_model_reads_the_catalog_and_marks_estimates():
    nvml = gpu_profile_for("NVIDIA H100 80GB HBM3")
    assert nvml == gpu_profile_for("H100") == gpu_profile_for("h100-sxm")
    assert nvml.name == "H100 SXM" and nvml.memory_bandwidth_gbs == 3350 and not nvml.estimate
    assert nvml.tflops_bf16 == 989 and nvml.nvlink_gbs == 450
    unknown = gpu_profile_for("Mystery Accelerator 9000", 64e9, 2000)
    assert unknown.estimate and "Mystery Accelerator 9000" in unknown.estimate_reason
    assert unknown.memory_bytes == 64e9 and unknown.tflops_bf16 == pytest.approx(400)
    assert set(GPU_PROFILES) == {s.name.lower() for s in catalog.GPUS.values()}
    a100 = gpu_profile_for("NVIDIA A100-SXM4-80GB")
    assert a100.tflops_fp8 == a100.tflops_bf16 == 312 and a100.fp8_mfu_factor == 1.0


def test_simulator_profiles_are_the_catalog_entries():
    for spec in catalog.GPUS.values():
        hw = profiles.get_hardware(spec.nvml_name)
        assert hw.name == spec.name and hw.memory_bandwidth_gbs == spec.memory_bandwidth_gbs
        assert hw.mfu == spec.mfu and hw.tdp_w == spec.tdp_w
    with pytest.raises(profiles.UnknownProfileError):
        profiles.get_hardware("NVIDIA H100 80GB HBM3 MIG 1g.10gb")  # estimated: refused
    for entry in catalog.MODELS.values():
        assert profiles.get_model(entry.name).weight_bytes == entry.weight_bytes


def test_forms_and_sample_fleets_take_their_figures_from_the_catalog():
    from controlplane.dashboard.whatifpage import GPU_CHOICES, MODEL_PRESETS
    from controlplane.topology.samples import SAMPLE_FLEETS

    assert catalog.gpu_choices() == GPU_CHOICES
    assert all(catalog.lookup_gpu(name).estimated is False for name in GPU_CHOICES)
    assert set(MODEL_PRESETS) == set(catalog.MODELS)
    for fleet in SAMPLE_FLEETS:
        spec = catalog.GPUS[fleet["gpu"]["product_name"]]
        assert fleet["gpu"]["memory_bandwidth_gbs"] == spec.memory_bandwidth_gbs
        assert fleet["gpu"]["memory_bytes"] == spec.memory_bytes
        assert fleet["model"]["weight_bytes"] == int(
            catalog.lookup_model(fleet["model"]["name"]).weight_bytes)


def test_the_catalog_and_the_simulator_import_no_django_or_celery():
    code = ("import sys, pdcatalog, workers_agent.sim.profiles, workers_agent.sim.node; "
            "bad = [m for m in ('django', 'celery', 'controlplane') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_gpu_fires_the_estimate_alert_and_a_known_one_does_not():
    from controlplane.alerts.rules import GPU_PROFILE_ESTIMATED, FleetSnapshot, NodeFacts, evaluate

    def node(name, products):
        return NodeFacts("c1", name, last_report_age_s=1.0, gpu_products=products)

    result = evaluate(FleetSnapshot(now=100.0, nodes=(
        node("known", ("NVIDIA H100 80GB HBM3", "NVIDIA H100 80GB HBM3")),
        node("odd", ("NVIDIA GH200 480GB",)),
    )))
    fired = [o for o in result.observations if o.rule == GPU_PROFILE_ESTIMATED]
    assert [o.labels["node"] for o in fired] == ["odd"]
    assert fired[0].labels["gpu_product"] == "NVIDIA GH200 480GB"
    assert "estimated" in fired[0].annotations["summary"]
    assert "not in the hardware catalog" in fired[0].annotations["description"]


def test_the_what_if_answer_leads_with_the_estimate():
    from controlplane.planner.whatif import WhatIfQuery, whatif

    known = whatif(WhatIfQuery(gpu="NVIDIA H200 NVL", nodes=1, gpus_per_node=2))
    assert known.gpu_estimate == "" and not known.explanation.startswith("Estimated")
    odd = whatif(WhatIfQuery(gpu="Mystery Accelerator 9000", nodes=1, gpus_per_node=2))
    assert odd.explanation.startswith("Estimated GPU profile: GPU 'Mystery Accelerator 9000'")
    assert odd.as_dict()["gpu_estimate"] == odd.gpu_estimate != ""
