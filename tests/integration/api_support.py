"""Personas and a small fleet for the API, accounts and audit tests."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from controlplane.accounts.access import set_role
from controlplane.accounts.models import APIToken
from controlplane.policies.models import Policy
from controlplane.topology.models import (
    GPU,
    NIC,
    Cluster,
    Fabric,
    Gateway,
    Node,
    ServedModel,
    Worker,
)

GB = 1000**3


def make_user(role: str | None, username: str | None = None):
    user = get_user_model().objects.create(username=username or f"{role or 'norole'}-user",
                                           is_staff=True)
    set_role(user, role)
    return user


def token_client(user, scope: str = "admin") -> tuple[APIClient, str]:
    _, raw = APIToken.issue(user, scope=scope)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw}")
    return client, raw


def build_fleet(name: str = "c1", nodes: int = 2, gpus_per_node: int = 4) -> dict:
    cluster = Cluster.objects.create(name=name)
    fabric = Fabric.objects.create(cluster=cluster, name="ib0", transport="infiniband", rdma=True,
                                   line_rate_gbps=400)
    node_rows = [Node.objects.create(cluster=cluster, hostname=f"{name}-n{i}", rack="r1")
                 for i in range(nodes)]
    gpu_rows = []
    for node in node_rows:
        NIC.objects.create(node=node, name="mlx5_0", line_rate_gbps=400, transport="infiniband",
                           rdma=True, fabric=fabric)
        for i in range(gpus_per_node):
            gpu_rows.append(GPU.objects.create(
                node=node, index=i, uuid=f"GPU-{node.hostname}-{i}", product_name="H200",
                memory_bytes=141 * GB, nvlink_group=0, nvlink_bandwidth_gbs=450))
    model = ServedModel.objects.create(
        cluster=cluster, name="llama-3.3-70b-fp8", layers=80, kv_heads=8, head_dim=128,
        kv_dtype_bytes=1, weight_bytes=71 * GB)
    worker = Worker.objects.create(served_model=model, node=node_rows[0], name="e0", tp_size=1,
                                   api_url="http://127.0.0.1:8000")
    worker.gpus.set([gpu_rows[0]])
    gateway = Gateway.objects.create(cluster=cluster, name="gw", url="http://127.0.0.1:9000",
                                     secret="s3cret")
    policy = Policy.objects.create(cluster=cluster, ttft_p95_ms=800)
    return {"cluster": cluster, "fabric": fabric, "nodes": node_rows, "gpus": gpu_rows,
            "model": model, "worker": worker, "gateway": gateway, "policy": policy}
