"""Inventory reconciliation: what an agent announces in hello becomes topology.

New GPUs, NICs and engines appear; ones the agent no longer announces are flagged
(GPU.missing, NIC.missing, Worker.state=missing), never deleted — an operator may still
want their history, and a flapping agent must not destroy configuration.

Engines become Worker rows matched by (node, engine id). The served model is matched by
(cluster, model name). pdplane does NOT create a ServedModel from an agent's word: its KV
geometry (layers, KV heads, head dim, dtype) is unknown to the agent and a wrong guess
would mislead the planner. An engine whose model is not configured stays *unmatched*: its
live state is kept under the node in hot state ("unmatched_engines") and logged, and it
becomes a Worker on the next hello after an operator adds the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from controlplane import audit
from controlplane.topology.choices import EngineKind, NodeStatus, Role, Transport, WorkerState
from controlplane.topology.models import GPU, NIC, Node, ServedModel, Worker

log = logging.getLogger(__name__)


@dataclass
class ReconcileResult:
    workers: dict[str, int | None] = field(default_factory=dict)  # engine id → worker id
    unmatched: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    flagged_missing: list[str] = field(default_factory=list)


@transaction.atomic
def reconcile_inventory(node: Node, inventory: dict) -> ReconcileResult:
    result = ReconcileResult()
    _reconcile_gpus(node, inventory.get("gpus", []), result)
    _reconcile_nics(node, inventory.get("nics", []), result)
    _reconcile_engines(node, inventory.get("engines", []), result)
    return result


def accept_hello(node_id: int, agent_version, protocol_version, inventory: dict,
                 agent_metrics_url: str | None = None) -> ReconcileResult:
    """Store an announced inventory (a hello's, or an inventory frame's with no agent
    version) and mark the node online, unless an operator holds it in maintenance."""
    with transaction.atomic():
        # The row lock serialises reconciles of one node (an old and a new connection may
        # overlap); reconciles of different nodes run side by side.
        node = Node.objects.select_for_update().get(pk=node_id)
        with audit.actor_node(node):  # inventory changes are the node's, in the change log
            result = reconcile_inventory(node, inventory)
    updates = {"status": NodeStatus.ONLINE, "last_seen": timezone.now()}
    if agent_version is not None:
        updates.update(agent_version=agent_version[:32], agent_protocol=protocol_version)
    if agent_metrics_url is not None:
        updates["agent_metrics_url"] = agent_metrics_url
    Node.objects.filter(pk=node_id).exclude(status=NodeStatus.MAINTENANCE).update(**updates)
    return result


def known_engines(node_id: int, cluster_id: int, inventory: dict
                  ) -> tuple[dict[str, int | None], list[str]]:
    """For the welcome: engine id → existing worker id (None if not yet a worker), and the
    engines whose model this cluster does not serve (they stay unmatched, as reconcile says)."""
    existing = dict(Worker.objects.filter(node_id=node_id).values_list("name", "pk"))
    served = set(ServedModel.objects.filter(cluster_id=cluster_id).values_list("name",
                                                                                flat=True))
    engines = inventory.get("engines", [])
    known = {e["id"]: existing.get(e["id"]) for e in engines}
    return known, [e["id"] for e in engines if e.get("model") not in served]


def nvlink_groups(gpus: list[dict]) -> dict[int, int]:
    """GPU index → NVLink group number (the lowest index of its connected set of peers);
    GPUs without peers get no group."""
    peers = {g["index"]: set(g.get("nvlink_peers") or ()) for g in gpus}
    group: dict[int, int] = {}
    for start in sorted(peers):
        if start in group or not peers[start]:
            continue
        stack, members = [start], set()
        while stack:
            i = stack.pop()
            if i in members or i not in peers:
                continue
            members.add(i)
            stack.extend(peers[i] - members)
        for i in members:
            group[i] = min(members)
    return group


def _reconcile_gpus(node: Node, gpus: list[dict], result: ReconcileResult) -> None:
    existing = {g.index: g for g in node.gpus.all()}
    groups = nvlink_groups(gpus)
    announced = set()
    for item in gpus:
        index = item["index"]
        announced.add(index)
        gpu = existing.get(index)
        uuid = item["uuid"]
        memory = item.get("memory_total_bytes") or None
        if gpu is None:
            if GPU.objects.filter(uuid=uuid).exists():
                log.warning("node %s announces GPU %s already registered elsewhere", node, uuid)
                continue
            if not memory:
                log.warning("node %s: GPU %s has no memory size; not added", node, index)
                continue
            GPU.objects.create(node=node, index=index, uuid=uuid,
                               product_name=item.get("name") or "unknown", memory_bytes=memory,
                               nvlink_group=groups.get(index))
            result.created.append(f"gpu{index}")
            continue
        changed = []
        if gpu.missing:
            gpu.missing = False
            changed.append("missing")
        if gpu.uuid != uuid and not GPU.objects.filter(uuid=uuid).exclude(pk=gpu.pk).exists():
            gpu.uuid = uuid
            changed.append("uuid")
        if memory and gpu.memory_bytes != memory:
            gpu.memory_bytes = memory
            changed.append("memory_bytes")
        # Only what the agent can see: an operator's grouping stays unless peers are reported.
        if index in groups and gpu.nvlink_group != groups[index]:
            gpu.nvlink_group = groups[index]
            changed.append("nvlink_group")
        if changed:
            gpu.save(update_fields=[*changed, "updated"])
    gone = [g for i, g in existing.items() if i not in announced and not g.missing]
    for gpu in gone:
        gpu.missing = True
        gpu.save(update_fields=["missing", "updated"])
        result.flagged_missing.append(f"gpu{gpu.index}")


def _reconcile_nics(node: Node, nics: list[dict], result: ReconcileResult) -> None:
    existing = {n.name: n for n in node.nics.all()}
    announced = set()
    for item in nics:
        name = item["name"]
        announced.add(name)
        nic = existing.get(name)
        rate = item.get("line_rate_gbps") or 0
        if nic is None:
            if rate <= 0:  # unknown speed (virtual NIC): keep its counters, not a topology link
                continue
            transport = item.get("transport") or Transport.ETHERNET
            NIC.objects.create(node=node, name=name, line_rate_gbps=rate, transport=transport,
                               rdma=bool(item.get("rdma")) and transport != Transport.ETHERNET)
            result.created.append(name)
        elif nic.missing:
            nic.missing = False
            nic.save(update_fields=["missing", "updated"])
    for nic in existing.values():
        if nic.name not in announced and not nic.missing:
            nic.missing = True
            nic.save(update_fields=["missing", "updated"])
            result.flagged_missing.append(nic.name)


def _reconcile_engines(node: Node, engines: list[dict], result: ReconcileResult) -> None:
    existing = {w.name: w for w in node.workers.all()}
    models = {m.name: m for m in ServedModel.objects.filter(cluster_id=node.cluster_id)}
    gpus = {g.index: g for g in node.gpus.all()}
    announced = set()
    for item in engines:
        name = item["id"]
        announced.add(name)
        worker = existing.get(name)
        role = item.get("role") or ""
        if worker is None:
            model = models.get(item["model"])
            if model is None:
                log.warning("node %s: engine %s serves %r, which is not a configured model "
                            "of cluster %s; left unmatched", node, name, item["model"],
                            node.cluster_id)
                result.workers[name] = None
                result.unmatched.append(name)
                continue
            worker = Worker.objects.create(
                served_model=model, node=node, name=name,
                tp_size=item.get("tp") or max(1, len(item.get("gpus", []))),
                engine_kind=item.get("kind") or EngineKind.VLLM,
                api_url=item.get("api_url") or "",
                metrics_url=item.get("metrics_url") or "",
                kv_events_endpoint=item.get("kv_events_endpoint") or "",
                kv_replay_endpoint=item.get("kv_replay_endpoint") or "",
                desired_role=role or Role.BOTH, observed_role=role,
            )
            worker.gpus.set([gpus[i] for i in item.get("gpus", []) if i in gpus])
            result.created.append(name)
        else:
            changed = []
            for attr, key in (("api_url", "api_url"), ("metrics_url", "metrics_url"),
                              ("kv_events_endpoint", "kv_events_endpoint"),
                              ("kv_replay_endpoint", "kv_replay_endpoint")):
                value = item.get(key)
                if value and getattr(worker, attr) != value:
                    setattr(worker, attr, value)
                    changed.append(attr)
            if role and worker.observed_role != role:
                worker.observed_role = role
                changed.append("observed_role")
            if worker.state == WorkerState.MISSING:
                worker.state = WorkerState.ACTIVE
                changed.append("state")
            if changed:
                worker.save(update_fields=[*changed, "updated"])
        result.workers[name] = worker.pk
    for worker in existing.values():
        if worker.name not in announced and worker.state != WorkerState.MISSING:
            worker.state = WorkerState.MISSING
            worker.save(update_fields=["state", "updated"])
            result.flagged_missing.append(worker.name)


def record_observed(worker_id: int, role: str | None, generation: int | None) -> None:
    """Store what a report says a worker is doing now (called only when it changes)."""
    updates = {}
    if role:
        updates["observed_role"] = role
    if generation is not None:
        updates["observed_generation"] = generation
    if updates:
        Worker.objects.filter(pk=worker_id).update(**updates)
