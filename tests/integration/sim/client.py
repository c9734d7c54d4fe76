"""A client of the simulated fleet written from the reference only (ENGINES.md, docs/sim.md):
it never imports workers_agent.sim. It starts fleets through the `pdplane-sim` command line
and talks HTTP (urllib), Prometheus text (prometheus_client's parser) and ZMQ + msgpack."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import msgpack
import zmq
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import START_S, WAIT_S

ROOT = Path(__file__).resolve().parents[3]


class RunningFleet:
    def __init__(self, proc: subprocess.Popen, endpoints: dict, workdir: Path):
        self.proc = proc
        self.endpoints = endpoints
        self.workdir = workdir

    def engine(self, engine_id: str) -> dict:
        return next(e for e in self.endpoints["engines"] if e["id"] == engine_id)

    def node(self, hostname: str) -> dict:
        return next(n for n in self.endpoints["nodes"] if n["hostname"] == hostname)

    def stop(self, sig: int = signal.SIGINT, timeout: float = WAIT_S) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        return self.proc.returncode


def start_fleet(config: dict, workdir: Path, *extra: str,
                timeout: float = START_S) -> RunningFleet:
    config_path = workdir / "fleet.json"
    endpoints_path = workdir / "endpoints.json"
    config_path.write_text(json.dumps(config))
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers_agent.sim.cli", "run", "--config", str(config_path),
         "--endpoints-out", str(endpoints_path), *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + timeout
    while not endpoints_path.exists():
        if proc.poll() is not None:
            raise RuntimeError(f"pdplane-sim exited early: {proc.stdout.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait(timeout=5)
            raise TimeoutError("pdplane-sim did not write its endpoints")
        time.sleep(0.05)
    return RunningFleet(proc, json.loads(endpoints_path.read_text()), workdir)


def http(method: str, url: str, body=None, headers=None, timeout: float = WAIT_S,
         raw: bytes | None = None):
    """(status, decoded JSON or text)."""
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, payload, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
    except urllib.error.HTTPError as exc:
        status, payload, ctype = exc.code, exc.read(), exc.headers.get("Content-Type", "")
    if "json" in ctype:
        return status, json.loads(payload)
    return status, payload.decode()


def post(url: str, body=None, **kw):
    return http("POST", url, body, **kw)


def get(url: str, **kw):
    return http("GET", url, **kw)


def sse_events(url: str, body: dict, timeout: float = WAIT_S) -> list:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        for line in resp:
            line = line.decode().strip()
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def scrape(metrics_url: str) -> dict:
    """{family name: [samples]} from an engine's /metrics."""
    status, text = get(metrics_url)
    assert status == 200
    return {fam.name: fam for fam in text_string_to_metric_families(text)}


def value(families: dict, name: str, sample: str | None = None, **labels) -> float:
    """Sum of the samples of a family (counters: the _total sample) matching labels."""
    fam = families.get(name)
    if fam is None:
        return 0.0
    wanted = sample or (name + "_total" if fam.type == "counter" else name)
    return sum(
        s.value for s in fam.samples
        if s.name == wanted and all(s.labels.get(k) == v for k, v in labels.items())
    )


class KvSubscriber:
    """SUB to an engine's KV-event endpoint; decodes vLLM 0.32 batches."""

    def __init__(self, endpoint: str):
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        time.sleep(0.3)  # PUB/SUB joins asynchronously ("slow joiner")

    def receive(self, timeout: float = 5.0, until=None) -> list[tuple[str, int, object]]:
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.sub.poll(50):
                if until is not None and until(out):
                    break
                continue
            topic, seq, payload = self.sub.recv_multipart()
            out.append((topic.decode(), int.from_bytes(seq, "big"), msgpack.unpackb(payload)))
            if until is not None and until(out):
                break
        return out

    def close(self):
        self.sub.close(0)
        self.ctx.term()


def replay(endpoint: str, start_seq: int, timeout: float = WAIT_S) -> list[tuple[int, object]]:
    """Ask a replay ROUTER for batches from start_seq (DEALER sends [b"", seq])."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    try:
        sock.send_multipart([b"", start_seq.to_bytes(8, "big")])
        out = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not sock.poll(100):
                continue
            frames = sock.recv_multipart()
            assert frames[0] == b""
            seq = int.from_bytes(frames[1], "big", signed=True)
            if seq == -1:
                return out
            out.append((seq, msgpack.unpackb(frames[2])))
        raise TimeoutError("no end-of-replay marker")
    finally:
        sock.close(0)
        ctx.term()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    with contextlib.suppress(OSError):
        stat = Path(f"/proc/{pid}/stat").read_text()
        if stat.split(")")[-1].split()[0] == "Z":
            return False
    return True
