"""Ingest benchmark: node reports per second through the real server, and latency from
"report sent" to "hot state written" (the server acks a report with ``"ack": true`` only
after its Redis pipeline returned).

A report is 8 GPUs, 2 engines, 4 NICs (~2.3 KB). The load generator runs on the same
machine: ``--nodes`` websocket connections, each an authenticated node, sending open-loop
at ``--rate`` reports/s in total (Poisson-free, evenly paced), acks matched by seq.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pdplane_bench \
    REDIS_URL=redis://127.0.0.1:6379/9 \
    .venv/bin/python bench/ingest_bench.py --nodes 200 --rate 2000 --duration 20 [--workers 2]

It migrates the database, creates a "bench" cluster with the nodes and their tokens,
starts uvicorn on a free port, runs the load, prints a JSON summary and stops the server.

Two more scenarios (issue 20):

    … bench/ingest_bench.py --storm 300     # N never-seen agents connect at once: time
                                            # until each is welcomed (first hellos)
    … bench/ingest_bench.py --restart 500   # N real agent transports (workers_agent/
                                            # transport.py) report; the server is killed
                                            # (SIGKILL) and restarted: time until each is
                                            # welcomed again, reports dropped beyond buffers
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setup_fleet(n: int, cluster_name: str = "bench") -> list[tuple[str, str]]:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from controlplane.telemetry.tokens import issue_token
    from controlplane.topology.models import Cluster, Node, ServedModel

    cluster, _ = Cluster.objects.get_or_create(name=cluster_name)
    ServedModel.objects.get_or_create(cluster=cluster, name="bench-model", defaults=dict(
        layers=80, kv_heads=8, head_dim=128, kv_dtype_bytes=1, weight_bytes=70 * 10**9))
    out = []
    for i in range(n):
        node, _ = Node.objects.get_or_create(cluster=cluster,
                                             hostname=f"{cluster_name}-{i:04d}")
        out.append((node.hostname, issue_token(node)))
    return out


def hello(host: str) -> dict:
    return {"type": "hello", "protocol": [1], "agent_version": "bench", "hostname": host,
            "inventory": {
                "gpus": [{"index": i, "uuid": f"GPU-{host}-{i}", "name": "NVIDIA H200",
                          "memory_total_bytes": 141 * 10**9} for i in range(8)],
                "nics": [{"name": f"mlx5_{i}", "line_rate_gbps": 400,
                          "transport": "infiniband", "rdma": True} for i in range(4)],
                "engines": [{"id": f"e{j}", "model": "bench-model", "kind": "vllm",
                             "gpus": [4 * j + k for k in range(4)], "tp": 4, "role": "both",
                             "api_url": f"http://10.0.0.1:{8000 + j}"} for j in range(2)]}}


def report(seq: int) -> dict:
    return {"type": "report", "seq": seq, "ts": time.time(), "ack": True,
            "gpus": [{"index": i, "memory_used_bytes": 120 * 10**9 + seq % 1000,
                      "memory_total_bytes": 141 * 10**9, "utilization": 0.73,
                      "temperature_c": 61.0, "power_w": 612.5, "nvlink_tx_gbps": 120.4,
                      "nvlink_rx_gbps": 118.9} for i in range(8)],
            "engines": [{"id": f"e{j}", "up": True, "role": "both", "running": 42,
                         "waiting": 3, "kv_blocks_used": 31000, "kv_blocks_total": 52000,
                         "kv_usage": 0.596, "prefix_hit_rate": 0.41,
                         "prompt_tokens_per_s": 18250.5, "generation_tokens_per_s": 3120.2,
                         "ttft_p50_s": 0.182, "ttft_p95_s": 0.611, "itl_p50_s": 0.021,
                         "itl_p95_s": 0.044, "preemptions": 0,
                         "kv_events": {"blocks": 30872, "digest": "9f0c1b2a3d4e5f60",
                                       "last_seq": seq, "gaps": 0, "replayed": 0,
                                       "lost": 0}} for j in range(2)],
            "nics": [{"name": f"mlx5_{i}", "tx_gbps": 81.2, "rx_gbps": 77.5, "rx_errors": 0,
                      "tx_errors": 0, "rx_drops": 0, "tx_drops": 0} for i in range(4)],
            "agent": {"dropped_reports": 0, "buffered": 0, "reconnects": 0}}


async def node_client(url, host, token, rate, start_at, stop_at, lat, counts):
    import orjson
    from websockets.asyncio.client import connect

    async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                       max_size=2**22, ping_interval=None) as ws:
        await ws.send(orjson.dumps(hello(host)).decode())
        welcome = orjson.loads(await ws.recv())
        assert welcome["type"] == "welcome", welcome
        sent: dict[int, float] = {}

        async def reader():
            async for raw in ws:
                msg = orjson.loads(raw)
                t = time.perf_counter()
                if msg.get("type") == "ack":
                    t0 = sent.pop(msg["seq"], None)
                    if t0 is not None:
                        lat.append(t - t0)
                        counts["acked"] += 1
                else:
                    counts["errors"] += 1
                    counts.setdefault("codes", {}).setdefault(msg.get("code"), 0)
                    counts["codes"][msg.get("code")] += 1

        task = asyncio.create_task(reader())
        await asyncio.sleep(max(0.0, start_at - time.perf_counter()))
        interval = 1.0 / rate
        # Serialise once; only seq and ts change (keeps the generator's CPU for sending).
        body = orjson.dumps({k: v for k, v in report(0).items()
                             if k not in ("type", "seq", "ts")}).decode()[1:]
        seq = 0
        next_at = time.perf_counter()
        while time.perf_counter() < stop_at:
            seq += 1
            frame = f'{{"type":"report","seq":{seq},"ts":{time.time()},{body}'

            sent[seq] = time.perf_counter()
            await ws.send(frame)
            counts["sent"] += 1
            next_at += interval
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.sleep(1.0)  # let the last acks arrive
        counts["unacked"] += len(sent)
        task.cancel()


def server_cpu_s(pid: int) -> float | None:
    """CPU seconds used so far by the server and its worker processes (psutil if present)."""
    try:
        import psutil
    except ImportError:
        return None
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
        return sum(sum(p.cpu_times()[:2]) for p in procs)
    except psutil.Error:
        return None


async def run_load(url, fleet, rate, duration, warmup, server_pid=None):
    lat: list[float] = []
    counts = {"sent": 0, "acked": 0, "errors": 0, "unacked": 0}
    per_node = rate / len(fleet)
    t0 = time.perf_counter() + 2.0
    stop_at = t0 + warmup + duration
    warm_lat: list[float] = []
    clients = [asyncio.create_task(node_client(url, h, t, per_node, t0 + (i / len(fleet)) /
                                               per_node, stop_at, lat, counts))
               for i, (h, t) in enumerate(fleet)]

    async def mark_warm():
        await asyncio.sleep(max(0.0, t0 + warmup - time.perf_counter()))
        warm_lat.extend(lat)
        counts["acked_at_warm"] = counts["acked"]
        counts["cpu_at_warm"] = server_cpu_s(server_pid) if server_pid else None
        await asyncio.sleep(max(0.0, stop_at - time.perf_counter()))
        counts["cpu_at_stop"] = server_cpu_s(server_pid) if server_pid else None

    await asyncio.gather(mark_warm(), *clients)
    measured = lat[len(warm_lat):]
    acked = counts["acked"] - counts["acked_at_warm"]
    return measured, acked, counts


def pct(values, q):
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# --------------------------------------------------------------------------- storm


async def storm(url: str, fleet) -> dict:
    """Every agent connects and says hello at the same instant; seconds until welcomed."""
    import orjson
    from websockets.asyncio.client import connect

    t0 = time.perf_counter()

    async def one(host, token):
        async with connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                           open_timeout=120, ping_interval=None) as ws:
            await ws.send(orjson.dumps(hello(host)).decode())
            welcome = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
            assert welcome["type"] == "welcome", welcome
            welcomed = time.perf_counter() - t0
            # The first report waits for its node's inventory reconcile (rows created).
            await ws.send(orjson.dumps(report(1)).decode())
            ack = orjson.loads(await asyncio.wait_for(ws.recv(), 120))
            assert ack == {"type": "ack", "seq": 1}, ack
            return welcomed, time.perf_counter() - t0

    results = await asyncio.gather(*(one(h, t) for h, t in fleet))
    times = sorted(w for w, _ in results)
    acks = sorted(a for _, a in results)
    return {"agents": len(times), "welcomed_p50_s": round(pct(times, 0.5), 2),
            "welcomed_p90_s": round(pct(times, 0.9), 2), "all_welcomed_s": round(times[-1], 2),
            "first_report_acked_p50_s": round(pct(acks, 0.5), 2),
            "all_first_reports_acked_s": round(acks[-1], 2)}


# --------------------------------------------------------------------------- restart


class FakeAgent:
    """What AgentTransport needs of an Agent: the bench's hello and numbered reports."""

    def __init__(self, host: str):
        self.host, self.seq, self.hooks, self.engine_ids = host, 0, {}, ["e0", "e1"]

    def hello(self) -> dict:
        return hello(self.host)

    async def acollect(self, counters: dict) -> dict:
        self.seq += 1
        return report(self.seq) | {"agent": counters}

    def inventory_changed(self) -> bool:
        return False


async def restart_run(url: str, fleet, start_server, kill_server, settle_s: float,
                      ready) -> dict:
    """Agents report until all are connected; SIGKILL the server, start it again; time
    until each is welcomed again (AgentTransport's own backoff with full jitter)."""
    import logging

    from workers_agent.config import AgentConfig
    from workers_agent.transport import AgentTransport

    logging.getLogger("workers_agent").setLevel(logging.ERROR)
    transports = [AgentTransport(AgentConfig(server=url, token=t, hostname=h, heartbeat_s=20),
                                 FakeAgent(h)) for h, t in fleet]
    tasks = [asyncio.create_task(tr.run()) for tr in transports]
    deadline = time.monotonic() + 300
    while not (all(tr.connected.is_set() for tr in transports)
               and await asyncio.to_thread(ready)):  # every inventory stored
        if time.monotonic() > deadline:
            raise TimeoutError("not every agent connected before the kill")
        await asyncio.sleep(0.5)
    await asyncio.sleep(settle_s)  # steady reporting
    back: dict[int, float] = {}
    kill_server()
    killed_at = time.perf_counter()
    while any(tr.connected.is_set() for tr in transports):  # they notice the dead server
        await asyncio.sleep(0.05)
    start_server()
    restarted_in = time.perf_counter() - killed_at
    while len(back) < len(transports) and time.perf_counter() - killed_at < 300:
        for i, tr in enumerate(transports):
            if i not in back and tr.connected.is_set():
                back[i] = time.perf_counter() - killed_at
        await asyncio.sleep(0.05)
    await asyncio.sleep(5)  # buffers drain after the reconnect
    dropped = sum(tr.buffer.dropped for tr in transports)
    buffered = sum(len(tr.buffer) for tr in transports)
    for tr in transports:
        tr.stop()
    await asyncio.gather(*tasks, return_exceptions=True)
    times = sorted(back.values())
    return {"agents": len(transports), "back": len(times),
            "restart_issued_s": round(restarted_in, 2),
            "back_p90_s": round(pct(times, 0.9), 2) if times else None,
            "all_back_s": round(times[-1], 2) if len(times) == len(transports) else None,
            "reports_dropped_beyond_buffers": dropped, "still_buffered": buffered,
            "buffer_size": transports[0].cfg.buffer_size}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--rate", type=float, default=2000, help="total reports/s offered")
    ap.add_argument("--duration", type=float, default=20)
    ap.add_argument("--warmup", type=float, default=3)
    ap.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--storm", type=int, metavar="N",
                    help="N never-seen agents connect at once; time until all are welcomed")
    ap.add_argument("--restart", type=int, metavar="N",
                    help="N agents report; kill -9 the server, restart it; time until all "
                         "are back")
    args = ap.parse_args()
    if not os.environ.get("DATABASE_URL") or not os.environ.get("REDIS_URL"):
        print("set DATABASE_URL and REDIS_URL", file=sys.stderr)
        return 2
    scenario = args.storm or args.restart
    # Storm and restart: a fresh cluster, so every hello is a node's first (rows created).
    cluster_name = f"storm-{uuid.uuid4().hex[:6]}" if scenario else "bench"
    fleet = setup_fleet(scenario or args.nodes, cluster_name)
    port = args.port or free_port()
    prefix = f"bench:{uuid.uuid4().hex[:6]}:"
    env = dict(os.environ, PDPLANE_TELEMETRY_PREFIX=prefix,
               PDPLANE_AGENT_MAX_REPORTS_PER_S=str(max(50.0, 4 * args.rate / args.nodes)),
               PDPLANE_AGENT_REPORT_BURST="100", LOG_LEVEL="WARNING")
    from controlplane.core.wsprotocol import UVICORN_WS

    command = [sys.executable, "-m", "uvicorn", "controlplane.asgi:application", "--host",
               "127.0.0.1", "--port", str(port), "--workers", str(args.workers),
               "--log-level", "warning", "--no-access-log", "--ws", UVICORN_WS,
               "--backlog", "4096"]
    server = subprocess.Popen(command, cwd=ROOT, env=env)

    def wait_listening():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return
            except OSError:
                time.sleep(0.05)

    try:
        wait_listening()
        time.sleep(1.0)
        try:
            import uvloop

            uvloop.install()
        except ImportError:
            pass
        url = f"ws://127.0.0.1:{port}/ws/agent/v1/"
        if scenario:
            def kill():
                server.kill()  # SIGKILL: no graceful close for anyone
                server.wait()

            def start():
                nonlocal server
                server = subprocess.Popen(command, cwd=ROOT, env=env)

            def ready() -> bool:
                from controlplane.topology.models import Worker

                workers = Worker.objects.filter(node__cluster__name=cluster_name).count()
                return workers >= 2 * len(fleet)

            result = (asyncio.run(storm(url, fleet)) if args.storm else
                      asyncio.run(restart_run(url, fleet, start, kill, 6.0, ready)))
            result.update(load_avg_1m=round(os.getloadavg()[0], 1), cpus=os.cpu_count())
            print(json.dumps(result))
            return 0
        lat, acked, counts = asyncio.run(run_load(url, fleet, args.rate, args.duration,
                                                  args.warmup, server.pid))
        cpu = None
        if counts.get("cpu_at_warm") is not None and counts.get("cpu_at_stop") is not None:
            cpu = counts["cpu_at_stop"] - counts["cpu_at_warm"]
        summary = {
            "nodes": args.nodes, "workers": args.workers, "offered_per_s": args.rate,
            "duration_s": args.duration,
            "acked_per_s": round(acked / args.duration, 1),
            "p50_ms": round(pct(lat, 0.50) * 1000, 2) if lat else None,
            "p99_ms": round(pct(lat, 0.99) * 1000, 2) if lat else None,
            "max_ms": round(max(lat) * 1000, 2) if lat else None,
            "mean_ms": round(statistics.fmean(lat) * 1000, 2) if lat else None,
            "server_cpu_us_per_report": round(cpu / acked * 1e6, 1) if cpu and acked else None,
            "server_cpu_cores": round(cpu / args.duration, 2) if cpu else None,
            "load_avg_1m": round(os.getloadavg()[0], 1),
            "sent": counts["sent"], "errors": counts["errors"], "unacked": counts["unacked"],
            "error_codes": counts.get("codes", {}),
        }
        print(json.dumps(summary))
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
        import redis

        r = redis.Redis.from_url(os.environ["REDIS_URL"])
        keys = list(r.scan_iter(prefix + "*"))
        if keys:
            r.delete(*keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
