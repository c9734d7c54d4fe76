"""`pdplane-sim run`: starts a fleet from a config, prints and writes its endpoints, and stops
every node process on SIGINT/SIGTERM."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, START_S, WAIT_S
from tests.integration.sim.client import KvSubscriber, get, pid_alive, post, start_fleet

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

TWO_NODES = {
    "time_scale": 0.05,
    "nodes": [
        {"hostname": "alpha", "gpu": "L40S", "gpu_count": 2,
         "nics": [{"name": "eth0", "line_rate_gbps": 100, "transport": "ethernet"}]},
        {"hostname": "beta", "gpu": "L40S", "gpu_count": 2,
         "nics": [{"name": "eth0", "line_rate_gbps": 100, "transport": "ethernet"}]},
    ],
    "engines": [
        {"id": "engine-0", "node": "alpha", "model": "llama-3.1-8b", "gpus": [0]},
        {"id": "engine-0", "node": "beta", "model": "llama-3.1-8b", "gpus": [0],
         "served_model_name": "meta-llama/Llama-3.1-8B-Instruct"},
    ],
}


def _wait_gone(pids, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_two_node_fleet_starts_serves_and_stops_cleanly(tmp_path, sig):
    fleet = start_fleet(TWO_NODES, tmp_path)
    try:
        doc = fleet.endpoints
        assert [n["hostname"] for n in doc["nodes"]] == ["alpha", "beta"]
        assert len(doc["engines"]) == 2
        pids = set()
        for node in doc["nodes"]:
            status, snap = get(node["telemetry_url"])
            assert status == 200 and snap["hostname"] == node["hostname"]
            assert snap["gpus"][0]["name"] == "NVIDIA L40S"
            pids.add(snap["pid"])
        assert len(pids) == 2 and fleet.proc.pid not in pids  # one process per node
        beta = next(e for e in doc["engines"] if e["node"] == "beta")
        status, body = post(beta["api_url"] + "/v1/completions", {
            "model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "hello", "max_tokens": 2})
        assert status == 200 and body["usage"]["completion_tokens"] == 2
    finally:
        code = fleet.stop(sig)
    assert code == 0
    output = fleet.proc.stdout.read()
    assert "engine engine-0 [both]" in output and "stopped" in output
    assert _wait_gone(pids), "node processes outlived the launcher"


def test_in_process_fleet_with_map_encoded_kv_batches(tmp_path):
    fleet = start_fleet(TWO_NODES, tmp_path, "--in-process", "--kv-batch-format", "map")
    try:
        pids = {get(n["telemetry_url"])[1]["pid"] for n in fleet.endpoints["nodes"]}
        assert pids == {fleet.proc.pid}
        engine = fleet.endpoints["engines"][0]
        sub = KvSubscriber(engine["kv_events_endpoint"])
        try:
            status, _ = post(engine["api_url"] + "/v1/completions", {
                "prompt": " ".join(["tok"] * 40), "max_tokens": 1})
            assert status == 200
            batches = sub.receive(timeout=WAIT_S, until=bool)
        finally:
            sub.close()
        _topic, seq, batch = batches[0]
        assert seq == 0
        assert set(batch) == {"ts", "events", "data_parallel_rank"}
        assert batch["events"][0]["type"] == "BlockStored"
    finally:
        assert fleet.stop() == 0


def test_invalid_config_is_refused_with_a_reason(tmp_path):
    bad = dict(TWO_NODES, engines=[{"id": "x", "node": "nowhere", "model": "llama-3.1-8b",
                                     "gpus": [0]}])
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    result = subprocess.run(
        [sys.executable, "-m", "workers_agent.sim.cli", "run", "--config", str(path)],
        cwd=ROOT, capture_output=True, text=True, timeout=START_S,
    )
    assert result.returncode == 2
    assert "unknown node 'nowhere'" in result.stderr


def test_example_config_is_a_valid_fleet(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "workers_agent.sim.cli", "example-config", "--nodes", "1",
         "--gpu", "L4", "--model", "llama-3.1-8b", "--gpus-per-node", "1",
         "--engines-per-node", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=START_S,
    )
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    config["time_scale"] = 0.05
    fleet = start_fleet(config, tmp_path)
    try:
        engine = fleet.endpoints["engines"][0]
        assert get(engine["api_url"] + "/health")[0] == 200
    finally:
        assert fleet.stop() == 0
