"""pdplane's one hardware and model catalog: GPU and model facts with their sources.

A plain package at the top level, beside ``controlplane``, ``workers_agent`` and ``gateway``,
importing nothing but the standard library. The simulator, the agent and the gateway must
not pull in Django or Celery (``controlplane/__init__.py`` starts the Celery app), and the
control plane's cost model must not depend on the simulator's code: both read the same
facts from here, each with its own formulas.

    from pdcatalog import lookup_gpu, lookup_model
    found = lookup_gpu("NVIDIA H100 80GB HBM3")   # GpuLookup
    found.spec.memory_bandwidth_gbs, found.estimated, found.reason

An unknown GPU never fails and never passes silently: ``lookup_gpu`` returns an estimated
spec with ``estimated = True`` and a ``reason`` meant to be shown to operators.
"""

from .gpus import GPUS, GpuLookup, GpuSpec, gpu_choices, lookup_gpu
from .models import MODELS, ModelEntry, UnknownModelError, UnknownNameError, lookup_model

__all__ = [
    "GPUS",
    "MODELS",
    "GpuLookup",
    "GpuSpec",
    "ModelEntry",
    "UnknownModelError",
    "UnknownNameError",
    "gpu_choices",
    "lookup_gpu",
    "lookup_model",
]
