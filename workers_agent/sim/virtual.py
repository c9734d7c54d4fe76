"""A discrete-event (virtual-time) fleet of simulated engines.

Engines live on nodes and NVLink groups and have a role (``prefill``, ``decode``, ``both``)
and a state (``active``, ``draining``). A router picks, per arrival, a decode-capable engine
and — when that engine is a pure decode engine and prefill engines exist — a prefill engine:
the prefill engine computes the prompt and holds its blocks, the KV moves over the link
between the two engines (NVLink within a group, PCIe within a node, the NIC between nodes),
and the decode engine takes it as computed (``kv_from_remote``), paying the transfer time
before its first step; the prefill engine's blocks are released when the decode engine's
first token comes out. A controller may change roles every ``control_interval_s``: a role
change drains — the engine takes no new work of a kind its new role does not cover, and
switches once its in-flight work of the old kind is done.

Every engine step is one event; idle engines cost nothing, so 10,000 requests replay in
seconds of wall time.

    workload = load_mooncake(path)                      # or synthetic(...), load_azure(...)
    engines = uniform_fleet(8, "llama-3.3-70b-fp8", "H200", roles=["prefill"] * 2 + ["decode"] * 6)
    fleet = VirtualFleet(engines, LinkModel(nic=links.nic(400)), router=KVAwareRouter(),
                         controller=my_planner, control_interval_s=10)
    result = fleet.run(workload)
    print(result.summary(slo_ttft_ms=1000, slo_itl_ms=50).lines())

``controller(now, snapshot)`` gets a :class:`FleetSnapshot` (per-engine stats, roles, states,
in-flight work, and the requests finished since its previous call) and returns
:class:`RoleChange` objects.

``queue_deadline_s`` (off by default) models deadline shedding at the gateway: a request
that, that long after its arrival, has no first token and still sits in an engine's queue
(not yet admitted to a batch, or preempted back to the queue) is aborted with an error
starting ``"deadline exceeded"`` instead of being served late. A request being computed at
that moment (prefill chunks running, KV in transfer, decoding) is left to finish; the check
happens once per request. Shed requests count as failed, like any other error.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from . import links as linkmod
from .engine import (
    DecodeBurst,
    EngineSpec,
    EngineStats,
    Output,
    RequestRejectedError,
    SimEngine,
    SimRequest,
)
from .links import LinkProfile
from .profiles import get_hardware
from .report import Summary, summarize
from .workload import PromptFactory, Workload, WorkloadRequest

ROLES = ("prefill", "decode", "both")
ACTIVE = "active"
DRAINING = "draining"

# Kinds of work an engine can take. "decode" covers a P/D decode stage and a whole request
# served in place (an aggregated request decodes there too).
_COVERS = {"prefill": {"prefill"}, "decode": {"decode"}, "both": {"prefill", "decode"}}


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


class LinkModel:
    """The link between two engines: NVLink in the same group, PCIe on the same node, else
    the NIC (per node; the slower end wins).

    ``nvlink`` and ``pcie`` default to what the engines' hardware profile says (NVLink
    bandwidth, PCIe generation and width; the slower of the two ends); ``nic`` to 400 G RDMA.
    """

    def __init__(
        self,
        nvlink: LinkProfile | None = None,
        pcie: LinkProfile | None = None,
        nic: LinkProfile | None = None,
        node_nics: dict[str, LinkProfile] | None = None,
    ) -> None:
        self.nvlink = nvlink
        self.pcie = pcie
        self.nic = nic or linkmod.nic(400, rdma=True)
        self.node_nics = node_nics or {}

    def between(self, a: FleetEngine, b: FleetEngine) -> LinkProfile:
        if a is b:
            return linkmod.LOCAL
        hw_a, hw_b = a.spec.hardware, b.spec.hardware
        if a.node == b.node:
            if a.nvlink_group is not None and a.nvlink_group == b.nvlink_group:
                if self.nvlink is not None:
                    return self.nvlink
                if hw_a.nvlink_gbs and hw_b.nvlink_gbs:
                    return linkmod.nvlink(min(hw_a.nvlink_gbs, hw_b.nvlink_gbs))
            if self.pcie is not None:
                return self.pcie
            return linkmod.pcie(
                min(hw_a.pcie_generation, hw_b.pcie_generation),
                min(hw_a.pcie_width, hw_b.pcie_width),
            )
        nic_a = self.node_nics.get(a.node, self.nic)
        nic_b = self.node_nics.get(b.node, self.nic)
        return nic_a if nic_a.bandwidth_gbs * nic_a.efficiency <= (
            nic_b.bandwidth_gbs * nic_b.efficiency
        ) else nic_b

    @staticmethod
    def lanes(link: LinkProfile, tp_a: int, tp_b: int) -> int:
        """Parallel paths for a TP-sharded KV: one per rank over NVLink and PCIe; a node's
        NIC is one path (as the real-time server assumes)."""
        return min(tp_a, tp_b) if link.kind in ("nvlink", "pcie") else 1


class _Member:
    """Fleet-side state of one engine."""

    __slots__ = (
        "engine",
        "engine_id",
        "fleet_engine",
        "incoming_pd",
        "inflight_decode",
        "inflight_prefill",
        "pending_role",
        "role",
        "state",
        "step",
        "token",
    )

    def __init__(self, fleet_engine: FleetEngine) -> None:
        self.fleet_engine = fleet_engine
        self.engine = SimEngine(fleet_engine.spec)
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
        return kind in _COVERS[self.role_for_new_work]

    @property
    def node(self) -> str:
        return self.fleet_engine.node

    @property
    def nvlink_group(self) -> str | None:
        return self.fleet_engine.nvlink_group


@dataclass
class RoutingRequest:
    request_id: str
    prompt_tokens: int
    output_tokens: int
    block_hashes: list[int]
    arrival: float


class Router:
    """Base router: choose a decode-capable engine; if it is a pure decode engine and prefill
    engines exist, choose a prefill engine for it too (llm-d's rule: only when the decode
    engine would have to compute at least ``pd_min_uncached_tokens`` itself).

    Subclasses implement :meth:`pick`.
    """

    pd_min_uncached_tokens: int = 0

    def __call__(self, req: RoutingRequest, fleet: VirtualFleet) -> Route | None:
        decode_candidates = fleet.candidates("decode")
        if not decode_candidates:
            return None
        decode = self.pick(req, decode_candidates, fleet, "decode")
        if decode.role_for_new_work == "decode":
            prefill_candidates = [
                m for m in fleet.candidates("prefill") if m.role_for_new_work == "prefill"
            ]
            uncached = req.prompt_tokens - decode.engine.cached_prefix_tokens(req.block_hashes)
            if prefill_candidates and uncached >= max(self.pd_min_uncached_tokens, 1):
                prefill = self.pick(req, prefill_candidates, fleet, "prefill")
                return Route(decode.engine_id, prefill.engine_id)
        return Route(decode.engine_id, None)

    def pick(
        self, req: RoutingRequest, candidates: list[_Member], fleet: VirtualFleet, stage: str
    ) -> _Member:
        raise NotImplementedError


class RoundRobinRouter(Router):
    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def pick(self, req, candidates, fleet, stage):
        index = self._counters.get(stage, 0)
        self._counters[stage] = index + 1
        return candidates[index % len(candidates)]


class LeastLoadedRouter(Router):
    """Fewest queued prompt tokens for prefill; fewest running + waiting requests for
    decode (ties: the earlier engine in fleet order)."""

    def pick(self, req, candidates, fleet, stage):
        if stage == "prefill":
            return min(candidates, key=lambda m: m.engine.pending_prefill_tokens())
        return min(
            candidates,
            key=lambda m: (
                len(m.engine.scheduler.running) + len(m.engine.scheduler.waiting),
                m.engine.pending_prefill_tokens(),
            ),
        )


class KVAwareRouter(Router):
    """Dynamo's KV router cost, per candidate, in blocks:

        prefill_load_scale × max(queued prefill blocks + prompt blocks − overlap_credit ×
        cached prompt blocks, 0) + decode blocks in use

    lowest cost wins. The prefill stage of P/D uses only the prefill term; a pure decode
    stage ignores the cache credit (the KV arrives by transfer anyway).
    """

    def __init__(self, prefill_load_scale: float = 1.0, overlap_credit: float = 1.0) -> None:
        self.prefill_load_scale = prefill_load_scale
        self.overlap_credit = overlap_credit
        self._turn = 0

    def pick(self, req, candidates, fleet, stage):
        # Ties (e.g. an idle fleet) go round-robin rather than always to the first engine.
        self._turn += 1
        offset = self._turn % len(candidates)
        best = None
        best_cost = float("inf")
        for member in candidates[offset:] + candidates[:offset]:
            engine = member.engine
            bs = engine.block_size
            prompt_blocks = -(-req.prompt_tokens // bs)
            queued = engine.pending_prefill_tokens() / bs
            credit = 0.0
            if stage == "prefill" or member.role_for_new_work == "both":
                credit = engine.kv.count_cached_prefix(req.block_hashes) * self.overlap_credit
            prefill_cost = self.prefill_load_scale * max(queued + prompt_blocks - credit, 0.0)
            cost = prefill_cost if stage == "prefill" else prefill_cost + engine.kv.num_used
            if cost < best_cost:
                best, best_cost = member, cost
        return best


_ARRIVAL, _STEP_DONE, _CONTROL, _DEADLINE = 0, 1, 2, 3
DEADLINE_EXCEEDED = "deadline exceeded"


class VirtualFleet:
    def __init__(
        self,
        engines: Iterable[FleetEngine],
        links: LinkModel | None = None,
        router: Callable[[RoutingRequest, VirtualFleet], Route | None] | None = None,
        controller: Callable[[float, FleetSnapshot], list[RoleChange]] | None = None,
        control_interval_s: float = 5.0,
        held_timeout_s: float = 480.0,
        decode_bursts: bool = True,
        nic_contention: bool = True,
        queue_deadline_s: float | None = None,
    ) -> None:
        if queue_deadline_s is not None and queue_deadline_s <= 0:
            raise ValueError("queue_deadline_s must be positive (or None: no shedding)")
        self.members: dict[str, _Member] = {}
        for fleet_engine in engines:
            if fleet_engine.spec.record_kv_events:
                # Nobody drains events in virtual time: don't buffer them.
                fleet_engine = replace(
                    fleet_engine, spec=replace(fleet_engine.spec, record_kv_events=False)
                )
            if fleet_engine.engine_id in self.members:
                raise ValueError(f"duplicate engine id {fleet_engine.engine_id!r}")
            self.members[fleet_engine.engine_id] = _Member(fleet_engine)
        if not self.members:
            raise ValueError("a fleet needs at least one engine")
        if len({m.engine.block_size for m in self.members.values()}) > 1:
            # Routers compare block hashes across engines: one block size per fleet.
            raise ValueError("all engines of a virtual fleet must use the same block size")
        self.order = list(self.members.values())
        self.links = links or LinkModel()
        self.router = router or KVAwareRouter()
        self.controller = controller
        self.control_interval_s = control_interval_s
        self.held_timeout_s = held_timeout_s
        # Pure-decode stretches that nothing can interrupt run as one event (exact same
        # timings as step by step; see SimEngine.decode_burst). Off: one event per step.
        self.decode_bursts = decode_bursts
        # KV transfers between nodes share each node's NIC, one after another; NVLink and
        # PCIe transfers are not queued (per-GPU links).
        self.nic_contention = nic_contention
        self._nic_free: dict[str, float] = {}
        self.queue_deadline_s = queue_deadline_s
        self.num_shed = 0
        self._next_arrival = float("inf")
        self._next_control = float("inf")
        self._last_activity = 0.0
        self.role_changes: list[RoleChangeRecord] = []
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._tracks: dict[str, _Track] = {}
        self._results: list[RequestResult] = []
        self._recent: list[RequestResult] = []
        self._arrivals_since = 0
        self._num_arrived = 0
        self._num_events = 0

    # -- helpers for routers and controllers --------------------------------------------------

    def candidates(self, kind: str) -> list[_Member]:
        return [m for m in self.order if m.accepts(kind)]

    def member(self, engine_id: str) -> _Member:
        return self.members[engine_id]

    @property
    def num_gpus(self) -> int:
        return sum(m.fleet_engine.spec.tp for m in self.order)

    def snapshot(self) -> FleetSnapshot:
        engines = [
            EngineSnapshot(
                engine_id=m.engine_id,
                node=m.node,
                nvlink_group=m.nvlink_group,
                role=m.role,
                state=m.state,
                pending_role=m.pending_role,
                num_gpus=m.fleet_engine.spec.tp,
                stats=m.engine.stats(),
                pending_prefill_tokens=m.engine.pending_prefill_tokens(),
                inflight_prefill=m.inflight_prefill,
                inflight_decode=m.inflight_decode,
                model=m.fleet_engine.spec.model.name,
                hardware=m.fleet_engine.spec.hardware.name,
            )
            for m in self.order
        ]
        return FleetSnapshot(
            now=self.now,
            engines=engines,
            recent_results=list(self._recent),
            arrivals_since_last=self._arrivals_since,
            interval_s=self.control_interval_s,
            num_arrived=self._num_arrived,
            num_finished=len(self._results),
            inflight_results=[t.result for t in self._tracks.values()],
        )

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

    def _check_drained(self, member: _Member) -> None:
        if member.state != DRAINING or member.pending_role is None:
            return
        old_kinds = _COVERS[member.role] - _COVERS[member.pending_role]
        busy = ("prefill" in old_kinds and member.inflight_prefill) or (
            "decode" in old_kinds and member.inflight_decode
        )
        if busy:
            return
        member.role, member.state, member.pending_role = member.pending_role, ACTIVE, None
        record = self._pending_record(member)
        if record is not None:
            record.completed_at = self.now
            record.outcome = "done"

    def _pending_record(self, member: _Member) -> RoleChangeRecord | None:
        for record in reversed(self.role_changes):
            if record.engine_id == member.engine_id:
                return record if record.outcome == "pending" else None
        return None

    # -- the event loop -----------------------------------------------------------------------

    def _push(self, when: float, kind: int, payload: object, token: int = 0) -> None:
        heapq.heappush(self._heap, (when, next(self._seq), kind, payload, token))

    def run(self, workload: Workload | Iterable[WorkloadRequest],
            prompts: PromptFactory | None = None) -> FleetResult:
        started = time.perf_counter()
        if isinstance(workload, Workload):
            prompts = workload.prompts
            requests = workload.requests
        else:
            requests = sorted(workload, key=lambda r: r.arrival)
        prompts = prompts or PromptFactory()
        self._prompts = prompts
        arrivals = iter(requests)
        first = next(arrivals, None)
        if first is not None:
            self._push(first.arrival, _ARRIVAL, first)
            self._next_arrival = first.arrival
        if self.controller is not None:
            self._push(self.control_interval_s, _CONTROL, None)
            self._next_control = self.control_interval_s
        self._pending_arrivals = arrivals
        heap = self._heap
        pop = heapq.heappop
        while heap:
            when, _, kind, payload, token = pop(heap)
            self.now = when
            self._num_events += 1
            if kind == _STEP_DONE:
                self._last_activity = when
                member = payload
                if token != member.token:
                    continue  # an idle wait superseded by new work
                step = member.step
                member.step = None
                if isinstance(step, DecodeBurst):
                    self._handle_burst(member, step)
                else:
                    outputs = member.engine.finish_step(step, when)
                    if outputs:
                        self._handle_outputs(member, outputs)
                self._kick(member)
            elif kind == _DEADLINE:
                self._deadline(payload)
            elif kind == _ARRIVAL:
                self._last_activity = when
                nxt = next(self._pending_arrivals, None)
                if nxt is not None:
                    self._push(nxt.arrival, _ARRIVAL, nxt)
                    self._next_arrival = nxt.arrival
                else:
                    self._next_arrival = float("inf")
                self._arrive(payload)
            else:
                self._control()
        for track in list(self._tracks.values()):
            # Nothing left to wake it (should not happen): report it, don't drop it.
            track.result.error = "still queued when the simulation ran out of events"
            self._done(track.result)
        self._tracks.clear()
        for member in self.order:
            member.engine.expire_held(float("inf"), 0.0)
        return FleetResult(
            results=sorted(self._results, key=lambda r: r.arrival),
            engine_stats={m.engine_id: m.engine.stats() for m in self.order},
            sim_seconds=self._last_activity,
            wall_seconds=time.perf_counter() - started,
            num_gpus=self.num_gpus,
            role_changes=self.role_changes,
            num_events=self._num_events,
        )

    def _kick(self, member: _Member) -> None:
        step = member.step
        if step is not None:
            if not step.idle:
                return  # busy: it looks again when the step ends
            member.step = None
            member.token += 1  # forget the idle wait; plan with the new work
        if self.decode_bursts:
            horizon = min(self._next_arrival, self._next_control)
            if member.incoming_pd:
                horizon = min(horizon, self._prefill_horizon())
            burst = member.engine.decode_burst(self.now, horizon)
            if burst is not None:
                member.step = burst
                member.token += 1
                self._push(burst.times[-1], _STEP_DONE, member, member.token)
                return
        step = member.engine.next_step(self.now)
        if step is None:
            return
        member.step = step
        member.token += 1
        self._push(self.now + step.duration, _STEP_DONE, member, member.token)

    def _prefill_horizon(self) -> float:
        """Earliest time a prefill stage elsewhere could hand this engine new work: the end
        of the current step of every engine holding prefill work (or, if one of them is idle,
        the next event of any kind, which is what could wake it)."""
        horizon = float("inf")
        for other in self.order:
            if not other.inflight_prefill:
                continue
            step = other.step
            if step is None or step.idle:
                return self._heap[0][0] if self._heap else self.now
            end = step.times[-1] if isinstance(step, DecodeBurst) else (
                step.started_at + step.duration
            )
            horizon = min(horizon, end)
        return horizon

    def _control(self) -> None:
        snapshot = self.snapshot()
        self._recent = []
        self._arrivals_since = 0
        for change in self.controller(self.now, snapshot) or ():
            self.apply_role_change(change)
        if self._tracks or self._heap:
            self._next_control = self.now + self.control_interval_s
            self._push(self._next_control, _CONTROL, None)
        else:
            self._next_control = float("inf")

    def _arrive(self, wreq: WorkloadRequest) -> None:
        self._num_arrived += 1
        self._arrivals_since += 1
        some_engine = self.order[0].engine
        hashes = self._prompts.block_hashes(wreq, some_engine.block_size)
        rreq = RoutingRequest(
            wreq.request_id, wreq.input_length, wreq.output_length, hashes, self.now
        )
        result = RequestResult(wreq.request_id, self.now, wreq.input_length)
        route = self.router(rreq, self)
        if route is None:
            result.error = "no engine accepts this request"
            self._done(result)
            return
        track = _Track(rreq, result, route)
        self._tracks[wreq.request_id] = track
        if self.queue_deadline_s is not None:
            self._push(self.now + self.queue_deadline_s, _DEADLINE, track)
        decode = self.members[route.decode]
        result.decode_engine = decode.engine_id
        decode.inflight_decode += 1
        if route.prefill is None or route.prefill == route.decode:
            result.prefill_engine = decode.engine_id
            self._submit(decode, SimRequest(
                wreq.request_id, [], wreq.output_length, self.now,
                block_hashes=hashes, num_prompt_tokens=wreq.input_length,
            ), track)
            return
        prefill = self.members[route.prefill]
        result.prefill_engine = prefill.engine_id
        prefill.inflight_prefill += 1
        decode.incoming_pd += 1
        track.stage = "prefill"
        self._submit(prefill, SimRequest(
            wreq.request_id, [], 1, self.now, hold_for_remote_decode=True,
            block_hashes=hashes, num_prompt_tokens=wreq.input_length,
        ), track)

    def _submit(self, member: _Member, sreq: SimRequest, track: _Track) -> None:
        try:
            member.engine.submit(sreq)
        except RequestRejectedError as exc:
            self._fail(track, f"{member.engine_id}: {exc}")
            return
        self._kick(member)

    def _deadline(self, track: _Track) -> None:
        """Shed the request if it is still queued, without a first token, at its deadline."""
        result = track.result
        if self._tracks.get(result.request_id) is not track or result.first_token_time is not None:
            return
        if track.stage == "prefill":
            where = self.members[result.prefill_engine]
        else:
            where = self.members[result.decode_engine]
        if not where.engine.is_queued(result.request_id):
            return
        self.num_shed += 1
        decode = self.members[result.decode_engine]
        if track.stage == "decode":
            decode.engine.abort(result.request_id)
        self._fail(track, f"{DEADLINE_EXCEEDED}: still queued at {where.engine_id} "
                          f"{self.queue_deadline_s:g} s after arrival")
        self._kick(decode)

    def _fail(self, track: _Track, error: str) -> None:
        result = track.result
        result.error = error
        self._tracks.pop(result.request_id, None)
        if track.stage == "prefill":
            self.members[result.decode_engine].incoming_pd -= 1
        if track.stage == "prefill" or track.prefill_held:
            prefill = self.members[result.prefill_engine]
            prefill.engine.release_held(result.request_id)
            prefill.engine.abort(result.request_id)
            prefill.inflight_prefill -= 1
            self._check_drained(prefill)
            self._kick(prefill)
        decode = self.members[result.decode_engine]
        decode.inflight_decode -= 1
        self._check_drained(decode)
        self._done(result)

    def _handle_outputs(self, member: _Member, outputs: list[Output]) -> None:
        now = self.now
        tracks = self._tracks
        for out in outputs:
            track = tracks.get(out.request_id)
            if track is None:
                continue
            result = track.result
            if track.stage == "prefill":
                # Prefill done and held: move the KV to the decode engine.
                track.stage = "decode"
                track.prefill_held = True
                result.cached_tokens = out.num_cached_tokens
                result.preemptions += out.num_preemptions
                decode = self.members[result.decode_engine]
                decode.incoming_pd -= 1
                local = decode.engine.cached_prefix_tokens(track.request.block_hashes)
                moved = max(out.prompt_tokens - local, 0)
                spec_p = member.fleet_engine.spec
                spec_d = decode.fleet_engine.spec
                link = self.links.between(member.fleet_engine, decode.fleet_engine)
                seconds = link.transfer_seconds(
                    moved * spec_p.model.kv_bytes_per_token,
                    lanes=self.links.lanes(link, spec_p.tp, spec_d.tp),
                )
                if self.nic_contention and link.kind in ("rdma", "tcp") and seconds > 0:
                    # Transfers through a node's NIC queue behind each other (FIFO).
                    src, dst = member.node, decode.node
                    start = max(now, self._nic_free.get(src, 0.0), self._nic_free.get(dst, 0.0))
                    self._nic_free[src] = self._nic_free[dst] = start + seconds
                    seconds = start + seconds - now
                result.transferred_tokens = moved
                result.transfer_seconds = seconds
                self._submit(decode, SimRequest(
                    out.request_id, [], track.request.output_tokens, now,
                    kv_from_remote=out.prompt_tokens, transfer_seconds=seconds,
                    block_hashes=track.request.block_hashes,
                    num_prompt_tokens=out.prompt_tokens,
                ), track)
                continue
            if out.first_token:
                result.first_token_time = now
                result.ttft = now - result.arrival
                if not track.prefill_held:
                    result.cached_tokens = out.num_cached_tokens
                else:
                    prefill = self.members[result.prefill_engine]
                    prefill.engine.release_held(out.request_id)
                    track.prefill_held = False
                    prefill.inflight_prefill -= 1
                    self._check_drained(prefill)
                    self._kick(prefill)  # freed blocks may let queued prompts in
            else:
                result.itls.append(now - track.last_token_time)
            track.last_token_time = now
            result.output_tokens = out.num_output_tokens
            if out.finished:
                result.finish_time = now
                result.e2e = now - result.arrival
                result.preemptions += out.num_preemptions
                del tracks[out.request_id]
                member.inflight_decode -= 1
                self._check_drained(member)
                self._done(result)

    def _handle_burst(self, member: _Member, burst: DecodeBurst) -> None:
        times = burst.times
        first = times[0]
        last = times[-1]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        tracks = self._tracks
        for request_id, num_output, finished in burst.entries:
            track = tracks.get(request_id)
            if track is None:
                continue
            result = track.result
            result.itls.append(first - track.last_token_time)
            result.itls.extend(gaps)
            track.last_token_time = last
            result.output_tokens = num_output
            if finished:
                result.finish_time = last
                result.e2e = last - result.arrival
                del tracks[request_id]
                member.inflight_decode -= 1
                self._done(result)
        self._check_drained(member)

    def _done(self, result: RequestResult) -> None:
        self._results.append(result)
        self._recent.append(result)


class _Track:
    __slots__ = ("last_token_time", "prefill_held", "request", "result", "route", "stage")

    def __init__(self, request: RoutingRequest, result: RequestResult, route: Route) -> None:
        self.request = request
        self.result = result
        self.route = route
        self.stage = "decode"
        self.prefill_held = False
        self.last_token_time = 0.0


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
