"""API list benchmark: server time for a page of 100 with 1,000 nodes / 8,000 GPUs.

Runs the Django app in-process (no network) and times each request from the handler's
entry to its response, with the queries it made. The fleet is created with bulk_create in
a cluster named ``apibench`` (removed afterwards unless ``--keep``).

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/pdplane_api_bench \
    REDIS_URL=redis://127.0.0.1:6379/9 \
    .venv/bin/python bench/api_bench.py [--nodes 1000] [--gpus-per-node 8] [--repeat 30]

Prints one JSON object: per endpoint the p50/p95/max milliseconds and the query count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

GB = 1000**3
ENDPOINTS = [
    "/api/v1/nodes/?limit=100",
    "/api/v1/nodes/?limit=100&offset=900",
    "/api/v1/nodes/?limit=100&brief=1",
    "/api/v1/gpus/?limit=100",
    "/api/v1/gpus/?limit=100&offset=7900",
    "/api/v1/nics/?limit=100",
    "/api/v1/workers/?limit=100",
    "/api/v1/workers/?limit=100&state=active",
    "/api/v1/audit/?limit=100",
]


def build(nodes: int, gpus_per_node: int):
    from controlplane import audit
    from controlplane.topology.models import GPU, NIC, Cluster, Node, ServedModel, Worker

    Cluster.objects.filter(name="apibench").delete()
    with audit.actor("api_bench"):
        cluster = Cluster.objects.create(name="apibench")
    node_rows = Node.objects.bulk_create(
        Node(cluster=cluster, hostname=f"bench-{i:05d}", rack=f"r{i // 32}", zone=f"z{i % 4}",
             status="online") for i in range(nodes))
    gpus = GPU.objects.bulk_create(
        GPU(node=n, index=g, uuid=f"GPU-bench-{n.pk}-{g}", product_name="H100",
            memory_bytes=80 * GB, nvlink_group=0, nvlink_bandwidth_gbs=450)
        for n in node_rows for g in range(gpus_per_node))
    NIC.objects.bulk_create(
        NIC(node=n, name=f"mlx5_{k}", line_rate_gbps=400, transport="infiniband", rdma=True)
        for n in node_rows for k in range(2))
    model = ServedModel.objects.create(cluster=cluster, name="llama-70b", layers=80, kv_heads=8,
                                       head_dim=128, kv_dtype_bytes=1, weight_bytes=71 * GB)
    workers = Worker.objects.bulk_create(
        Worker(served_model=model, node=n, name=f"e{k}", tp_size=4,
               api_url=f"http://10.0.{i // 250}.{i % 250}:800{k}")
        for i, n in enumerate(node_rows) for k in range(2))
    by_node: dict[int, list] = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    Worker.gpus.through.objects.bulk_create(
        Worker.gpus.through(worker_id=w.pk, gpu_id=g.pk)
        for w in workers
        for g in by_node[w.node_id][4 * int(w.name[1:]): 4 * int(w.name[1:]) + 4])
    return cluster, len(gpus), len(workers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection, reset_queries
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    call_command("migrate", verbosity=0)
    from django.contrib.auth import get_user_model

    from controlplane.accounts.access import set_role
    from controlplane.accounts.models import APIToken

    started = time.perf_counter()
    cluster, gpu_count, worker_count = build(args.nodes, args.gpus_per_node)
    build_s = time.perf_counter() - started
    user, _ = get_user_model().objects.get_or_create(username="api-bench")
    set_role(user, "viewer")
    token, raw = APIToken.issue(user, scope="read", description="api_bench")
    client = Client(HTTP_AUTHORIZATION=f"Bearer {raw}", HTTP_HOST="127.0.0.1")

    results = {}
    try:
        for url in ENDPOINTS:
            sep = "&" if "?" in url else "?"
            url = f"{url}{sep}cluster_id={cluster.pk}" if "audit" not in url else url
            client.get(url)  # warm caches and the connection
            timings = []
            queries = 0
            for _ in range(args.repeat):
                reset_queries()
                with CaptureQueriesContext(connection) as captured:
                    t0 = time.perf_counter()
                    response = client.get(url)
                    timings.append((time.perf_counter() - t0) * 1000)
                assert response.status_code == 200, (url, response.status_code)
                queries = len(captured)
            timings.sort()
            results[url] = {
                "p50_ms": round(statistics.median(timings), 1),
                "p95_ms": round(timings[int(0.95 * (len(timings) - 1))], 1),
                "max_ms": round(timings[-1], 1),
                "queries": queries,
                "rows": len(response.json()["results"]),
            }
    finally:
        token.delete()
        if not args.keep:
            cluster.delete()
    print(json.dumps({
        "nodes": args.nodes, "gpus": gpu_count, "workers": worker_count,
        "build_s": round(build_s, 1), "repeat": args.repeat, "endpoints": results,
    }, indent=2))


if __name__ == "__main__":
    main()
