"""Model validation against PostgreSQL."""

import io

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.db import IntegrityError

from controlplane.policies.models import Policy, effective_policy_for
from controlplane.topology.models import GPU, NIC, Cluster, Fabric, Node, ServedModel, Worker

pytestmark = pytest.mark.django_db

GB = 1000**3


@pytest.fixture
def fleet():
    cluster = Cluster.objects.create(name="c1")
    node = Node.objects.create(cluster=cluster, hostname="n1")
    gpus = [
        GPU.objects.create(node=node, index=i, uuid=f"GPU-{i}", product_name="H200",
                           memory_bytes=141 * GB)
        for i in range(4)
    ]
    model = ServedModel.objects.create(
        cluster=cluster, name="llama-3.3-70b-fp8", layers=80, kv_heads=8, head_dim=128,
        kv_dtype_bytes=1, weight_bytes=71 * GB,
    )
    return cluster, node, gpus, model


def make_worker(model, node, name="e0", tp=1):
    return Worker.objects.create(served_model=model, node=node, name=name, tp_size=tp,
                                 api_url="http://127.0.0.1:8000")


def test_served_model_kv_bytes_per_token(fleet):
    _, _, _, model = fleet
    assert model.kv_bytes_per_token == 163_840


def test_served_model_rejects_non_positive_geometry(fleet):
    cluster = fleet[0]
    model = ServedModel(cluster=cluster, name="bad", layers=80, kv_heads=8, head_dim=128,
                        kv_dtype_bytes=0, weight_bytes=1)
    with pytest.raises(ValidationError) as exc:
        model.full_clean()
    assert "kv_dtype_bytes" in exc.value.message_dict


def test_tp_size_must_match_gpu_count(fleet):
    _, node, gpus, model = fleet
    worker = make_worker(model, node, tp=2)
    with pytest.raises(ValidationError, match="TP size is 2 but 1 GPU"):
        worker.validate_gpus(gpus[:1])
    worker.validate_gpus(gpus[:2])


def test_gpu_belongs_to_one_worker_of_a_model(fleet):
    _, node, gpus, model = fleet
    first = make_worker(model, node, "e0")
    first.gpus.set([gpus[0]])
    second = make_worker(model, node, "e1")
    with pytest.raises(ValidationError, match=r"already taken: gpu0 \(worker e0\)"):
        second.validate_gpus([gpus[0]])
    # Re-validating the owner's own assignment is fine.
    first.validate_gpus([gpus[0]])


def test_same_gpu_may_serve_a_different_model(fleet):
    cluster, node, gpus, model = fleet
    make_worker(model, node, "e0").gpus.set([gpus[0]])
    other = ServedModel.objects.create(cluster=cluster, name="llama-3.1-8b", layers=32,
                                       kv_heads=8, head_dim=128, kv_dtype_bytes=2,
                                       weight_bytes=16 * GB)
    make_worker(other, node, "small").validate_gpus([gpus[0]])


def test_gpus_must_be_on_the_worker_node(fleet):
    cluster, node, _, model = fleet
    other_node = Node.objects.create(cluster=cluster, hostname="n2")
    foreign = GPU.objects.create(node=other_node, index=0, uuid="GPU-x", product_name="H200",
                                 memory_bytes=GB)
    with pytest.raises(ValidationError, match="not on node n1"):
        make_worker(model, node).validate_gpus([foreign])


def test_worker_and_model_in_same_cluster(fleet):
    _, _, _, model = fleet
    elsewhere = Node.objects.create(cluster=Cluster.objects.create(name="c2"), hostname="x")
    worker = Worker(served_model=model, node=elsewhere, name="e", api_url="http://h:1")
    with pytest.raises(ValidationError, match="different clusters"):
        worker.full_clean()


def test_unique_gpu_index_per_node(fleet):
    _, node, _, _ = fleet
    with pytest.raises(IntegrityError):
        GPU.objects.create(node=node, index=0, uuid="GPU-dup", product_name="H200",
                           memory_bytes=GB)


def test_rdma_over_plain_ethernet_is_rejected(fleet):
    _, node, _, _ = fleet
    nic = NIC(node=node, name="eth0", line_rate_gbps=100, transport="ethernet", rdma=True)
    with pytest.raises(ValidationError, match="Plain Ethernet is TCP"):
        nic.full_clean()


def test_nic_fabric_must_be_in_node_cluster(fleet):
    _, node, _, _ = fleet
    fabric = Fabric.objects.create(cluster=Cluster.objects.create(name="c3"), name="ib",
                                   transport="infiniband", rdma=True, line_rate_gbps=400)
    nic = NIC(node=node, name="ib0", line_rate_gbps=400, transport="infiniband", rdma=True,
              fabric=fabric)
    with pytest.raises(ValidationError, match="another cluster"):
        nic.full_clean()


def test_node_labels_must_be_strings(fleet):
    _, node, _, _ = fleet
    node.labels = {"gpu": 8}
    with pytest.raises(ValidationError, match="string to string"):
        node.full_clean()


def test_effective_policy_merges_cluster_and_model_rows(fleet):
    cluster, _, _, model = fleet
    Policy.objects.create(cluster=cluster, ttft_p95_ms=2500, itl_p95_ms=40)
    Policy.objects.create(cluster=cluster, served_model=model, ttft_p95_ms=900)
    policy, sources = effective_policy_for(model)
    assert (policy.ttft_p95_ms, sources["ttft_p95_ms"]) == (900, "model")
    assert (policy.itl_p95_ms, sources["itl_p95_ms"]) == (40, "cluster")
    assert sources["attainment"] == "default"


def test_policy_clean_reports_merged_contradictions(fleet):
    cluster, _, _, model = fleet
    Policy.objects.create(cluster=cluster, max_prefill_workers=1)
    override = Policy(cluster=cluster, served_model=model, min_prefill_workers=2)
    with pytest.raises(ValidationError) as exc:
        override.full_clean()
    assert "min_prefill_workers" in exc.value.message_dict


def test_one_default_policy_per_cluster(fleet):
    cluster = fleet[0]
    Policy.objects.create(cluster=cluster)
    with pytest.raises(IntegrityError):
        Policy.objects.create(cluster=cluster)


def test_seed_command_is_idempotent():
    call_command("load_sample_fleets", stdout=io.StringIO())
    counts = (Cluster.objects.count(), Node.objects.count(), GPU.objects.count(),
              Worker.objects.count(), NIC.objects.count(), Policy.objects.count())
    call_command("load_sample_fleets", stdout=io.StringIO())
    assert counts == (Cluster.objects.count(), Node.objects.count(), GPU.objects.count(),
                      Worker.objects.count(), NIC.objects.count(), Policy.objects.count())
    assert counts[:4] == (2, 6, 48, 48)
    h200 = Node.objects.get(hostname="h200nvl-01")
    groups = sorted(h200.gpus.values_list("nvlink_group", flat=True))
    assert groups == [0, 0, 0, 0, 1, 1, 1, 1]
    rtx_nic = NIC.objects.get(node__hostname="rtxpro-01")
    assert (rtx_nic.line_rate_gbps, rtx_nic.rdma) == (100, False)
    assert ServedModel.objects.get(cluster__name="two-rtxpro-servers").kv_bytes_per_token == 163_840
