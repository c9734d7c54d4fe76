"""The router adapter against the real vllm-router / sglang-router binaries, when installed
(bench/gateway_bench.py installs them in a venv of their own; they are not dependencies)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from gateway.adapters.router_sync import client_for, sync_once
from gateway.statictable import table_from_sim_endpoints
from tests.conftest import WAIT_S, free_ports, require_system_part, stop_process, wait_for_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

PEERS_BIN = Path(os.environ.get("PDPLANE_PEERS_BIN",
                                str(Path.home() / ".cache/pdplane-peers/bin")))


@pytest.mark.parametrize("kind", ["vllm-router", "sglang-router"])
def test_adapter_keeps_router_workers_in_sync(kind, sim_fleet):
    binary = PEERS_BIN / kind
    if not binary.exists():
        require_system_part("peer-routers", f"{kind} is not installed at {binary}",
                            "bash scripts/peer_routers_env.sh (pinned vllm-router, "
                            "sglang-router; PDPLANE_PEERS_BIN=its output)")
    fleet = sim_fleet([("a", "both"), ("b", "both")])
    urls = {e["id"]: e["api_url"] for e in fleet.endpoints["engines"]}
    port, metrics_port = free_ports(2)
    cmd = [str(binary)] + (["launch"] if kind == "sglang-router" else []) + [
        "--host", "127.0.0.1", "--port", str(port), "--prometheus-port", str(metrics_port),
        "--worker-urls", urls["a"], "--policy", "round_robin"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_port(port, process=proc)
        client = client_for(kind, f"http://127.0.0.1:{port}")
        deadline = time.monotonic() + WAIT_S
        while set(client.list()) != {urls["a"]} and time.monotonic() < deadline:
            time.sleep(0.2)  # sglang-router registers --worker-urls in the background
        table = table_from_sim_endpoints(fleet.endpoints)
        table["models"][0]["workers"][0]["state"] = "draining"  # a out, b in
        result = sync_once(client, table)
        assert result == {"added": [urls["b"]], "removed": [urls["a"]]}
        deadline = time.monotonic() + WAIT_S
        while set(client.list()) != {urls["b"]} and time.monotonic() < deadline:
            time.sleep(0.2)  # sglang-router applies changes asynchronously (202)
        assert set(client.list()) == {urls["b"]}
    finally:
        stop_process(proc)
