"""Why did this request go there? The deciding rule of a routing plan, the response header
that names it, the avoidable prefill, and a sampled log of decisions. Pure, no I/O.

Rules (``X-Pdplane-Route: rule=…``):

- ``affinity``: followed the worker holding the longest cached prefix (router ``kv_prefix``).
- ``cost``: the lowest routing cost (``kv_aware``, ``only_candidate``, remote P/D prefill).
- ``balance``: a near-tie on cost went to the worker that took the least new KV lately
  (the router's ``cache_balance_band``): the chosen worker is not the cheapest one.
- ``local_prefill``: P/D, the uncached part was small enough to prefill where it decodes.
- ``fallback``: no regular choice was possible (a retry after a failed worker, no prefill
  worker, only prefill-role workers left).

*Avoidable prefill*: tokens the chosen prefill worker computes although another worker that
could have done that stage was believed to hold a longer prefix of the prompt.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .router import RoutePlan
from .table import ModelRoute

RULES = ("affinity", "cost", "balance", "local_prefill", "fallback")
ROUTE_HEADER = "X-Pdplane-Route"
FALLBACK_REASONS = ("fallback_prefill_only", "pd_no_prefill_worker")


def rule_of(plan: RoutePlan, retried: bool = False, temperature: float = 0.0) -> str:
    reason = plan.reason
    if retried or reason in FALLBACK_REASONS or reason.startswith("retry_"):
        return "fallback"
    if reason == "kv_prefix":
        return "affinity"
    if reason == "pd_local_prefill":
        return "local_prefill"
    if reason == "kv_aware" and plan.scores and temperature <= 0:
        chosen = next((s for s in plan.scores if s.worker_id == plan.decode), None)
        cheapest = min(s.cost for s in plan.scores)
        if chosen is not None and chosen.cost > cheapest + 1e-9:
            return "balance"
    return "cost"


def prefill_worker(plan: RoutePlan) -> str:
    return plan.prefill or plan.decode


def avoidable_prefill(plan: RoutePlan, model: ModelRoute, cached: Mapping[str, int],
                      prompt_tokens: int) -> tuple[int, str | None]:
    """(tokens, worker): how much more of the prompt the best other eligible worker held
    than the one that prefills it (0, None when none held more)."""
    at = prefill_worker(plan)
    if not cached or (len(cached) == 1 and at in cached):
        return 0, None  # nobody else is believed to hold any of it
    have = min(cached.get(at, 0), prompt_tokens)
    remote = plan.prefill is not None
    best, best_worker = have, None
    for worker_id, tokens in cached.items():
        if tokens <= best or worker_id == at:
            continue
        w = model.worker(worker_id)
        if w is None or not w.active or not (w.can_prefill if remote else w.can_decode):
            continue
        best, best_worker = min(tokens, prompt_tokens), worker_id
    return max(best - have, 0), best_worker


def route_header(rule: str, plan: RoutePlan) -> str:
    value = f"rule={rule}; worker={plan.decode}"
    if plan.prefill:
        value += f"; prefill={plan.prefill}"
    return f"{value}; cached={plan.cached_tokens}; reason={plan.reason}"


@dataclass
class DecisionLog:
    """The last ``size`` sampled decisions (a ring buffer). Sampling keeps the request path
    free of allocations for the ones not kept; fallbacks and avoidable prefills are always
    kept, being the ones an operator asks about."""

    sample_rate: float = 0.05
    size: int = 1000
    seed: int | None = None

    def __post_init__(self) -> None:
        self.entries: deque[dict[str, Any]] = deque(maxlen=self.size)
        self._rng = random.Random(self.seed)
        self.seen = 0

    def wants(self, rule: str, avoidable: int) -> bool:
        self.seen += 1
        return rule == "fallback" or avoidable > 0 or self._rng.random() < self.sample_rate

    def add(self, *, request_id: str, model: str, rule: str, plan: RoutePlan,
            prompt_tokens: int, avoidable: int, avoidable_on: str | None,
            top: int = 3) -> None:
        scores = sorted(plan.scores, key=lambda s: s.cost)[:top]
        self.entries.append({
            "ts": time.time(), "request_id": request_id, "model": model, "rule": rule,
            "reason": plan.reason, "decode": plan.decode, "prefill": plan.prefill,
            "prompt_tokens": prompt_tokens, "cached_tokens": plan.cached_tokens,
            # Followed by affinity: how many admitted holders of the prefix it chose among.
            "prefix_holders": plan.holders,
            "avoidable_prefill_tokens": avoidable, "longer_prefix_on": avoidable_on,
            "candidates": [{"worker": s.worker_id, "cost": round(s.cost, 3),
                            "prefill_term": round(s.prefill_term, 3),
                            "decode_term": round(s.decode_term, 3),
                            "cached_blocks": round(s.cached_blocks, 2)} for s in scores],
        })

    def recent(self, limit: int = 100) -> list[dict[str, Any]]:
        return list(self.entries)[-limit:][::-1]
