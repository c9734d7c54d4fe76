"""The simulated engines over the wire: OpenAI API, /metrics, KV events, P/D, telemetry.

One fleet (three simulated H200 nodes, time 20× faster) is started through the
``pdplane-sim`` command line for the whole module; the client side (tests/integration/sim/
client.py) is written from the reference and never imports the simulator.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.parse

import pytest

from tests.conftest import WAIT_S, wait_until
from tests.integration.sim.client import (
    KvSubscriber,
    get,
    post,
    replay,
    scrape,
    sse_events,
    start_fleet,
    value,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

MODEL = "llama-3.3-70b-fp8"
SMALL = "llama-3.1-8b"
IB400 = {"name": "mlx5_0", "line_rate_gbps": 400, "transport": "infiniband", "rdma": True}
ROCE25 = {"name": "eth0", "line_rate_gbps": 25, "transport": "roce", "rdma": True}
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0]

FLEET = {
    "time_scale": 0.05,
    "nodes": [
        {"hostname": "n1", "gpu": "H200", "gpu_count": 8, "nvlink_group_size": 4, "nics": [IB400]},
        {"hostname": "n2", "gpu": "H200", "gpu_count": 8, "nvlink_group_size": 4, "nics": [IB400]},
        {"hostname": "n3", "gpu": "H200", "gpu_count": 8, "nvlink_group_size": 4, "nics": [ROCE25]},
    ],
    "engines": [
        {"id": "agg", "node": "n1", "model": MODEL, "gpus": [2]},
        {"id": "p", "node": "n1", "model": MODEL, "gpus": [0], "role": "prefill",
         "kv_hold_timeout_s": 20},
        {"id": "d-nvl", "node": "n1", "model": MODEL, "gpus": [1], "role": "decode"},
        {"id": "d-pcie", "node": "n1", "model": MODEL, "gpus": [4], "role": "decode"},
        {"id": "d-400", "node": "n2", "model": MODEL, "gpus": [0], "role": "decode"},
        {"id": "d-25", "node": "n3", "model": MODEL, "gpus": [0], "role": "decode"},
        {"id": "lossy", "node": "n2", "model": SMALL, "gpus": [1], "drop_kv_batch_every": 2},
        {"id": "small", "node": "n3", "model": SMALL, "gpus": [1], "num_gpu_blocks": 48},
        {"id": "timing", "node": "n2", "model": SMALL, "gpus": [3]},
    ],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    running = start_fleet(FLEET, tmp_path_factory.mktemp("simfleet"))
    try:
        yield running
    finally:
        running.stop()


def words(n: int, prefix: str = "w") -> str:
    return " ".join(f"{prefix}{i}" for i in range(n))


def completion(fleet, engine: str, prompt: str, max_tokens: int = 4, **extra):
    return post(fleet.engine(engine)["api_url"] + "/v1/completions",
                {"model": SMALL if engine in ("small", "lossy", "timing") else MODEL,
                 "prompt": prompt, "max_tokens": max_tokens, **extra})


def test_models_health_tokenize(fleet):
    api = fleet.engine("agg")["api_url"]
    assert get(api + "/health")[0] == 200
    status, models = get(api + "/v1/models")
    assert status == 200 and models["data"][0]["id"] == MODEL
    status, tok = post(api + "/tokenize", {"model": MODEL, "prompt": "hello there world"})
    assert status == 200 and tok["count"] == 3 and len(tok["tokens"]) == 3


def test_completion_usage_and_streaming_match(fleet):
    api = fleet.engine("agg")["api_url"]
    prompt = words(300, "stream")
    status, first = completion(fleet, "agg", prompt, max_tokens=6)
    assert status == 200, first
    usage = first["usage"]
    assert usage["prompt_tokens"] == 300 and usage["completion_tokens"] == 6
    assert usage["total_tokens"] == 306
    assert usage["prompt_tokens_details"]["cached_tokens"] == 0
    assert first["choices"][0]["finish_reason"] == "length"

    events = sse_events(api + "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": 6, "stream": True,
        "stream_options": {"include_usage": True},
    })
    assert events[-1] == "[DONE]"
    usage_chunk = events[-2]
    assert usage_chunk["choices"] == []
    # The repeated prompt hits the prefix cache: every full 16-token block of it.
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] == 288
    text = "".join(e["choices"][0]["text"] for e in events[:-2])
    assert text == first["choices"][0]["text"]  # same prompt, same deterministic tokens

    chat = sse_events(api + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi there"}],
        "max_tokens": 3, "stream": True,
    })
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chat[-2]["choices"][0]["finish_reason"] == "length"
    status, nonstream = post(api + "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": "hi there"}], "max_tokens": 3})
    assert status == 200
    assert nonstream["choices"][0]["message"]["role"] == "assistant"
    assert nonstream["usage"]["completion_tokens"] == 3


def test_prefix_cache_hits_rise_for_shared_prefixes(fleet):
    metrics = fleet.engine("agg")["metrics_url"]
    before = scrape(metrics)
    system = words(512, "sys")
    for i in range(4):
        status, _ = completion(fleet, "agg", f"{system} question{i} {words(20, f'q{i}x')}")
        assert status == 200
    after = scrape(metrics)
    queries = value(after, "vllm:prefix_cache_queries") - value(before, "vllm:prefix_cache_queries")
    hits = value(after, "vllm:prefix_cache_hits") - value(before, "vllm:prefix_cache_hits")
    assert queries >= 4 * 532
    assert hits >= 3 * 512  # requests 2..4 reuse the 512-token shared prefix
    hit_source = (value(after, "vllm:prompt_tokens_by_source", source="local_cache_hit")
                  - value(before, "vllm:prompt_tokens_by_source", source="local_cache_hit"))
    assert hit_source >= 3 * 512

    before = scrape(metrics)
    for i in range(3):
        completion(fleet, "agg", words(200, f"unique{i}x"))
    after = scrape(metrics)
    assert value(after, "vllm:prefix_cache_hits") == value(before, "vllm:prefix_cache_hits")


def test_metric_names_labels_and_buckets(fleet):
    families = scrape(fleet.engine("agg")["metrics_url"])
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                 "vllm:kv_cache_usage_perc", "vllm:cache_config_info",
                 "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
                 "vllm:generation_tokens", "vllm:num_preemptions", "vllm:request_success",
                 "vllm:prompt_tokens_by_source", "vllm:external_prefix_cache_queries",
                 "vllm:external_prefix_cache_hits", "vllm:time_to_first_token_seconds",
                 "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
                 "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
                 "vllm:request_decode_time_seconds", "vllm:request_prompt_tokens",
                 "vllm:request_generation_tokens", "vllm:nixl_xfer_time_seconds",
                 "vllm:nixl_bytes_transferred"):
        assert name in families, name
        for sample in families[name].samples:
            assert sample.labels["engine"] == "0"
            if name != "vllm:cache_config_info":
                assert sample.labels["model_name"] == MODEL
    assert families["vllm:prompt_tokens"].type == "counter"
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    assert 0.0 <= value(families, "vllm:kv_cache_usage_perc") <= 1.0

    def bounds(name):
        return [float(s.labels["le"]) for s in families[name].samples
                if s.name == name + "_bucket" and s.labels["le"] != "+Inf"]

    assert bounds("vllm:time_to_first_token_seconds") == TTFT_BUCKETS
    assert bounds("vllm:inter_token_latency_seconds") == ITL_BUCKETS
    info = families["vllm:cache_config_info"].samples[0]
    assert info.value == 1
    assert info.labels["block_size"] == "16"
    assert int(info.labels["num_gpu_blocks"]) > 1000
    assert info.labels["enable_prefix_caching"] == "True"
    ttft_count = "vllm:time_to_first_token_seconds_count"
    assert value(families, "vllm:time_to_first_token_seconds", ttft_count) > 0


def test_kv_events_wire_format(fleet):
    engine = fleet.engine("agg")
    sub = KvSubscriber(engine["kv_events_endpoint"])
    try:
        status, _ = completion(fleet, "agg", words(64, "kvevent"), max_tokens=2)
        assert status == 200
        batches = sub.receive(timeout=WAIT_S, until=lambda got: any(
            ev.get("type") == "BlockStored" for _, _, batch in got for ev in batch[1]))
    finally:
        sub.close()
    assert batches, "no KV events"
    topic, _seq, batch = batches[0]
    assert topic == "kv-events"
    assert isinstance(batch, list) and len(batch) == 3  # [ts, events, data_parallel_rank]
    ts, _events, dp_rank = batch
    assert isinstance(ts, float) and dp_rank == 0
    stored = [ev for _, _, b in batches for ev in b[1] if ev["type"] == "BlockStored"]
    assert stored
    event = stored[0]
    assert next(iter(event)) == "type"
    assert all(isinstance(h, int) and 0 <= h < 2**64 for h in event["block_hashes"])
    assert event["block_size"] == 16
    assert len(event["token_ids"]) == 16 * len(event["block_hashes"])
    assert event["medium"] == "GPU"
    seqs = [s for _, s, _ in batches]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_replay_returns_batches_lost_by_fault_injection(fleet):
    engine = fleet.engine("lossy")  # drops every 2nd published batch
    sub = KvSubscriber(engine["kv_events_endpoint"])
    try:
        for i in range(6):
            status, _ = completion(fleet, "lossy", words(40, f"lossy{i}x"), max_tokens=1)
            assert status == 200
        # Until the stream shows a gap (every 2nd batch is dropped), not for a fixed time.
        received = sub.receive(timeout=WAIT_S, until=lambda got: len(got) >= 2 and (
            got[-1][1] - got[0][1] + 1 > len(got)))
    finally:
        sub.close()
    seqs = [s for _, s, _ in received]
    assert seqs, "nothing received"
    missing = sorted(set(range(seqs[0], seqs[-1] + 1)) - set(seqs))
    assert missing, f"expected a gap in {seqs}"
    replayed = dict(replay(engine["kv_replay_endpoint"], missing[0]))
    for seq in missing:
        assert seq in replayed
        assert isinstance(replayed[seq], list) and len(replayed[seq]) == 3
    assert all(s in replayed for s in seqs if s >= missing[0])


@pytest.mark.parametrize(
    ("path", "raw", "status"),
    [
        ("/v1/completions", b"{not json", 400),
        ("/v1/completions", b"[1, 2]", 400),
        ("/v1/completions", json.dumps({"model": MODEL}).encode(), 400),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": 5}).encode(), 400),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x", "max_tokens": -1}).encode(),
         400),
        ("/v1/completions", json.dumps({"model": "other", "prompt": "x"}).encode(), 404),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x",
                                        "stream_options": {"include_usage": True}}).encode(), 400),
        ("/v1/completions", json.dumps({"model": MODEL, "prompt": "x",
                                        "kv_transfer_params": "yes"}).encode(), 400),
        ("/v1/chat/completions", json.dumps({"model": MODEL, "messages": []}).encode(), 400),
        ("/v1/chat/completions",
         json.dumps({"model": MODEL, "messages": [{"content": 1}]}).encode(), 400),
        ("/tokenize", b"nope", 400),
    ],
)
def test_malformed_requests_get_openai_errors(fleet, path, raw, status):
    got, body = post(fleet.engine("agg")["api_url"] + path, raw=raw)
    assert got == status
    assert isinstance(body, dict) and isinstance(body["error"]["message"], str)


def test_prefill_decode_round_trip_and_link_speeds(fleet):
    prefill = fleet.engine("p")
    prompt = words(4000, "pd")
    xfer = {}
    for i, decode in enumerate(("d-nvl", "d-pcie", "d-400", "d-25")):
        header = {"X-Request-Id": f"pd-{i}"}
        status, first = post(prefill["api_url"] + "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None},
        }, headers=header)
        assert status == 200, first
        params = first["kv_transfer_params"]
        assert params["do_remote_prefill"] is True
        assert params["remote_engine_id"] == "p"
        assert params["remote_num_tokens"] == 4000
        assert len(params["remote_block_ids"]) == 250
        assert first["usage"]["completion_tokens"] == 1

        metrics = fleet.engine(decode)["metrics_url"]
        status, second = post(fleet.engine(decode)["api_url"] + "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 5, "kv_transfer_params": params,
        }, headers=header)
        assert status == 200, second
        assert second["usage"]["completion_tokens"] == 5
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 3984
        families = scrape(metrics)
        assert value(families, "vllm:external_prefix_cache_hits") >= 3984
        assert value(families, "vllm:prompt_tokens_by_source", source="external_kv_transfer") > 0
        nbytes = value(families, "vllm:nixl_bytes_transferred",
                       "vllm:nixl_bytes_transferred_sum")
        assert nbytes == 4000 * 163840  # Llama 3.3 70B FP8: 160 KiB per token ≈ 0.66 GB
        xfer[decode] = value(families, "vllm:nixl_xfer_time_seconds",
                             "vllm:nixl_xfer_time_seconds_sum")
        ttft = value(families, "vllm:time_to_first_token_seconds",
                     "vllm:time_to_first_token_seconds_sum")
        assert ttft >= xfer[decode]  # the transfer is charged before the first token

        # The same params again: the blocks were released by the first pull (the prefill
        # engine's own 404, not a pull that timed out: that would be a 502).
        status, again = post(fleet.engine(decode)["api_url"] + "/v1/completions", {
            "model": MODEL, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
        assert status == 404 and "expired" in again["error"]["message"]

    assert xfer["d-nvl"] < xfer["d-pcie"] < xfer["d-400"] < xfer["d-25"]
    # 0.655 GB over 400 Gb/s ≈ 13 ms and over 25 Gb/s ≈ 0.21 s at line rate (RDMA ~87%).
    assert 0.010 < xfer["d-400"] < 0.03
    assert 0.15 < xfer["d-25"] < 0.35
    assert xfer["d-nvl"] < 0.005

    n1 = get(fleet.node("n1")["telemetry_url"])[1]
    n2 = get(fleet.node("n2")["telemetry_url"])[1]
    n3 = get(fleet.node("n3")["telemetry_url"])[1]
    gpus = {g["index"]: g for g in n1["gpus"]}
    assert gpus[0]["nvlink_tx_bytes"] == 4000 * 163840
    assert gpus[1]["nvlink_rx_bytes"] == 4000 * 163840
    assert n1["nics"][0]["tx_bytes"] == 2 * 4000 * 163840  # to n2 and n3
    assert n2["nics"][0]["rx_bytes"] == 4000 * 163840
    assert n3["nics"][0]["rx_bytes"] == 4000 * 163840


def test_unknown_or_malformed_transfer_params_fail_fast(fleet):
    prefill = fleet.engine("p")["api_url"]
    port = urllib.parse.urlsplit(prefill).port
    cases = [
        ({"do_remote_prefill": True, "remote_engine_id": "p", "remote_host": "127.0.0.1",
          "remote_port": port, "remote_request_id": "no-such-request"}, 404),
        ({"do_remote_prefill": True, "remote_engine_id": "p", "remote_host": "127.0.0.1",
          "remote_port": 1, "remote_request_id": "x"}, 502),
        ({"do_remote_prefill": True, "remote_port": port}, 400),
        ({"do_remote_prefill": True, "do_remote_decode": True}, 400),
    ]
    for params, expected in cases:
        status, body = completion(fleet, "d-400", "a b c", kv_transfer_params=params)
        assert status == expected, body
        # Fast: refused or answered, never a pull left to run into its timeout.
        assert body["error"]["message"] and "Timeout" not in body["error"]["message"], body


def test_held_kv_expires_when_nobody_pulls_it(fleet):
    prefill = fleet.engine("p")
    before = scrape(prefill["metrics_url"])
    status, first = post(prefill["api_url"] + "/v1/completions", {
        "model": MODEL, "prompt": words(800, "unpulled"), "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True}})
    assert status == 200
    assert value(scrape(prefill["metrics_url"]), "vllm:kv_cache_usage_perc") > 0  # held
    # The hold is 20 simulated seconds = 1 s at time_scale 0.05.
    after = wait_until(lambda: (a := scrape(prefill["metrics_url"])) and value(
        a, "vllm:nixl_num_kv_expired_reqs") > value(before, "vllm:nixl_num_kv_expired_reqs")
        and a, what="the held KV to expire")
    assert (value(after, "vllm:nixl_num_kv_expired_reqs")
            - value(before, "vllm:nixl_num_kv_expired_reqs")) == 1
    assert value(after, "vllm:kv_cache_usage_perc") == 0
    status, body = completion(fleet, "d-400", words(800, "unpulled"),
                              kv_transfer_params=first["kv_transfer_params"])
    assert status == 404 and body["error"]["code"] == "kv_transfer_params_unknown"


def test_client_disconnect_aborts_the_request(fleet):
    engine = fleet.engine("agg")
    before = scrape(engine["metrics_url"])
    url = urllib.parse.urlsplit(engine["api_url"])
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=WAIT_S)
    conn.request("POST", "/v1/completions", json.dumps({
        "model": MODEL, "prompt": words(50, "bye"), "max_tokens": 5000, "stream": True}),
        {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    assert resp.read(6) == b"data: "
    conn.sock.close()
    conn.close()
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        families = scrape(engine["metrics_url"])
        aborted = (value(families, "vllm:request_success", finished_reason="abort")
                   - value(before, "vllm:request_success", finished_reason="abort"))
        if aborted == 1 and value(families, "vllm:num_requests_running") == 0:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the engine kept generating for a client that went away")


def test_kv_pressure_shows_usage_and_preemptions(fleet):
    engine = fleet.engine("small")  # 48 blocks × 16 tokens
    peak = []
    done = threading.Event()

    def watch():
        while not done.is_set():
            peak.append(value(scrape(engine["metrics_url"]), "vllm:kv_cache_usage_perc"))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    results = []

    def one(i):
        results.append(completion(fleet, "small", words(200, f"press{i}x"), max_tokens=400))

    workers = [threading.Thread(target=one, args=(i,)) for i in range(6)]
    for t in workers:
        t.start()
    for t in workers:
        t.join(timeout=30)
    done.set()
    watcher.join(timeout=5)
    assert [status for status, _ in results] == [200] * 6
    families = scrape(engine["metrics_url"])
    assert value(families, "vllm:num_preemptions") > 0
    assert max(peak) > 0.7


def test_node_telemetry_format_role_and_faults(fleet):
    node = fleet.node("n2")
    status, snap = get(node["telemetry_url"])
    assert status == 200
    assert snap["hostname"] == "n2"
    assert len(snap["gpus"]) == 8
    gpu = snap["gpus"][0]
    for key in ("index", "uuid", "name", "memory_total_bytes", "memory_used_bytes",
                "utilization", "temperature_c", "power_w", "nvlink_tx_bytes",
                "nvlink_rx_bytes"):
        assert key in gpu
    assert gpu["uuid"].startswith("GPU-")
    # Llama 3.3 70B FP8 weights (~70.6 GB) on GPU 0; GPU 7 holds nothing.
    assert gpu["memory_used_bytes"] > 70e9
    assert snap["gpus"][7]["memory_used_bytes"] == 0
    assert 0 <= gpu["utilization"] <= 1
    nic = snap["nics"][0]
    assert (nic["name"], nic["line_rate_gbps"], nic["transport"], nic["rdma"]) == (
        "mlx5_0", 400, "infiniband", True)
    engines = {e["id"]: e for e in snap["engines"]}
    assert set(engines) == {"d-400", "lossy", "timing"}
    e = engines["d-400"]
    assert e["kind"] == "sim" and e["gpus"] == [0] and e["tp"] == 1 and e["role"] == "decode"
    assert e["api_url"] == fleet.engine("d-400")["api_url"]
    assert e["kv_events_endpoint"].startswith("tcp://127.0.0.1:")
    assert e["block_size"] == 16 and e["num_gpu_blocks"] > 0

    base = node["telemetry_url"].rsplit("/sim/v1/node", 1)[0]
    status, body = post(base + "/sim/v1/engines/d-400/role", {"role": "both"})
    assert status == 200 and body["previous_role"] == "decode"
    assert get(node["telemetry_url"])[1]["engines"][0]["role"] == "both"
    assert post(base + "/sim/v1/engines/d-400/role", {"role": "boss"})[0] == 400
    assert post(base + "/sim/v1/engines/nope/role", {"role": "both"})[0] == 404
    status, body = post(base + "/sim/v1/nics/mlx5_0/faults", {"rx_errors": 3, "tx_drops": 1})
    assert status == 200 and body["rx_errors"] == 3
    assert get(node["telemetry_url"])[1]["nics"][0]["tx_drops"] == 1


def _mean(families_before, families_after, name):
    total = (value(families_after, name, name + "_sum")
             - value(families_before, name, name + "_sum"))
    count = (value(families_after, name, name + "_count")
             - value(families_before, name, name + "_count"))
    assert count > 0
    return total / count


def test_ttft_rises_with_uncached_prompt_tokens(fleet):
    metrics = fleet.engine("timing")["metrics_url"]
    ttft = {}
    for n in (100, 6000):
        before = scrape(metrics)
        status, _ = completion(fleet, "timing", words(n, f"ttft{n}x"), max_tokens=1)
        assert status == 200
        ttft[n] = _mean(before, scrape(metrics), "vllm:time_to_first_token_seconds")
    assert ttft[6000] > 5 * ttft[100]


def test_itl_rises_with_batch_size(fleet):
    metrics = fleet.engine("timing")["metrics_url"]
    name = "vllm:inter_token_latency_seconds"
    before = scrape(metrics)
    assert completion(fleet, "timing", words(500, "solo"), max_tokens=60)[0] == 200
    alone = _mean(before, scrape(metrics), name)

    before = scrape(metrics)
    statuses = []
    threads = [
        threading.Thread(target=lambda i=i: statuses.append(
            completion(fleet, "timing", words(500, f"batch{i}x"), max_tokens=60)[0]))
        for i in range(64)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert statuses == [200] * 64
    batched = _mean(before, scrape(metrics), name)
    assert batched > 1.3 * alone


def test_reset_prefix_cache_publishes_all_blocks_cleared(fleet):
    engine = fleet.engine("agg")
    sub = KvSubscriber(engine["kv_events_endpoint"])
    try:
        assert post(engine["api_url"] + "/reset_prefix_cache")[0] == 200
        batches = sub.receive(timeout=WAIT_S, until=lambda got: any(
            ev.get("type") == "AllBlocksCleared" for _, _, b in got for ev in b[1]))
    finally:
        sub.close()
    assert any(ev == {"type": "AllBlocksCleared"} for _, _, b in batches for ev in b[1])
