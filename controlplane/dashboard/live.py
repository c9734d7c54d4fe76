"""Live values for the dashboard, read from the ingest's hot state.

Everything the templates show about *now* goes through :func:`hot_for_nodes`, which returns
plain dicts keyed by node id. A node absent from the result has "no data" — shown as such,
never as zero.
"""

from __future__ import annotations


def hot_for_nodes(node_ids: list[int]) -> dict[int, dict]:
    """Latest hot state per node: ``{node_id: {"gpus": {index: {...}}, "engines": {name: {...}},
    "nics": {name: {...}}, "last_report_at": float | None, "stale": bool}}``."""
    try:
        from controlplane.telemetry import hotstate
    except ImportError:
        return {}
    reader = getattr(hotstate, "nodes_state", None)
    if reader is None:
        return {}
    return reader(node_ids)


def node_history(node_id: int) -> dict[str, dict[str, list[float | None]]]:
    """Last 15 minutes per engine of the node: ``{engine: {metric: [values, oldest first]}}``."""
    try:
        from controlplane.telemetry import hotstate
    except ImportError:
        return {}
    reader = getattr(hotstate, "node_engine_history", None)
    if reader is None:
        return {}
    return reader(node_id)
