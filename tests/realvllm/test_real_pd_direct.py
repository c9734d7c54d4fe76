"""vLLM's prefill->decode protocol between two real engines (NixlConnector, UCX over TCP).

A minimal proxy, written from ENGINES.md (the protocol the gateway implements): prefill on
engine A with max_tokens=1 and do_remote_decode, hand the returned kv_transfer_params to
engine B, stream the answer from B. The tokens must equal what A produces alone (greedy),
and B's /metrics must show the prompt arrived by KV transfer, not by recomputation.
"""

from __future__ import annotations

import time
import uuid

import pytest
import requests

from tests.realvllm import engine_probe as probe
from tests.realvllm.conftest import BLOCK_SIZE

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]

REMOTE_DECODE = {
    "do_remote_decode": True,
    "do_remote_prefill": False,
    "remote_engine_id": None,
    "remote_block_ids": None,
    "remote_host": None,
    "remote_port": None,
}
TRANSFER_COUNTERS = (
    ("vllm:external_prefix_cache_hits_total", {}),
    ("vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"}),
    ("vllm:prompt_tokens_by_source_total", {"source": "local_compute"}),
    ("vllm:nixl_bytes_transferred_count", {}),
    ("vllm:nixl_bytes_transferred_sum", {}),
    ("vllm:nixl_num_failed_transfers_total", {}),
)


def transfer_counters(engine) -> dict[str, float]:
    families = probe.scrape(engine.metrics_url)
    return {
        name + str(labels): probe.value(families, name, **labels)
        for name, labels in TRANSFER_COUNTERS
    }


EXTERNAL_KEY = "vllm:prompt_tokens_by_source_total{'source': 'external_kv_transfer'}"


def transfer_counters_after(engine, before: dict[str, float], timeout: float = 15.0):
    """The counters once they show a transfer since ``before`` (or after ``timeout``).

    vLLM updates them when it logs the finished request, which can come a moment after the
    stream's last byte; reading at once races it on a busy machine."""
    deadline = time.monotonic() + timeout
    while True:
        after = transfer_counters(engine)
        if after[EXTERNAL_KEY] > before[EXTERNAL_KEY] or time.monotonic() > deadline:
            return after
        time.sleep(0.2)


def disaggregated_stream(prefill, decode, body: dict) -> tuple[list[int], dict]:
    """The proxy sequence: returns (decoded token ids, the prefill's kv_transfer_params)."""
    request_id = str(uuid.uuid4())
    headers = {"X-Request-Id": request_id}
    prefill_body = {
        **{k: v for k, v in body.items() if k not in ("stream", "stream_options", "min_tokens")},
        "max_tokens": 1,
        "max_completion_tokens": 1,
        "stream": False,
        "kv_transfer_params": REMOTE_DECODE,
    }
    response = requests.post(
        f"{prefill.url}/v1/completions", json=prefill_body, headers=headers, timeout=60
    )
    response.raise_for_status()
    params = response.json()["kv_transfer_params"]
    assert params and params.get("do_remote_prefill") is True, params

    decode_body = {**body, "stream": True, "kv_transfer_params": params}
    with requests.post(
        f"{decode.url}/v1/completions",
        json=decode_body,
        headers=headers,
        stream=True,
        timeout=60,
    ) as stream:
        stream.raise_for_status()
        return probe.stream_token_ids(stream), params


def test_disaggregated_stream_matches_one_engine_alone(engine_a, engine_b, nixl_transfer_capable):
    prompt = probe.unique_prompt(150)
    body = {
        "model": "tiny",
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    alone = probe.complete(engine_a.url, prompt, max_tokens=24)
    expected = alone["choices"][0]["token_ids"]
    prompt_tokens = alone["usage"]["prompt_tokens"]

    before = transfer_counters(engine_b)
    tokens, params = disaggregated_stream(engine_a, engine_b, body)
    after = transfer_counters_after(engine_b, before)
    delta = {key: after[key] - before[key] for key in after}

    assert tokens == expected, "P/D greedy tokens differ from one engine alone"
    assert params["remote_num_tokens"] == prompt_tokens
    assert params["remote_block_ids"], params
    # The decode engine got the prompt's KV by transfer, not by computing it.
    external = delta["vllm:prompt_tokens_by_source_total{'source': 'external_kv_transfer'}"]
    assert external >= (prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert delta["vllm:external_prefix_cache_hits_total{}"] == external
    assert delta["vllm:prompt_tokens_by_source_total{'source': 'local_compute'}"] < BLOCK_SIZE
    assert delta["vllm:nixl_bytes_transferred_count{}"] >= 1
    assert delta["vllm:nixl_bytes_transferred_sum{}"] > 0
    assert delta["vllm:nixl_num_failed_transfers_total{}"] == 0
