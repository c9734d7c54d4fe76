"""Which workers change role this cycle on the way to a target layout.

Pure. Split out of :mod:`.planner` (its "step" step): given the concrete placement of the
target and the per-cycle limit, pick the role changes, idlest first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .placement import Placement, WorkerInput


def target_role(placed: str, aggregated: bool) -> str:
    """Aggregated: everyone 'both'. Split: prefill, and pure decode on the other side (a
    'both' worker serves whole requests in place and would leave the prefill pool idle)."""
    if aggregated:
        return "both"
    return "prefill" if placed == "prefill" else "decode"


def eligible(w: WorkerInput, now: float, cooldown_s: float,
             waive_since: float | None = None) -> str:
    """'' when the worker may change role now, else why not. ``waive_since``: the decision
    time of the last move when the load has since moved past the turn-back margin; a worker
    changed at or after it is then out of its cooldown (the cooldown stops reversals on
    noise, and a load shift past that margin is not noise — see dwell.cooldown_waiver)."""
    if w.stale:
        return "stale"
    if w.state != "active":
        return w.state
    if in_cooldown(w, now, cooldown_s) and (waive_since is None or w.changed_at < waive_since):
        return "cooldown"
    return ""


def in_cooldown(w: WorkerInput, now: float, cooldown_s: float) -> bool:
    return w.changed_at is not None and now - w.changed_at < cooldown_s


@dataclass
class Wanted:
    """Role changes toward a target, split by what they cost."""

    wanted: list[tuple[WorkerInput, str]]
    heavy: list[tuple[WorkerInput, str]]  # into or out of prefill: drains, moves capacity
    light: list[tuple[WorkerInput, str]]  # both ↔ decode: every sequence stays where it is
    blocked: dict[str, int]


def wanted_changes(
    workers: list[WorkerInput], placement: Placement | None, now: float, cooldown_s: float,
    waive_since: float | None = None,
) -> Wanted:
    aggregated = placement is None
    wanted, movable, blocked = [], [], {}
    for x in workers:
        role = target_role(placement.roles[x.id] if placement else "both", aggregated)
        if role == x.role:
            continue
        wanted.append((x, role))
        why = eligible(x, now, cooldown_s, waive_since)
        if why:
            blocked[why] = blocked.get(why, 0) + 1
        else:
            movable.append((x, role))
    heavy = [(x, r) for x, r in movable if "prefill" in (x.role, r)]
    light = [(x, r) for x, r in movable if "prefill" not in (x.role, r)]
    heavy.sort(key=lambda t: (t[0].running + t[0].waiting, t[0].name, t[0].id))
    return Wanted(wanted, heavy, light, blocked)


def take_up_to(
    w: Wanted, limit: int, workers: list[WorkerInput], placement: Placement | None,
    target_prefill: int, target_decode: int,
) -> list[tuple[WorkerInput, str]]:
    """At most ``limit`` heavy changes; relabels between both and decode ride along in
    proportion, so that after each step the pure decode workers (the only ones that send
    prompts to the prefill pool) match the prefill workers in the target ratio, and the
    rest keep serving whole requests in place."""
    aggregated = placement is None
    cur_p = sum(1 for x in workers if x.role == "prefill")
    d_now = sum(1 for x in workers if x.role == "decode")
    take = w.heavy[:limit]
    p_after = cur_p + sum(1 for _x, r in take if r == "prefill") - sum(
        1 for x, _r in take if x.role == "prefill"
    )
    d_after_heavy = d_now - sum(1 for x, _r in take if x.role == "decode")
    n = len(workers)
    if target_prefill > 0:
        d_goal = min(math.ceil(p_after * target_decode / target_prefill), n - p_after)
    else:
        d_goal = math.ceil(d_now * p_after / cur_p) if cur_p else 0
    if len(w.heavy) <= len(take):  # last step: everything goes
        d_goal = sum(
            1 for x in workers
            if target_role(placement.roles[x.id] if placement else "both", aggregated)
            == "decode"
        )
    nodes_moving = {x.node for x, _r in take}
    rest = sorted(
        w.light, key=lambda t: (t[0].node not in nodes_moving, t[0].running, t[0].name, t[0].id)
    )
    if target_prefill > 0:
        return take + rest[: max(d_goal - d_after_heavy, 0)]
    return take + rest[: max(d_after_heavy - d_goal, 0)]


def roles_after(
    workers: list[WorkerInput], take: list[tuple[WorkerInput, str]]
) -> dict[int, str]:
    new = {x.id: r for x, r in take}
    return {x.id: new.get(x.id, x.role) for x in workers}
