"""KV-cache geometry: pure arithmetic shared by the data model, planner and simulator."""

from __future__ import annotations


def kv_bytes_per_token(
    layers: int,
    kv_heads: int,
    head_dim: int,
    dtype_bytes: float,
    explicit: int | None = None,
) -> int:
    """Bytes of KV cache one token occupies across all layers.

    K and V each hold ``kv_heads × head_dim`` elements per layer. Models with latent
    attention (DeepSeek's MLA) do not follow the formula; they pass ``explicit``.
    """
    if explicit is not None:
        if explicit <= 0:
            raise ValueError("explicit KV bytes per token must be positive")
        return int(explicit)
    for name, value in (
        ("layers", layers),
        ("kv_heads", kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    return int(2 * layers * kv_heads * head_dim * dtype_bytes)


def kv_bytes_per_block(bytes_per_token: int, block_size: int) -> int:
    if block_size <= 0:
        raise ValueError("block_size must be positive")
    return bytes_per_token * block_size
