"""The demo fleet: 3 simulated nodes × 8 H200 (NVLink groups of 4, 400 G InfiniBand)
serving two models, recorded in the database and written as a simulator config from the
same spec, so the topology and the engines agree port for port.

Idempotent: a second run finds every row and reuses the agent tokens and gateway secret
kept in ``var/demo/``.
"""

from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass
from pathlib import Path

from django.db import transaction

from controlplane.topology.samples import gpu_fields, model_fields

CLUSTER = "demo"
NODES = ("demo-node-1", "demo-node-2", "demo-node-3")
GPUS_PER_NODE = 8
NVLINK_GROUP = 4

# served model name → (geometry, which GPUs of every node serve it)
MODELS = {
    "llama-3.1-8b": {
        "geometry": model_fields("llama-3.1-8b", kv_block_size=16, max_model_len=32768),
        "gpus": (0, 1, 2, 3),
    },
    "llama-3.3-70b-fp8": {
        "geometry": model_fields("llama-3.3-70b-fp8", kv_block_size=16, max_model_len=32768),
        "gpus": (4, 5, 6, 7),
    },
}
PORTS_PER_NODE = 1 + GPUS_PER_NODE * 3
GATEWAY_NAME = "demo-gw"


@dataclass(frozen=True)
class DemoPorts:
    web: int
    gateway: int
    base: int

    def telemetry(self, node_index: int) -> int:
        return self.base + node_index * PORTS_PER_NODE

    def engine(self, node_index: int, gpu: int) -> tuple[int, int, int]:
        first = self.telemetry(node_index) + 1 + gpu * 3
        return first, first + 1, first + 2

    def all(self) -> list[int]:
        return [self.web, self.gateway, *range(self.base, self.base + len(NODES) * PORTS_PER_NODE)]


def busy_ports(ports: list[int]) -> list[int]:
    taken = []
    for port in ports:
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


def engine_name(gpu: int) -> str:
    return f"engine-{gpu}"


def _model_of(gpu: int) -> str:
    return next(name for name, spec in MODELS.items() if gpu in spec["gpus"])


def fleet_config(ports: DemoPorts) -> dict:
    """The simulator's fleet config (docs/sim.md) for the demo."""
    nodes, engines = [], []
    for i, host in enumerate(NODES):
        nodes.append({
            "hostname": host, "gpu": "H200", "gpu_count": GPUS_PER_NODE,
            "nvlink_group_size": NVLINK_GROUP,
            "nics": [{"name": "ib0", "line_rate_gbps": 400, "transport": "infiniband",
                      "rdma": True}],
            "telemetry_port": ports.telemetry(i),
        })
        for gpu in range(GPUS_PER_NODE):
            http, kv, replay = ports.engine(i, gpu)
            model = _model_of(gpu)
            engines.append({
                "id": engine_name(gpu), "node": host, "model": model, "gpus": [gpu], "tp": 1,
                "role": "both", "served_model_name": model, "http_port": http,
                "kv_events_port": kv, "kv_replay_port": replay,
            })
    return {"time_scale": 1.0, "host": "127.0.0.1", "nodes": nodes, "engines": engines}


@transaction.atomic
def seed(ports: DemoPorts, var_dir: Path) -> dict:
    """Create or refresh the demo cluster; return tokens per node and the gateway secret."""
    from controlplane.policies.models import Policy
    from controlplane.telemetry.tokens import issue_token
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

    secrets_dir = var_dir / "demo"
    secrets_dir.mkdir(parents=True, exist_ok=True)
    cluster, _ = Cluster.objects.update_or_create(
        name=CLUSTER, defaults={"description": "Simulated demo fleet started by `make run`"}
    )
    fabric, _ = Fabric.objects.update_or_create(
        cluster=cluster, name="ib400",
        defaults={"transport": "infiniband", "rdma": True, "line_rate_gbps": 400},
    )
    models = {}
    for name, spec in MODELS.items():
        models[name], _ = ServedModel.objects.update_or_create(
            cluster=cluster, name=name, defaults=spec["geometry"]
        )
    # The demo shows the planner acting: automatic mode, short interval and cooldown.
    Policy.objects.update_or_create(
        cluster=cluster, served_model=None,
        defaults={"ttft_p95_ms": 1000, "itl_p95_ms": 50, "attainment": 0.9,
                  "rebalancing_mode": "auto", "rebalance_interval_s": 20, "cooldown_s": 60,
                  "max_changes_per_cycle": 2},
    )
    # The 70B model serves long RAG prompts: a looser TTFT target, the same ITL target.
    Policy.objects.update_or_create(
        cluster=cluster, served_model=models["llama-3.3-70b-fp8"],
        defaults={"ttft_p95_ms": 2500},
    )
    tokens = {}
    for i, host in enumerate(NODES):
        node, _ = Node.objects.update_or_create(
            cluster=cluster, hostname=host,
            defaults={"rack": f"rack-{1 + i // 2}", "zone": "z1"},
        )
        NIC.objects.update_or_create(
            node=node, name="ib0",
            defaults={"line_rate_gbps": 400, "transport": "infiniband", "rdma": True,
                      "fabric": fabric},
        )
        token_file = secrets_dir / f"{host}.token"
        if not token_file.exists() or not node.agent_token_hash:
            token_file.write_text(issue_token(node))
            token_file.chmod(0o600)
        tokens[host] = token_file
        h200 = gpu_fields("NVIDIA H200", nvlink_group_size=NVLINK_GROUP)
        h200.pop("nvlink_group_size")  # a property of the node's layout, not a GPU column
        for gpu in range(GPUS_PER_NODE):
            gpu_row, _ = GPU.objects.update_or_create(
                node=node, index=gpu,
                defaults={"uuid": f"GPU-demo-{i + 1}-{gpu}", **h200,
                          "nvlink_group": gpu // NVLINK_GROUP, "pcie_width": 16},
            )
            http, kv, replay = ports.engine(i, gpu)
            worker, created = Worker.objects.update_or_create(
                node=node, name=engine_name(gpu),
                defaults={
                    "served_model": models[_model_of(gpu)], "tp_size": 1, "engine_kind": "sim",
                    "api_url": f"http://127.0.0.1:{http}",
                    "metrics_url": f"http://127.0.0.1:{http}/metrics",
                    "kv_events_endpoint": f"tcp://127.0.0.1:{kv}",
                    "kv_replay_endpoint": f"tcp://127.0.0.1:{replay}",
                },
            )
            if created:
                worker.gpus.set([gpu_row])
    secret_file = secrets_dir / "gateway.secret"
    if not secret_file.exists():
        secret_file.write_text(secrets.token_urlsafe(32))
        secret_file.chmod(0o600)
    Gateway.objects.update_or_create(
        cluster=cluster, name=GATEWAY_NAME,
        defaults={"url": f"http://127.0.0.1:{ports.gateway}", "kind": "pdplane",
                  "secret": secret_file.read_text().strip()},
    )
    fleet_file = secrets_dir / "fleet.json"
    fleet_file.write_text(json.dumps(fleet_config(ports), indent=2))
    return {"tokens": tokens, "gateway_secret_file": secret_file, "fleet_file": fleet_file}
