"""End to end: uvicorn (real ASGI server) + Postgres + Redis + a simulated node + a real
``pdplane-agent`` process.

One scenario, so the processes start once (~1 min in all):
reports arrive and the hot state matches the engines' own metrics; KV block counts match
the engine's own event stream, including an engine whose publisher drops every 4th batch
(gap detected and replayed); a command round-trips through the agent's hook to the sim;
the server restarts, the agent reconnects (jittered backoff) and the state recovers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

import msgpack
import pytest
import zmq

from controlplane.telemetry import enginestats, hotstate
from controlplane.telemetry.commands import command_status, send_command
from controlplane.telemetry.tokens import issue_token
from controlplane.topology.models import GPU, Cluster, Node, ServedModel, Worker
from tests.conftest import (
    ROOT,
    START_S,
    WAIT_S,
    free_port,
    python_env,
    stop_process,
    wait_for_port,
    wait_until,
)

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True),
              pytest.mark.timeout(240)]

MODEL = "llama-3.1-8b"
HOST = "sim-agent-1"


def http_json(url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def database_url() -> str:
    from django.db import connection

    s = connection.settings_dict
    auth = s["USER"] + (f":{s['PASSWORD']}" if s["PASSWORD"] else "")
    return f"postgres://{auth}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"


def independent_block_count(replay_endpoint: str) -> tuple[int, int]:
    """The engine's cached blocks rebuilt from its own replay buffer with a plain decoder
    (not the agent's code): (blocks, batches). Requires the buffer to start at seq 0."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(replay_endpoint)
    sock.send_multipart([b"", (0).to_bytes(8, "big")])
    blocks, seqs = set(), []
    try:
        while sock.poll(3000):
            frames = sock.recv_multipart()[1:]
            seq = int.from_bytes(frames[-2], "big", signed=True)
            if seq == -1:
                break
            seqs.append(seq)
            batch = msgpack.unpackb(frames[-1], raw=False, strict_map_key=False)
            events = batch["events"] if isinstance(batch, dict) else batch[1]
            for ev in events:
                kind = ev["type"] if isinstance(ev, dict) else ev[0]
                hashes = ev["block_hashes"] if isinstance(ev, dict) else ev[1]
                if kind == "BlockStored":
                    blocks.update(hashes)
                elif kind == "BlockRemoved":
                    blocks.difference_update(hashes)
                elif kind == "AllBlocksCleared":
                    blocks.clear()
    finally:
        sock.close(linger=0)
    assert seqs == list(range(len(seqs))), "replay buffer must hold the whole stream"
    return len(blocks), len(seqs)


def one_node_fleet(host: str, engines: int, time_scale: float, **engine_extras: dict) -> dict:
    """A `pdplane-sim run` config: one H200 node with ``engines`` TP1 engines of MODEL (one
    per GPU, all on one NVLink group, a 400 G RDMA NIC), every port chosen by the OS.
    ``engine_extras`` adds options per engine id, e.g. ``e1={"drop_kv_batch_every": 4}``."""
    return {
        "time_scale": time_scale,
        "nodes": [{"hostname": host, "gpu": "H200", "gpu_count": engines,
                   "nvlink_group_size": engines,
                   "nics": [{"name": "mlx5_0", "line_rate_gbps": 400,
                             "transport": "infiniband", "rdma": True}],
                   "telemetry_port": 0}],
        "engines": [
            {"id": f"e{i}", "node": host, "model": MODEL, "gpus": [i], "role": "both",
             "http_port": 0, "kv_events_port": 0, "kv_replay_port": 0,
             **engine_extras.get(f"e{i}", {})}
            for i in range(engines)
        ],
    }


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


@pytest.fixture
def sim_fleet(workdir):
    fleet = one_node_fleet(HOST, 2, 1.0, e1={"drop_kv_batch_every": 4})
    (workdir / "fleet.json").write_text(json.dumps(fleet))
    endpoints = workdir / "endpoints.json"
    with open(workdir / "sim.log", "w") as log:  # the child keeps its own copy of the fd
        proc = subprocess.Popen(
            [sys.executable, "-m", "workers_agent.sim.cli", "run", "--config",
             str(workdir / "fleet.json"), "--endpoints-out", str(endpoints), "--in-process"],
            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(endpoints.exists, 60, what="sim endpoints")
        yield json.loads(endpoints.read_text())
    finally:
        stop_process(proc)


class Server:
    def __init__(self, env, port, log: Path):
        self.env, self.port, self.log, self.proc = env, port, log, None

    def start(self):
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host",
                 "127.0.0.1", "--port", str(self.port), "--log-level", "warning"],
                cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        wait_for_port(self.port, process=self.proc)

    def stop(self):
        stop_process(self.proc)


def test_agent_against_simulated_node(workdir, sim_fleet, settings):
    prefix = f"test:{uuid.uuid4().hex[:8]}:"
    settings.TELEMETRY_REDIS_PREFIX = prefix
    cluster = Cluster.objects.create(name="agent-e2e")
    ServedModel.objects.create(cluster=cluster, name=MODEL, layers=32, kv_heads=8,
                               head_dim=128, kv_dtype_bytes=2, weight_bytes=16 * 10**9)
    node = Node.objects.create(cluster=cluster, hostname=HOST)
    (workdir / "token").write_text(issue_token(node))
    port = free_port()
    env = python_env(DATABASE_URL=database_url(), PDPLANE_TELEMETRY_PREFIX=prefix,
                     PDPLANE_REPORT_INTERVAL_S="0.5", PDPLANE_AGENT_MAX_REPORTS_PER_S="20")
    server = Server(env, port, workdir / "server.log")
    agent = None
    engines = {e["id"]: e for e in sim_fleet["engines"]}
    try:
        server.start()
        with open(workdir / "agent.log", "w") as log:
            agent = subprocess.Popen(
                [sys.executable, "-m", "workers_agent.cli", "--server",
                 f"ws://127.0.0.1:{port}/ws/agent/v1/", "--token-file", str(workdir / "token"),
                 "--hostname", HOST, "--sim-node-url", sim_fleet["nodes"][0]["telemetry_url"]],
                cwd=ROOT, env=python_env(PDPLANE_AGENT_LOG_LEVEL="INFO"),
                stdout=log, stderr=subprocess.STDOUT)

        # 1. Reports arrive; the topology learns the engines.
        wait_until(lambda: Worker.objects.filter(node=node).count() == 2, START_S,
                   what="workers")  # the agent process starts first
        workers = {w.name: w for w in Worker.objects.filter(node=node)}
        gpus = GPU.objects.filter(node=node)
        assert sorted(g.index for g in gpus) == [0, 1]
        assert {g.nvlink_group for g in gpus} == {0}  # one NVLink group of two (sim config)
        wait_until(lambda: hotstate.worker_state(workers["e0"].pk), WAIT_S, what="hot state")

        # 2. Traffic with shared prefixes (KV events, prefix hits), then quiet.
        shared = " ".join(f"word{i}" for i in range(120))
        for i in range(12):
            for eid in ("e0", "e1"):
                http_json(engines[eid]["api_url"] + "/v1/completions",
                          {"model": MODEL, "prompt": f"{shared} question {i} " * 2,
                           "max_tokens": 8})

        def settled(eid):
            own = http_json(engines[eid]["api_url"] + "/sim/v1/engine")
            hot = hotstate.worker_state(workers[eid].pk)
            kv = (hot or {}).get("kv_events") or {}
            if not hot or hot["stale"] or own["stats"]["num_running"]:
                return None
            expected_blocks, batches = independent_block_count(engines[eid]["kv_replay_endpoint"])
            if kv.get("last_seq") != batches - 1 or kv.get("blocks") != expected_blocks:
                return None
            return own, hot, expected_blocks

        for eid in ("e0", "e1"):
            own, hot, expected_blocks = wait_until(lambda eid=eid: settled(eid), WAIT_S,
                                                   what=f"{eid} to settle")
            stats = own["stats"]
            assert hot["kv_blocks_total"] == stats["num_gpu_blocks"] == own["num_gpu_blocks"]
            assert hot["kv_usage"] == pytest.approx(stats["kv_usage"])
            assert hot["running"] == stats["num_running"]
            assert hot["waiting"] == stats["num_waiting"]
            assert hot["kv_events"]["blocks"] == expected_blocks > 0
            assert hot["role"] == "both"
            assert hot["prefix_hit_rate"] is not None and hot["prefix_hit_rate"] > 0
            assert hot["ttft_p95_s"] is not None
            # The engine's cumulative counters and buckets reach hot state (issue 16).
            wid = workers[eid].pk
            snap = wait_until(
                lambda wid=wid: (s := enginestats.read_snapshots([wid])[wid])
                and s[-1].counters.get("request_success") == 12 and s[-1], WAIT_S,
                what=f"{eid} counters in hot state")
            assert snap.histograms["ttft_s"].count == 12
            assert snap.histograms["prompt_tokens"].count == 12
            assert snap.histograms["generation_tokens"].count == 12
            assert snap.counters["generation_tokens"] > 0 and snap.counters["prompt_tokens"] > 0
            assert "counters" not in hot and "histograms" not in hot  # kept out of the state
        e1_kv = hotstate.worker_state(workers["e1"].pk)["kv_events"]
        e1_own = http_json(engines["e1"]["api_url"] + "/sim/v1/engine")
        assert e1_own["kv_events"]["dropped"] > 0
        assert e1_kv["gaps"] > 0 and e1_kv["replayed"] >= e1_kv["gaps"] and e1_kv["lost"] == 0
        node_state = hotstate.node_state(node.pk)
        assert {g["index"] for g in node_state["gpus"]} == {0, 1}
        assert node_state["nics"][0]["name"] == "mlx5_0"

        # 3. A command round-trips: control plane → agent → hook → sim → result.
        cid = send_command(node.pk, "set_role", {"engine": "e0", "role": "prefill"})
        wait_until(lambda: command_status(cid)["status"] == "succeeded", WAIT_S,
                   what="command")
        sim_node = http_json(sim_fleet["nodes"][0]["telemetry_url"])
        assert {e["id"]: e["role"] for e in sim_node["engines"]}["e0"] == "prefill"
        wait_until(lambda: hotstate.worker_state(workers["e0"].pk)["role"] == "prefill", WAIT_S,
                   what="observed role in hot state")
        wait_until(lambda: Worker.objects.get(pk=workers["e0"].pk).observed_role == "prefill",
                   WAIT_S, what="observed role in the database")
        refused = send_command(node.pk, "restart_engine", {"engine": "e0"})
        wait_until(lambda: command_status(refused)["status"] == "refused", WAIT_S,
                   what="refused command")
        assert "no hook" in command_status(refused)["detail"]

        # 4. The server restarts: the agent reconnects and reports resume.
        gen_before = hotstate.node_state(node.pk)["gen"]
        server.stop()
        time.sleep(1.5)
        server.start()
        state = wait_until(
            lambda: (s := hotstate.node_state(node.pk)) and s["gen"] > gen_before
            and not s["stale"] and s, WAIT_S, what="reports after restart")
        assert state["agent"]["reconnects"] >= 1
        assert hotstate.worker_state(workers["e0"].pk)["role"] == "prefill"
    finally:
        stop_process(agent)
        server.stop()
        for name in ("agent.log", "server.log", "sim.log"):
            path = workdir / name
            if path.exists() and os.environ.get("PDPLANE_TEST_VERBOSE"):
                print(f"--- {name}\n{path.read_text()[-4000:]}")
        client = hotstate.sync_redis()
        keys = list(client.scan_iter(prefix + "*"))
        if keys:
            client.delete(*keys)
