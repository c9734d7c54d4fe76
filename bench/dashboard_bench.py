"""Dashboard at scale: server-side render time of the topology page, and live coalescing.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pdplane_bench \
    REDIS_URL=redis://127.0.0.1:6379/11 .venv/bin/python bench/dashboard_bench.py

1. Builds a fleet of --nodes nodes × 8 GPUs (one worker per GPU) with hot state for every
   node and worker in Redis, then times the whole topology view (queries + hot state +
   template) through Django's test client, --repeat times: the default view (rack tiles
   above 64 nodes) and one rack's drill-down (its node cards and GPU tiles).
2. Connects one live websocket consumer (in-process) and, for --seconds, does what the
   ingest does when every node reports once a second: rewrites every node's and worker's
   hot state with new numbers (utilisation, queue, KV use move) and sends one hint per
   second with all node ids. Reports fragments/s and bytes/s the client receives.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("PDPLANE_TELEMETRY_PREFIX", "pdp:bench:")
os.environ.setdefault("ALLOWED_HOSTS", "testserver,localhost,127.0.0.1")

import django

django.setup()

import orjson  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

GB = 1000**3


def build_fleet(nodes: int):
    from controlplane.topology.models import GPU, NIC, Cluster, Node, ServedModel, Worker

    # A bench fleet of an earlier run: delete table by table (the ORM's cascade would load
    # all 40,000 GPUs and workers first).
    old = list(Cluster.objects.filter(name="bench").values_list("pk", flat=True))
    if old:
        Worker.gpus.through.objects.filter(worker__node__cluster_id__in=old)._raw_delete("default")
        for model, lookup in ((Worker, "node__cluster_id__in"), (GPU, "node__cluster_id__in"),
                              (NIC, "node__cluster_id__in")):
            model.objects.filter(**{lookup: old})._raw_delete("default")
        Cluster.objects.filter(pk__in=old).delete()
    cluster = Cluster.objects.create(name="bench")
    model = ServedModel.objects.create(cluster=cluster, name="llama-3.3-70b-fp8", layers=80,
                                       kv_heads=8, head_dim=128, kv_dtype_bytes=1,
                                       weight_bytes=71 * GB)
    node_rows = Node.objects.bulk_create(
        [Node(cluster=cluster, hostname=f"gpu-{i:04d}", rack=f"r{i // 16:02d}", status="online")
         for i in range(nodes)]
    )
    gpus = GPU.objects.bulk_create(
        [GPU(node=n, index=g, uuid=f"GPU-bench-{n.pk}-{g}", product_name="NVIDIA H200",
             memory_bytes=141 * GB, nvlink_group=g // 4) for n in node_rows for g in range(8)]
    )
    NIC.objects.bulk_create([NIC(node=n, name="ib0", line_rate_gbps=400,
                                 transport="infiniband", rdma=True) for n in node_rows])
    workers = Worker.objects.bulk_create(
        [Worker(served_model=model, node_id=g.node_id, name=f"engine-{g.index}",
                api_url="http://127.0.0.1:1", desired_role=("prefill" if g.index < 2 else
                                                            "decode")) for g in gpus]
    )
    Worker.gpus.through.objects.bulk_create(
        [Worker.gpus.through(worker_id=w.pk, gpu_id=g.pk)
         for w, g in zip(workers, gpus, strict=True)]
    )
    return cluster, node_rows, workers


def write_hot_state(cluster, nodes, workers, tick: int = 0):
    """Every node's and worker's report; ``tick`` moves the numbers like real load does."""
    from controlplane.telemetry import hotstate

    keys = hotstate.Keys()
    r = hotstate.sync_redis()
    now = time.time()

    def wobble(i: int) -> float:  # deterministic, different per entity and per tick
        return ((i * 7919 + tick * 104729) % 1000) / 1000

    mapping = {}
    by_node = {}
    for w in workers:
        by_node.setdefault(w.node_id, []).append(w)
        mapping[f"w:{w.pk}"] = orjson.dumps({
            "worker_id": w.pk, "node_id": w.node_id, "engine": w.name, "up": True,
            "role": w.desired_role, "running": 12, "waiting": int(wobble(w.pk) * 8),
            "kv_blocks_used": 20000, "kv_blocks_total": 52000, "kv_usage": wobble(w.pk + 1),
            "prefix_hit_rate": 0.4,
            "prompt_tokens_per_s": 9000.0, "generation_tokens_per_s": 1500.0,
            "ttft_p95_s": 0.4, "itl_p95_s": 0.03, "received_at": now, "interval_s": 1.0,
        })
    for n in nodes:
        mapping[f"n:{n.pk}"] = orjson.dumps({
            "node_id": n.pk, "cluster_id": cluster.pk, "hostname": n.hostname,
            "received_at": now, "interval_s": 1.0,
            "gpus": [{"index": g, "memory_used_bytes": 100 * GB, "memory_total_bytes": 141 * GB,
                      "utilization": wobble(n.pk * 8 + g)} for g in range(8)],
            "nics": [{"name": "ib0", "tx_gbps": 80.0, "rx_gbps": 75.0}],
            "engines": [{"id": w.name, "worker_id": w.pk} for w in by_node.get(n.pk, [])],
        })
    if tick == 0:
        r.delete(keys.cluster(cluster.pk))
    r.hset(keys.cluster(cluster.pk), mapping=mapping)


def time_render(repeat: int, url: str = "/?cluster=bench") -> tuple[list[float], int]:
    from django.contrib.auth import get_user_model
    from django.test import Client

    user, _ = get_user_model().objects.get_or_create(username="bench-admin",
                                                     defaults={"is_superuser": True})
    client = Client()
    client.force_login(user)
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        response = client.get(url)
        assert response.status_code == 200
        times.append(time.perf_counter() - started)
    return times, len(response.content)


async def live_coalescing(cluster, nodes, workers, seconds: float):
    from channels.layers import get_channel_layer
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth import get_user_model

    from controlplane.dashboard.consumers import LiveTopologyConsumer, cluster_group

    user = await get_user_model().objects.aget(username="bench-admin")
    communicator = WebsocketCommunicator(LiveTopologyConsumer.as_asgi(), "/ws/live/?cluster=bench")
    communicator.scope["user"] = user
    await communicator.connect(timeout=60)
    await communicator.receive_from(timeout=120)  # the snapshot
    layer = get_channel_layer()
    ids = [n.pk for n in nodes]
    received = []  # (time, fragments, bytes)

    async def reader():
        while True:
            try:
                text = await communicator.receive_from(timeout=seconds + 30)
            except TimeoutError:
                return
            received.append((time.monotonic(), text.count('hx-swap-oob="true"'), len(text)))

    task = asyncio.create_task(reader())
    started = time.monotonic()
    hints = 0
    tick = 0
    while time.monotonic() - started < seconds:
        tick += 1
        await asyncio.to_thread(write_hot_state, cluster, nodes, workers, tick)
        await layer.group_send(cluster_group(cluster.pk),
                               {"type": "telemetry.changed", "node_ids": ids})
        hints += 1
        await asyncio.sleep(1.0)
    await asyncio.sleep(3)
    task.cancel()
    await communicator.disconnect()
    window = [r for r in received if r[0] - started <= seconds + 3]
    fragments = sum(r[1] for r in window)
    nbytes = sum(r[2] for r in window)
    span = seconds + 3
    return {"hints": hints, "messages": len(window), "fragments_per_s": fragments / span,
            "kbytes_per_s": nbytes / span / 1024}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=20)
    args = parser.parse_args()
    call_command("migrate", verbosity=0)
    t0 = time.perf_counter()
    cluster, nodes, workers = build_fleet(args.nodes)
    write_hot_state(cluster, nodes, workers)
    print(f"fleet: {args.nodes} nodes × 8 GPUs built in {time.perf_counter() - t0:.1f} s "
          f"({connection.vendor})")
    for label, url in (("default view", "/?cluster=bench"),
                       ("one rack (16 nodes)", "/?cluster=bench&rack=r00")):
        times, size = time_render(args.repeat, url)
        print(f"topology page, {args.nodes * 8} GPUs, {label}: median "
              f"{statistics.median(times) * 1000:.0f} ms, min {min(times) * 1000:.0f} ms, "
              f"max {max(times) * 1000:.0f} ms, {size / 1024:.0f} KiB HTML")
    live = asyncio.run(live_coalescing(cluster, nodes, workers, args.seconds))
    print(f"live (default view): every node reporting and hinted once a second for "
          f"{args.seconds:.0f} s → {live['messages']} websocket messages, "
          f"{live['fragments_per_s']:.1f} fragments/s (rack tiles above 64 nodes, node cards "
          f"below), {live['kbytes_per_s']:.0f} KiB/s per viewer")


if __name__ == "__main__":
    main()
