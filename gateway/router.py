"""Choosing workers: KV-aware cost for aggregated serving, decode-first for P/D. Pure.

Cost of sending a request to worker *w*, in KV blocks (a block of prefill ≈ a unit of
engine time)::

    uncached(w)  = request_blocks − min(overlap_weight × cached_blocks(w), request_blocks)
    prefill_term = load_weight × (queued_blocks(w) + uncached(w))
    decode_term  = stall_weight(w) × in_flight(w) × max(uncached(w), mean_kv_per_request)
    cost(w)      = prefill_term + decode_term

The prefill term is Dynamo's (the request's own wait for its first token: prefill queued
ahead of it plus its own uncached part). The decode term is the **stall** its prefill
brings to the worker's decodes: an engine runs prefill chunks in the same steps as every
running decode (chunked prefill), so each of the ``in_flight(w)`` requests there loses
about the request's prefill time once — an ITL spike that SLOs count per request. Each
request in flight is charged at least the fleet's mean KV per request in flight
(``mean_kv_per_request``; the request's own blocks when nothing is in flight): without
that floor a short prompt would cost nearly the same anywhere and short prompts would pile
onto a few crowded workers while long ones take the rest, so workers would serve very
unequal numbers of requests. With the floor, a cache hit lowers the request's own wait but
never makes a crowded worker look free (the decode term still counts its requests), and
the term scales with the fleet's own pressure rather than a fixed threshold.

``stall_weight(w)`` (:func:`stall_weight`; the mean over the worker's requests in flight)
converts a stall into the new request's wait as the SLO sees them: a stall raises a
request's mean ITL by the stall ÷ its output tokens, so measured against the ITL target it
weighs ``ttft_itl_ratio`` (TTFT target ÷ ITL target, from the table) ÷ output tokens of a
wait measured against the TTFT target, at most 1. Long answers absorb a stall that sinks a
short one: without it a long prompt was sent behind a deep prefill queue to spare twelve
400-token answers a stall worth ~1 ms of ITL each (Azure conversation at 2×, its TTFT
missed; docs/benchmarks.md). Without the ratio in the table every stall counts in full.

Dynamo's decode term (KV blocks of the worker's running requests + this request's) is
where the request's KV arrives by transfer and stalls nothing (the decode stage of P/D),
and ``cost_of`` without ``stall_floor`` (unit-tested on Dynamo's worked example). The
stall form replaced it for aggregated serving because balancing *blocks* puts many short
requests beside few long ones, and on a chunked-prefill engine each long prefill then
stalls many decodes (bench/router_quality.py: docs/benchmarks.md, issue 18).
``queued_blocks`` = blocks the worker is still prefilling for other requests; the credit
offsets only this prompt's own blocks, never work queued ahead of it: a cached prefix
cannot make an overloaded worker look idle. Lowest cost wins; ties go to fewer in-flight
requests, then to a random pick. With temperature T > 0 the pick samples
softmax(−normalised cost / T).

Prefix affinity comes first (SGLang's and vllm-router's ``cache_aware`` rule), bounded by
load: the request follows the longest cached prefix covering at least ``prefix_min_match``
of the prompt (0.3) among the holders that :class:`AffinityBound` admits — in-flight
requests and queued prefill at most ``affinity_load_factor`` (1.5) × the candidates' mean
(+ one request), KV in use at most ``affinity_kv_limit`` (0.9) of capacity — ties to the
lowest cost. Means scale with the number of workers and with their pressure, where the
older fleet-wide guard (max − min in-flight > ``imbalance_abs`` AND max > ``imbalance_rel``
× min; 64 and 1.5, still applied) almost never fires at 8+ workers under overload. A long
match saves a whole prefill, which the cost above credits once (its prefill term), while
one or two more requests in flight outweigh that and would send the prefix elsewhere, to
be computed again. Short or no matches, and overloaded holders, go by the
cost.

Among workers whose cost is within ``cache_balance_band`` (0.1 = 10 %) of the cheapest,
the one with the fewest requests in flight wins, then the one that took the least new KV
lately (vllm-router's "smallest tree" idea, within a load bound): engines evict
least-recently-used blocks, so even inflow gives every cache the same length of history,
and a prefix reused a while later is likelier to be found.

P/D (modes ``conditional`` and ``disaggregated``), in the spirit of llm-d: pick the decode
worker first; in ``conditional`` mode, if the prompt's part not cached on that worker is at
most ``local_prefill_max_tokens``, it prefills locally (when the worker the cache pointed to
would not prefill locally anyway, the decode worker is picked again by load alone, as in
``disaggregated`` mode: its cache would save only part of a transfer). Otherwise pick a
prefill worker by prefill cost plus a KV-transfer penalty that grows as the link from it to
the chosen decode worker gets slower (NVLink ≪ RDMA < TCP < unknown), so fast pairs are
preferred.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

# WorkerLoad, LoadReservation and stall_weight live in gateway/load.py (the load booked per
# worker) and are imported from here as before.
from .load import LoadReservation, WorkerLoad, stall_weight
from .table import ModelRoute, WorkerEntry

__all__ = ["AffinityBound", "LoadReservation", "NoWorkerError", "RoutePlan", "Scored",
           "WorkerLoad", "blocks_for", "cost_of", "follow_prefix", "pick", "plan_request",
           "stall_weight", "transfer_penalty"]

# KV-transfer penalty: request_blocks × TRANSFER_WEIGHT × clamp(REF_GBPS / link_gbps).
# At the reference speed (400 Gb/s RDMA) a transfer costs a tenth of the prompt's blocks;
# an unknown path is priced as a 10 Gb/s link.
REF_GBPS = 400.0
TRANSFER_WEIGHT = 0.1
UNKNOWN_PATH_GBPS = 10.0


@dataclass(frozen=True)
class Scored:
    worker_id: str
    cost: float
    prefill_term: float
    decode_term: float
    cached_blocks: float


@dataclass
class RoutePlan:
    decode: str  # the worker that produces the answer (the only one in aggregated mode)
    prefill: str | None  # remote prefill worker, or None for local prefill
    reason: str
    cached_tokens: int = 0
    scores: list[Scored] = field(default_factory=list)
    ttft_itl_ratio: float = 0.0  # the model's, for LoadReservation's stall weight
    # For a "kv_prefix" decision: how many admitted workers held the best match (the
    # router took the cheapest of them; the cost model's dispatch reads their shares).
    holders: int = 0


    @property
    def disaggregated(self) -> bool:
        return self.prefill is not None


_NO_LOAD = WorkerLoad()  # read-only stand-in for a worker with nothing in flight


class NoWorkerError(LookupError):
    """No active worker can take this request."""


def blocks_for(tokens: int, block_size: int) -> int:
    return max(math.ceil(tokens / max(block_size, 1)), 0)


def cost_of(
    worker_id: str,
    load: WorkerLoad,
    request_blocks: float,
    cached_blocks: float,
    *,
    overlap_weight: float,
    load_weight: float,
    use_cache: bool = True,
    kv_reuse: bool = False,
    stall_floor: float | None = None,
    stall_weight: float = 1.0,
) -> Scored:
    """Dynamo's cost. With ``kv_reuse`` the decode term counts only the KV blocks the
    request adds: with prefix caching its cached blocks are shared, not copied.

    With ``stall_floor`` (blocks; the gateway passes the mean KV of a request in flight)
    the decode term is instead the *stall* this request's prefill brings to the decodes on
    the worker: ``stall_weight × in_flight × max(uncached blocks, stall_floor)`` (see the
    module doc; ``stall_weight`` is the mean :func:`stall_weight` of those requests)."""
    # The credit offsets this request's own prompt blocks only, never the work queued ahead
    # of it: a cached prefix cannot make an overloaded worker look idle.
    credit = min(overlap_weight * cached_blocks, request_blocks) if use_cache else 0.0
    uncached = request_blocks - credit
    prefill = load_weight * (max(load.prefill_blocks, 0.0) + uncached)
    if stall_floor is not None:
        decode = stall_weight * max(load.in_flight, 0) * max(uncached, stall_floor)
    else:
        added = request_blocks - (min(cached_blocks, request_blocks)
                                  if kv_reuse and use_cache else 0)
        decode = load.decode_blocks + added
    return Scored(worker_id, prefill + decode, prefill, decode, cached_blocks)


def pick(
    scores: Sequence[Scored],
    temperature: float,
    rng: random.Random,
    loads: Mapping[str, WorkerLoad] | None = None,
    inflow: Mapping[str, float] | None = None,
    band: float = 0.0,
) -> Scored:
    """Lowest cost (ties: fewer in flight, then random), or a softmax sample when T > 0.

    With ``band`` > 0, every worker within ``band`` (a fraction) of the lowest cost counts
    as tied: among them the one with the fewest requests in flight wins, then (with
    ``inflow``) the one that took the least new KV lately, then the lowest cost. The KV
    difference inside the band is small, while SLOs are counted per request: on one engine
    every prefill chunk stalls every running decode, so requests, not blocks, are what to
    even out (in bench/router_quality.py this tie order lifted pdplane's goodput in 13 of
    18 cells, docs/benchmarks.md). Spreading new KV evenly keeps the same length of history in every
    engine's LRU cache, so a prefix reused later is still there wherever it went."""
    if not scores:
        raise NoWorkerError("no candidate workers")
    if temperature > 0 and len(scores) > 1:
        costs = [s.cost for s in scores]
        lo, hi = min(costs), max(costs)
        spread = (hi - lo) or 1.0
        logits = [-(c - lo) / spread / temperature for c in costs]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        return rng.choices(list(scores), weights=weights, k=1)[0]
    best = min(s.cost for s in scores)
    tied = [s for s in scores if s.cost <= best + 1e-9]
    if band > 0 and len(scores) > 1 and (inflow is not None or loads):
        near = [s for s in scores if s.cost <= best * (1.0 + band) + 1e-9]
        if loads:
            fewest = min(loads.get(s.worker_id, _NO_LOAD).in_flight for s in near)
            near = [s for s in near if loads.get(s.worker_id, _NO_LOAD).in_flight == fewest]
        if inflow is not None:
            least = min(inflow.get(s.worker_id, 0.0) for s in near)
            near = [s for s in near if inflow.get(s.worker_id, 0.0) <= least + 1e-9]
        low = min(s.cost for s in near)
        tied = [s for s in near if s.cost <= low + 1e-9]
    if len(tied) > 1 and loads:
        fewest = min(loads.get(s.worker_id, _NO_LOAD).in_flight for s in tied)
        tied = [s for s in tied if loads.get(s.worker_id, _NO_LOAD).in_flight == fewest]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


@dataclass(frozen=True)
class AffinityBound:
    """How far prefix affinity may load a worker beyond the candidates' mean.

    A holder is followed only while its in-flight requests are at most ``load_factor`` ×
    the mean (+1), its queued prefill at most ``load_factor`` × the mean (+ this request's
    blocks), and its KV blocks in use at most ``kv_limit`` of its capacity (``capacity``:
    worker id → KV blocks; unknown or 0 = no bound). Means scale with the fleet and with its
    pressure, so under overload a prefix is still followed to a worker as busy as the rest
    but not to one far busier. ``load_factor`` 0 turns the bound off. Queues are read at
    ``now`` (:meth:`WorkerLoad.queued_at`: drained by what each worker has computed since)."""

    load_factor: float = 1.5
    kv_limit: float = 0.9
    capacity: Mapping[str, float] = field(default_factory=dict)
    now: float | None = None

    def admits(self, s: Scored, loads: Mapping[str, WorkerLoad], mean_in_flight: float,
               mean_queue: float, request_blocks: float) -> bool:
        if self.load_factor <= 0:
            return True
        load = loads.get(s.worker_id, _NO_LOAD)
        if load.in_flight > self.load_factor * mean_in_flight + 1:
            return False
        if load.queued_at(self.now) > self.load_factor * mean_queue + request_blocks:
            return False
        cap = self.capacity.get(s.worker_id, 0.0)
        return not (cap > 0 and self.kv_limit > 0 and load.decode_blocks > self.kv_limit * cap)


def follow_prefix(
    scores: Sequence[Scored],
    match_ratio: Mapping[str, float],
    loads: Mapping[str, WorkerLoad],
    *,
    min_match: float,
    imbalance_abs: float,
    imbalance_rel: float,
    bound: AffinityBound | None = None,
    request_blocks: float = 0.0,
) -> Scored | None:
    """The worker holding the longest cached prefix that covers at least ``min_match`` of
    the prompt and that ``bound`` admits (ties: lowest cost), unless in-flight counts are
    imbalanced fleet-wide (max − min > ``imbalance_abs`` AND max > ``imbalance_rel`` × min);
    else None (use the cost)."""
    got = _followed(scores, match_ratio, loads, min_match, imbalance_abs, imbalance_rel,
                    bound, request_blocks)
    return None if got is None else got[0]


def _followed(scores, match_ratio, loads, min_match, imbalance_abs, imbalance_rel, bound,
              request_blocks) -> tuple[Scored, int] | None:
    """:func:`follow_prefix`'s choice and how many admitted holders of the best match it
    was chosen from."""
    if len(scores) < 2:
        return None
    holders = [s for s in scores if match_ratio.get(s.worker_id, 0.0) >= max(min_match, 1e-9)]
    if not holders:
        return None
    in_flight = [loads.get(s.worker_id, _NO_LOAD).in_flight for s in scores]
    hi, lo = max(in_flight), min(in_flight)
    if hi - lo > imbalance_abs and hi > imbalance_rel * lo:
        return None
    if bound is not None:
        mean_in_flight = sum(in_flight) / len(scores)
        mean_queue = sum(loads.get(s.worker_id, _NO_LOAD).queued_at(bound.now)
                         for s in scores) / len(scores)
        holders = [s for s in holders
                   if bound.admits(s, loads, mean_in_flight, mean_queue, request_blocks)]
        if not holders:
            return None
    best = max(match_ratio.get(s.worker_id, 0.0) for s in holders)
    holders = [s for s in holders if match_ratio.get(s.worker_id, 0.0) >= best - 1e-9]
    return min(holders, key=lambda s: s.cost), len(holders)


def transfer_penalty(request_blocks: float, src: WorkerEntry, dst_id: str) -> float:
    path = src.kv_paths.get(dst_id)
    gbps = path.bandwidth_gbps if path and path.bandwidth_gbps > 0 else UNKNOWN_PATH_GBPS
    return request_blocks * TRANSFER_WEIGHT * min(max(REF_GBPS / gbps, 0.01), 40.0)


def _plan(model: ModelRoute, *args, **fields) -> RoutePlan:
    plan = RoutePlan(*args, **fields)
    plan.ttft_itl_ratio = model.ttft_itl_ratio
    return plan


def _score(model: ModelRoute, workers: Sequence[WorkerEntry], loads: Mapping[str, WorkerLoad],
           request_blocks: int, prompt_tokens: int, cached_tokens: Mapping[str, int],
           stall_floor: float | None, fleet_weight: float, use_cache: bool = True
           ) -> list[Scored]:
    """``cost_of`` for each worker. ``stall_floor`` None: the worker does not prefill the
    prompt (its KV arrives by transfer and stalls nothing: Dynamo's decode term)."""
    bs, ow, lw = model.block_size, model.kv_overlap_weight, model.load_weight
    out = []
    for w in workers:
        load = loads.get(w.id, _NO_LOAD)
        out.append(cost_of(
            w.id, load, request_blocks, min(cached_tokens.get(w.id, 0), prompt_tokens) / bs,
            overlap_weight=ow, load_weight=lw, use_cache=use_cache, kv_reuse=True,
            stall_floor=stall_floor, stall_weight=load.mean_stall_weight(fleet_weight)))
    return out


def _choose(model: ModelRoute, scores: list[Scored], active: Sequence[WorkerEntry],
            loads: Mapping[str, WorkerLoad], request_blocks: int, prompt_tokens: int,
            cached_tokens: Mapping[str, int], rng: random.Random,
            inflow: Mapping[str, float] | None, now: float | None) -> tuple[Scored, int]:
    """(chosen, how many holders of the best prefix it was followed among: 0 = not by
    prefix affinity): the prefix rule, else the cost (:func:`pick`)."""
    if len(scores) > 1:  # one candidate: no prefix to follow, pick draws no random number
        ratios = {w: min(t, prompt_tokens) / prompt_tokens
                  for w, t in cached_tokens.items()} if prompt_tokens > 0 else {}
        bs = model.block_size
        bound = AffinityBound(model.affinity_load_factor, model.affinity_kv_limit,
                              {w.id: w.kv_tokens / bs for w in active if w.kv_tokens > 0}, now)
        followed = _followed(scores, ratios, loads, model.prefix_min_match,
                             model.imbalance_abs, model.imbalance_rel, bound, request_blocks)
        if followed is not None:
            return followed
    return pick(scores, model.temperature, rng, loads, inflow, model.cache_balance_band), 0


def _only_candidate(model: ModelRoute, w: WorkerEntry, prompt_tokens: int,
                    cached_tokens: Mapping[str, int], loads: Mapping[str, WorkerLoad],
                    rng: random.Random, inflow: Mapping[str, float] | None) -> RoutePlan:
    """:func:`plan_request` for an aggregated model whose one worker can take the request:
    the same plan (reason, cached tokens, score from the one :func:`cost_of`), without the
    fleet-wide sums over one worker and the choice among one (issue 19: this is every
    request's path on a one-worker model; tests/unit/test_gateway_hot_paths_router.py
    holds the general path as the oracle)."""
    bs = model.block_size
    request_blocks = blocks_for(prompt_tokens, bs)
    load = loads.get(w.id)
    if load is None:
        load, stall_floor, fleet_weight = _NO_LOAD, float(request_blocks), 1.0
    else:  # the general path's fleet sums, over this one worker (0.0 + as they start)
        in_flight, own = 0.0 + load.in_flight, 0.0 + load.own_requests
        stall_floor = ((0.0 + load.decode_blocks) / in_flight if in_flight > 0
                       else float(request_blocks))
        fleet_weight = (0.0 + load.stall_weight_sum) / own if own > 0 else 1.0
    score = cost_of(
        w.id, load, request_blocks, min(cached_tokens.get(w.id, 0), prompt_tokens) / bs,
        overlap_weight=model.kv_overlap_weight, load_weight=model.load_weight,
        kv_reuse=True, stall_floor=stall_floor,
        stall_weight=load.mean_stall_weight(fleet_weight))
    # One candidate: pick would return it (and draw nothing); a NaN cost goes through pick
    # as it does on the general path.
    chosen = score if score.cost == score.cost else pick(
        [score], model.temperature, rng, loads, inflow, model.cache_balance_band)
    return _plan(model, chosen.worker_id, None, "only_candidate",
                 int(chosen.cached_blocks * bs), [score])


def plan_request(
    model: ModelRoute,
    prompt_tokens: int,
    cached_tokens: Mapping[str, int],
    loads: Mapping[str, WorkerLoad],
    rng: random.Random,
    exclude: frozenset[str] | set[str] = frozenset(),
    inflow: Mapping[str, float] | None = None,
    now: float | None = None,
) -> RoutePlan:
    """Decide where one request goes. ``cached_tokens`` maps worker id → tokens of this
    prompt it is believed to hold; ``exclude`` lists workers that already failed it;
    ``inflow`` the new KV each worker took lately (see :func:`pick`); ``now`` the clock the
    loads were booked on (the affinity bound reads queues drained to it, gateway/load.py).

    On every request's path: no closures and nothing built that one candidate does not
    need (issue 19, docs/benchmarks.md)."""
    workers = model.workers
    if len(workers) == 1 and model.mode == "aggregated":
        w = workers[0]
        if w.active and w.can_decode and w.id not in exclude:
            return _only_candidate(model, w, prompt_tokens, cached_tokens, loads, rng,
                                   inflow)
    active = [w for w in model.workers if w.active and w.id not in exclude]
    if not active:
        raise NoWorkerError(f"no active worker for model {model.name}")
    bs = model.block_size
    request_blocks = blocks_for(prompt_tokens, bs)
    # The mean KV a request in flight holds, fleet-wide: the least stall a prefill is
    # charged per request it runs beside (the cost's decode term, module doc).
    in_flight = kv_in_flight = own = weight_sum = 0.0
    for w in active:
        load = loads.get(w.id)
        if load is not None:
            in_flight += load.in_flight
            kv_in_flight += load.decode_blocks
            own += load.own_requests
            weight_sum += load.stall_weight_sum
    stall_floor = kv_in_flight / in_flight if in_flight > 0 else float(request_blocks)
    # How much a stall counts per request in flight (stall_weight): each worker's own mean;
    # the fleet's where this process has none there (only sibling processes' requests).
    fleet_weight = weight_sum / own if own > 0 else 1.0
    context = (loads, request_blocks, prompt_tokens, cached_tokens)

    decoders = [w for w in active if w.can_decode]
    if model.mode == "aggregated" or not decoders:
        pool = decoders or active
        reason = "kv_aware" if decoders else "fallback_prefill_only"
        if len(pool) == 1 and decoders:
            reason = "only_candidate"
        scores = _score(model, pool, *context, stall_floor, fleet_weight)
        chosen, holders = _choose(model, scores, active, *context, rng, inflow, now)
        if holders:
            reason = "kv_prefix"
        return _plan(model, chosen.worker_id, None, reason, int(chosen.cached_blocks * bs),
                     scores, holders=holders)

    # P/D: decode first. In conditional mode the decode worker may prefill locally, so its
    # cached prefix counts; in disaggregated mode the decode stage ignores cache credit.
    conditional = model.mode == "conditional"
    decode_scores = _score(model, decoders, *context, stall_floor if conditional else None,
                           fleet_weight, use_cache=conditional)
    if conditional:
        decode, _ = _choose(model, decode_scores, active, *context, rng, inflow, now)
        if prompt_tokens - min(cached_tokens.get(decode.worker_id, 0), prompt_tokens) > (
            model.local_prefill_max_tokens
        ):
            # It will be prefilled remotely anyway: the decode worker's cache would save
            # only part of a transfer, and following it piles long decodes onto the
            # prefix's holder. Pick the decode worker as in disaggregated mode.
            decode_scores = _score(model, decoders, *context, None, fleet_weight,
                                   use_cache=False)
            decode = pick(decode_scores, model.temperature, rng, loads)
    else:
        decode = pick(decode_scores, model.temperature, rng, loads)
    decode_cached = min(cached_tokens.get(decode.worker_id, 0), prompt_tokens)
    uncached = prompt_tokens - decode_cached
    if conditional and uncached <= model.local_prefill_max_tokens:
        return _plan(model, decode.worker_id, None, "pd_local_prefill", decode_cached,
                     decode_scores)
    remote = [w for w in active
              if (w.role == "prefill" or w.role == "both") and w.id != decode.worker_id]
    if not remote:
        return _plan(model, decode.worker_id, None, "pd_no_prefill_worker", decode_cached,
                     decode_scores)
    prefill_scores = []
    for w in remote:
        base = cost_of(
            w.id, loads.get(w.id, _NO_LOAD), request_blocks,
            min(cached_tokens.get(w.id, 0), prompt_tokens) / bs,
            overlap_weight=model.kv_overlap_weight, load_weight=model.load_weight,
        )
        penalty = transfer_penalty(request_blocks, w, decode.worker_id)
        # A prefill worker's own decode load barely matters (it emits one token).
        cost = base.prefill_term + penalty
        prefill_scores.append(Scored(w.id, cost, base.prefill_term, penalty, base.cached_blocks))
    prefill = pick(prefill_scores, model.temperature, rng, loads)
    return _plan(model, decode.worker_id, prefill.worker_id, "pd_remote_prefill",
                 int(prefill.cached_blocks * bs), decode_scores + prefill_scores)
