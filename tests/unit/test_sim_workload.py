"""Workload loaders, prompt factory and the local tokeniser."""

from __future__ import annotations

import pytest

from workers_agent.sim import tokens
from workers_agent.sim.blocks import chain_hashes
from workers_agent.sim.workload import (
    PromptFactory,
    WorkloadError,
    WorkloadRequest,
    load_azure,
    load_mooncake,
    load_trace,
    scenario_workload,
    synthetic,
)


def test_encode_decode_round_trip():
    ids = list(range(tokens.VOCAB_SIZE))
    assert tokens.encode(tokens.decode(ids)) == ids
    assert tokens.encode("the cache") == tokens.encode("the   cache\n")
    assert tokens.encode("xyzzy-unknown") == tokens.encode("xyzzy-unknown")
    assert 0 <= tokens.encode("xyzzy-unknown")[0] < tokens.VOCAB_SIZE
    text = tokens.apply_chat_template([{"role": "user", "content": "hi there"}])
    assert text.startswith("<|begin_of_text|>") and text.endswith("<|end_header_id|>")
    parts = tokens.apply_chat_template(
        [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], False
    )
    assert "hi" in parts.split()


def test_mooncake_blocks_share_prefixes(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(
        '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [1, 2, 3]}\n'
        '{"timestamp": 500, "input_length": 700, "output_length": 0, "hash_ids": [1, 9]}\n'
    )
    workload = load_mooncake(path, speedup=2.0)
    a, b = workload.requests
    assert (a.arrival, b.arrival) == (0.0, 0.25)
    assert b.output_length == 1  # at least one token
    ids_a = workload.prompts.token_ids(a)
    ids_b = workload.prompts.token_ids(b)
    assert len(ids_a) == 1100 and len(ids_b) == 700
    assert ids_a[:512] == ids_b[:512] and ids_a[512:700] != ids_b[512:700]
    for req, ids in ((a, ids_a), (b, ids_b)):
        assert workload.prompts.block_hashes(req, 16) == chain_hashes(ids, 16)
        assert workload.prompts.block_hashes(req, 48) == chain_hashes(ids, 48)
    assert tokens.encode(tokens.decode(ids_a)) == ids_a
    path.write_text('{"timestamp": "x"}\n')
    with pytest.raises(WorkloadError):
        load_mooncake(path)


def test_synthetic_scenario_is_seeded_with_shared_prefix():
    scenario = {"isl": 1000, "osl": 20, "shared_prefix_fraction": 0.3, "rate_rps": 2.0}
    one = synthetic(scenario, 200, seed=3)
    two = synthetic(scenario, 200, seed=3)
    assert [r.arrival for r in one] == [r.arrival for r in two]
    assert 60 < one.duration < 150  # Poisson at 2/s
    a, b = one.requests[:2]
    ids_a, ids_b = one.prompts.token_ids(a), one.prompts.token_ids(b)
    assert ids_a[:300] == ids_b[:300] and ids_a[300:] != ids_b[300:]
    assert one.prompts.block_hashes(a, 16) == chain_hashes(ids_a, 16)
    fast = synthetic(scenario, 200, seed=3, speedup=4)
    assert fast.requests[-1].arrival == pytest.approx(one.requests[-1].arrival / 4)
    with pytest.raises(WorkloadError):
        synthetic({"isl": 0, "osl": 1}, 5)


def test_fresh_prompts_differ():
    factory = PromptFactory()
    a = WorkloadRequest("a", 0.0, 50, 1, seed=1)
    b = WorkloadRequest("b", 0.0, 50, 1, seed=2)
    assert factory.token_ids(a) != factory.token_ids(b)
    assert len(factory.token_ids(a)) == 50


def test_real_traces_parse(shared_dir):
    traces = shared_dir / "data" / "traces"
    mooncake = load_trace(traces / "mooncake_synthetic.jsonl")
    assert len(mooncake) == 3993
    mean_input = sum(r.input_length for r in mooncake) / len(mooncake)
    assert 15_000 < mean_input < 15_700
    assert mooncake.duration == pytest.approx(1022.025)
    for path in ("azure2023_code.csv", "azure2023_conv.csv"):
        azure = load_azure(traces / path, limit=500)
        assert len(azure) == 500
        assert azure.requests[0].arrival == 0.0
        assert all(r.input_length > 0 and r.output_length > 0 for r in azure)
        assert azure.requests[-1].arrival > 0
    rag = scenario_workload(shared_dir / "data" / "scenarios.json", "rag-4k", 20, rate_rps=1.0)
    assert len(rag) == 20 and rag.requests[0].input_length == 4000
    with pytest.raises(WorkloadError):
        scenario_workload(shared_dir / "data" / "scenarios.json", "nope", 1)
