"""Issue 5's real-engine tier: a disaggregated request through pdplane's gateway.

The gateway (``python -m gateway``) runs on a routing table that marks engine A prefill and
engine B decode (built by gateway.statictable, the same validation as a pushed table, with
both engines' KV-event endpoints). A streaming completion through it must return exactly
the greedy tokens of one engine alone, and B's /metrics must show the prompt's KV arrived
by NIXL transfer.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from gateway.statictable import static_table
from tests.conftest import ROOT, free_port
from tests.realvllm import engine_probe as probe
from tests.realvllm.conftest import BLOCK_SIZE, MODEL_NAME
from tests.realvllm.test_real_pd_direct import transfer_counters

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(600)]

EXTERNAL = "vllm:prompt_tokens_by_source_total{'source': 'external_kv_transfer'}"
LOCAL = "vllm:prompt_tokens_by_source_total{'source': 'local_compute'}"


@pytest.fixture(scope="module")
def gateway_url(engine_a, engine_b, tmp_path_factory) -> Iterator[str]:
    workdir: Path = tmp_path_factory.mktemp("gateway")
    workers = [
        {
            "id": f"vllm-{engine.name}",
            "url": engine.url,
            "role": role,
            "metrics_url": engine.metrics_url,
            "kv_events_endpoint": engine.kv_events_endpoint,
            "kv_replay_endpoint": engine.kv_replay_endpoint,
        }
        for engine, role in ((engine_a, "prefill"), (engine_b, "decode"))
    ]
    table = static_table(
        MODEL_NAME,
        workers,
        mode="disaggregated",
        block_size=BLOCK_SIZE,
        local_prefill_max_tokens=0,
    )
    table_file = workdir / "table.json"
    table_file.write_text(json.dumps(table))
    port = free_port()
    log = (workdir / "gateway.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
         "--table", str(table_file), "--admin-secret", "realvllm-test-secret"],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited: {(workdir / 'gateway.log').read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"gateway not healthy: {(workdir / 'gateway.log').read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def test_gateway_disaggregated_stream_matches_one_engine_alone(engine_a, engine_b, gateway_url):
    prompt = probe.unique_prompt(150)
    alone = probe.complete(engine_a.url, prompt, max_tokens=24)
    expected = alone["choices"][0]["token_ids"]
    prompt_tokens = alone["usage"]["prompt_tokens"]

    before = transfer_counters(engine_b)
    body = {
        "model": MODEL_NAME,
        "prompt": prompt,
        "max_tokens": 24,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "return_token_ids": True,
    }
    with requests.post(
        f"{gateway_url}/v1/completions", json=body, stream=True, timeout=120
    ) as response:
        assert response.status_code == 200, response.text
        tokens = probe.stream_token_ids(response)
    after = transfer_counters(engine_b)
    delta = {key: after[key] - before[key] for key in after}

    assert tokens == expected, "gateway P/D greedy tokens differ from one engine alone"
    assert delta[EXTERNAL] >= (prompt_tokens // BLOCK_SIZE) * BLOCK_SIZE
    assert delta["vllm:external_prefix_cache_hits_total{}"] == delta[EXTERNAL]
    assert delta[LOCAL] < BLOCK_SIZE
    assert delta["vllm:nixl_bytes_transferred_count{}"] >= 1
    assert delta["vllm:nixl_num_failed_transfers_total{}"] == 0

    gateway = probe.scrape(f"{gateway_url}/metrics")
    sent = {
        (s.labels["worker"], s.labels["stage"]): s.value
        for s in gateway["pdplane_gateway_worker_requests"]
        if s.name.endswith("_total")
    }
    assert sent.get(("vllm-a", "prefill"), 0) >= 1
    assert sent.get(("vllm-b", "decode"), 0) >= 1


def test_gateway_chat_disaggregated_matches_one_engine_alone(engine_a, engine_b, gateway_url):
    messages = [{"role": "user", "content": probe.unique_prompt(120)}]
    body = {
        "model": MODEL_NAME,
        "messages": messages,
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    alone = requests.post(f"{engine_a.url}/v1/chat/completions", json=body, timeout=60).json()
    expected = alone["choices"][0]["token_ids"]
    before = transfer_counters(engine_b)
    with requests.post(
        f"{gateway_url}/v1/chat/completions", json={**body, "stream": True}, stream=True,
        timeout=120,
    ) as response:  # fmt: skip
        assert response.status_code == 200, response.text
        tokens = probe.stream_token_ids(response)
    after = transfer_counters(engine_b)
    assert tokens == expected
    assert after[EXTERNAL] - before[EXTERNAL] >= BLOCK_SIZE


def test_gateway_consumes_real_kv_events(gateway_url):
    gateway = probe.scrape(f"{gateway_url}/metrics")
    batches = {
        s.labels["worker"]: s.value
        for s in gateway.get("pdplane_gateway_kv_events", [])
        if s.name.endswith("_total")
    }
    assert batches.get("vllm-a", 0) > 0, (
        f"gateway saw no KV events from the prefill engine: {batches}"
    )
