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
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from gateway.statictable import static_table
from tests.conftest import ROOT, START_S, free_port, stop_process
from tests.realvllm import engine_probe as probe
from tests.realvllm.conftest import BLOCK_SIZE, MODEL_NAME
from tests.realvllm.test_real_pd_direct import transfer_counters, transfer_counters_after

pytestmark = [pytest.mark.realvllm, pytest.mark.timeout(900)]

EXTERNAL = "vllm:prompt_tokens_by_source_total{'source': 'external_kv_transfer'}"
LOCAL = "vllm:prompt_tokens_by_source_total{'source': 'local_compute'}"
ADMIN_SECRET = "realvllm-test-secret"


def _table_file(workdir: Path, engines_roles, mode: str) -> Path:
    workers = [
        {
            "id": f"vllm-{engine.name}",
            "url": engine.url,
            "role": role,
            "metrics_url": engine.metrics_url,
            "kv_events_endpoint": engine.kv_events_endpoint,
            "kv_replay_endpoint": engine.kv_replay_endpoint,
        }
        for engine, role in engines_roles
    ]
    table = static_table(
        MODEL_NAME, workers, mode=mode, block_size=BLOCK_SIZE, local_prefill_max_tokens=0
    )
    path = workdir / f"table-{mode}.json"
    path.write_text(json.dumps(table))
    return path


@contextmanager
def _gateway(table_file: Path, workdir: Path, *extra: str) -> Iterator[str]:
    """``python -m gateway`` on a table file; stopped (terminate, then kill) on exit."""
    port = free_port()
    log_path = workdir / f"gateway-{port}.log"
    log = log_path.open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "gateway", "--host", "127.0.0.1", "--port", str(port),
         "--table", str(table_file), "--admin-secret", ADMIN_SECRET, *extra],
        cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_S  # a start beside two engines
        while True:
            if proc.poll() is not None:
                pytest.fail(f"gateway exited: {log_path.read_text()[-3000:]}")
            try:
                if requests.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"gateway not healthy: {log_path.read_text()[-3000:]}")
            time.sleep(0.2)
        yield url
    finally:
        stop_process(proc)


@pytest.fixture(scope="module")
def gateway_url(engine_a, engine_b, nixl_transfer_capable, tmp_path_factory) -> Iterator[str]:
    """Disaggregated: engine a prefills, engine b decodes (NIXL moves the KV)."""
    workdir = tmp_path_factory.mktemp("gateway")
    table = _table_file(workdir, ((engine_a, "prefill"), (engine_b, "decode")), "disaggregated")
    with _gateway(table, workdir) as url:
        yield url


@pytest.fixture(scope="module")
def aggregated_gateway_url(engine_a, engine_b, tmp_path_factory) -> Iterator[str]:
    """Aggregated, KV-aware: both engines serve whole requests; the gateway learns where
    prefixes sit from their real KV events (token ids via the engine's /tokenize)."""
    workdir = tmp_path_factory.mktemp("gateway-agg")
    table = _table_file(workdir, ((engine_a, "both"), (engine_b, "both")), "aggregated")
    with _gateway(table, workdir, "--tokenize-via-engine") as url:
        yield url


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
    after = transfer_counters_after(engine_b, before)
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
    after = transfer_counters_after(engine_b, before)
    assert tokens == expected
    assert after[EXTERNAL] - before[EXTERNAL] >= BLOCK_SIZE


def test_gateway_consumes_real_kv_events(gateway_url):
    def batches() -> dict:
        gateway = probe.scrape(f"{gateway_url}/metrics")
        return {
            s.labels["worker"]: s.value
            for s in gateway.get("pdplane_gateway_kv_events", [])
            if s.name.endswith("_total")
        }

    # ZMQ subscribers miss what was published before they joined, so prefill something new
    # through the gateway (its prefill runs on engine a) until a batch from a arrives.
    deadline = time.monotonic() + 30
    seen = batches()
    while seen.get("vllm-a", 0) == 0 and time.monotonic() < deadline:
        requests.post(f"{gateway_url}/v1/completions", json={
            "model": MODEL_NAME, "prompt": probe.unique_prompt(80), "max_tokens": 2,
            "temperature": 0}, timeout=60).raise_for_status()
        time.sleep(0.5)
        seen = batches()
    assert seen.get("vllm-a", 0) > 0, f"gateway saw no KV events from the prefill engine: {seen}"


def _counter(families: dict, name: str) -> float:
    try:
        return probe.value(families, name)
    except KeyError:  # a labelled counter has no sample before its first increment
        return 0.0


def test_gateway_routes_to_the_engine_whose_real_kv_events_hold_the_prefix(
    engine_a, engine_b, aggregated_gateway_url
):
    """A prompt placed on one engine behind the gateway's back (sent to it directly) is
    known to the gateway only through that engine's KV events; the gateway must send the
    repeat there and credit the cached prefix."""
    metrics_url = f"{aggregated_gateway_url}/metrics"

    def batches_seen(engine) -> float:
        families = probe.scrape(metrics_url)
        return sum(
            sample.value
            for sample in families.get("pdplane_gateway_kv_events", [])
            if sample.name.endswith("_total")
            and sample.labels.get("worker") == f"vllm-{engine.name}"
        )

    def place_until_seen(engine, prompt: str) -> dict:
        """Send ``prompt`` to ``engine`` directly; wait until the gateway got its events.
        (A fresh SUB can miss the first batch while its subscription travels; the gateway
        replays history on the first batch it does get, so one more prompt catches it up.)"""
        before = batches_seen(engine)
        result = probe.complete(engine.url, prompt, max_tokens=1)
        for _ in range(5):
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline:
                if batches_seen(engine) > before:
                    return result
                time.sleep(0.1)
            probe.complete(engine.url, probe.unique_prompt(40), max_tokens=1)
        raise AssertionError(f"the gateway received no KV events from engine {engine.name}")

    for owner, other in ((engine_b, engine_a), (engine_a, engine_b)):
        prompt = probe.unique_prompt(200)
        placed = place_until_seen(owner, prompt)
        n = placed["usage"]["prompt_tokens"]
        expected_hit = ((n - 1) // BLOCK_SIZE) * BLOCK_SIZE

        def counters(engine):
            families = probe.scrape(engine.metrics_url)
            return (
                probe.value(families, "vllm:prompt_tokens_total"),
                probe.value(families, "vllm:prefix_cache_hits_total"),
            )

        gateway_before = probe.scrape(metrics_url)
        owner_before, other_before = counters(owner), counters(other)
        body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
        response = requests.post(f"{aggregated_gateway_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
        owner_after, other_after = counters(owner), counters(other)
        gateway_after = probe.scrape(metrics_url)

        assert owner_after[0] - owner_before[0] == n, f"not routed to {owner.name}"
        assert other_after[0] == other_before[0]
        assert owner_after[1] - owner_before[1] == expected_hit
        credited = _counter(gateway_after, "pdplane_gateway_predicted_cached_tokens_total") - (
            _counter(gateway_before, "pdplane_gateway_predicted_cached_tokens_total")
        )
        assert credited >= expected_hit, "the gateway did not credit the event-known prefix"
