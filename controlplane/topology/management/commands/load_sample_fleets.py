"""Load the brief's example fleets. Safe to run again: rows are matched by natural keys."""

import uuid

from django.core.management.base import BaseCommand
from django.db import transaction

from controlplane.policies.models import Policy
from controlplane.topology.choices import EngineKind, Role
from controlplane.topology.models import GPU, NIC, Cluster, Fabric, Node, ServedModel, Worker
from controlplane.topology.samples import SAMPLE_FLEETS


def stable_gpu_uuid(hostname: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{hostname}.gpu{index}.pdplane"))


class Command(BaseCommand):
    help = "Create or refresh the example fleets from the product brief."

    @transaction.atomic
    def handle(self, *args, **options):
        for fleet in SAMPLE_FLEETS:
            counts = self.load_fleet(fleet)
            self.stdout.write(
                f"{fleet['cluster']}: {counts['nodes']} nodes, {counts['gpus']} GPUs, "
                f"{counts['workers']} workers"
            )

    def load_fleet(self, fleet: dict) -> dict:
        cluster, _ = Cluster.objects.update_or_create(
            name=fleet["cluster"], defaults={"description": fleet["description"]}
        )
        fabric, _ = Fabric.objects.update_or_create(
            cluster=cluster, name=fleet["fabric"]["name"],
            defaults={k: v for k, v in fleet["fabric"].items() if k != "name"},
        )
        model_spec = dict(fleet["model"])
        model, _ = ServedModel.objects.update_or_create(
            cluster=cluster, name=model_spec.pop("name"), defaults=model_spec
        )
        Policy.objects.get_or_create(
            cluster=cluster, served_model=None,
            defaults={"ttft_p95_ms": 1000, "itl_p95_ms": 50, "attainment": 0.9},
        )
        gpu_spec = fleet["gpu"]
        group = gpu_spec["nvlink_group_size"]
        counts = {"nodes": 0, "gpus": 0, "workers": 0}
        for n in range(1, fleet["nodes"] + 1):
            hostname = fleet["hostname"].format(n)
            racks = fleet["racks"]
            node, _ = Node.objects.update_or_create(
                cluster=cluster, hostname=hostname,
                defaults={"rack": racks[(n - 1) * len(racks) // fleet["nodes"]], "zone": "z1"},
            )
            counts["nodes"] += 1
            for i in range(fleet["nics_per_node"]):
                NIC.objects.update_or_create(
                    node=node, name=f"nic{i}",
                    defaults={
                        "line_rate_gbps": fabric.line_rate_gbps,
                        "transport": fabric.transport,
                        "rdma": fabric.rdma,
                        "fabric": fabric,
                    },
                )
            for index in range(fleet["gpus_per_node"]):
                gpu, _ = GPU.objects.update_or_create(
                    node=node, index=index,
                    defaults={
                        "uuid": stable_gpu_uuid(hostname, index),
                        "product_name": gpu_spec["product_name"],
                        "memory_bytes": gpu_spec["memory_bytes"],
                        "memory_bandwidth_gbs": gpu_spec["memory_bandwidth_gbs"],
                        "nvlink_group": index // group if group else None,
                        "nvlink_bandwidth_gbs": gpu_spec["nvlink_bandwidth_gbs"],
                        "pcie_generation": gpu_spec["pcie_generation"],
                        "pcie_width": 16,
                    },
                )
                counts["gpus"] += 1
                worker, created = Worker.objects.get_or_create(
                    node=node, name=f"engine-{index}",
                    defaults={
                        "served_model": model,
                        "tp_size": 1,
                        "engine_kind": EngineKind.VLLM,
                        "api_url": f"http://{hostname}:{8000 + index}",
                        "metrics_url": f"http://{hostname}:{8000 + index}/metrics",
                        "desired_role": Role.BOTH,
                    },
                )
                if created:
                    worker.gpus.set([gpu])
                counts["workers"] += 1
        return counts
