"""Alert lifecycle: pending → firing → resolved, grouped notifications. Pure: no Django.

Modelled on Prometheus + Alertmanager (``reference/RELIABILITY.md``):

- An observation is *pending* until its condition has held for the rule's ``for``
  duration; an observation that disappears while pending leaves no trace (flapping within
  ``for`` produces no notice).
- Alerts are deduplicated by a fingerprint of their labels.
- Alerts are grouped by ``group_by`` labels; a group's first notice waits ``group_wait``
  (so alerts that start together arrive together), later changes wait ``group_interval``,
  and an unchanged firing group is re-sent every ``repeat_interval``.
- A silence (labels + time window) keeps matching alerts out of firing notices.
  Acknowledged alerts are not re-sent by the repeat interval.
- A resolved notice is sent only for an alert that was notified as firing; a silenced
  alert that was already notified still gets its resolved notice, so the receiver's
  incident closes.

:func:`advance` is a step function: state in, state and notifications out. The glue in
``tasks.py`` loads the state from the database, calls it and stores the result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from .rules import Observation

PENDING = "pending"
FIRING = "firing"
RESOLVED = "resolved"


def fingerprint(labels: Mapping[str, str]) -> str:
    """Stable 16-hex-digit id of a label set (order-independent)."""
    canonical = "\x1f".join(f"{k}\x1e{labels[k]}" for k in sorted(labels))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class LifecycleConfig:
    group_by: tuple[str, ...] = ("alertname", "cluster")
    group_wait_s: float = 30.0
    group_interval_s: float = 300.0
    repeat_interval_s: float = 4 * 3600.0


@dataclass(frozen=True)
class Silence:
    """Mutes alerts whose labels include every matcher, between ``starts_at`` and ``ends_at``."""

    matchers: Mapping[str, str]
    starts_at: float
    ends_at: float

    def matches(self, labels: Mapping[str, str], now: float) -> bool:
        if not (self.starts_at <= now < self.ends_at) or not self.matchers:
            return False
        return all(labels.get(k) == v for k, v in self.matchers.items())


@dataclass
class AlertState:
    fingerprint: str
    labels: dict[str, str]  # includes alertname and severity
    annotations: dict[str, str]
    status: str  # pending | firing | resolved
    active_since: float  # when the condition was first seen (this episode)
    for_s: float = 0.0
    starts_at: float | None = None  # when it started firing
    ends_at: float | None = None  # when it resolved
    notified_firing: bool = False
    acknowledged: bool = False
    silenced: bool = False

    @property
    def rule(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def severity(self) -> str:
        return self.labels.get("severity", "")


@dataclass
class GroupState:
    group_key: str
    group_labels: dict[str, str]
    first_ready_at: float | None = None  # when it first had something to send
    last_notified_at: float | None = None
    last_digest: str = ""  # what the last notice (or silent update) said was firing


@dataclass
class Notification:
    group_key: str
    group_labels: dict[str, str]
    status: str  # firing if any alert in it fires, else resolved
    alerts: list[AlertState]
    reason: str  # first | changed | repeat


@dataclass
class StepResult:
    alerts: dict[str, AlertState]
    groups: dict[str, GroupState]
    notifications: list[Notification] = field(default_factory=list)
    # Alerts whose episode is over (resolved and notified, or never notified): the glue
    # archives them.
    closed: list[AlertState] = field(default_factory=list)


def group_labels_for(labels: Mapping[str, str], config: LifecycleConfig) -> dict[str, str]:
    return {k: labels[k] for k in config.group_by if k in labels}


def group_key_for(group_labels: Mapping[str, str]) -> str:
    """Alertmanager's spelling: ``{}:{alertname="X", cluster="c"}``."""
    inner = ", ".join(f'{k}="{group_labels[k]}"' for k in sorted(group_labels))
    return "{}:{" + inner + "}"


def _digest(fingerprints: Iterable[str]) -> str:
    return ",".join(sorted(fingerprints))


def advance(
    alerts: Mapping[str, AlertState],
    groups: Mapping[str, GroupState],
    observations: Sequence[Observation],
    now: float,
    silences: Sequence[Silence] = (),
    config: LifecycleConfig | None = None,
) -> StepResult:
    config = config or LifecycleConfig()
    states = {fp: replace(a, labels=dict(a.labels)) for fp, a in alerts.items()}
    group_states = {k: replace(g) for k, g in groups.items()}
    closed: list[AlertState] = []

    seen: set[str] = set()
    for obs in observations:
        labels = obs.all_labels
        fp = fingerprint(labels)
        if fp in seen:  # dedupe: two rules' subjects that spell the same labels
            continue
        seen.add(fp)
        current = states.get(fp)
        if current is None:
            current = AlertState(fp, labels, dict(obs.annotations), PENDING, now, obs.for_s)
            states[fp] = current
        elif current.status == RESOLVED:
            if current.notified_firing:
                # Came back before its resolved notice went out: to the receiver it never
                # stopped, so it simply keeps firing.
                current.status, current.ends_at = FIRING, None
            else:
                current = AlertState(fp, labels, dict(obs.annotations), PENDING, now, obs.for_s)
                states[fp] = current
        current.annotations = dict(obs.annotations)
        current.for_s = obs.for_s
        if current.status == PENDING and now - current.active_since >= current.for_s:
            current.status, current.starts_at = FIRING, now

    for fp, state in list(states.items()):
        if fp in seen:
            continue
        if state.status == PENDING:
            del states[fp]  # flapped within `for`: no notice, no record
        elif state.status == FIRING:
            state.status, state.ends_at, state.acknowledged = RESOLVED, now, False

    for state in states.values():
        state.silenced = any(s.matches(state.labels, now) for s in silences)

    by_group: dict[str, list[AlertState]] = {}
    for state in states.values():
        glabels = group_labels_for(state.labels, config)
        key = group_key_for(glabels)
        by_group.setdefault(key, []).append(state)
        if key not in group_states:
            group_states[key] = GroupState(key, glabels)

    notifications: list[Notification] = []
    for key in sorted(group_states):
        group = group_states[key]
        members = by_group.get(key, [])
        firing = sorted(
            (a for a in members if a.status == FIRING and not a.silenced),
            key=lambda a: a.fingerprint,
        )
        resolved = sorted(
            (a for a in members if a.status == RESOLVED and a.notified_firing),
            key=lambda a: a.fingerprint,
        )
        digest = _digest(a.fingerprint for a in firing)
        send = False
        reason = ""
        if firing or resolved:
            if group.first_ready_at is None:
                group.first_ready_at = now
            if group.last_notified_at is None:
                send = bool(firing) and now - group.first_ready_at >= config.group_wait_s
                reason = "first"
            else:
                since = now - group.last_notified_at
                if (digest != group.last_digest or resolved) and since >= config.group_interval_s:
                    send, reason = True, "changed"
                elif any(not a.acknowledged for a in firing) and since >= config.repeat_interval_s:
                    send, reason = True, "repeat"
        if send:
            for a in firing:
                a.notified_firing = True
            notifications.append(
                Notification(
                    key,
                    dict(group.group_labels),
                    FIRING if firing else RESOLVED,
                    [replace(a) for a in firing + resolved],
                    reason,
                )
            )
            group.last_notified_at = now
            group.last_digest = digest
            for a in resolved:
                closed.append(states.pop(a.fingerprint))
        elif not firing and not resolved and group.last_notified_at is not None:
            # Everything notified is silenced now: remember that, so lifting the silence
            # counts as a change.
            group.last_digest = digest

        # Resolved alerts that were never announced end quietly.
        for a in members:
            if a.status == RESOLVED and not a.notified_firing and a.fingerprint in states:
                closed.append(states.pop(a.fingerprint))
        if not any(a.fingerprint in states for a in members):
            del group_states[key]

    return StepResult(states, group_states, notifications, closed)
