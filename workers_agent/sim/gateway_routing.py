"""The virtual fleet routed by the product's router, fed as the gateway feeds it.

- The routing table is the one the control plane builds: a snapshot of the fleet (engines,
  nodes, NVLink groups, NICs, roles, the policy) goes through
  ``controlplane.routing.builder.build_table`` and the gateway's ``gateway.table.parse``.
  It is rebuilt when a role changes.
- Decisions are ``gateway.router.plan_request``; load accounting is the gateway's
  (``gateway.router.LoadReservation``: queued prefill until the prefill is done, KV blocks
  and in-flight count until the request ends).
- Answer lengths (``answers``): ``"true"`` tells the router each request's real output
  length (an oracle); otherwise the router is told what a gateway sees — ``"fixed:N"``
  (no ``max_tokens``: the gateway's default length N for every request), ``"scale:K"``
  (``max_tokens`` = K × the real length, taken as the length) — and with a ``learn-``
  prefix (``"learn"``: no ``max_tokens``; ``"learn-scale:K"``) the stall weight is the
  expected one from the answer lengths learned from finished requests and their durations
  (``gateway.answer_lengths.AnswerLengths``), as the gateway learns them from usage.
- Prefix knowledge is the gateway's ``ApproxPrefixIndex``, learning from its own decisions
  (block hashes stand in for the gateway's text-chunk hashes; per-worker capacity as the
  gateway sizes it) and, with ``precise=True``, the ``PreciseIndex`` fed with the engines'
  KV-cache events.

    fleet = VirtualFleet(engines, router=GatewayRouter(policy={"load_weight": 1.0}))
"""

from __future__ import annotations

import random
from collections import Counter, defaultdict
from typing import Any

from controlplane.policies.effective import EffectivePolicy
from controlplane.routing.builder import build_table
from gateway.answer_lengths import DEFAULT_OUTPUT_TOKENS, AnswerLengths
from gateway.prefix_index import ApproxPrefixIndex, PreciseIndex
from gateway.router import LoadReservation, NoWorkerError, WorkerLoad, plan_request
from gateway.table import ModelRoute, parse

from .fleet import Route, RoutingRequest

GB = 1e9


def default_policy() -> dict[str, Any]:
    return EffectivePolicy().as_dict()


class GatewayRouter:
    """``router(request, fleet) -> Route`` with the gateway's router and bookkeeping."""

    def __init__(self, policy: dict[str, Any] | None = None, *, precise: bool = False,
                 approx_ttl_s: float = 120.0, seed: int = 0,
                 kv_tokens: int | None = None,
                 routing: dict[str, Any] | None = None, answers: str = "true") -> None:
        self.policy = {**default_policy(), **(policy or {})}
        # Routing fields set over the builder's (a benchmark's "before" variant).
        self.routing = dict(routing or {})
        self.approx = ApproxPrefixIndex(ttl_s=approx_ttl_s)
        self.precise = PreciseIndex() if precise else None
        self.wants_kv_events = precise
        self.loads: defaultdict[str, WorkerLoad] = defaultdict(WorkerLoad)
        self.rng = random.Random(seed)
        self.decisions: Counter[str] = Counter()
        # "kv_prefix" decisions by how many admitted holders of the best match they chose
        # among (the cost model's dispatch: the shortest of that many queues).
        self.affinity_holders: Counter[int] = Counter()
        self.model: ModelRoute | None = None
        self.table: dict[str, Any] | None = None
        self._table_key: tuple | None = None
        self._engine_of: dict[str, str] = {}  # table worker id -> engine id
        self._worker_of: dict[str, str] = {}  # engine id -> table worker id
        self._reservations: dict[str, LoadReservation] = {}
        # "-stream": as a gateway relaying streams, follow each answer's tokens so far and
        # re-book its expected weight as they grow (AnswerLengths.weight_after).
        parts = answers.split("-")
        self.stream = "stream" in parts
        answers = "-".join(part for part in parts if part != "stream")
        # request id -> (bit length of its tokens seen, learner epoch) when last re-booked
        self._stream_bucket: dict[str, tuple[int, int]] = {}
        self.learn = answers.startswith("learn")
        if self.stream and not self.learn:
            raise ValueError("answers: -stream needs learn")
        told = answers.removeprefix("learn").lstrip("-") or "fixed:0"
        kind, _, value = told.partition(":")
        if kind not in ("true", "fixed", "scale"):
            raise ValueError(f"answers: unknown {answers!r}")
        self._told = (kind, float(value or 0))
        self.answer_lengths = AnswerLengths()
        # request id -> (prompt, real answer length: its usage at the end, dispatch time)
        self._answer_of: dict[str, tuple[int, int, float]] = {}
        self._clock = None  # the fleet routed last (its clock times the answers)
        # Per-worker KV capacity the table states, when not the builder's estimate from GPU
        # memory (an engine started with a fixed --num-gpu-blocks).
        self.kv_tokens = kv_tokens

    # -- the routing table -------------------------------------------------------------------

    def _model_route(self, fleet) -> ModelRoute:
        key = (id(fleet), fleet.roles_version)
        if key != self._table_key:
            self.table = build_table(fleet_snapshot(fleet, self.policy))
            self.table["version"] = fleet.roles_version + 1
            self.table["models"][0]["routing"].update(self.routing)
            if self.kv_tokens is not None:
                for entry in self.table["models"][0]["workers"]:
                    entry["capacity"]["kv_tokens"] = int(self.kv_tokens)
            self.model = next(iter(parse(self.table).models.values()))
            self._table_key = key
            self._engine_of = {w.id: w.id.split("/", 1)[1] for w in self.model.workers}
            self._worker_of = {e: w for w, e in self._engine_of.items()}
            bs = self.model.block_size
            for w in self.model.workers:
                # As the gateway sizes it: twice the nominal capacity, in chunks.
                self.approx.set_capacity(w.id, int(2 * w.kv_tokens / bs))
        return self.model

    # -- the router protocol of VirtualFleet -------------------------------------------------

    def __call__(self, req: RoutingRequest, fleet) -> Route | None:
        model = self._model_route(fleet)
        now = fleet.now
        self._clock = fleet
        bs = model.block_size
        hashes = req.block_hashes
        cached = {w: n * bs for w, n in self.approx.match(model.name, hashes, now).items()}
        if self.precise is not None:
            for engine_id, held in self.precise.match_hashes(hashes).items():
                w = self._worker_of.get(engine_id)
                if w is not None:
                    cached[w] = max(cached.get(w, 0), held)
        cached = {w: min(t, req.prompt_tokens) for w, t in cached.items()}
        inflow = None
        if model.cache_balance_band > 0 and model.temperature <= 0:
            inflow = {w.id: self.approx.inflow(w.id, now) for w in model.workers}
        if self.stream and self._reservations:
            self._follow_streams(model, fleet)
        try:
            plan = plan_request(model, req.prompt_tokens, cached, self.loads, self.rng,
                                inflow=inflow, now=now)
        except NoWorkerError:
            return None
        self.decisions[plan.reason] += 1
        if plan.holders:
            self.affinity_holders[plan.holders] += 1
        output, weight = self._answer(model, req, fleet)
        self._reservations[req.request_id] = LoadReservation(
            self.loads, plan, req.prompt_tokens, output, bs, weight, now)
        # Remembered at dispatch (requests sharing the prefix that arrive while this one
        # prefills should follow it), as the gateway does.
        self.approx.record(model.name, hashes, plan.decode, now)
        if plan.prefill:
            self.approx.record(model.name, hashes, plan.prefill, now)
        prefill = self._engine_of[plan.prefill] if plan.prefill else None
        return Route(self._engine_of[plan.decode], prefill)

    def _answer(self, model: ModelRoute, req: RoutingRequest, fleet) -> tuple[int, float | None]:
        """(output tokens the gateway books, the stall weight when learned) for a request."""
        kind, value = self._told
        if kind == "true":
            return req.output_tokens, None
        max_tokens = max(round(value * req.output_tokens), 1) if kind == "scale" else None
        output = max_tokens or int(value) or DEFAULT_OUTPUT_TOKENS
        if not self.learn:
            return output, None
        self._answer_of[req.request_id] = (req.prompt_tokens, req.output_tokens, fleet.now)
        return output, self.answer_lengths.dispatch_weight(
            model.name, req.prompt_tokens, max_tokens, model.ttft_itl_ratio, self.stream)

    def _follow_streams(self, model: ModelRoute, fleet) -> None:
        """What a relay sees of each answer in flight: its tokens so far. Re-book a weight
        when their count crosses a power of two (the learned buckets' edges)."""
        produced = {seq.request_id: seq.num_output for member in fleet.members.values()
                    for seq in member.engine.scheduler.running}
        for request_id, reservation in self._reservations.items():
            tokens = produced.get(request_id)
            answer = self._answer_of.get(request_id)
            if tokens is None or answer is None:
                continue
            # Re-booked when the count crosses a bucket edge or the learned answers have
            # grown by ~1/64 of the memory since (the learner's cache period).
            key = (tokens.bit_length(), self.answer_lengths.epoch)
            if key == self._stream_bucket.get(request_id):
                continue
            self._stream_bucket[request_id] = key
            kind, value = self._told
            max_tokens = max(round(value * answer[1]), 1) if kind == "scale" else None
            weight = self.answer_lengths.weight_after(model.name, answer[0], max_tokens,
                                                      model.ttft_itl_ratio, tokens)
            if weight is not None:
                reservation.reweight(weight)

    def prefill_done(self, request_id: str) -> None:
        reservation = self._reservations.get(request_id)
        if reservation is not None:
            reservation.prefill_done(self._clock.now)

    def finished(self, request_id: str) -> None:
        reservation = self._reservations.pop(request_id, None)
        if reservation is not None:
            reservation.release()
        self._stream_bucket.pop(request_id, None)
        answer = self._answer_of.pop(request_id, None)
        if answer is not None and self.model is not None:
            # As the gateway learns: the usage's length, and the time since dispatch.
            prompt, length, sent = answer
            now = self._clock.now
            self.answer_lengths.observe(self.model.name, prompt, length, now - sent, now)

    def kv_events(self, engine_id: str, events: list[dict], now: float) -> None:
        if self.precise is not None:
            self.precise.apply_hashed(engine_id, events)


def fleet_snapshot(fleet, policy: dict[str, Any]) -> dict[str, Any]:
    """The control plane's snapshot of a virtual fleet (controlplane.routing.builder's
    input): one model, its engines as workers with their new-work role, the nodes' NICs."""
    first = fleet.order[0].fleet_engine.spec
    model = first.model
    nic = fleet.links.nic
    groups: dict[str, int] = {}
    workers = []
    nodes: dict[str, Any] = {}
    for member in fleet.order:
        spec = member.fleet_engine.spec
        hw = spec.hardware
        group = member.nvlink_group
        index = groups.setdefault(group, len(groups)) if group is not None else None
        nic_link = fleet.links.node_nics.get(member.node, nic)
        nodes.setdefault(member.node, {"nics": [{
            "name": "nic0", "line_rate_gbps": nic_link.bandwidth_gbs * 8,
            "rdma": nic_link.kind == "rdma", "fabric": "fabric", "missing": False,
        }]})
        workers.append({
            "name": member.engine_id, "node": member.node,
            "url": f"http://sim.invalid/{member.engine_id}", "metrics_url": "",
            "engine": "sim", "tp_size": spec.tp, "desired_role": member.role_for_new_work,
            "observed_role": member.role, "state": "active", "kv_events_endpoint": "",
            "kv_replay_endpoint": "",
            "gpus": [{"index": i, "memory_bytes": int(hw.memory_gb * GB),
                      "nvlink_group": index, "nvlink_bandwidth_gbs": hw.nvlink_gbs or 0,
                      "pcie_gbs": hw.pcie_width * {3: 1, 4: 2, 5: 4, 6: 8}.get(
                          hw.pcie_generation, 4)} for i in range(spec.tp)],
        })
    rdma = nic.kind == "rdma"
    return {
        "cluster": "virtual",
        "fabrics": {"fabric": {"transport": "infiniband" if rdma else "ethernet", "rdma": rdma,
                               "line_rate_gbps": nic.bandwidth_gbs * 8}},
        "nodes": nodes,
        "models": [{
            "name": model.name, "kv_block_size": first.block_size,
            "kv_bytes_per_token": model.kv_bytes_per_token, "weight_bytes": model.weight_bytes,
            "max_model_len": model.max_model_len, "policy": policy, "workers": workers,
        }],
    }
