"""Named baseline routers for the virtual fleet — round-robin, least-loaded and a
Dynamo-style KV cost — to compare pdplane's router (``gateway.router`` via
``workers_agent.sim.gateway_routing.GatewayRouter``, the fleet's default) against.

Benchmark code only: the product routes with ``gateway.router``. Each baseline is a
``router(request, fleet) -> Route`` as ``VirtualFleet`` expects, and reads engine state
directly (an oracle a real router does not have), which only flatters the baselines.
"""

from __future__ import annotations

from workers_agent.sim.fleet import Route


class BaselineRouter:
    """Choose a decode-capable engine; if it is a pure decode engine and prefill engines
    exist, choose a prefill engine for it too (llm-d's rule: only when the decode engine
    would have to compute at least ``pd_min_uncached_tokens`` itself). Subclasses
    implement :meth:`pick`."""

    name = "baseline"
    pd_min_uncached_tokens: int = 0

    def __call__(self, req, fleet) -> Route | None:
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

    def pick(self, req, candidates, fleet, stage):
        raise NotImplementedError


class RoundRobinRouter(BaselineRouter):
    name = "round-robin"

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def pick(self, req, candidates, fleet, stage):
        index = self._counters.get(stage, 0)
        self._counters[stage] = index + 1
        return candidates[index % len(candidates)]


class LeastLoadedRouter(BaselineRouter):
    """Fewest queued prompt tokens for prefill; fewest running + waiting requests for
    decode (ties: the earlier engine in fleet order)."""

    name = "least-loaded"

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


class DynamoCostRouter(BaselineRouter):
    """Dynamo's KV router cost, per candidate, in blocks:

        prefill_load_scale × max(queued prefill blocks + prompt blocks − overlap_credit ×
        cached prompt blocks, 0) + decode blocks in use

    lowest cost wins, with the engines' true cache contents (Dynamo's precise mode). The
    prefill stage of P/D uses only the prefill term; a pure decode stage ignores the cache
    credit (the KV arrives by transfer anyway)."""

    name = "dynamo-cost"

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


BASELINES = {cls.name: cls for cls in (RoundRobinRouter, LeastLoadedRouter, DynamoCostRouter)}
