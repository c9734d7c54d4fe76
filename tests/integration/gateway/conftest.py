"""Fixtures for the gateway and routing-delivery integration tests: a simulated fleet, a
gateway subprocess, a Celery worker on the test database. Everything started here is
stopped in teardown; every wait has a timeout; loopback only."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.conftest import ROOT, START_S, WAIT_S, free_port, python_env, stop_process, wait_for_port

MODEL = "llama-3.3-70b-fp8"


def fleet_config(engines: list[tuple[str, str]], time_scale: float = 0.05) -> dict:
    """One node per engine, so killing a node process kills exactly one engine."""
    nodes, entries = [], []
    for i, (engine_id, role) in enumerate(engines):
        host = f"n{i}"
        nodes.append({"hostname": host, "gpu": "H200", "gpu_count": 1, "nvlink_group_size": 0,
                      "nics": [{"name": "eth0", "line_rate_gbps": 100,
                                "transport": "ethernet", "rdma": False}]})
        entries.append({"id": engine_id, "node": host, "model": MODEL, "gpus": [0],
                        "role": role, "block_size": 16})
    return {"time_scale": time_scale, "nodes": nodes, "engines": entries}


class SimFleet:
    def __init__(self, engines, time_scale=0.05):
        from workers_agent.sim.fleetconfig import parse_fleet_config
        from workers_agent.sim.launcher import FleetProcesses

        self.fleet = FleetProcesses(parse_fleet_config(fleet_config(engines, time_scale)))
        self.endpoints = self.fleet.endpoints
        self.by_id = {e["id"]: e for e in self.endpoints["engines"]}

    def start(self):
        self.fleet.start(timeout=START_S)
        return self

    def kill_engine(self, engine_id: str) -> None:
        node = self.by_id[engine_id]["node"]
        proc = self.fleet.procs[node]
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)

    def restart_engine(self, engine_id: str) -> None:
        """Kill the engine's node process and start it again on the same ports: a real
        engine restart (empty cache, KV-event sequence numbers from 0 again)."""
        node = self.by_id[engine_id]["node"]
        if self.fleet.procs[node].poll() is None:
            self.kill_engine(engine_id)
        self.fleet.procs[node] = subprocess.Popen(
            [sys.executable, "-m", "workers_agent.sim.cli", "node", "--config",
             str(self.fleet.config_path), "--node", node, "--log-level", "WARNING"],
            cwd=ROOT, stdin=subprocess.DEVNULL)
        self.fleet.wait_ready(START_S)

    def metric(self, engine_id: str, name: str, **labels) -> float:
        """Sum of a metric family's samples on one engine (0 if absent)."""
        url = self.by_id[engine_id]["metrics_url"]
        text = urllib.request.urlopen(url, timeout=WAIT_S).read().decode()
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name) or line.startswith("#"):
                continue
            head, _, value = line.rpartition(" ")
            series = head.split("{", 1)[0]
            if series != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def stop(self):
        self.fleet.stop()


@pytest.fixture
def sim_fleet():
    started = []

    def start(engines, time_scale=0.05):
        fleet = SimFleet(engines, time_scale)
        started.append(fleet)
        return fleet.start()

    yield start
    for fleet in started:
        fleet.stop()


class GatewayProcess:
    def __init__(self, tmp_path: Path, *args: str, secret: str = "gw-secret",  # noqa: S107
                 port=None):
        self.port = port or free_port()
        self.secret = secret
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        self.log_path = tmp_path / f"gateway-{self.port}-{uuid.uuid4().hex[:4]}.log"
        self.proc: subprocess.Popen | None = None

    def start(self, wait_healthy: bool = True) -> GatewayProcess:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "--port", str(self.port), "--log-level", "INFO",
             "--seed", "7", *self.args],
            cwd=ROOT, env=python_env(PDPLANE_GATEWAY_SECRET=self.secret),
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_for_port(self.port, process=self.proc)
        if wait_healthy:
            self.wait_health()
        return self

    def wait_health(self, version: int | None = None, timeout: float = WAIT_S) -> dict:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                # Each try may take what is left: a starved gateway can be slow to answer.
                with urllib.request.urlopen(self.url + "/health",
                                            timeout=max(deadline - time.monotonic(), 0.1)) as r:
                    last = json.loads(r.read())
                    if version is None or last.get("table_version") == version:
                        return last
            except OSError as exc:
                last = exc
            time.sleep(0.1)
        raise TimeoutError(f"gateway not healthy at v{version}: {last}; log: {self.tail()}")

    def admin_table(self) -> dict:
        from gateway.signing import signed_headers

        headers = signed_headers(self.secret, "GET", "/admin/routing-table", b"", now=time.time())
        req = urllib.request.Request(self.url + "/admin/routing-table", headers=headers)
        with urllib.request.urlopen(req, timeout=WAIT_S) as r:
            return json.loads(r.read())

    def put_table(self, table: dict, secret: str | None = None) -> tuple[int, dict]:
        from gateway.signing import signed_headers

        body = json.dumps(table).encode()
        headers = {"Content-Type": "application/json",
                   **signed_headers(secret or self.secret, "PUT", "/admin/routing-table", body,
                                    now=time.time())}
        req = urllib.request.Request(self.url + "/admin/routing-table", data=body,
                                     headers=headers, method="PUT")
        try:
            with urllib.request.urlopen(req, timeout=WAIT_S) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"{}")

    def tail(self, n: int = 2000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(Exception):
            self.log.close()


@pytest.fixture
def gateway_process(tmp_path):
    started = []

    def start(*args, wait_healthy=True, port=None, **kwargs):
        gw = GatewayProcess(tmp_path, *args, port=port, **kwargs)
        started.append(gw)
        return gw.start(wait_healthy=wait_healthy)

    yield start
    for gw in started:
        gw.stop()


def write_json(path: Path, data) -> str:
    path.write_text(json.dumps(data))
    return str(path)


def post(url: str, body: dict, timeout: float = WAIT_S, headers=None):
    """POST JSON; returns (status, headers, raw body bytes)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def sse_events(raw: bytes) -> list:
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] or "postgres"
    if s.get("PASSWORD"):
        auth += f":{s['PASSWORD']}"
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


class CeleryWorker:
    """``celery -A controlplane worker -P solo`` on the test database and a private queue."""

    def __init__(self, queue: str, log_path: Path):
        self.queue, self.log_path = queue, log_path
        self.proc: subprocess.Popen | None = None

    def start(self) -> CeleryWorker:
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "worker", "-P", "solo",
             "-Q", self.queue, "-n", f"{self.queue}@localhost", "--without-gossip",
             "--without-mingle", "--without-heartbeat", "-l", "INFO"],
            cwd=ROOT,
            env=python_env(DATABASE_URL=database_url(),
                           DJANGO_SETTINGS_MODULE="controlplane.settings"),
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        return self

    def tail(self, n: int = 3000) -> str:
        try:
            return self.log_path.read_text()[-n:]
        except OSError:
            return ""

    def stop(self) -> None:
        stop_process(self.proc)
        with contextlib.suppress(Exception):
            self.log.close()


@pytest.fixture
def celery_worker(tmp_path, settings):
    queue = f"routing-test-{uuid.uuid4().hex[:8]}"
    settings.ROUTING_PUSH_QUEUE = queue
    worker = CeleryWorker(queue, tmp_path / "celery.log").start()
    yield worker
    worker.stop()


def wait_until(predicate, timeout: float = WAIT_S, interval: float = 0.1, message: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(message or "condition not met in time")
