"""Publishing routing tables: snapshot the cluster, build, store a new version if changed,
and queue a delivery to every push gateway once the transaction commits.

Entry point for the rest of pdplane: :func:`request_publish`. Call it after any change
that may alter a table (worker role/state, topology, policy); it is cheap when nothing
changed, and the periodic reconcile (tasks.reconcile_routing) calls it too, so a missed
call costs at most one reconcile interval.
"""

from __future__ import annotations

import contextlib
import logging

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from controlplane.outbox import store as outbox
from controlplane.outbox.tasks import kick
from controlplane.policies.effective import DEFAULT_POLICY, PolicyError
from controlplane.policies.models import effective_policy_for
from controlplane.topology.choices import GatewayKind
from controlplane.topology.models import Cluster, Fabric, Gateway, Node, ServedModel

from .builder import build_table, content_sha
from .models import ROUTING_PUSH_KIND, SUPERSEDED, GatewayDelivery, RoutingTableVersion
from .schema import validate_table

log = logging.getLogger(__name__)

# Gateways that receive PUTs; the others pull (GET with ETag) or are driven by an adapter
# that pulls (gateway/adapters/).
PUSH_KINDS = (GatewayKind.PDPLANE,)


class InvalidRoutingTable(ValidationError):
    """The built table fails its JSON Schema: it was not stored and nothing was pushed
    (every gateway would refuse it and keep — or never get — a table). ``problems`` lists
    what is wrong; the refusal is logged and recorded in the change log."""

    def __init__(self, cluster: str, problems: list[str]):
        self.cluster, self.problems = cluster, problems
        super().__init__(f"routing table of {cluster} not published, it fails its schema: "
                         + "; ".join(problems[:5]))


def request_publish(cluster_id: int, cause: str, actor: str = "system") -> None:
    """Build the cluster's table; if it differs from the latest stored version, store
    version+1 with ``cause`` and ``actor`` and, on commit, push it to the gateways.

    A table that fails its schema is refused (logged, change log); callers that publish as
    a side effect of another change are not failed by it."""
    with contextlib.suppress(InvalidRoutingTable):  # publish() logged and recorded it
        publish(cluster_id, cause, actor)


def publish(cluster_id: int, cause: str, actor: str = "system") -> RoutingTableVersion | None:
    """As :func:`request_publish`, returning the new version (None when unchanged).

    Raises :class:`InvalidRoutingTable` (nothing stored) when the table fails its schema."""
    with transaction.atomic():
        # The row lock serialises publishers of one cluster, so version numbers never
        # collide and "latest" is read consistently.
        cluster = Cluster.objects.select_for_update().get(pk=cluster_id)
        table = build_table(snapshot_cluster(cluster))
        sha = content_sha(table)
        latest = latest_table(cluster.pk)
        if latest is not None and latest.content_sha == sha:
            return None
        table["version"] = (latest.version if latest else 0) + 1
        problems = validate_table(table)
        if not problems:
            return _store(cluster, table, sha, cause, actor)
    # Outside the rolled-back work, so the record of the refusal stays.
    log.error("routing table %s v%d refused before publishing (%s, by %s): %s",
              cluster.name, table["version"], cause, actor, "; ".join(problems[:10]))
    from controlplane import audit

    audit.log_action(cluster, "routing_table_refused",
                     {"cause": cause[:200], "problems": problems[:20]})
    raise InvalidRoutingTable(cluster.name, problems)


def _store(cluster: Cluster, table: dict, sha: str, cause: str, actor: str
           ) -> RoutingTableVersion:
    """Store the checked table as the newest version and queue its deliveries."""
    row = RoutingTableVersion.objects.create(
        cluster=cluster,
        version=table["version"],
        body=table,
        content_sha=sha,
        cause=cause[:200],
        actor=(actor or "system")[:150],
    )
    queue_deliveries(row)
    log.info("routing table %s v%d stored (%s, by %s)", cluster.name, row.version, cause, actor)
    kick(ROUTING_PUSH_KIND)  # the outbox's worker loop sends them once this commits
    return row


def latest_table(cluster_id: int) -> RoutingTableVersion | None:
    return RoutingTableVersion.objects.filter(cluster_id=cluster_id).order_by("-version").first()


def queue_deliveries(row: RoutingTableVersion, gateways=None) -> list[GatewayDelivery]:
    """One pending delivery (an outbox row) per push gateway; older unsent ones are
    superseded."""
    now = timezone.now()
    if gateways is None:
        gateways = Gateway.objects.filter(cluster_id=row.cluster_id, kind__in=PUSH_KINDS)
    created = []
    for gateway in gateways:
        outbox.cancel(GatewayDelivery.objects.filter(gateway=gateway), outcome=SUPERSEDED)
        created.append(
            GatewayDelivery.objects.create(gateway=gateway, table=row, next_attempt_at=now)
        )
    return created


def gateway_lag(gateway: Gateway, latest: RoutingTableVersion | None = None) -> dict:
    """How far a gateway is behind: versions and seconds since the first version it lacks."""
    latest = latest if latest is not None else latest_table(gateway.cluster_id)
    if latest is None or gateway.applied_table_version >= latest.version:
        return {"versions": 0, "seconds": 0.0}
    first_missing = (
        RoutingTableVersion.objects.filter(
            cluster_id=gateway.cluster_id, version__gt=gateway.applied_table_version
        )
        .order_by("version")
        .first()
    )
    since = first_missing.created if first_missing else latest.created
    return {
        "versions": latest.version - gateway.applied_table_version,
        "seconds": max((timezone.now() - since).total_seconds(), 0.0),
    }


def snapshot_cluster(cluster: Cluster) -> dict:
    """Plain-data snapshot of everything :func:`builder.build_table` reads."""
    fabrics = {
        f.name: {"transport": f.transport, "rdma": f.rdma, "line_rate_gbps": f.line_rate_gbps}
        for f in Fabric.objects.filter(cluster=cluster)
    }
    nodes = {}
    for node in Node.objects.filter(cluster=cluster).prefetch_related("nics__fabric"):
        nodes[node.hostname] = {
            "nics": [
                {
                    "name": nic.name,
                    "line_rate_gbps": nic.line_rate_gbps,
                    "rdma": nic.rdma,
                    "fabric": nic.fabric.name if nic.fabric_id else None,
                    "missing": nic.missing,
                }
                for nic in nic_list(node)
            ]
        }
    models = []
    served = ServedModel.objects.filter(cluster=cluster).prefetch_related(
        "workers__gpus", "workers__node"
    )
    for model in served:
        try:
            policy, _sources = effective_policy_for(model)
        except PolicyError as exc:
            # A broken override must not stop routing: publish with defaults and say so.
            log.warning("policy for %s is invalid (%s); routing with defaults", model, exc)
            policy = DEFAULT_POLICY
        models.append(
            {
                "name": model.name,
                "kv_block_size": model.kv_block_size,
                "kv_bytes_per_token": model.kv_bytes_per_token,
                "weight_bytes": model.weight_bytes,
                "max_model_len": model.max_model_len,
                "policy": policy.as_dict(),
                "workers": [_worker_snapshot(w) for w in model.workers.all()],
            }
        )
    return {"cluster": cluster.name, "fabrics": fabrics, "nodes": nodes, "models": models}


def nic_list(node: Node) -> list:
    return sorted(node.nics.all(), key=lambda n: n.name)


def _worker_snapshot(worker) -> dict:
    return {
        "name": worker.name,
        "node": worker.node.hostname,
        "url": worker.api_url,
        "metrics_url": worker.metrics_url,
        "engine": worker.engine_kind,
        "tp_size": worker.tp_size,
        "desired_role": worker.desired_role,
        "observed_role": worker.observed_role,
        "state": worker.state,
        "kv_events_endpoint": worker.kv_events_endpoint,
        "kv_replay_endpoint": worker.kv_replay_endpoint,
        "gpus": [
            {
                "index": g.index,
                "memory_bytes": g.memory_bytes,
                "nvlink_group": g.nvlink_group,
                "nvlink_bandwidth_gbs": g.nvlink_bandwidth_gbs,
                "pcie_gbs": g.pcie_gbs,
            }
            for g in sorted(worker.gpus.all(), key=lambda g: g.index)
        ],
    }

