"""plan_request without per-call closures (issue 19) decides exactly as the form it
replaced: same workers, reason, cached tokens, scores, and the same random numbers drawn.

The reference below is the earlier ``plan_request`` (router at 0a4d96f), kept here only as
the test's oracle; it builds its helpers per call and the affinity bound even for one
candidate, which the product code no longer does."""

import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.router import (
    AffinityBound,
    NoWorkerError,
    Scored,
    WorkerLoad,
    _plan,
    blocks_for,
    cost_of,
    follow_prefix,
    pick,
    plan_request,
    transfer_penalty,
)
from gateway.statictable import static_table
from gateway.table import parse


def reference_plan(model, prompt_tokens, cached_tokens, loads, rng, exclude=frozenset(),
                   inflow=None):
    active = [w for w in model.workers if w.active and w.id not in exclude]
    if not active:
        raise NoWorkerError(model.name)
    bs = model.block_size
    request_blocks = blocks_for(prompt_tokens, bs)

    def cached_blocks(w):
        return min(cached_tokens.get(w.id, 0), prompt_tokens) / bs

    ratios = {w: min(t, prompt_tokens) / prompt_tokens
              for w, t in cached_tokens.items()} if prompt_tokens > 0 else {}
    bound = AffinityBound(model.affinity_load_factor, model.affinity_kv_limit,
                          {w.id: w.kv_tokens / bs for w in active if w.kv_tokens > 0})

    def choose(scores):
        followed = follow_prefix(scores, ratios, loads, min_match=model.prefix_min_match,
                                 imbalance_abs=model.imbalance_abs,
                                 imbalance_rel=model.imbalance_rel, bound=bound,
                                 request_blocks=request_blocks)
        if followed is not None:
            return followed, True
        return pick(scores, model.temperature, rng, loads, inflow,
                    model.cache_balance_band), False

    in_flight = kv_in_flight = own = weight_sum = 0.0
    for w in active:
        load = loads.get(w.id)
        if load is not None:
            in_flight += load.in_flight
            kv_in_flight += load.decode_blocks
            own += load.own_requests
            weight_sum += load.stall_weight_sum
    stall_floor = kv_in_flight / in_flight if in_flight > 0 else float(request_blocks)
    fleet_weight = weight_sum / own if own > 0 else 1.0

    def score(workers, use_cache=True, prefills_here=True):
        floor = stall_floor if prefills_here else None
        out = []
        for w in workers:
            load = loads.get(w.id, WorkerLoad())
            out.append(cost_of(w.id, load, request_blocks, cached_blocks(w),
                               overlap_weight=model.kv_overlap_weight,
                               load_weight=model.load_weight, use_cache=use_cache,
                               kv_reuse=True, stall_floor=floor,
                               stall_weight=load.mean_stall_weight(fleet_weight)))
        return out

    decoders = [w for w in active if w.can_decode]
    prefillers = [w for w in active if w.role == "prefill" or w.role == "both"]
    if model.mode == "aggregated" or not decoders:
        pool = decoders or active
        reason = "kv_aware" if decoders else "fallback_prefill_only"
        if len(pool) == 1 and decoders:
            reason = "only_candidate"
        scores = score(pool)
        chosen, followed = choose(scores)
        if followed:
            reason = "kv_prefix"
        return _plan(model, chosen.worker_id, None, reason, int(chosen.cached_blocks * bs),
                     scores)
    conditional = model.mode == "conditional"
    decode_scores = score(decoders, use_cache=conditional, prefills_here=conditional)
    if conditional:
        decode, _ = choose(decode_scores)
        if prompt_tokens - min(cached_tokens.get(decode.worker_id, 0), prompt_tokens) > (
                model.local_prefill_max_tokens):
            decode_scores = score(decoders, use_cache=False, prefills_here=False)
            decode = pick(decode_scores, model.temperature, rng, loads)
    else:
        decode = pick(decode_scores, model.temperature, rng, loads)
    decode_cached = min(cached_tokens.get(decode.worker_id, 0), prompt_tokens)
    if conditional and prompt_tokens - decode_cached <= model.local_prefill_max_tokens:
        return _plan(model, decode.worker_id, None, "pd_local_prefill", decode_cached,
                     decode_scores)
    remote = [w for w in prefillers if w.id != decode.worker_id]
    if not remote:
        return _plan(model, decode.worker_id, None, "pd_no_prefill_worker", decode_cached,
                     decode_scores)
    prefill_scores = []
    for w in remote:
        base = cost_of(w.id, loads.get(w.id, WorkerLoad()), request_blocks, cached_blocks(w),
                       overlap_weight=model.kv_overlap_weight, load_weight=model.load_weight)
        penalty = transfer_penalty(request_blocks, w, decode.worker_id)
        prefill_scores.append(Scored(w.id, base.prefill_term + penalty, base.prefill_term,
                                     penalty, base.cached_blocks))
    prefill = pick(prefill_scores, model.temperature, rng, loads)
    return _plan(model, decode.worker_id, prefill.worker_id, "pd_remote_prefill",
                 int(prefill.cached_blocks * bs),
                 decode_scores + prefill_scores)


load_st = st.builds(WorkerLoad, st.integers(0, 3000).map(float), st.integers(0, 3000).map(float),
                    st.integers(0, 40), st.integers(0, 6),
                    st.floats(0, 3, allow_nan=False))
worker_st = st.fixed_dictionaries({
    "role": st.sampled_from(["both", "both", "prefill", "decode"]),
    "state": st.sampled_from(["active", "active", "active", "draining"]),
    "kv_tokens": st.sampled_from([0, 0, 2000, 50_000]),
    "load": st.none() | load_st,
    "cached": st.none() | st.integers(0, 4000),
    "excluded": st.booleans(),
    "inflow": st.integers(0, 6),
})


@settings(max_examples=400, deadline=None)
@given(workers=st.lists(worker_st, min_size=1, max_size=6),
       mode=st.sampled_from([None, "aggregated", "conditional", "disaggregated"]),
       prompt_tokens=st.integers(0, 3000), band=st.sampled_from([0.0, 0.1]),
       temperature=st.sampled_from([0.0, 0.0, 0.5]), load_factor=st.sampled_from([0.0, 1.5]),
       threshold=st.sampled_from([0, 256, 512]), seed=st.integers(0, 2**16),
       with_inflow=st.booleans())
def test_plan_request_decides_as_the_reference(workers, mode, prompt_tokens, band,
                                               temperature, load_factor, threshold, seed,
                                               with_inflow):
    table = static_table(
        "m", [{"id": f"w{i}", "url": f"http://w{i}:8000", "role": w["role"],
               "state": w["state"], "kv_tokens": w["kv_tokens"]} for i, w in enumerate(workers)],
        mode=mode, local_prefill_max_tokens=threshold,
        routing={"cache_balance_band": band, "temperature": temperature,
                 "affinity_load_factor": load_factor})
    model = parse(table).models["m"]
    loads = defaultdict(WorkerLoad)
    for i, w in enumerate(workers):
        if w["load"] is not None:
            loads[f"w{i}"] = w["load"]
    cached = {f"w{i}": w["cached"] for i, w in enumerate(workers) if w["cached"] is not None}
    exclude = {f"w{i}" for i, w in enumerate(workers) if w["excluded"]}
    inflow = {f"w{i}": float(w["inflow"]) for i, w in enumerate(workers)} if with_inflow \
        else None
    before = set(loads)
    rng_new, rng_ref = random.Random(seed), random.Random(seed)
    try:
        expected = reference_plan(model, prompt_tokens, cached, loads, rng_ref, exclude, inflow)
    except NoWorkerError:
        expected = None
    try:
        got = plan_request(model, prompt_tokens, cached, loads, rng_new, exclude, inflow)
    except NoWorkerError:
        got = None
    assert (got is None) == (expected is None)
    if got is not None:
        assert (got.decode, got.prefill, got.reason, got.cached_tokens, got.scores,
                got.ttft_itl_ratio) == (expected.decode, expected.prefill, expected.reason,
                                        expected.cached_tokens, expected.scores,
                                        expected.ttft_itl_ratio)
    assert rng_new.random() == rng_ref.random()  # the same random numbers were drawn
    assert set(loads) == before  # routing reads the loads, adds no worker to them
