"""What a real vLLM 0.32 engine actually exposes, read by an independent client.

These pin the facts pdplane's agent relies on (metric names, cache_config_info, prefix-hit
accounting, the KV-event wire format and the replay protocol) to the real engine, so a
vLLM upgrade that moves them fails here first. The agent's own collectors are checked
against the same engine in test_real_agent_collectors.py.
"""

from __future__ import annotations

import itertools
import time

import pytest
import requests

from tests.realvllm import engine_probe as probe
from tests.realvllm.conftest import BLOCK_SIZE, ENGINE_A_BLOCKS

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]


def full_blocks_hit(prompt_tokens: int) -> int:
    """Tokens a repeated prompt can take from prefix cache: whole blocks, last token computed."""
    return ((prompt_tokens - 1) // BLOCK_SIZE) * BLOCK_SIZE


def test_metric_families_and_cache_config(engine_a):
    probe.complete(engine_a.url, probe.unique_prompt(40), max_tokens=4)
    families = probe.scrape(engine_a.metrics_url)
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries",
        "vllm:prefix_cache_hits",
        "vllm:prompt_tokens",
        "vllm:generation_tokens",
        "vllm:time_to_first_token_seconds",
        "vllm:inter_token_latency_seconds",
        "vllm:cache_config_info",
    ):
        assert name in families, f"{name} missing from real /metrics"
    config = probe.cache_config(families)
    assert config["block_size"] == str(BLOCK_SIZE)
    assert config["num_gpu_blocks"] == str(ENGINE_A_BLOCKS)
    assert config["enable_prefix_caching"] == "True"
    usage = probe.value(families, "vllm:kv_cache_usage_perc")
    assert 0.0 <= usage <= 1.0  # a fraction, not a percent


def test_prefix_hits_are_whole_blocks_of_a_repeated_prompt(engine_a):
    prompt = probe.unique_prompt(150)
    before = probe.scrape(engine_a.metrics_url)
    first = probe.complete(engine_a.url, prompt, max_tokens=2)
    middle = probe.scrape(engine_a.metrics_url)
    probe.complete(engine_a.url, prompt, max_tokens=2)
    after = probe.scrape(engine_a.metrics_url)
    n = first["usage"]["prompt_tokens"]

    def delta(old, new, name):
        return probe.value(new, name) - probe.value(old, name)

    assert delta(before, middle, "vllm:prefix_cache_hits_total") == 0
    assert delta(before, middle, "vllm:prefix_cache_queries_total") == n
    assert delta(middle, after, "vllm:prefix_cache_hits_total") == full_blocks_hit(n)
    assert delta(middle, after, "vllm:prefix_cache_queries_total") == n


def test_kv_usage_counts_blocks_of_a_running_request(engine_a):
    """usage x num_gpu_blocks = blocks held by the request in flight (then back to 0)."""
    # The tiny model decodes 800 tokens in well under a second on a quiet machine, so the
    # scrape can land after the request finished: try again with a fresh request.
    for _ in range(5):
        with probe.request_in_flight(engine_a.url, probe.unique_prompt(100)) as prompt_ids:
            families = probe.scrape(engine_a.metrics_url)
        if probe.value(families, "vllm:num_requests_running") == 1:
            break
    blocks = round(probe.value(families, "vllm:kv_cache_usage_perc") * ENGINE_A_BLOCKS)
    assert probe.value(families, "vllm:num_requests_running") == 1
    # At least the prompt's blocks, at most what prompt + all 800 tokens could fill.
    assert len(prompt_ids) // BLOCK_SIZE <= blocks <= -(-(len(prompt_ids) + 800) // BLOCK_SIZE)
    deadline = time.monotonic() + 10  # closing the stream aborts the request
    while probe.value(probe.scrape(engine_a.metrics_url), "vllm:kv_cache_usage_perc") != 0.0:
        assert time.monotonic() < deadline, "KV usage did not return to 0 after the abort"
        time.sleep(0.2)


def test_block_stored_events_carry_the_prompt_tokens(engine_a):
    tap = probe.KVEventTap(engine_a.kv_events_endpoint, engine_a.kv_replay_endpoint)
    try:
        tap.connect()
        tap.drain(quiet_s=0.3)
        # On a busy machine the batch can come late or the fresh subscription can miss it
        # (ZMQ's slow joiner): try again with a new prompt rather than fail on timing.
        for _ in range(3):
            tap.batches.clear()
            result = probe.complete(engine_a.url, probe.unique_prompt(120), max_tokens=2)
            seqs = tap.drain(quiet_s=1.5)
            if seqs:
                break
    finally:
        tap.close()
    prompt_ids = result["choices"][0]["prompt_token_ids"]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "sequence numbers are +1 per batch"
    stored = [e for s in seqs for e in tap.batches[s] if e["type"] == "BlockStored"]
    assert stored, "no BlockStored for a new prompt"
    assert stored[0]["parent_block_hash"] is None  # the nonce leads: a new chain
    tokens = [t for e in stored for t in e["token_ids"]]
    full = (len(prompt_ids) // BLOCK_SIZE) * BLOCK_SIZE
    assert tokens[:full] == prompt_ids[:full]
    hashes = [h for e in stored for h in e["block_hashes"]]
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in hashes)
    for parent, child in itertools.pairwise(stored):
        assert child["parent_block_hash"] == parent["block_hashes"][-1]


def test_eviction_emits_block_removed_and_events_predict_prefix_hits(engine_a):
    """Overflow the 64-block cache; the event-built block set must predict vLLM's hits."""
    prompts = [probe.unique_prompt(420) for _ in range(6)]  # ~14 blocks each: 6 x 14 > 64
    prompt_ids = {}
    for prompt in prompts:
        result = probe.complete(engine_a.url, prompt, max_tokens=1)
        prompt_ids[prompt] = result["choices"][0]["prompt_token_ids"]
    time.sleep(0.5)  # the publisher thread flushes within ~0.1 s

    tap = probe.KVEventTap(engine_a.kv_events_endpoint, engine_a.kv_replay_endpoint)
    try:
        history = tap.replay(0)  # the whole session so far (buffer holds 10,000 batches)
    finally:
        tap.close()
    state = probe.KVState()
    for _seq, events in history:
        state.apply(events)
    assert state.removed > 0, "no BlockRemoved after overflowing the KV cache"
    assert len(state.live) <= ENGINE_A_BLOCKS

    by_tokens = {tuple(tokens): h for h, tokens in state.live.items()}
    for prompt in (prompts[0], prompts[-1]):  # the oldest (evicted first) and the newest
        ids = prompt_ids[prompt]
        predicted = 0
        while predicted + BLOCK_SIZE <= full_blocks_hit(len(ids)):
            if tuple(ids[predicted : predicted + BLOCK_SIZE]) not in by_tokens:
                break
            predicted += BLOCK_SIZE
        before = probe.scrape(engine_a.metrics_url)
        probe.complete(engine_a.url, prompt, max_tokens=1)
        after = probe.scrape(engine_a.metrics_url)
        hits = probe.value(after, "vllm:prefix_cache_hits_total") - probe.value(
            before, "vllm:prefix_cache_hits_total"
        )
        assert hits == predicted, f"events predicted {predicted} cached tokens, vLLM hit {hits}"


def publish_until_received(engine, tap: probe.KVEventTap, tries: int = 5) -> list[int]:
    """Send new prompts until the tap receives batches (a new SUB can miss the first ones
    while its subscription travels to the publisher, more so on a loaded machine)."""
    for _ in range(tries):
        probe.complete(engine.url, probe.unique_prompt(60), max_tokens=1)
        seqs = tap.drain()
        if seqs:
            return seqs
    raise AssertionError("the subscriber received no KV events")


def test_sequence_gap_is_recovered_from_the_replay_socket(engine_a):
    tap = probe.KVEventTap(engine_a.kv_events_endpoint, engine_a.kv_replay_endpoint)
    try:
        tap.connect()
        last_seen = publish_until_received(engine_a, tap)[-1]

        tap.disconnect()  # a subscriber that is away misses what is published meanwhile
        for _ in range(3):
            probe.complete(engine_a.url, probe.unique_prompt(60), max_tokens=1)
        time.sleep(0.5)
        tap.connect()
        first_new = publish_until_received(engine_a, tap)[0]
        assert first_new > last_seen + 1, "the missed batches must show as a sequence gap"

        replayed = tap.replay(last_seen + 1)
        replayed_seqs = [seq for seq, _ in replayed]
        assert replayed_seqs[: first_new - last_seen - 1] == list(range(last_seen + 1, first_new))
        missed = [e for seq, events in replayed if seq < first_new for e in events]
        assert any(e["type"] == "BlockStored" for e in missed)
        # The replay reproduces live batches byte-for-byte once decoded.
        for seq, events in replayed:
            if seq in tap.batches:
                assert events == tap.batches[seq]
    finally:
        tap.close()


def test_health_and_models(engine_a, engine_b):
    for engine in (engine_a, engine_b):
        assert requests.get(f"{engine.url}/health", timeout=5).status_code == 200
        models = requests.get(f"{engine.url}/v1/models", timeout=5).json()
        assert [m["id"] for m in models["data"]] == ["tiny"]
