"""Write a simulated-fleet config (``pdplane-sim run --config``) from a cluster's topology.

Nodes keep their hostnames, GPUs (count, NVLink groups) and NICs; every worker becomes a
simulated engine with the same name, GPUs, TP size and desired role. ``--base-port N``
numbers the ports from N (each node's telemetry port, then each engine's HTTP, KV-event and
replay ports); without it every port is 0 and the simulator picks free ones.
"""

from __future__ import annotations

import json
from collections import Counter

from django.core.management.base import BaseCommand, CommandError

import pdcatalog as catalog
from controlplane.topology.models import Cluster, ServedModel
from workers_agent.sim import profiles


def model_profile_name(model: ServedModel) -> str:
    """The simulator's profile for a served model: by name if known, else by geometry."""
    try:
        return profiles.get_model(model.name).name
    except KeyError:
        pass
    size = "70b" if model.layers >= 60 else "8b"
    family = "llama-3.3" if size == "70b" else "llama-3.1"
    fp8 = model.kv_dtype_bytes <= 1
    if size == "70b":
        return f"{family}-70b-{'fp8' if fp8 else 'bf16'}"
    return f"{family}-8b{'-fp8' if fp8 else ''}"


def gpu_profile_name(product_name: str) -> str:
    """The simulator's profile for a GPU: the catalog's entry, or its closest catalogued
    part by name or family (the simulator needs some profile); never a generic guess."""
    found = catalog.lookup_gpu(product_name)
    if found.matched_by == "generic":
        raise CommandError(f"no simulator profile for GPU {product_name!r}")
    return profiles.get_hardware(found.spec.name).name


def nvlink_group_size(gpus) -> int:
    """The simulator models NVLink as consecutive groups of equal size."""
    groups = Counter(g.nvlink_group for g in gpus if g.nvlink_group is not None)
    if not groups:
        return 0
    return max(groups.values())


class Command(BaseCommand):
    help = "Write a pdplane-sim fleet config from a cluster's nodes, GPUs, NICs and workers."

    def add_arguments(self, parser):
        parser.add_argument("--cluster", required=True, help="cluster name")
        parser.add_argument("--base-port", type=int, default=0,
                            help="first port to assign (0: let the simulator pick)")
        parser.add_argument("--time-scale", type=float, default=1.0)
        parser.add_argument("--output", "-o", help="file to write (default: stdout)")

    def handle(self, *args, **options):
        try:
            cluster = Cluster.objects.get(name=options["cluster"])
        except Cluster.DoesNotExist:
            raise CommandError(f"no cluster named {options['cluster']!r}") from None
        base = options["base_port"]
        if base and not 1024 <= base <= 65000:
            raise CommandError("--base-port must be between 1024 and 65000")
        if options["time_scale"] <= 0:
            raise CommandError("--time-scale must be positive")
        next_port = base

        def port() -> int:
            nonlocal next_port
            if not base:
                return 0
            value = next_port
            next_port += 1
            return value

        nodes, engines = [], []
        for node in cluster.nodes.prefetch_related("gpus", "nics", "workers__gpus",
                                                   "workers__served_model"):
            gpus = [g for g in node.gpus.all() if not g.missing]
            if not gpus:
                continue
            nodes.append({
                "hostname": node.hostname,
                "gpu": gpu_profile_name(gpus[0].product_name),
                "gpu_count": max(g.index for g in gpus) + 1,
                "nvlink_group_size": nvlink_group_size(gpus),
                "nics": [
                    {"name": nic.name, "line_rate_gbps": nic.line_rate_gbps,
                     "transport": nic.transport, "rdma": nic.rdma}
                    for nic in node.nics.all() if not nic.missing
                ],
                "telemetry_port": port(),
            })
            for worker in node.workers.all():
                indices = sorted(g.index for g in worker.gpus.all())
                if not indices:
                    self.stderr.write(f"skipping {worker}: no GPUs assigned")
                    continue
                engines.append({
                    "id": worker.name,
                    "node": node.hostname,
                    "model": model_profile_name(worker.served_model),
                    "served_model_name": worker.served_model.name,
                    "gpus": indices,
                    "tp": len(indices),
                    "role": worker.desired_role,
                    "block_size": worker.served_model.kv_block_size,
                    "http_port": port(),
                    "kv_events_port": port(),
                    "kv_replay_port": port(),
                })
        if not nodes:
            raise CommandError(f"cluster {cluster.name!r} has no nodes with GPUs")
        document = {"time_scale": options["time_scale"], "cluster": cluster.name,
                    "nodes": nodes, "engines": engines}
        text = json.dumps(document, indent=2) + "\n"
        if options["output"]:
            with open(options["output"], "w") as fh:
                fh.write(text)
            self.stdout.write(f"wrote {len(nodes)} nodes and {len(engines)} engines to "
                              f"{options['output']}")
        else:
            self.stdout.write(text, ending="")
