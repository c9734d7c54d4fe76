"""Differences between two routing tables, as a list of plain-language changes. Pure."""

from __future__ import annotations

from typing import Any

_MODEL_FIELDS = ("mode", "kv_block_size", "routing", "disaggregation", "max_model_len")
_WORKER_FIELDS = ("url", "role", "state", "node", "capacity", "kv_events", "kv_paths")


def diff_tables(old: dict[str, Any] | None, new: dict[str, Any]) -> list[dict[str, Any]]:
    """Changes from ``old`` to ``new``: dicts with ``kind``, ``model``, ``worker``, ``field``,
    ``old`` and ``new`` (the last four when they apply). Order is deterministic."""
    changes: list[dict[str, Any]] = []
    old_models = {m["name"]: m for m in (old or {}).get("models", [])}
    new_models = {m["name"]: m for m in new.get("models", [])}
    for name in sorted(old_models.keys() - new_models.keys()):
        changes.append({"kind": "model_removed", "model": name})
    for name in sorted(new_models.keys() - old_models.keys()):
        changes.append({"kind": "model_added", "model": name})
    for name in sorted(old_models.keys() & new_models.keys()):
        a, b = old_models[name], new_models[name]
        for field in _MODEL_FIELDS:
            if a.get(field) != b.get(field):
                changes.append(
                    {"kind": "model_changed", "model": name, "field": field,
                     "old": a.get(field), "new": b.get(field)}
                )
        changes.extend(_worker_changes(name, a.get("workers", []), b.get("workers", [])))
    return changes


def _worker_changes(model: str, old: list, new: list) -> list[dict[str, Any]]:
    changes: list[dict[str, Any]] = []
    a = {w["id"]: w for w in old}
    b = {w["id"]: w for w in new}
    for wid in sorted(a.keys() - b.keys()):
        changes.append({"kind": "worker_removed", "model": model, "worker": wid})
    for wid in sorted(b.keys() - a.keys()):
        changes.append({"kind": "worker_added", "model": model, "worker": wid})
    for wid in sorted(a.keys() & b.keys()):
        for field in _WORKER_FIELDS:
            if a[wid].get(field) != b[wid].get(field):
                changes.append(
                    {"kind": "worker_changed", "model": model, "worker": wid, "field": field,
                     "old": a[wid].get(field), "new": b[wid].get(field)}
                )
    return changes


def summarize(changes: list[dict[str, Any]]) -> str:
    """One line for logs and the UI, e.g. ``"m: worker h1/e0 state active→draining"``."""
    parts = []
    for c in changes:
        if c["kind"] == "worker_changed" and c["field"] in ("role", "state", "url"):
            parts.append(f"{c['model']}: {c['worker']} {c['field']} {c['old']}→{c['new']}")
        elif c["kind"] in ("worker_changed", "model_changed"):
            target = c.get("worker") or c["model"]
            parts.append(f"{c['model']}: {target} {c['field']} changed")
        else:
            parts.append(f"{c['kind'].replace('_', ' ')} {c.get('worker') or c['model']}")
    return "; ".join(parts) if parts else "no changes"
