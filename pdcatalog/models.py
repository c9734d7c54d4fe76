"""Model catalog: geometry of the served models pdplane knows by name.

Geometry from the models' published configs (``config.json``): Llama 3.1 8B has 32 layers,
hidden 4096, 32 attention heads and 8 KV heads of 128; Llama 3.3 70B has 80 layers, hidden
8192, 64 heads and 8 KV heads of 128 (shared/reference/CALIBRATION.md, "Models"). FP8
halves weight and KV bytes. Llama 3.1 70B has the same geometry as 3.3 and shares its rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


class UnknownNameError(KeyError):
    """A name the catalog does not hold; the message lists the known names."""

    def __str__(self) -> str:
        return str(self.args[0])


class UnknownModelError(UnknownNameError):
    """No model of that name."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    params_b: float  # billions of parameters
    layers: int
    hidden: int
    heads: int  # attention (query) heads
    kv_heads: int
    head_dim: int
    weight_bytes_per_param: float  # 2 for BF16, 1 for FP8
    kv_bytes_per_element: float  # 2 for 16-bit KV, 1 for FP8 KV
    max_model_len: int = 131_072
    fp8_compute: bool = False  # matmuls run on FP8 tensor cores
    aliases: tuple[str, ...] = ()
    source: str = "published config.json; shared/reference/CALIBRATION.md (Models)"

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.weight_bytes_per_param


_MODELS = [
    ModelEntry("llama-3.1-8b", 8.03, 32, 4096, 32, 8, 128, 2, 2,
               aliases=("llama-3.1-8b-instruct", "meta-llama-llama-3.1-8b-instruct",
                        "llama-3.1-8b-bf16")),
    ModelEntry("llama-3.1-8b-fp8", 8.03, 32, 4096, 32, 8, 128, 1, 1, fp8_compute=True,
               aliases=("llama-3.1-8b-instruct-fp8",)),
    ModelEntry("llama-3.3-70b-bf16", 70.6, 80, 8192, 64, 8, 128, 2, 2,
               aliases=("llama-3.3-70b", "llama-3.3-70b-instruct",
                        "meta-llama-llama-3.3-70b-instruct", "llama-3.1-70b")),
    ModelEntry("llama-3.3-70b-fp8", 70.6, 80, 8192, 64, 8, 128, 1, 1, fp8_compute=True,
               aliases=("llama-3.3-70b-instruct-fp8",)),
]

MODELS: dict[str, ModelEntry] = {m.name: m for m in _MODELS}


def _normalise(name: str) -> str:
    return re.sub(r"[\s_/]+", "-", (name or "").strip().lower())


_INDEX = {_normalise(key): m for m in _MODELS for key in (m.name, *m.aliases)}


def lookup_model(name: str) -> ModelEntry:
    """The entry for a model name or alias; :class:`UnknownModelError` otherwise."""
    found = _INDEX.get(_normalise(name))
    if found is None:
        raise UnknownModelError(f"unknown model {name!r}; known: {', '.join(MODELS)}")
    return found
