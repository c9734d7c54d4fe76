"""The simulated engine model: KV blocks, prefix cache, scheduler, events."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from workers_agent.sim import tokens
from workers_agent.sim.blocks import KVBlockManager, chain_hashes, hash_block
from workers_agent.sim.engine import (
    EngineSpec,
    RequestRejectedError,
    SimEngine,
    SimRequest,
    generated_token,
)
from workers_agent.sim.workload import random_tokens


def make_engine(**overrides) -> SimEngine:
    fields = {"engine_id": "e0", "model": "llama-3.1-8b", "hardware": "H100"}
    fields.update(overrides)
    return SimEngine(EngineSpec(**fields))


def run(engine: SimEngine, now: float = 0.0, limit: int = 100_000):
    """Drive the engine until idle; returns (end time, [(time, output)], [steps])."""
    outputs = []
    steps = []
    for _ in range(limit):
        step = engine.next_step(now)
        if step is None:
            return now, outputs, steps
        now += step.duration
        steps.append(step)
        outputs.extend((now, out) for out in engine.finish_step(step, now))
    raise AssertionError("engine did not go idle")


def ttft_of(outputs, request_id, arrival=0.0):
    return next(t for t, o in outputs if o.request_id == request_id and o.first_token) - arrival


def test_generates_max_tokens_deterministically():
    prompt = random_tokens(1, 300)
    texts = []
    for _ in range(2):
        engine = make_engine()
        engine.submit(SimRequest("r", prompt, 5, 0.0))
        _, outputs, _ = run(engine)
        ids = [i for _, o in outputs for i in o.new_token_ids]
        assert len(ids) == 5
        assert outputs[-1][1].finished and outputs[-1][1].finish_reason == "length"
        assert outputs[0][1].first_token and not outputs[1][1].first_token
        texts.append(tokens.decode(ids))
    assert texts[0] == texts[1]
    assert all(word not in tokens.SPECIAL_TOKENS for word in texts[0].split())
    assert generated_token(7, 0) != generated_token(8, 0)


def test_prefix_cache_hits_rise_for_shared_prefixes():
    engine = make_engine()
    shared = random_tokens(2, 1024)
    now = 0.0
    for index in range(4):
        prompt = shared + random_tokens(100 + index, 256)
        engine.submit(SimRequest(f"r{index}", prompt, 2, now))
        now, outputs, _ = run(engine, now)
    stats = engine.stats()
    # First request misses; the next three hit the 1,024 shared tokens (64 full blocks).
    assert stats.prefix_cache_hits == 3 * 1024
    assert stats.prefix_cache_queries == 4 * 1280
    assert outputs[-1][1].num_cached_tokens == 1024
    cold = make_engine()
    cold.submit(SimRequest("x", random_tokens(9, 1280), 2, 0.0))
    run(cold)
    assert cold.stats().prefix_cache_hits == 0


def test_fully_cached_prompt_still_computes_one_token():
    engine = make_engine()
    prompt = random_tokens(3, 320)  # exactly 20 blocks
    engine.submit(SimRequest("a", prompt, 1, 0.0))
    now, _, _ = run(engine)
    engine.submit(SimRequest("b", prompt, 1, now))
    _, outputs, _ = run(engine, now)
    # vLLM recomputes the last block when the whole prompt is cached.
    assert outputs[0][1].num_cached_tokens == 304


def test_ttft_rises_with_uncached_prompt_tokens():
    ttfts = []
    for length in (512, 2048, 8192):
        engine = make_engine()
        engine.submit(SimRequest("r", random_tokens(length, length), 2, 0.0))
        _, outputs, _ = run(engine)
        ttfts.append(ttft_of(outputs, "r"))
    assert ttfts[0] < ttfts[1] < ttfts[2]
    # The same long prompt with its first 7,680 tokens cached is much faster.
    engine = make_engine()
    prompt = random_tokens(77, 8192)
    engine.submit(SimRequest("warm", prompt[:7680] + random_tokens(5, 16), 1, 0.0))
    now, _, _ = run(engine)
    engine.submit(SimRequest("r", prompt, 2, now))
    _, outputs, _ = run(engine, now)
    assert ttft_of(outputs, "r", now) < ttfts[2] / 4


def test_itl_rises_with_batch():
    def itl(batch: int) -> float:
        engine = make_engine()
        for index in range(batch):
            engine.submit(SimRequest(f"r{index}", random_tokens(index, 2000), 20, 0.0))
        _, outputs, _ = run(engine)
        times = [t for t, o in outputs if o.request_id == "r0"]
        gaps = [b - a for a, b in itertools.pairwise(times[5:])]
        return sum(gaps) / len(gaps)

    small, medium, large = itl(1), itl(16), itl(64)
    assert small < medium < large
    assert large > 1.5 * small


def test_chunked_prefill_respects_token_budget():
    engine = make_engine(max_num_batched_tokens=512)
    engine.submit(SimRequest("long", random_tokens(1, 3000), 3, 0.0))
    engine.submit(SimRequest("other", random_tokens(2, 700), 3, 0.0))
    _, _, steps = run(engine)
    for step in steps:
        assert sum(n for _, n in step.entries) <= 512
    # The 3,000-token prompt takes at least 6 chunks.
    assert sum(1 for s in steps for seq, n in s.entries if seq.request_id == "long" and n > 1) >= 6


def test_kv_usage_and_preemptions_under_memory_pressure():
    engine = make_engine(num_gpu_blocks=100, max_num_seqs=64)  # 1,600 tokens of KV
    for index in range(8):
        engine.submit(SimRequest(f"r{index}", random_tokens(index, 300), 200, 0.0))
    peak_usage = 0.0
    now = 0.0
    finished = set()
    while True:
        step = engine.next_step(now)
        if step is None:
            break
        now += step.duration
        for out in engine.finish_step(step, now):
            if out.finished:
                finished.add(out.request_id)
        peak_usage = max(peak_usage, engine.stats().kv_usage)
    stats = engine.stats()
    assert finished == {f"r{i}" for i in range(8)}
    assert peak_usage > 0.9
    assert stats.num_preemptions > 0
    assert stats.num_used_blocks == 0 and stats.kv_usage == 0.0
    assert stats.generation_tokens == 8 * 200


def test_too_large_request_is_rejected():
    engine = make_engine(num_gpu_blocks=10)
    with pytest.raises(RequestRejectedError):
        engine.submit(SimRequest("big", random_tokens(1, 200), 1, 0.0))
    with pytest.raises(RequestRejectedError):
        engine.submit(SimRequest("empty", [], 1, 0.0))


def test_block_hashes_are_deterministic_and_chained():
    ids = list(range(100, 164))
    hashes = chain_hashes(ids, 16)
    assert len(hashes) == 4
    assert hashes[0] == hash_block(None, ids[:16])
    assert hashes[1] == hash_block(hashes[0], ids[16:32])
    assert all(0 <= h < 2**64 for h in hashes)
    # The same tokens after a different prefix hash differently.
    assert chain_hashes(ids[16:32], 16) != [hashes[1]]
    assert make_engine().block_hashes_for(ids) == hashes
    code = (
        "from workers_agent.sim.blocks import chain_hashes;"
        "print(chain_hashes(list(range(100, 164)), 16))"
    )
    for seed in ("1", "12345"):
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
            env={"PYTHONHASHSEED": seed, "PATH": ""},
        )
        assert out.stdout.strip() == str(hashes), out.stderr


def test_lru_eviction_order():
    kv = KVBlockManager(num_blocks=6, block_size=4)
    a = kv.allocate(3)
    kv.cache_full_blocks(a, [11, 12, 13], 0, 3, None)
    b = kv.allocate(3)
    kv.cache_full_blocks(b, [21, 22, 23], 0, 3, None)
    kv.release(a)  # freed tail first: 13, 12, 11
    kv.release(b)  # then 23, 22, 21
    assert kv.num_free == 6
    # A hit on 11 and 12 takes them off the free queue.
    hit = kv.longest_cached_prefix([11, 12, 99])
    assert hit == a[:2]
    kv.touch(hit)
    fresh = kv.allocate(3)
    assert fresh == [a[2], b[2], b[1]]  # least recently freed first
    assert 13 not in kv.cached and 23 not in kv.cached and 22 not in kv.cached
    assert 21 in kv.cached and 11 in kv.cached
    events = kv.drain_events()
    assert events[-1] == {"type": "BlockRemoved", "block_hashes": [13, 23, 22], "medium": "GPU"}


def test_kv_events_have_vllm_shape():
    engine = make_engine()
    prompt = random_tokens(4, 40)
    engine.submit(SimRequest("r", prompt, 1, 0.0))
    run(engine)
    events = engine.drain_kv_events()
    assert len(events) == 1
    event = events[0]
    assert next(iter(event)) == "type" and event["type"] == "BlockStored"
    assert event["block_hashes"] == chain_hashes(prompt, 16)
    assert event["parent_block_hash"] is None
    assert event["token_ids"] == prompt[:32]
    assert event["block_size"] == 16 and event["medium"] == "GPU"
    assert event["lora_id"] is None and event["lora_name"] is None
    assert engine.drain_kv_events() == []
    assert engine.reset_prefix_cache()
    assert engine.drain_kv_events() == [{"type": "AllBlocksCleared"}]


def test_abort_frees_blocks_and_stats_are_monotonic():
    engine = make_engine()
    engine.submit(SimRequest("a", random_tokens(1, 500), 50, 0.0))
    engine.submit(SimRequest("b", random_tokens(2, 500), 50, 0.0))
    step = engine.next_step(0.0)
    engine.finish_step(step, step.duration)
    before = engine.stats()
    assert before.num_used_blocks > 0
    assert engine.abort("a") and engine.abort("b")
    assert not engine.abort("a")
    after = engine.stats()
    assert after.num_used_blocks == 0 and after.num_running == 0
    assert after.prefix_cache_queries >= before.prefix_cache_queries
    assert after.busy_seconds >= before.busy_seconds
    assert engine.next_step(1.0) is None


def test_hold_for_remote_decode_and_release():
    prefill = make_engine(engine_id="p")
    prompt = random_tokens(5, 1000)
    prefill.submit(SimRequest("r", prompt, 1, 0.0, hold_for_remote_decode=True))
    _, outputs, _ = run(prefill)
    assert len(outputs) == 1 and outputs[0][1].finished and outputs[0][1].held
    assert prefill.stats().num_used_blocks == 63 and prefill.stats().num_held == 1
    assert prefill.release_held("r")
    assert not prefill.release_held("r") and not prefill.release_held("nope")
    assert prefill.stats().num_used_blocks == 0

    decode = make_engine(engine_id="d")
    decode.submit(
        SimRequest("r", prompt, 4, 0.0, kv_from_remote=1000, transfer_seconds=0.05)
    )
    step = decode.next_step(0.0)
    assert step.idle and step.duration == pytest.approx(0.05)
    assert decode.finish_step(step, 0.05) == []
    _, outputs, steps = run(decode, 0.05)
    # Only the last prompt token is computed locally; the rest arrived by transfer.
    assert sum(n for s in steps for _, n in s.entries) == 1 + 3
    first = outputs[0][1]
    assert first.first_token and first.num_external_tokens == 999
    assert outputs[0][0] >= 0.05
    assert decode.stats().prompt_tokens_external == 999


def test_generated_blocks_are_cached_for_the_next_turn():
    engine = make_engine()
    first = random_tokens(11, 100)
    engine.submit(SimRequest("t1", first, 40, 0.0))
    now, outputs, _ = run(engine)
    answer = [i for _, o in outputs for i in o.new_token_ids]
    follow_up = first + answer + random_tokens(12, 50)
    engine.submit(SimRequest("t2", follow_up, 2, now))
    _, outputs, _ = run(engine, now)
    # KV existed for 100 + 39 tokens (the last sampled token is never computed): 8 blocks.
    assert outputs[0][1].num_cached_tokens == 128
    stored = [e for e in engine.drain_kv_events() if e["type"] == "BlockStored"]
    assert chain_hashes(follow_up, 16)[:8] == [h for e in stored for h in e["block_hashes"]][:8]
