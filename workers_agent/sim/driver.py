"""The one engine driver: request tracking, P/D hand-off, KV transfer and latency
bookkeeping around a :class:`~workers_agent.sim.engine.SimEngine`, with no clock of its own.

Two clocks drive it: the virtual fleet (:mod:`workers_agent.sim.virtual`, a discrete-event
heap, simulated seconds) and the real-time engine server
(:mod:`workers_agent.sim.server.engine_server`, asyncio sleeps). Each asks the driver for the
next step (or a decode burst), waits its duration in its own way, and hands it back with the
time it ended; the driver applies the engine's outputs to the requests it tracks — first
token, inter-token gaps, finish — and returns one :class:`Update` per request that moved,
which the clock then delivers (a fleet event, an HTTP chunk). Latency figures (TTFT, ITL,
queue/prefill/decode split) are computed here once and passed to an optional
:class:`LatencyObserver` (the server's Prometheus histograms).

P/D hand-off: the prefill half of a pair is submitted with ``hold=True``; when its one token
comes out, the driver keeps its blocks as a :class:`HeldKv` until the decode side takes them
(:meth:`EngineDriver.take_held`) or they expire. The decode half is submitted with
``external_tokens`` (KV that arrives by transfer) and the transfer time from
:func:`transfer_seconds`, which both clocks use over the links of :class:`LinkModel` (fleet)
or the server's path model.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from . import links as linkmod
from .engine import SimEngine
from .enginetypes import DecodeBurst, SimRequest, Step
from .links import LinkProfile


@dataclass(slots=True)
class Tracked:
    """One request on one engine, as the driver follows it."""

    request_id: str
    arrival: float  # when the request arrived (at the fleet or the HTTP server)
    prompt_tokens: int
    max_tokens: int
    hold: bool = False  # prefill half of P/D: keep the KV after the one token
    external_tokens: int = 0  # prompt tokens whose KV came from a prefill engine
    context: Any = None  # the clock's own per-request object (fleet track, HTTP queue)
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    itls: list[float] = field(default_factory=list)
    generated: int = 0
    cached_tokens: int = 0  # local prefix-cache hit
    preemptions: int = 0
    finished: bool = False
    finish_reason: str | None = None
    finished_at: float | None = None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token_at is None else self.first_token_at - self.arrival

    @property
    def e2e(self) -> float | None:
        return None if self.finished_at is None else self.finished_at - self.arrival


@dataclass(slots=True)
class Update:
    """What one step or burst did to one request."""

    tracked: Tracked
    new_token_ids: list[int]
    num_new: int
    first: bool
    finished: bool


@dataclass
class HeldKv:
    """Blocks a prefill engine keeps for the decode engine of a P/D pair."""

    request_id: str
    num_tokens: int
    block_ids: list[int]
    since: float
    cached_tokens: int = 0
    context: Any = None


class LatencyObserver(Protocol):
    def first_token(self, tracked: Tracked, ttft: float) -> None: ...
    def token_gaps(self, tracked: Tracked, gap: float, count: int) -> None: ...
    def finished(self, tracked: Tracked, *, queued: float, prefill: float,
                 decode: float) -> None: ...


class EngineDriver:
    """Tracks the requests of one engine between its steps; see the module docstring."""

    def __init__(self, engine: SimEngine, observer: LatencyObserver | None = None,
                 record_itls: bool = True) -> None:
        self.engine = engine
        self.observer = observer
        self.record_itls = record_itls
        self.requests: dict[str, Tracked] = {}
        self.held: dict[str, HeldKv] = {}

    # -- requests ----------------------------------------------------------------------------

    def submit(self, request: SimRequest, *, arrival: float | None = None,
               external_tokens: int = 0, context: Any = None) -> Tracked:
        """Hand a request to the engine and start tracking it (raises the engine's
        RequestRejectedError, tracking nothing, when it refuses)."""
        prompt = request.num_prompt_tokens or len(request.prompt_token_ids)
        tracked = Tracked(
            request.request_id, request.arrival_time if arrival is None else arrival, prompt,
            request.max_tokens, hold=request.hold_for_remote_decode,
            external_tokens=external_tokens, context=context,
        )
        self.engine.submit(request)
        self.requests[request.request_id] = tracked
        return tracked

    def abort(self, request_id: str) -> Tracked | None:
        """Drop a request (queued, running or held) and stop tracking it."""
        self.engine.abort(request_id)
        self.held.pop(request_id, None)
        return self.requests.pop(request_id, None)

    def forget(self, request_id: str) -> Tracked | None:
        return self.requests.pop(request_id, None)

    def is_queued(self, request_id: str) -> bool:
        return self.engine.is_queued(request_id)

    # -- steps -------------------------------------------------------------------------------

    def next_step(self, now: float) -> Step | None:
        step = self.engine.next_step(now)
        if step is not None and not step.idle:
            requests = self.requests
            for seq, _ in step.entries:
                tracked = requests.get(seq.request_id)
                if tracked is not None and tracked.scheduled_at is None:
                    tracked.scheduled_at = now
        return step

    def decode_burst(self, now: float, horizon: float) -> DecodeBurst | None:
        return self.engine.decode_burst(now, horizon)

    def finish(self, step: Step | DecodeBurst, now: float) -> list[Update]:
        """Apply a step (at ``now``, when it ended) or a burst (its own times)."""
        if isinstance(step, DecodeBurst):
            return self._finish_burst(step)
        outputs = self.engine.finish_step(step, now)
        updates = []
        requests = self.requests
        observer = self.observer
        for out in outputs:
            tracked = requests.get(out.request_id)
            if tracked is None:
                continue
            new_ids = out.new_token_ids or []
            num_new = max(out.num_output_tokens - tracked.generated, len(new_ids), 1)
            first = tracked.first_token_at is None
            tracked.preemptions = out.num_preemptions
            if first:
                tracked.first_token_at = now
                tracked.cached_tokens = out.num_cached_tokens
                if observer is not None:
                    observer.first_token(tracked, now - tracked.arrival)
            else:
                gap = (now - tracked.last_token_at) / num_new
                if self.record_itls:
                    tracked.itls.extend([gap] * num_new)
                if observer is not None:
                    observer.token_gaps(tracked, gap, num_new)
            tracked.last_token_at = now
            tracked.generated = max(out.num_output_tokens, tracked.generated + len(new_ids))
            if out.finished:
                self._finished(tracked, now, out.finish_reason or "length")
                if out.held:
                    self.held[tracked.request_id] = HeldKv(
                        tracked.request_id, tracked.prompt_tokens,
                        self.engine.held_blocks(tracked.request_id) or [], now,
                        tracked.cached_tokens, tracked.context,
                    )
            updates.append(Update(tracked, new_ids, num_new, first, out.finished))
        return updates

    def _finish_burst(self, burst: DecodeBurst) -> list[Update]:
        times = burst.times
        first_time, last = times[0], times[-1]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        updates = []
        requests = self.requests
        observer = self.observer
        for request_id, num_output, finished in burst.entries:
            tracked = requests.get(request_id)
            if tracked is None:
                continue
            num_new = num_output - tracked.generated
            lead = first_time - tracked.last_token_at
            if self.record_itls:
                tracked.itls.append(lead)
                tracked.itls.extend(gaps[: num_new - 1])
            if observer is not None:
                observer.token_gaps(tracked, lead, 1)
                for gap in gaps[: num_new - 1]:
                    observer.token_gaps(tracked, gap, 1)
            end = times[num_new - 1] if num_new <= len(times) else last
            tracked.last_token_at = end
            tracked.generated = num_output
            if finished:
                self._finished(tracked, end, "length")
            updates.append(Update(tracked, [], num_new, False, finished))
        return updates

    def _finished(self, tracked: Tracked, now: float, reason: str) -> None:
        tracked.finished = True
        tracked.finish_reason = reason
        tracked.finished_at = now
        self.requests.pop(tracked.request_id, None)
        if self.observer is not None:
            first = tracked.first_token_at if tracked.first_token_at is not None else now
            scheduled = tracked.scheduled_at if tracked.scheduled_at is not None else (
                tracked.arrival)
            scheduled = min(scheduled, first)
            self.observer.finished(tracked, queued=scheduled - tracked.arrival,
                                   prefill=first - scheduled, decode=now - first)

    # -- P/D hand-off ------------------------------------------------------------------------

    def take_held(self, request_id: str) -> HeldKv | None:
        """The decode side takes a held prefill: the blocks are freed here."""
        held = self.held.pop(request_id, None)
        if held is not None:
            self.engine.release_held(request_id)
        return held

    def expire_held(self, now: float, max_age_s: float) -> list[str]:
        stale = [rid for rid, held in self.held.items() if now - held.since > max_age_s]
        for rid in stale:
            self.take_held(rid)
        return stale


def kv_lanes(link: LinkProfile, tp_a: int, tp_b: int) -> int:
    """Parallel paths for a TP-sharded KV: one per rank over NVLink and PCIe; a node's NIC
    is one path."""
    return min(tp_a, tp_b) if link.kind in ("nvlink", "pcie") else 1


def transfer_seconds(link: LinkProfile, tokens: int, kv_bytes_per_token: int,
                     tp_src: int = 1, tp_dst: int = 1) -> float:
    """Time to move ``tokens`` of KV from a prefill engine to a decode engine."""
    if tokens <= 0:
        return 0.0
    return link.transfer_seconds(tokens * kv_bytes_per_token,
                                 lanes=kv_lanes(link, tp_src, tp_dst))


class NicQueue:
    """Transfers through a node's NIC queue behind each other (FIFO); NVLink and PCIe are
    per-GPU links and are not queued."""

    def __init__(self) -> None:
        self._free: dict[str, float] = {}

    def delay(self, link: LinkProfile, src_node: str, dst_node: str, now: float,
              seconds: float) -> float:
        """Seconds from ``now`` until a ``seconds``-long transfer over ``link`` ends."""
        if link.kind not in ("rdma", "tcp") or seconds <= 0:
            return seconds
        start = max(now, self._free.get(src_node, 0.0), self._free.get(dst_node, 0.0))
        self._free[src_node] = self._free[dst_node] = start + seconds
        return start + seconds - now


class LinkModel:
    """The link between two engines: NVLink in the same group, PCIe on the same node, else
    the NIC (per node; the slower end wins).

    ``nvlink`` and ``pcie`` default to what the engines' hardware profile says (NVLink
    bandwidth, PCIe generation and width; the slower of the two ends); ``nic`` to 400 G RDMA.
    Engines are anything with ``spec`` (an EngineSpec), ``node`` and ``nvlink_group``.
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

    def between(self, a, b) -> LinkProfile:
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

    lanes = staticmethod(kv_lanes)


# A router for the virtual fleet: (request, fleet) -> Route | None. Declared here so the
# fleet and benchmark baselines share one signature.
RouterFn = Callable[..., Any]
