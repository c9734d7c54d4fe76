"""Issue 19 on a real engine: the gateway notices a vLLM restart and rebuilds that worker's
index from the new engine's KV events.

A gateway (``python -m gateway``, one worker: engine ``a``) follows the engine's real ZMQ
stream. A prompt is cached and the gateway's precise index holds its blocks. The engine is
then restarted for real (``VLLMInstance.restart``: every process stopped, the same command
started again on the same ports). vLLM numbers KV-event batches from 0 again and its cache
is empty; the gateway must see that (the stream's ``restarts``), drop the worker's blocks,
stop crediting the old prompt, and refill from the new engine's events. The simulated-engine
version is tests/integration/gateway/test_gateway_kv_stream.py.

The engines are shared with the rest of the folder: the restarted one is healthy on the
same ports before this test ends (later tests run against it).
"""

from __future__ import annotations

import os
import random
import time

import pytest
import requests

from gateway.signing import signed_headers
from tests.conftest import wait_until
from tests.realvllm import engine_probe as probe
from tests.realvllm.conftest import BLOCK_SIZE, MODEL_NAME
from tests.realvllm.test_real_gateway_pd import ADMIN_SECRET, _gateway, _table_file

# Opt-in until a restarted engine starts reliably: in 2 of about 8 runs on a 2-core box the
# restarted vLLM CPU engine wrote nothing to its log for minutes (the cause is not known), and
# a failure here must not fail the suite for every later change. The skip reason says how to
# run it.
RUN_RESTART = os.environ.get("PDPLANE_REALVLLM_RESTART") == "1"
pytestmark = [
    pytest.mark.realvllm, pytest.mark.timeout(600),
    pytest.mark.skipif(not RUN_RESTART, reason=(
        "engine-restart test is opt-in (PDPLANE_REALVLLM_RESTART=1): a restarted vLLM CPU "
        "engine hung at start in 2 of ~8 runs (docs/real-vllm.md)")),
]

WORKER = "vllm-a"
PROMPT_BLOCKS = 4


def _token_prompt(rng: random.Random) -> list[int]:
    """Token ids (not text): the gateway matches them against the events' token ids without a
    tokenizer. Random ids from the tiny model's vocabulary (4..511, past the specials) can't
    share a first block with anything cached before; a partial tail block is never stored."""
    return [rng.randrange(4, 512) for _ in range(PROMPT_BLOCKS * BLOCK_SIZE + 5)]


def _stream(url: str) -> dict:
    path = "/admin/routing-table"
    headers = signed_headers(ADMIN_SECRET, "GET", path, b"", now=time.time())
    answer = requests.get(url + path, headers=headers, timeout=5)
    answer.raise_for_status()
    return answer.json()["kv_streams"].get(WORKER, {})


def _through_gateway(url: str, prompt: list[int]) -> str:
    """One completion through the gateway; its route header (``…; cached=N; …``)."""
    body = {"model": MODEL_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    response = requests.post(f"{url}/v1/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.headers["X-Pdplane-Route"]


def _cached(route: str) -> int:
    return int(route.split("cached=", 1)[1].split(";", 1)[0])


def _prefix_hits(engine) -> float:
    return probe.value(probe.scrape(engine.metrics_url), "vllm:prefix_cache_hits_total")


def test_engine_restart_empties_and_refills_the_gateways_index(engine_a, tmp_path_factory):
    rng = random.Random(time.time_ns())
    old, new = _token_prompt(rng), _token_prompt(rng)
    full = PROMPT_BLOCKS * BLOCK_SIZE
    workdir = tmp_path_factory.mktemp("gateway-restart")
    table = _table_file(workdir, ((engine_a, "both"),), "aggregated")
    with _gateway(table, workdir) as url:
        # Cache the old prompt. The gateway's fresh subscription may miss the first live
        # batch; it then replays the engine's history, so its blocks arrive either way.
        _through_gateway(url, old)
        before = wait_until(lambda: (s := _stream(url)) and s["blocks"] >= PROMPT_BLOCKS and s,
                            30, what="the old prompt's blocks in the gateway's index")
        assert before["restarts"] == 0, before
        assert _cached(_through_gateway(url, old)) == full  # credited while the engine has it

        took = engine_a.restart()
        healthy_at = time.monotonic()
        print(f"\n[realvllm] engine a restarted in {took:.1f}s (stop {engine_a.stopped_in_s:.1f}s, "
              f"start to /health {engine_a.started_in_s:.1f}s)")

        # Nothing sent to the new engine yet. The gateway's liveness probe of the replay
        # socket (every 10 s while the stream is quiet) asks for the last batch it applied;
        # the new engine doesn't have it, so the stream starts over: the index empties.
        emptied = wait_until(lambda: (s := _stream(url)) and s["restarts"] >= 1 and s,
                             30, what="the gateway to detect the restart")
        assert emptied["blocks"] == 0, emptied
        print(f"[realvllm] the gateway saw the restart {time.monotonic() - healthy_at:.1f}s "
              "after /health")

        # The engine really lost the old prompt (no prefix hit), and the gateway no longer
        # credits it; serving it there caches it again.
        hits = _prefix_hits(engine_a)
        assert _cached(_through_gateway(url, old)) == 0
        assert _prefix_hits(engine_a) == hits
        # Refill from the new engine's own events (its stream from seq 0).
        _through_gateway(url, new)
        refilled = wait_until(
            lambda: (s := _stream(url)) and s["blocks"] >= 2 * PROMPT_BLOCKS and s,
            30, what="the new engine's blocks in the gateway's index")
        assert refilled["blocks"] == 2 * PROMPT_BLOCKS, refilled  # only what the new one holds
        assert refilled["restarts"] == emptied["restarts"], refilled
        assert not refilled["stalled"], refilled
        assert _cached(_through_gateway(url, new)) == full

    # The shared engine is back where later tests expect it: healthy, same address.
    assert requests.get(f"{engine_a.url}/health", timeout=5).status_code == 200
