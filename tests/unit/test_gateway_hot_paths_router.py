"""Issue 19's cheaper hot paths decide exactly as the code they replaced (bit for bit:
floats compared by ``repr``, dict orders included). Each ``old_*`` below is the function as
it was before (router, prefix index and answer lengths at b961afd), kept only as the oracle.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Mapping

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.router import (
    _NO_LOAD,
    NoWorkerError,
    RoutePlan,
    Scored,
    WorkerLoad,
    _choose,
    _plan,
    _score,
    blocks_for,
    cost_of,
    pick,
    plan_request,
    transfer_penalty,
)
from gateway.statictable import static_table
from gateway.table import ModelRoute, parse

# --- plan_request on one worker ------------------------------------------------------------

def old_plan_request(
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
        chosen, followed = _choose(model, scores, active, *context, rng, inflow, now)
        if followed:
            reason = "kv_prefix"
        return _plan(model, chosen.worker_id, None, reason,
                     int(chosen.cached_blocks * bs), scores)

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


num_st = st.integers(-5, 3000).map(float) | st.floats(-1, 3000, allow_nan=False) | \
    st.sampled_from([0.0, -0.0, 1e-12])
load_st = st.builds(WorkerLoad, num_st, num_st, st.integers(-2, 40), st.integers(-1, 6),
                    st.floats(0, 3, allow_nan=False) | st.sampled_from([0.0, -0.0]))


@settings(max_examples=600, deadline=None)
@given(role=st.sampled_from(["both", "prefill", "decode"]),
       state=st.sampled_from(["active", "active", "draining"]),
       mode=st.sampled_from([None, "aggregated", "conditional"]),
       kv_tokens=st.sampled_from([0, 2000]), block_size=st.sampled_from([1, 16, 64]),
       load=st.none() | load_st, cached=st.none() | st.integers(-5, 5000),
       excluded=st.booleans(), prompt_tokens=st.integers(-3, 5000),
       band=st.sampled_from([0.0, 0.1]), temperature=st.sampled_from([0.0, 0.5]),
       overlap=st.sampled_from([1.0, 0.5, 2.0]), load_weight=st.sampled_from([1.0, 0.3]),
       ratio=st.sampled_from([0.0, 20.0]), seed=st.integers(0, 2**16),
       with_inflow=st.booleans())
def test_plan_request_one_worker_as_before(role, state, mode, kv_tokens, block_size, load,
                                           cached, excluded, prompt_tokens, band, temperature,
                                           overlap, load_weight, ratio, seed, with_inflow):
    table = static_table(
        "m", [{"id": "w0", "url": "http://w0:8000", "role": role, "state": state,
               "kv_tokens": kv_tokens}], mode=mode, block_size=block_size,
        routing={"cache_balance_band": band, "temperature": temperature,
                 "kv_overlap_weight": overlap, "load_weight": load_weight,
                 "ttft_itl_ratio": ratio})
    model = parse(table).models["m"]
    loads = defaultdict(WorkerLoad)
    if load is not None:
        loads["w0"] = load
    cached_tokens = {} if cached is None else {"w0": cached}
    exclude = {"w0"} if excluded else frozenset()
    inflow = {"w0": 1.0} if with_inflow else None
    rng_new, rng_old = random.Random(seed), random.Random(seed)
    outcomes = []
    for plan_fn, rng in ((plan_request, rng_new), (old_plan_request, rng_old)):
        try:
            plan = plan_fn(model, prompt_tokens, cached_tokens, loads, rng, exclude, inflow,
                           5.0)
            outcomes.append(repr((plan.decode, plan.prefill, plan.reason, plan.cached_tokens,
                                  plan.scores, plan.ttft_itl_ratio)))
        except NoWorkerError as error:
            outcomes.append(repr(error))
    assert outcomes[0] == outcomes[1]
    assert rng_new.random() == rng_old.random()
    assert set(loads) == ({"w0"} if load is not None else set())
