"""A discrete-event (virtual-time) fleet of simulated engines: a clock around the engine
driver (:mod:`workers_agent.sim.driver`), routed by the gateway's own router.

Engines live on nodes and NVLink groups and have a role (``prefill``, ``decode``, ``both``)
and a state (``active``, ``draining``). The router (by default
:class:`workers_agent.sim.gateway_routing.GatewayRouter`: ``gateway.router.plan_request`` fed
as the gateway feeds it) picks, per arrival, the engine that answers and, for P/D, a prefill
engine: the prefill engine computes the prompt and holds its blocks, the KV moves over the
link between the two engines (NVLink within a group, PCIe within a node, the NIC between
nodes), and the decode engine takes it as computed, paying the transfer time before its
first step; the prefill engine's blocks are released when the decode engine's first token
comes out. A controller may change roles every ``control_interval_s``: a role change drains
— the engine takes no new work of a kind its new role does not cover, and switches once its
in-flight work of the old kind is done.

Every engine step is one event; idle engines cost nothing, so 10,000 requests replay in
seconds of wall time.

    workload = load_mooncake(path)                      # or synthetic(...), load_azure(...)
    engines = uniform_fleet(8, "llama-3.3-70b-fp8", "H200", roles=["prefill"] * 2 + ["decode"] * 6)
    fleet = VirtualFleet(engines, LinkModel(nic=links.nic(400)),
                         controller=my_planner, control_interval_s=10)
    result = fleet.run(workload)
    print(result.summary(slo_ttft_ms=1000, slo_itl_ms=50).lines())

``router(request, fleet)`` returns a :class:`Route` (or None: nobody takes it); a router may
also define ``prefill_done(request_id)`` and ``finished(request_id)`` (called when the
request's prefill is over and when it leaves the fleet, to keep load accounting) and
``kv_events(engine_id, events, now)`` with ``wants_kv_events = True`` (the engines then
publish KV-cache events, handed over after every step). ``controller(now, snapshot)`` gets
a :class:`FleetSnapshot` and returns :class:`RoleChange` objects.

``queue_deadline_s`` (off by default) models deadline shedding at the gateway: a request
that, that long after its arrival, has no first token and still sits in an engine's queue
is aborted with an error starting ``"deadline exceeded"``. A request being computed at that
moment is left to finish; the check happens once per request. Shed requests count as failed.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Callable, Iterable
from dataclasses import replace

from .driver import LinkModel, NicQueue, Tracked, Update, transfer_seconds
from .enginetypes import DecodeBurst, RequestRejectedError, SimRequest
from .fleet import (
    ACTIVE,
    DRAINING,
    ROLES,
    EngineSnapshot,
    FleetEngine,
    FleetResult,
    FleetSnapshot,
    Member,
    RequestResult,
    RoleChange,
    RoleChangeRecord,
    RoleChanges,
    Route,
    RoutingRequest,
    cluster_fleet,
    uniform_fleet,
)
from .workload import PromptFactory, Workload, WorkloadRequest

__all__ = [
    "ACTIVE", "DEADLINE_EXCEEDED", "DRAINING", "ROLES", "EngineSnapshot", "FleetEngine",
    "FleetResult", "FleetSnapshot", "LinkModel", "RequestResult", "RoleChange",
    "RoleChangeRecord", "Route", "RoutingRequest", "VirtualFleet", "cluster_fleet",
    "uniform_fleet",
]

_ARRIVAL, _STEP_DONE, _CONTROL, _DEADLINE = 0, 1, 2, 3
DEADLINE_EXCEEDED = "deadline exceeded"


class _Track:
    __slots__ = ("prefill_held", "request", "result", "route", "stage")

    def __init__(self, request: RoutingRequest, result: RequestResult, route: Route) -> None:
        self.request = request
        self.result = result
        self.route = route
        self.stage = "decode"
        self.prefill_held = False


class VirtualFleet(RoleChanges):
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
        if router is None:
            from .gateway_routing import GatewayRouter

            router = GatewayRouter()
        self.router = router
        wants_events = bool(getattr(router, "wants_kv_events", False))
        self.members: dict[str, Member] = {}
        for fleet_engine in engines:
            if fleet_engine.spec.record_kv_events != wants_events:
                # Events are buffered only when the router drains them.
                fleet_engine = replace(
                    fleet_engine, spec=replace(fleet_engine.spec, record_kv_events=wants_events)
                )
            if fleet_engine.engine_id in self.members:
                raise ValueError(f"duplicate engine id {fleet_engine.engine_id!r}")
            self.members[fleet_engine.engine_id] = Member(fleet_engine)
        if not self.members:
            raise ValueError("a fleet needs at least one engine")
        if len({m.engine.block_size for m in self.members.values()}) > 1:
            # Routers compare block hashes across engines: one block size per fleet.
            raise ValueError("all engines of a virtual fleet must use the same block size")
        self.order = list(self.members.values())
        self.links = links or LinkModel()
        self._on_prefill_done = getattr(router, "prefill_done", None)
        self._on_finished = getattr(router, "finished", None)
        self._on_kv_events = getattr(router, "kv_events", None) if wants_events else None
        self.controller = controller
        self.control_interval_s = control_interval_s
        self.held_timeout_s = held_timeout_s
        # Pure-decode stretches that nothing can interrupt run as one event (exact same
        # timings as step by step; see SimEngine.decode_burst). Off: one event per step.
        self.decode_bursts = decode_bursts
        self.nic_contention = nic_contention
        self._nics = NicQueue()
        self.queue_deadline_s = queue_deadline_s
        self.num_shed = 0
        self._next_arrival = float("inf")
        self._next_control = float("inf")
        self._last_activity = 0.0
        self.role_changes: list[RoleChangeRecord] = []
        self.roles_version = 0  # bumped on every role/state change (routers cache tables)
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

    def candidates(self, kind: str) -> list[Member]:
        return [m for m in self.order if m.accepts(kind)]

    def member(self, engine_id: str) -> Member:
        return self.members[engine_id]

    @property
    def num_gpus(self) -> int:
        return sum(m.fleet_engine.spec.tp for m in self.order)

    def snapshot(self) -> FleetSnapshot:
        engines = [
            EngineSnapshot(
                engine_id=m.engine_id, node=m.node, nvlink_group=m.nvlink_group, role=m.role,
                state=m.state, pending_role=m.pending_role, num_gpus=m.fleet_engine.spec.tp,
                stats=m.engine.stats(), pending_prefill_tokens=m.engine.pending_prefill_tokens(),
                inflight_prefill=m.inflight_prefill, inflight_decode=m.inflight_decode,
                model=m.fleet_engine.spec.model.name, hardware=m.fleet_engine.spec.hardware.name,
            )
            for m in self.order
        ]
        return FleetSnapshot(
            now=self.now, engines=engines, recent_results=list(self._recent),
            arrivals_since_last=self._arrivals_since, interval_s=self.control_interval_s,
            num_arrived=self._num_arrived, num_finished=len(self._results),
            inflight_results=[t.result for t in self._tracks.values()],
        )

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
        self._prompts = prompts or PromptFactory()
        arrivals = iter(requests)
        first = next(arrivals, None)
        if first is not None:
            self._push(first.arrival, _ARRIVAL, first)
            self._next_arrival = first.arrival
        if self.controller is not None:
            self._push(self.control_interval_s, _CONTROL, None)
            self._next_control = self.control_interval_s
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
                self._apply(member, member.driver.finish(step, when))
                if self._on_kv_events is not None:
                    events = member.engine.drain_kv_events()
                    if events:
                        self._on_kv_events(member.engine_id, events, when)
                self._kick(member)
            elif kind == _DEADLINE:
                self._deadline(payload)
            elif kind == _ARRIVAL:
                self._last_activity = when
                nxt = next(arrivals, None)
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
            sim_seconds=self._last_activity, wall_seconds=time.perf_counter() - started,
            num_gpus=self.num_gpus, role_changes=self.role_changes,
            num_events=self._num_events,
        )

    def _kick(self, member: Member) -> None:
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
            burst = member.driver.decode_burst(self.now, horizon)
            if burst is not None:
                member.step = burst
                member.token += 1
                self._push(burst.times[-1], _STEP_DONE, member, member.token)
                return
        step = member.driver.next_step(self.now)
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
        hashes = self._prompts.block_hashes(wreq, self.order[0].engine.block_size)
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
            tracked = self._submit(decode, SimRequest(
                wreq.request_id, [], wreq.output_length, self.now,
                block_hashes=hashes, num_prompt_tokens=wreq.input_length,
            ), track)
            if tracked is not None:
                result.itls = tracked.itls
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

    def _submit(self, member: Member, sreq: SimRequest, track: _Track,
                external_tokens: int = 0) -> Tracked | None:
        try:
            tracked = member.driver.submit(sreq, arrival=track.result.arrival,
                                           external_tokens=external_tokens, context=track)
        except RequestRejectedError as exc:
            self._fail(track, f"{member.engine_id}: {exc}")
            return None
        self._kick(member)
        return tracked

    def _deadline(self, track: _Track) -> None:
        """Shed the request if it is still queued, without a first token, at its deadline."""
        result = track.result
        if self._tracks.get(result.request_id) is not track or result.first_token_time is not None:
            return
        where = self.members[result.prefill_engine if track.stage == "prefill"
                             else result.decode_engine]
        if not where.driver.is_queued(result.request_id):
            return
        self.num_shed += 1
        decode = self.members[result.decode_engine]
        if track.stage == "decode":
            decode.driver.abort(result.request_id)
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
            prefill.driver.abort(result.request_id)
            prefill.inflight_prefill -= 1
            self._check_drained(prefill)
            self._kick(prefill)
        decode = self.members[result.decode_engine]
        decode.inflight_decode -= 1
        self._check_drained(decode)
        self._leave(result)

    def _apply(self, member: Member, updates: list[Update]) -> None:
        tracks = self._tracks
        for update in updates:
            tracked = update.tracked
            track = tracked.context
            result = track.result
            if tracks.get(result.request_id) is not track:
                continue
            if track.stage == "prefill":
                if update.finished:
                    self._hand_off(member, track, tracked)
                continue
            if update.first:
                result.first_token_time = tracked.first_token_at
                result.ttft = tracked.first_token_at - result.arrival
                if not track.prefill_held:
                    result.cached_tokens = tracked.cached_tokens
                    if self._on_prefill_done is not None:
                        self._on_prefill_done(result.request_id)
                else:
                    prefill = self.members[result.prefill_engine]
                    prefill.driver.take_held(result.request_id)
                    track.prefill_held = False
                    prefill.inflight_prefill -= 1
                    self._check_drained(prefill)
                    self._kick(prefill)  # freed blocks may let queued prompts in
            result.output_tokens = tracked.generated
            if update.finished:
                result.finish_time = tracked.finished_at
                result.e2e = tracked.finished_at - result.arrival
                result.preemptions += tracked.preemptions
                del tracks[result.request_id]
                member.inflight_decode -= 1
                self._leave(result)
        self._check_drained(member)

    def _hand_off(self, prefill: Member, track: _Track, tracked: Tracked) -> None:
        """Prefill done and held: move the KV to the decode engine."""
        result = track.result
        track.stage = "decode"
        track.prefill_held = True
        result.cached_tokens = tracked.cached_tokens
        result.preemptions += tracked.preemptions
        if self._on_prefill_done is not None:
            self._on_prefill_done(result.request_id)
        decode = self.members[result.decode_engine]
        decode.incoming_pd -= 1
        hashes = track.request.block_hashes
        moved = max(tracked.prompt_tokens - decode.engine.cached_prefix_tokens(hashes), 0)
        spec_p, spec_d = prefill.fleet_engine.spec, decode.fleet_engine.spec
        link = self.links.between(prefill.fleet_engine, decode.fleet_engine)
        seconds = transfer_seconds(link, moved, spec_p.model.kv_bytes_per_token,
                                   spec_p.tp, spec_d.tp)
        if self.nic_contention:
            seconds = self._nics.delay(link, prefill.node, decode.node, self.now, seconds)
        result.transferred_tokens = moved
        result.transfer_seconds = seconds
        decoded = self._submit(decode, SimRequest(
            result.request_id, [], track.request.output_tokens, self.now,
            kv_from_remote=tracked.prompt_tokens, transfer_seconds=seconds,
            block_hashes=hashes, num_prompt_tokens=tracked.prompt_tokens,
        ), track, external_tokens=tracked.prompt_tokens)
        if decoded is not None:
            result.itls = decoded.itls

    def _leave(self, result: RequestResult) -> None:
        if self._on_finished is not None:
            self._on_finished(result.request_id)
        self._done(result)

    def _done(self, result: RequestResult) -> None:
        self._results.append(result)
        self._recent.append(result)
