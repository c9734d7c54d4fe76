"""The few places the real-time server touches the pure engine model, gathered in one module
so that the server's HTTP/ZMQ code does not depend on the model's internals."""

from __future__ import annotations

from dataclasses import asdict, is_dataclass
from typing import Any

from workers_agent.sim import links, profiles, tokens
from workers_agent.sim.driver import kv_lanes
from workers_agent.sim.engine import SimEngine
from workers_agent.sim.enginetypes import EngineSpec, SimRequest
from workers_agent.sim.fleetconfig import EngineConfig
from workers_agent.sim.server.pd import KvPath


def profiles_for(model: str, gpu: str) -> tuple[Any, Any]:
    """(ModelProfile, HardwareProfile); raises profiles.UnknownProfileError with known names."""
    return profiles.get_model(model), profiles.get_hardware(gpu)


def make_engine(cfg: EngineConfig, model: Any, hardware: Any) -> SimEngine:
    spec = EngineSpec(
        engine_id=cfg.id,
        model=model,
        hardware=hardware,
        tp=cfg.tp,
        block_size=cfg.block_size,
        num_gpu_blocks=cfg.num_gpu_blocks,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_prefix_caching=cfg.enable_prefix_caching,
    )
    return SimEngine(spec)


def make_request(**kwargs: Any) -> SimRequest:
    return SimRequest(**kwargs)


def kv_bytes_per_token(model: Any) -> int:
    return int(model.kv_bytes_per_token)


def weight_bytes(model: Any) -> float:
    return float(model.weight_bytes)


def max_model_len(model: Any) -> int:
    return int(getattr(model, "max_model_len", 131_072))


def encode(text: str) -> list[int]:
    return tokens.encode(text)


def decode(ids: list[int]) -> str:
    return tokens.decode(ids)


def encode_chat(messages: list[dict[str, str]]) -> list[int]:
    return tokens.encode(tokens.apply_chat_template(messages))


def step_request_ids(step: Any) -> list[str]:
    """Ids of the requests a step works on (for queue-time accounting)."""
    return [seq.request_id for seq, _ in getattr(step, "entries", ())]


def step_tokens(step: Any) -> int:
    return int(getattr(step, "num_prefill_tokens", 0)) + int(getattr(step, "num_decode_tokens", 0))


def held_block_ids(engine: Any, request_id: str, num_tokens: int, block_size: int) -> list[int]:
    """Block ids the prefill engine holds for ``request_id`` (opaque to the decode side)."""
    seq = getattr(engine, "_seqs", {}).get(request_id)
    blocks = getattr(seq, "blocks", None)
    if blocks:
        return [int(getattr(b, "block_id", b)) for b in blocks]
    return list(range((num_tokens + block_size - 1) // block_size))


def transfer_seconds(path: KvPath, nbytes: int, hardware: Any, tp: int) -> float:
    """Time to move ``nbytes`` of KV over ``path`` (one lane per TP rank, as NIXL does)."""
    if path.kind == "local" or nbytes <= 0:
        return 0.0
    if path.kind == "nvlink":
        link = links.nvlink(hardware.nvlink_gbs or 450.0)
    elif path.kind == "pcie":
        link = links.pcie(hardware.pcie_generation, hardware.pcie_width)
    else:
        link = links.nic(path.gbps, rdma=path.rdma)
    # The fleet's rule (workers_agent.sim.driver): a lane per TP rank over NVLink and PCIe,
    # one NIC per node in the simulated topology.
    return link.transfer_seconds(nbytes, lanes=kv_lanes(link, tp, tp))


def stats_dict(stats: Any) -> dict[str, Any]:
    if is_dataclass(stats):
        return asdict(stats)
    return {k: v for k, v in vars(stats).items() if not k.startswith("_")}
