"""List endpoints use a bounded number of queries, whatever the fleet size."""

import pytest

from controlplane.topology.models import GPU, NIC, Cluster, Node, ServedModel, Worker
from tests.integration.api_support import make_user, token_client

pytestmark = pytest.mark.django_db

GB = 1000**3
MAX_QUERIES_PER_LIST = 8  # token, role, count, page, ≤ 2 prefetches, slack for last_used_at


def bulk_fleet(nodes: int, gpus_per_node: int = 8) -> Cluster:
    cluster = Cluster.objects.create(name=f"bulk{nodes}")
    node_rows = Node.objects.bulk_create(
        Node(cluster=cluster, hostname=f"b{nodes}-n{i:04d}", rack=f"r{i % 16}")
        for i in range(nodes))
    gpus = GPU.objects.bulk_create(
        GPU(node=node, index=g, uuid=f"GPU-{node.hostname}-{g}", product_name="H100",
            memory_bytes=80 * GB)
        for node in node_rows for g in range(gpus_per_node))
    NIC.objects.bulk_create(
        NIC(node=node, name="eth0", line_rate_gbps=100, transport="ethernet")
        for node in node_rows)
    model = ServedModel.objects.create(cluster=cluster, name="m", layers=32, kv_heads=8,
                                       head_dim=128, kv_dtype_bytes=2, weight_bytes=16 * GB)
    workers = Worker.objects.bulk_create(
        Worker(served_model=model, node=node, name="e0", tp_size=2, api_url="http://127.0.0.1:1")
        for node in node_rows)
    by_node = {}
    for gpu in gpus:
        by_node.setdefault(gpu.node_id, []).append(gpu)
    Worker.gpus.through.objects.bulk_create(
        Worker.gpus.through(worker_id=w.pk, gpu_id=g.pk)
        for w in workers for g in by_node[w.node_id][:2])
    return cluster


LISTS = ["/api/v1/nodes/", "/api/v1/gpus/", "/api/v1/nics/", "/api/v1/workers/",
         "/api/v1/served-models/", "/api/v1/audit/", "/api/v1/nodes/?brief=1"]


@pytest.mark.parametrize("size", [5, 60])
def test_list_query_count_is_bounded(size, django_assert_max_num_queries):
    bulk_fleet(size)
    client, _ = token_client(make_user("viewer"), scope="read")
    client.get("/api/v1/clusters/")  # first use stamps last_used_at
    for url in LISTS:
        with django_assert_max_num_queries(MAX_QUERIES_PER_LIST):
            response = client.get(url, {"limit": 100})
        assert response.status_code == 200, url
        assert len(response.json()["results"]) <= 100
