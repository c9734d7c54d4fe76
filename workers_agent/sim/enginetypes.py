"""What passes between a simulated engine and its driver: the engine's spec (and the KV
capacity it derives), a request, a planned step or burst of decode steps, a step's output
per request, and the engine's cumulative figures. Plain records; the engine that acts on
them is :mod:`workers_agent.sim.engine`."""

from __future__ import annotations

from dataclasses import dataclass, field

from .profiles import HardwareProfile, ModelProfile, get_hardware, get_model


class RequestRejectedError(ValueError):
    """The request can never run on this engine (too long for its KV cache, bad fields)."""


@dataclass
class EngineSpec:
    engine_id: str
    model: ModelProfile | str  # a profile or its name/alias (converted in __post_init__)
    hardware: HardwareProfile | str
    tp: int = 1
    block_size: int = 16
    num_gpu_blocks: int | None = None  # None: derive from GPU memory − weights − overhead
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    enable_prefix_caching: bool = True
    # Extensions beyond the contract:
    record_kv_events: bool = True  # the virtual fleet turns them off for speed
    gpu_memory_utilization: float | None = None  # None: the hardware profile's default

    def __post_init__(self) -> None:
        self.model = get_model(self.model)
        self.hardware = get_hardware(self.hardware)
        if self.tp < 1 or self.block_size < 1 or self.max_num_seqs < 1:
            raise ValueError("tp, block_size and max_num_seqs must be positive")
        if self.max_num_batched_tokens < 1:
            raise ValueError("max_num_batched_tokens must be positive")

    def derived_num_gpu_blocks(self) -> int:
        """KV blocks that fit: per GPU, usable memory − weight shard − activations, × tp."""
        hw = self.hardware
        util = self.gpu_memory_utilization or hw.gpu_memory_utilization
        per_gpu = (
            hw.memory_bytes * util - self.model.weight_bytes / self.tp
            - hw.activation_overhead_gb * 1e9
        )
        blocks = int(per_gpu * self.tp // (self.model.kv_bytes_per_token * self.block_size))
        if blocks <= 0:
            raise ValueError(
                f"{self.model.name} TP{self.tp} does not fit on {hw.name}: "
                f"{per_gpu / 1e9:.1f} GB per GPU left for KV"
            )
        return blocks

    @property
    def kv_cache_memory_bytes(self) -> int:
        blocks = self.num_gpu_blocks or self.derived_num_gpu_blocks()
        return blocks * self.block_size * self.model.kv_bytes_per_token


@dataclass
class SimRequest:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    arrival_time: float
    kv_from_remote: int = 0  # decode side of P/D: tokens whose KV arrives by transfer
    transfer_seconds: float = 0.0  # charged before the request can start decoding
    hold_for_remote_decode: bool = False  # prefill side of P/D: keep blocks until released
    # Extensions: the virtual fleet passes precomputed hashes and a length instead of ids
    # (prompt_token_ids then may be empty; BlockStored events then carry no token_ids).
    block_hashes: list[int] | None = None
    num_prompt_tokens: int | None = None


@dataclass(slots=True)
class Step:
    step_id: int
    entries: list  # (Sequence, new tokens)
    duration: float
    started_at: float
    num_prefill_tokens: int = 0
    num_decode_tokens: int = 0
    idle: bool = False  # nothing to compute: waiting ``duration`` for a KV transfer


@dataclass(slots=True)
class DecodeBurst:
    """Several pure-decode steps planned and applied at once (virtual time only).

    ``times``: end time of each step; ``entries``: (request id, tokens generated so far,
    finished) per sequence, each of which got one token per step."""

    times: list[float]
    entries: list[tuple[str, int, bool]]
    started_at: float
    idle: bool = False

    @property
    def duration(self) -> float:
        return self.times[-1] - self.started_at


@dataclass(slots=True)
class Output:
    request_id: str
    new_token_ids: list[int]
    first_token: bool
    finished: bool
    finish_reason: str | None
    num_cached_tokens: int
    prompt_tokens: int
    # Extensions:
    num_external_tokens: int = 0  # prompt tokens whose KV came by transfer
    num_output_tokens: int = 0  # generated so far, this token included
    held: bool = False  # finished on the prefill side with blocks kept for the decode side
    num_preemptions: int = 0


@dataclass
class EngineStats:
    num_running: int
    num_waiting: int
    num_gpu_blocks: int
    num_used_blocks: int
    kv_usage: float
    prefix_cache_queries: int
    prefix_cache_hits: int
    prompt_tokens: int
    generation_tokens: int
    num_preemptions: int
    requests_finished: int
    busy_seconds: float
    # Extensions (cumulative unless said otherwise):
    prompt_tokens_local_compute: int = 0
    prompt_tokens_cached: int = 0
    prompt_tokens_external: int = 0
    requests_aborted: int = 0
    num_held: int = 0  # now
    num_steps: int = 0
    finished_by_reason: dict[str, int] = field(default_factory=dict)
