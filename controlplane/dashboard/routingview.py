"""Routing-table history as readable diffs: which worker changed role or state, which
weights moved and by how much — rather than "kv_paths changed"."""

from __future__ import annotations

from typing import Any

# Shown first: what an operator watching a move cares about.
_ORDER = {"role": 0, "state": 1, "capacity": 2}


def _short(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return f"{len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_short(v)}" for k, v in sorted(value.items())) or "{}"
    return str(value)


def _nested(old: Any, new: Any) -> str:
    """What moved inside a dict or list field, e.g. "+2 paths, −1" or "weight 0.4 → 0.6"."""
    if isinstance(old, dict) and isinstance(new, dict):
        parts = []
        for key in sorted(old.keys() | new.keys()):
            a, b = old.get(key), new.get(key)
            if a != b:
                parts.append(f"{key} {_short(a)} → {_short(b)}")
        return "; ".join(parts)
    if isinstance(old, list) and isinstance(new, list):
        as_key = [repr(x) for x in old], [repr(x) for x in new]
        added = len(set(as_key[1]) - set(as_key[0]))
        removed = len(set(as_key[0]) - set(as_key[1]))
        return f"+{added} / −{removed} (now {len(new)})"
    return f"{_short(old)} → {_short(new)}"


def change_lines(changes: list[dict[str, Any]]) -> list[dict[str, str]]:
    """One readable line per change: ``{"who", "what", "detail", "kind"}``."""
    lines = []
    for c in changes:
        kind = c["kind"]
        who = f"{c['model']} / {c['worker']}" if c.get("worker") else c["model"]
        if kind.endswith("_added") or kind.endswith("_removed"):
            lines.append({"who": who, "what": kind.split("_")[1], "detail": "", "kind": kind})
            continue
        field = c.get("field", "")
        lines.append({"who": who, "what": field, "kind": kind,
                      "detail": _nested(c.get("old"), c.get("new"))})
    lines.sort(key=lambda x: (_ORDER.get(x["what"], 9), x["who"]))
    return lines
