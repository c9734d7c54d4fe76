"""A real agent's report changes a GPU's bars on an open page, without a reload.

uvicorn + PostgreSQL + Redis + a simulated node + a real ``pdplane-agent`` process +
headless Chromium. The page is opened before the agent connects: the node has no GPUs
and "no data"; the agent's hello adds them and its reports fill the bars, all pushed over
the page's websocket.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from django.contrib.auth import get_user_model

from controlplane.accounts.access import set_role
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import Cluster, Node, ServedModel
from tests.conftest import ROOT, START_S, free_port, python_env

from .conftest import WAIT_MS, login, screenshot

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

HOST = "browser-node-1"


def _stop(proc):
    if proc and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture
def sim_node(tmp_path):
    telemetry = free_port()
    config = {
        "time_scale": 1.0, "host": "127.0.0.1",
        "nodes": [{"hostname": HOST, "gpu": "H200", "gpu_count": 2, "nvlink_group_size": 2,
                   "nics": [{"name": "ib0", "line_rate_gbps": 400, "transport": "infiniband",
                             "rdma": True}], "telemetry_port": telemetry}],
        "engines": [{"id": f"engine-{i}", "node": HOST, "model": "llama-3.1-8b", "gpus": [i],
                     "tp": 1, "role": "both"} for i in range(2)],
    }
    (tmp_path / "fleet.json").write_text(json.dumps(config))
    endpoints = tmp_path / "endpoints.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers_agent.sim.cli", "run", "--config",
         str(tmp_path / "fleet.json"), "--endpoints-out", str(endpoints)],
        cwd=ROOT, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + START_S
        while not endpoints.exists():
            assert proc.poll() is None and time.monotonic() < deadline, "sim did not start"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{telemetry}"
    finally:
        _stop(proc)


def test_agent_report_fills_gpu_bars_without_reload(asgi_server, sim_node, page, tmp_path):
    cluster = Cluster.objects.create(name="browser")
    node = Node.objects.create(cluster=cluster, hostname=HOST, rack="r1")
    ServedModel.objects.create(cluster=cluster, name="llama-3.1-8b", layers=32, kv_heads=8,
                               head_dim=128, kv_dtype_bytes=2, weight_bytes=16 * 10**9)
    token_file = tmp_path / "agent.token"
    token_file.write_text(issue_token(node))
    user = get_user_model().objects.create_user("viewer1", password="correct-horse-battery")
    set_role(user, "viewer")

    login(page, asgi_server, "viewer1", "correct-horse-battery")
    page.goto(f"{asgi_server}/?cluster=browser")
    page.wait_for_selector("#live-status.on")
    card = f"#node-{node.pk}"
    assert page.locator(f"{card} .gpu").count() == 0
    assert "never" in page.inner_text(f"{card} .seen")

    ws_url = asgi_server.replace("http://", "ws://") + "/ws/agent/v1/"
    agent = subprocess.Popen(
        [sys.executable, "-m", "workers_agent.cli", "--server", ws_url, "--token-file",
         str(token_file), "--hostname", HOST, "--sim-node-url", sim_node,
         "--report-interval", "1", "--log-level", "WARNING"],
        cwd=ROOT, env=python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        # Same page, no reload: the hello's GPUs appear, then reports fill memory bars.
        page.wait_for_selector(f"{card} .gpu .bar.mem:not(.nodata)", timeout=WAIT_MS)
        assert page.locator(f"{card} .gpu").count() == 2
        title = page.get_attribute(f"{card} .gpu .bar.mem", "title")
        assert title.startswith("memory ") and title != "memory no data"
        screenshot(page, "topology-live-agent")
    finally:
        _stop(agent)
