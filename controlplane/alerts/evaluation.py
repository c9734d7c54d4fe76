"""Glue: one evaluation cycle — snapshot → rules → lifecycle → stored state → outbox.

Everything between loading the state and queuing the deliveries happens in one
transaction, under a row lock on the evaluator's memory row, so two evaluations (a beat
tick and a manual run) never interleave, and a notification is queued if and only if
the state that says "notified" is stored.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from django.db import transaction
from django.utils import timezone

from controlplane.outbox.tasks import kick

from . import lifecycle, rules
from .conf import AlertsConf, load
from .delivery import enqueue_notification
from .models import (
    WEBHOOK_KIND,
    Alert,
    AlertGroup,
    AlertRule,
    EvaluatorMemory,
    Silence,
    WebhookEndpoint,
)

log = logging.getLogger(__name__)


@dataclass
class CycleSummary:
    observations: int
    open_alerts: int
    notifications: int
    deliveries: int


def _ts(dt: datetime | None) -> float | None:
    return dt.timestamp() if dt else None


def _dt(ts: float | None) -> datetime | None:
    return datetime.fromtimestamp(ts, tz=UTC) if ts is not None else None


def rule_configs() -> tuple[dict[str, rules.RuleConfig], dict[str, dict[str, rules.RuleConfig]]]:
    """(global configs, {cluster name: configs}) from the defaults and AlertRule rows."""
    base = dict(rules.DEFAULT_RULES)
    per_cluster: dict[str, dict[str, rules.RuleConfig]] = defaultdict(dict)
    rows = list(AlertRule.objects.select_related("cluster"))
    for row in rows:
        if row.cluster_id is None and row.rule in base:
            base[row.rule] = rules.merge_rule_config(base[row.rule], row.override())
    for row in rows:
        if row.cluster_id is not None and row.rule in base:
            current = per_cluster[row.cluster.name].get(row.rule, base[row.rule])
            per_cluster[row.cluster.name][row.rule] = rules.merge_rule_config(
                current, row.override()
            )
    return base, per_cluster


def evaluate_snapshot(snapshot: rules.FleetSnapshot, memory: dict) -> rules.EvaluationResult:
    """Rules per cluster (each with its own overrides), plus the fleet-wide facts."""
    base, per_cluster = rule_configs()
    clusters = sorted(
        {n.cluster for n in snapshot.nodes}
        | {w.cluster for w in snapshot.workers}
        | {g.cluster for g in snapshot.gateways}
        | {p.cluster for p in snapshot.plans}
    )
    total = rules.EvaluationResult(memory={"nic": {}, "hit": {}, "kvseq": {}})
    parts = [
        replace(
            snapshot,
            nodes=tuple(n for n in snapshot.nodes if n.cluster == c),
            workers=tuple(w for w in snapshot.workers if w.cluster == c),
            gateways=tuple(g for g in snapshot.gateways if g.cluster == c),
            plans=tuple(p for p in snapshot.plans if p.cluster == c),
            disabled_endpoints=(),
        )
        for c in clusters
    ]
    configs = [{**base, **per_cluster.get(c, {})} for c in clusters]
    parts.append(rules.FleetSnapshot(snapshot.now, disabled_endpoints=snapshot.disabled_endpoints))
    configs.append(base)
    for part, cfg in zip(parts, configs, strict=True):
        result = rules.evaluate(part, cfg, memory)
        total.observations.extend(result.observations)
        for key, values in result.memory.items():
            total.memory.setdefault(key, {}).update(values)
    return total


def disabled_endpoint_facts() -> tuple[rules.EndpointFacts, ...]:
    """Endpoints pdplane disabled itself (a reason is recorded); a person's switch-off
    carries no reason and raises nothing."""
    return tuple(
        rules.EndpointFacts(e.name, e.disabled_reason)
        for e in WebhookEndpoint.objects.filter(enabled=False).exclude(disabled_reason="")
    )


def _state_of(row: Alert) -> lifecycle.AlertState:
    return lifecycle.AlertState(
        fingerprint=row.fingerprint,
        labels=dict(row.labels),
        annotations=dict(row.annotations),
        status=row.status,
        active_since=row.active_since.timestamp(),
        for_s=row.for_seconds,
        starts_at=_ts(row.starts_at),
        ends_at=_ts(row.ends_at),
        notified_firing=row.notified_firing,
        acknowledged=row.acknowledged_at is not None,
        silenced=row.silenced,
    )


def _apply_state(row: Alert, s: lifecycle.AlertState, now: datetime, conf: AlertsConf) -> None:
    row.rule = s.rule
    row.severity = s.severity or "warning"
    row.labels = s.labels
    row.annotations = s.annotations
    row.group_key = lifecycle.group_key_for(lifecycle.group_labels_for(s.labels, conf.lifecycle))
    row.status = s.status
    row.for_seconds = s.for_s
    row.active_since = _dt(s.active_since)
    row.starts_at = _dt(s.starts_at)
    row.ends_at = _dt(s.ends_at)
    row.notified_firing = s.notified_firing
    row.silenced = s.silenced
    if not s.acknowledged:
        row.acknowledged_at, row.acknowledged_by = None, None
    row.last_evaluated_at = now


def run_cycle(
    now: datetime | None = None,
    snapshot: rules.FleetSnapshot | None = None,
    conf: AlertsConf | None = None,
) -> CycleSummary:
    conf = conf or load()
    now = now or timezone.now()
    if snapshot is None:
        from .inputs import build_snapshot

        snapshot = build_snapshot(now)
    # The alerts app's own facts come from its own tables, whoever built the snapshot.
    snapshot = replace(snapshot, disabled_endpoints=disabled_endpoint_facts())
    with transaction.atomic():
        EvaluatorMemory.objects.get_or_create(name="default")
        memory_row = EvaluatorMemory.objects.select_for_update().get(name="default")
        result = evaluate_snapshot(snapshot, memory_row.data)
        memory_row.data = result.memory
        memory_row.save(update_fields=["data", "updated"])

        rows = {a.fingerprint: a for a in Alert.objects.select_for_update().filter(is_open=True)}
        group_rows = {g.group_key: g for g in AlertGroup.objects.all()}
        silences = [
            lifecycle.Silence(dict(s.matchers), s.starts_at.timestamp(), s.ends_at.timestamp())
            for s in Silence.objects.filter(starts_at__lte=now, ends_at__gt=now)
        ]
        step = lifecycle.advance(
            {fp: _state_of(r) for fp, r in rows.items()},
            {
                k: lifecycle.GroupState(
                    k,
                    dict(g.group_labels),
                    _ts(g.first_ready_at),
                    _ts(g.last_notified_at),
                    g.last_digest,
                )
                for k, g in group_rows.items()
            },
            result.observations,
            now.timestamp(),
            silences,
            conf.lifecycle,
        )

        for fp, state in step.alerts.items():
            row = rows.get(fp) or Alert(fingerprint=fp, is_open=True)
            _apply_state(row, state, now, conf)
            row.save()
        closed = {s.fingerprint: s for s in step.closed}
        for fp, row in rows.items():
            if fp in step.alerts:
                continue
            if fp in closed:
                _apply_state(row, closed[fp], now, conf)
                row.is_open = False
                row.save()
            else:
                row.delete()  # a pending alert that flapped: never fired, no record

        for key, g in step.groups.items():
            AlertGroup.objects.update_or_create(
                group_key=key,
                defaults={
                    "group_labels": g.group_labels,
                    "first_ready_at": _dt(g.first_ready_at),
                    "last_notified_at": _dt(g.last_notified_at),
                    "last_digest": g.last_digest,
                },
            )
        AlertGroup.objects.exclude(group_key__in=list(step.groups)).delete()

        deliveries = 0
        for n in step.notifications:
            deliveries += len(enqueue_notification(n, now=now, conf=conf))
        if deliveries and conf.kick_sweeper:
            _kick_sweeper()  # runs once the transaction commits

    return CycleSummary(
        len(result.observations), len(step.alerts), len(step.notifications), deliveries
    )


def _kick_sweeper() -> None:
    """Send new deliveries now rather than at the next beat tick (best effort)."""
    kick(WEBHOOK_KIND)


def acknowledge(alert: Alert, user) -> None:
    Alert.objects.filter(pk=alert.pk, is_open=True).update(
        acknowledged_at=timezone.now(), acknowledged_by=user
    )
