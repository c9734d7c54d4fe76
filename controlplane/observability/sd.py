"""Prometheus HTTP service discovery (``http_sd_configs``) from the topology.

Prometheus re-reads this list every refresh interval, so when the planner flips a worker's
role the ``role`` label on its engine's series follows without touching Prometheus config.
"""

from __future__ import annotations

from urllib.parse import urlsplit


def _target(url: str) -> tuple[str, str, str] | None:
    parts = urlsplit(url)
    if not parts.hostname:
        return None
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{port}", parts.path or "/metrics", parts.scheme or "http"


def engine_groups(workers: list[dict]) -> list[dict]:
    """One target group per worker: ``workers`` are plain dicts (see :func:`targets`)."""
    groups = []
    for w in workers:
        url = w["metrics_url"] or (w["api_url"].rstrip("/") + "/metrics")
        parsed = _target(url)
        if parsed is None:
            continue
        address, path, scheme = parsed
        groups.append(
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": path,
                    "__scheme__": scheme,
                    "job": f"pdplane-engine-{w['engine_kind']}",
                    "cluster": w["cluster"],
                    "node": w["node"],
                    "model": w["model"],
                    "worker": f"{w['node']}/{w['name']}",
                    "role": w["role"],
                    "state": w["state"],
                },
            }
        )
    return groups


def gateway_groups(gateways: list[dict]) -> list[dict]:
    groups = []
    for g in gateways:
        parsed = _target(g["url"])
        if parsed is None:
            continue
        address, _, scheme = parsed
        groups.append(
            {
                "targets": [address],
                "labels": {
                    "__metrics_path__": "/metrics",
                    "__scheme__": scheme,
                    "job": "pdplane-gateway",
                    "cluster": g["cluster"],
                    "gateway": g["name"],
                },
            }
        )
    return groups


def agent_groups(nodes: list[dict]) -> list[dict]:
    """Agents that announced a metrics port in their hello."""
    groups = []
    for n in nodes:
        parsed = _target(n["metrics_url"]) if n["metrics_url"] else None
        if parsed is None:
            continue
        address, path, scheme = parsed
        groups.append({
            "targets": [address],
            "labels": {"__metrics_path__": path, "__scheme__": scheme, "job": "pdplane-agent",
                       "cluster": n["cluster"], "node": n["hostname"]},
        })
    return groups


def targets(cluster: str | None = None, visible=None) -> list[dict]:
    """Every engine, gateway and agent (optionally of one cluster), in http_sd format;
    only of the ``visible`` clusters (a Cluster queryset) when given."""
    from controlplane.topology.models import Gateway, Node, Worker

    workers = Worker.objects.select_related("node__cluster", "served_model")
    gateways = Gateway.objects.select_related("cluster")
    nodes = Node.objects.exclude(agent_metrics_url="").select_related("cluster")
    if visible is not None:
        workers = workers.filter(node__cluster__in=visible)
        gateways = gateways.filter(cluster__in=visible)
        nodes = nodes.filter(cluster__in=visible)
    if cluster:
        workers = workers.filter(node__cluster__name=cluster)
        gateways = gateways.filter(cluster__name=cluster)
        nodes = nodes.filter(cluster__name=cluster)
    worker_rows = [
        {
            "metrics_url": w.metrics_url,
            "api_url": w.api_url,
            "engine_kind": w.engine_kind,
            "cluster": w.node.cluster.name,
            "node": w.node.hostname,
            "name": w.name,
            "model": w.served_model.name,
            "role": w.desired_role,
            "state": w.state,
        }
        for w in workers
    ]
    gateway_rows = [{"url": g.url, "cluster": g.cluster.name, "name": g.name} for g in gateways]
    node_rows = [{"metrics_url": n.agent_metrics_url, "cluster": n.cluster.name,
                  "hostname": n.hostname} for n in nodes]
    return engine_groups(worker_rows) + gateway_groups(gateway_rows) + agent_groups(node_rows)
