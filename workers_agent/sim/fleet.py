"""What a virtual fleet is made of and what a run reports: engines with a place and a role,
role changes, per-request results, the snapshots a controller sees, and fleet builders.

Kept apart from the event loop (:mod:`workers_agent.sim.virtual`) so that controllers and
benchmarks can import the shapes without the loop.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from . import links as linkmod
from .driver import EngineDriver, LinkModel
from .engine import SimEngine
from .enginetypes import EngineSpec, EngineStats
from .profiles import get_hardware
from .report import Summary, summarize

ROLES = ("prefill", "decode", "both")
ACTIVE = "active"
DRAINING = "draining"

# Kinds of work an engine can take. "decode" covers a P/D decode stage and a whole request
# served in place (an aggregated request decodes there too).
COVERS = {"prefill": {"prefill"}, "decode": {"decode"}, "both": {"prefill", "decode"}}


@dataclass
class FleetEngine:
    """An engine in the fleet: its model, where it sits and its role."""

    spec: EngineSpec
    node: str = "node-0"
    nvlink_group: str | None = None  # engines sharing a group talk over NVLink
    role: str = "both"

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {self.role!r}")

    @property
    def engine_id(self) -> str:
        return self.spec.engine_id


@dataclass(frozen=True)
class RoleChange:
    engine_id: str
    role: str
    reason: str = ""


@dataclass(frozen=True)
class Route:
    decode: str  # engine that streams the answer (does the prefill too when prefill is None)
    prefill: str | None = None


@dataclass
class RoutingRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int]
    arrival: float


@dataclass
class RequestResult:
    request_id: str
    arrival: float
    prompt_tokens: int
    output_tokens: int = 0
    first_token_time: float | None = None
    finish_time: float | None = None
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    e2e: float | None = None
    cached_tokens: int = 0  # prompt tokens served from a prefix cache (prefill side)
    transferred_tokens: int = 0  # prompt tokens whose KV moved P → D
    transfer_seconds: float = 0.0
    prefill_engine: str | None = None
    decode_engine: str | None = None
    preemptions: int = 0
    error: str | None = None

    @property
    def disaggregated(self) -> bool:
        return self.prefill_engine is not None and self.prefill_engine != self.decode_engine


@dataclass
class EngineSnapshot:
    engine_id: str
    node: str
    nvlink_group: str | None
    role: str
    state: str
    pending_role: str | None
    num_gpus: int
    stats: EngineStats
    pending_prefill_tokens: int
    inflight_prefill: int
    inflight_decode: int
    model: str
    hardware: str


@dataclass
class FleetSnapshot:
    now: float
    engines: list[EngineSnapshot]
    recent_results: list[RequestResult]  # finished since the previous control call
    arrivals_since_last: int
    interval_s: float
    num_arrived: int
    num_finished: int
    # Requests still in flight (their first token and ITL gaps so far): what an engine's
    # latency histograms have already observed of them.
    inflight_results: list[RequestResult] = field(default_factory=list)


@dataclass
class RoleChangeRecord:
    engine_id: str
    old_role: str
    new_role: str
    requested_at: float
    completed_at: float | None = None
    reason: str = ""
    outcome: str = "pending"  # "done", "cancelled" (back to the old role), "superseded"


@dataclass
class FleetResult:
    results: list[RequestResult]
    engine_stats: dict[str, EngineStats]
    sim_seconds: float
    wall_seconds: float
    num_gpus: int
    role_changes: list[RoleChangeRecord]
    num_events: int

    def summary(
        self, slo_ttft_ms: float, slo_itl_ms: float, attainment: float = 0.9
    ) -> Summary:
        queries = sum(s.prefix_cache_queries for s in self.engine_stats.values())
        hits = sum(s.prefix_cache_hits for s in self.engine_stats.values())
        return summarize(
            self.results, slo_ttft_ms, slo_itl_ms, attainment, self.num_gpus,
            prefix_hit_rate=hits / queries if queries else None,
        )


class Member:
    """Fleet-side state of one engine."""

    __slots__ = ("driver", "engine", "engine_id", "fleet_engine", "incoming_pd",
                 "inflight_decode", "inflight_prefill", "pending_role", "role", "state",
                 "step", "token")

    def __init__(self, fleet_engine: FleetEngine) -> None:
        self.fleet_engine = fleet_engine
        self.engine = SimEngine(fleet_engine.spec)
        self.driver = EngineDriver(self.engine)
        self.engine_id = fleet_engine.engine_id
        self.role = fleet_engine.role
        self.state = ACTIVE
        self.pending_role: str | None = None
        self.step = None
        self.token = 0
        self.inflight_prefill = 0
        self.inflight_decode = 0
        self.incoming_pd = 0  # requests in their prefill stage elsewhere, to decode here

    @property
    def role_for_new_work(self) -> str:
        return self.pending_role if self.state == DRAINING and self.pending_role else self.role

    def accepts(self, kind: str) -> bool:
        return kind in COVERS[self.role_for_new_work]

    @property
    def node(self) -> str:
        return self.fleet_engine.node

    @property
    def nvlink_group(self) -> str | None:
        return self.fleet_engine.nvlink_group


class RoleChanges:
    """Role changes with drain, for a fleet of :class:`Member` (``self.members``,
    ``self.role_changes``, ``self.now``, ``self.roles_version``)."""

    def apply_role_change(self, change: RoleChange) -> None:
        member = self.members.get(change.engine_id)
        if member is None:
            raise ValueError(f"unknown engine {change.engine_id!r}")
        if change.role not in ROLES:
            raise ValueError(f"unknown role {change.role!r}")
        target = change.role
        if target == member.role_for_new_work and (
            member.state == ACTIVE or member.pending_role == target
        ):
            return
        self.roles_version += 1
        if member.state == DRAINING:
            pending = self._pending_record(member)
            if pending is not None:
                pending.outcome = "cancelled" if target == member.role else "superseded"
                pending.completed_at = self.now
            if target == member.role:
                # Cancelled before it completed: back to the old role at once.
                member.state, member.pending_role = ACTIVE, None
                return
        self.role_changes.append(
            RoleChangeRecord(member.engine_id, member.role, target, self.now, reason=change.reason)
        )
        member.state, member.pending_role = DRAINING, target
        self._check_drained(member)

    def _check_drained(self, member: Member) -> None:
        if member.state != DRAINING or member.pending_role is None:
            return
        old_kinds = COVERS[member.role] - COVERS[member.pending_role]
        if ("prefill" in old_kinds and member.inflight_prefill) or (
            "decode" in old_kinds and member.inflight_decode
        ):
            return
        member.role, member.state, member.pending_role = member.pending_role, ACTIVE, None
        self.roles_version += 1
        record = self._pending_record(member)
        if record is not None:
            record.completed_at = self.now
            record.outcome = "done"

    def _pending_record(self, member: Member) -> RoleChangeRecord | None:
        for record in reversed(self.role_changes):
            if record.engine_id == member.engine_id:
                return record if record.outcome == "pending" else None
        return None


def uniform_fleet(
    num_engines: int,
    model: str,
    hardware: str,
    tp: int = 1,
    gpus_per_node: int = 8,
    nvlink_group_size: int | None = 8,
    roles: list[str] | None = None,
    **spec_overrides,
) -> list[FleetEngine]:
    """``num_engines`` identical engines packed onto nodes of ``gpus_per_node`` GPUs, NVLink
    groups of ``nvlink_group_size`` GPUs (None, or a GPU without NVLink: no groups); ``roles``
    per engine (default all ``both``)."""
    if roles is not None and len(roles) != num_engines:
        raise ValueError(f"{len(roles)} roles for {num_engines} engines")
    if not get_hardware(hardware).nvlink_gbs:
        nvlink_group_size = None
    engines = []
    for index in range(num_engines):
        first_gpu = index * tp
        node = f"node-{first_gpu // gpus_per_node}"
        group = None
        if nvlink_group_size:
            local = first_gpu % gpus_per_node
            group = f"{node}/nvl-{local // nvlink_group_size}"
        role = roles[index] if roles else "both"
        spec = EngineSpec(f"e{index}", model, hardware, tp=tp, **spec_overrides)
        engines.append(FleetEngine(spec, node, group, role))
    return engines


def cluster_fleet(
    cluster: dict,
    model: str,
    tp: int = 1,
    roles: list[str] | None = None,
    **spec_overrides,
) -> tuple[list[FleetEngine], LinkModel]:
    """Engines and links for a ``clusters`` entry of scenarios.json: ``nodes`` ×
    ``gpus_per_node`` ``gpu``s, NVLink groups of ``nvlink_groups_of`` (none when ``nvlink`` is
    false), one engine per ``tp`` GPUs, nodes joined by ``nic_gbps`` NICs (RDMA or TCP)."""
    try:
        nodes = int(cluster["nodes"])
        per_node = int(cluster["gpus_per_node"])
        gpu = str(cluster["gpu"])
        nic_gbps = float(cluster["nic_gbps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"cluster needs nodes, gpus_per_node, gpu, nic_gbps: {exc!r}") from exc
    if tp < 1 or per_node % tp:
        raise ValueError(f"tp {tp} must divide gpus_per_node {per_node}")
    group = None
    if cluster.get("nvlink", True):
        group = int(cluster.get("nvlink_groups_of", per_node))
    engines = uniform_fleet(
        nodes * per_node // tp, model, gpu, tp=tp, gpus_per_node=per_node,
        nvlink_group_size=group, roles=roles, **spec_overrides,
    )
    return engines, LinkModel(nic=linkmod.nic(nic_gbps, rdma=bool(cluster.get("rdma", False))))
