"""The gateway over real HTTP against simulated vLLM engines (workers_agent/sim)."""

from __future__ import annotations

import socket
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from gateway.statictable import table_from_sim_endpoints
from tests.conftest import WAIT_S

from .conftest import MODEL, post, sse_events, write_json

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

WORDS = ("the", "cache", "of", "the", "model", "is", "long", "and", "the", "prefill",
         "is", "slow", "but", "decode", "is", "fast")


def prompt(n_words: int, seed: int = 0) -> str:
    return " ".join(WORDS[(i * 7 + seed) % len(WORDS)] for i in range(n_words))


def completion(gw, text, stream=False, max_tokens=8, **extra):
    return post(gw.url + "/v1/completions",
                {"model": MODEL, "prompt": text, "max_tokens": max_tokens, "stream": stream,
                 **extra})


def test_aggregated_requests_stream_and_not(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("a", "both"), ("b", "both")])
    table = write_json(tmp_path / "t.json", table_from_sim_endpoints(fleet.endpoints))
    gw = gateway_process("--table", table)

    status, headers, raw = completion(gw, prompt(40), max_tokens=6)
    assert status == 200, raw
    import json

    body = json.loads(raw)
    assert body["usage"]["completion_tokens"] == 6 and headers["X-Pdplane-Worker"] in ("a", "b")
    assert "X-Pdplane-Prefill-Worker" not in headers

    status, headers, raw = completion(gw, prompt(40), stream=True, max_tokens=5)
    events = sse_events(raw)
    assert status == 200 and events[-1] == "[DONE]"
    assert sum(1 for e in events[:-1] if e["choices"][0]["text"]) == 5

    status, _, raw = post(gw.url + "/v1/chat/completions", {
        "model": MODEL, "stream": True, "max_tokens": 4,
        "messages": [{"role": "user", "content": prompt(30)}]})
    events = sse_events(raw)
    assert status == 200 and events[0]["choices"][0]["delta"].get("role") == "assistant"
    assert events[-1] == "[DONE]"

    status, _, raw = post(gw.url + "/v1/chat/completions", {
        "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi there"}]})
    assert status == 200 and json.loads(raw)["choices"][0]["message"]["content"]

    # The same long prompt goes back to the worker that holds its prefix.
    shared = prompt(400, seed=3)
    first = completion(gw, shared + " one", max_tokens=2)[1]["X-Pdplane-Worker"]
    for i in range(4):
        assert completion(gw, shared + f" tail {i}", max_tokens=2)[1]["X-Pdplane-Worker"] == first

    models = post(gw.url + "/v1/models", {})  # POST is not allowed on /v1/models
    assert models[0] == 405
    metrics = __import__("urllib.request").request.urlopen(gw.url + "/metrics").read().decode()
    assert 'pdplane_gateway_routing_decisions_total{model="llama-3.3-70b-fp8",reason="kv_aware"}' \
        in metrics
    assert "pdplane_gateway_time_to_first_token_seconds_count" in metrics
    assert "pdplane_gateway_routing_table_version 1.0" in metrics


def test_bad_requests_get_openai_errors(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("a", "both")])
    gw = gateway_process("--table", write_json(tmp_path / "t.json",
                                               table_from_sim_endpoints(fleet.endpoints)))
    status, _, raw = post(gw.url + "/v1/completions", {"model": "nope", "prompt": "x"})
    assert status == 404 and b"model_not_found" in raw
    req = __import__("urllib.request").request
    bad = req.Request(gw.url + "/v1/completions", data=b"{not json",
                      headers={"Content-Type": "application/json"})
    try:
        req.urlopen(bad, timeout=WAIT_S)
        raise AssertionError("expected 400")
    except __import__("urllib.error").error.HTTPError as exc:
        assert exc.code == 400 and b"not JSON" in exc.read()
    # The engine's own 4xx (context too long) is passed through, not retried.
    status, _, raw = completion(gw, prompt(10), max_tokens=10**7)
    assert status == 400


def test_disaggregated_streaming_request(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("p", "prefill"), ("d", "decode")])
    table = table_from_sim_endpoints(fleet.endpoints, mode="disaggregated")
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    before = fleet.metric("d", "vllm:prompt_tokens_by_source_total",
                          source="external_kv_transfer")
    status, headers, raw = completion(gw, prompt(300), stream=True, max_tokens=6)
    events = sse_events(raw)
    assert status == 200, raw
    assert headers["X-Pdplane-Prefill-Worker"] == "p" and headers["X-Pdplane-Worker"] == "d"
    assert events[-1] == "[DONE]"
    assert sum(1 for e in events[:-1] if e["choices"][0]["text"]) == 6
    after = fleet.metric("d", "vllm:prompt_tokens_by_source_total",
                         source="external_kv_transfer")
    assert after > before  # the decode engine got the prompt's KV by transfer

    status, headers, raw = post(gw.url + "/v1/chat/completions", {
        "model": MODEL, "stream": True, "max_tokens": 3,
        "messages": [{"role": "user", "content": prompt(200, 1)}]})
    assert status == 200 and headers["X-Pdplane-Prefill-Worker"] == "p"
    assert sse_events(raw)[-1] == "[DONE]"


def test_conditional_mode_keeps_short_prompts_local(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("p", "prefill"), ("d", "decode")])
    table = table_from_sim_endpoints(fleet.endpoints, mode="conditional",
                                     local_prefill_max_tokens=64)
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    _, short, _ = completion(gw, prompt(10), max_tokens=2)
    assert short["X-Pdplane-Worker"] == "d" and "X-Pdplane-Prefill-Worker" not in short
    _, long, _ = completion(gw, prompt(600), max_tokens=2)
    assert long["X-Pdplane-Prefill-Worker"] == "p"


def test_draining_worker_gets_no_new_requests(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("a", "both"), ("b", "both")])
    table = table_from_sim_endpoints(fleet.endpoints)
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    drained = table_from_sim_endpoints(fleet.endpoints, version=2)
    drained["models"][0]["workers"][0]["state"] = "draining"  # worker "a"
    assert gw.put_table(drained) == (200, {"status": "ack", "applied_version": 2})
    served_before = fleet.metric("a", "vllm:request_success_total")
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(
            lambda i: completion(gw, prompt(50, i), stream=i % 2 == 0, max_tokens=3),
            range(24)))
    assert all(a[0] == 200 for a in answers)
    assert {a[1]["X-Pdplane-Worker"] for a in answers} == {"b"}
    assert fleet.metric("a", "vllm:request_success_total") == served_before


def test_killed_worker_does_not_fail_requests_not_yet_streaming(
    sim_fleet, gateway_process, tmp_path
):
    fleet = sim_fleet([("a", "both"), ("b", "both")])
    table = table_from_sim_endpoints(fleet.endpoints)
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    assert completion(gw, prompt(20), max_tokens=2)[0] == 200
    fleet.kill_engine("a")
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(
            lambda i: completion(gw, prompt(60, i), stream=i % 2 == 1, max_tokens=4),
            range(12)))
    assert [a[0] for a in answers] == [200] * 12, [a[2][:200] for a in answers]
    assert {a[1]["X-Pdplane-Worker"] for a in answers} == {"b"}
    metrics = __import__("urllib.request").request.urlopen(gw.url + "/metrics").read().decode()
    assert "pdplane_gateway_upstream_retries_total" in metrics


def test_client_disconnect_cancels_the_upstream_request(sim_fleet, gateway_process, tmp_path):
    fleet = sim_fleet([("a", "both")], time_scale=1.0)
    table = table_from_sim_endpoints(fleet.endpoints)
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    aborted_before = fleet.metric("a", "vllm:request_success_total", finished_reason="abort")
    body = (b'{"model": "%s", "prompt": "%s", "max_tokens": 4000, "stream": true}'
            % (MODEL.encode(), prompt(30).encode()))
    with socket.create_connection(("127.0.0.1", gw.port), timeout=WAIT_S) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                     b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        assert b"200 OK" in sock.recv(4096)  # streaming has begun
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        aborted = fleet.metric("a", "vllm:request_success_total", finished_reason="abort")
        if aborted > aborted_before:
            break
        time.sleep(0.1)
    assert aborted > aborted_before
    assert fleet.metric("a", "vllm:num_requests_running") == 0


def test_first_token_deadline_sheds_late_streams_and_cancels_them(
    sim_fleet, gateway_process, tmp_path
):
    fleet = sim_fleet([("a", "both")], time_scale=1.0)
    # The deadline leaves a short prompt (18 ms of simulated prefill) room for a starved box;
    # the long one's simulated prefill alone (about 2.9 s) is past it, however fast the box.
    table = table_from_sim_endpoints(fleet.endpoints,
                                     routing={"first_token_deadline_ms": 2000})
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table))
    aborted_before = fleet.metric("a", "vllm:request_success_total", finished_reason="abort")
    status, _, raw = completion(gw, prompt(20), stream=True, max_tokens=3)
    assert status == 200 and sse_events(raw)[-1] == "[DONE]"
    # A 20,000-token prefill of the 70B model takes longer than that: shed with a 503 and
    # an OpenAI-style error (at the deadline, not after the prefill: the message says
    # which), and the engine sees the request aborted.
    status, _, raw = completion(gw, prompt(20_000), stream=True, max_tokens=3)
    import json

    assert status == 503, raw[:300]
    assert "no first token within 2000 ms" in json.loads(raw)["error"]["message"]
    deadline = time.monotonic() + WAIT_S
    aborted = aborted_before
    while time.monotonic() < deadline and aborted <= aborted_before:
        time.sleep(0.1)
        aborted = fleet.metric("a", "vllm:request_success_total", finished_reason="abort")
    assert aborted > aborted_before
    # Non-streaming answers are never cut (their first byte is their last).
    status, _, _ = completion(gw, prompt(20_000, seed=1), max_tokens=2)  # no cached prefix
    assert status == 200
    metrics = __import__("urllib.request").request.urlopen(gw.url + "/metrics").read().decode()
    assert 'kind="first_token_deadline"' in metrics


def test_dead_prefill_engine_fails_its_pair_not_the_clients(sim_fleet, gateway_process,
                                                             tmp_path):
    """P/D over real simulated engines: a prefill engine that dies costs no request not yet
    streaming; its pair is marked unhealthy, skipped, re-probed after the engine is back,
    and healthy again."""
    import json
    import urllib.request

    fleet = sim_fleet([("p1", "prefill"), ("p2", "prefill"), ("d", "decode")])
    table = table_from_sim_endpoints(fleet.endpoints, mode="disaggregated")
    config = write_json(tmp_path / "gw.json", {"pd_pair_cooldown_s": 0.5})
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table), "--config", config)
    assert completion(gw, prompt(200), max_tokens=2)[0] == 200
    fleet.kill_engine("p1")
    answers = [completion(gw, prompt(200, i), stream=i % 2 == 0, max_tokens=3)
               for i in range(10)]
    assert [a[0] for a in answers] == [200] * 10, [a[2][:200] for a in answers]
    assert {a[1]["X-Pdplane-Prefill-Worker"] for a in answers} == {"p2"}
    pairs = {(p["prefill"], p["decode"]): p for p in gw.admin_table()["pd_pairs"]}
    assert pairs["p1", "d"]["state"] in ("unhealthy", "probing")
    assert pairs["p1", "d"]["last_failure"] == "prefill_failed"
    metrics = urllib.request.urlopen(gw.url + "/metrics", timeout=WAIT_S).read().decode()
    assert 'pdplane_gateway_pd_pair_failures_total{decode="d",kind="prefill_failed",' \
           'prefill="p1"}' in metrics

    fleet.restart_engine("p1")
    deadline = time.monotonic() + WAIT_S
    state = None
    i = 100
    while time.monotonic() < deadline:
        status, _, raw = completion(gw, prompt(200, i), max_tokens=2)
        assert status == 200, raw[:200]
        i += 1
        state = {(p["prefill"], p["decode"]): p["state"]
                 for p in gw.admin_table()["pd_pairs"]}.get(("p1", "d"))
        if state == "healthy":
            break
        time.sleep(0.2)
    assert state == "healthy", json.dumps(gw.admin_table()["pd_pairs"])


def test_two_gateway_processes_share_prefixes_and_tables(sim_fleet, gateway_process,
                                                         tmp_path):
    """--workers 2: two processes on one port (SO_REUSEPORT). A prefix one of them routed
    is followed by the other; a table pushed to one is applied by both."""
    fleet = sim_fleet([("a", "both"), ("b", "both")])
    table = table_from_sim_endpoints(fleet.endpoints)
    table["cluster"] = "c1"
    gw = gateway_process("--table", write_json(tmp_path / "t.json", table), "--workers", "2",
                         "--cluster", "c1")
    time.sleep(1.0)  # both processes up and their bus connected
    shared = prompt(400, seed=5)
    first = completion(gw, shared + " zero", max_tokens=2)[1]["X-Pdplane-Worker"]
    # Each urllib request is a new connection: the kernel spreads them over both processes.
    workers = {completion(gw, shared + f" tail {i}", max_tokens=2)[1]["X-Pdplane-Worker"]
               for i in range(10)}
    assert workers == {first}
    table["version"] = 2
    status, body = gw.put_table(table)
    assert status == 200, body
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        versions = {gw.wait_health()["table_version"] for _ in range(10)}
        if versions == {2}:
            break
        time.sleep(0.2)
    assert versions == {2}
