"""Operator actions on workers, shared by the UI and the REST API.

Draining a worker means: the routing table marks it draining (the gateway sends it no new
work), the node's agent is told (its drain hook may, e.g., stop accepting at the engine),
and the planner will not count it as capacity. Resuming reverses that. Both bump the
worker's ``generation`` so the agent can report when it has acted.
"""

from __future__ import annotations

import logging

from django.db import transaction

from controlplane.audit import log_action
from controlplane.topology.choices import WorkerState
from controlplane.topology.models import Worker

log = logging.getLogger(__name__)


class ActionError(ValueError):
    """The action does not apply to the worker in its current state."""


def _after_commit(worker: Worker, command: str, cause: str, actor: str) -> None:
    def notify():
        try:
            from controlplane.telemetry.commands import send_command
        except ImportError:
            send_command = None
        if send_command is not None:
            try:
                send_command(worker.node_id, command, {"engine": worker.name,
                                                       "generation": worker.generation})
            except Exception:  # the node may be offline; the table change still applies
                log.warning("could not reach the agent of %s for %s", worker, command,
                            exc_info=True)
        try:
            from controlplane.routing.service import request_publish
        except ImportError:
            return
        request_publish(worker.node.cluster_id, cause=cause, actor=actor)

    transaction.on_commit(notify)


@transaction.atomic
def drain_worker(worker: Worker, actor: str) -> Worker:
    worker = Worker.objects.select_for_update().select_related("node").get(pk=worker.pk)
    if worker.state == WorkerState.DRAINING:
        raise ActionError(f"{worker} is already draining")
    worker.state = WorkerState.DRAINING
    worker.generation += 1
    worker.save(update_fields=["state", "generation", "updated"])
    log_action(worker, "drain")
    _after_commit(worker, "drain", f"drain {worker} by {actor}", actor)
    return worker


@transaction.atomic
def resume_worker(worker: Worker, actor: str) -> Worker:
    worker = Worker.objects.select_for_update().select_related("node").get(pk=worker.pk)
    if worker.state == WorkerState.ACTIVE:
        raise ActionError(f"{worker} is already active")
    worker.state = WorkerState.ACTIVE
    worker.generation += 1
    worker.save(update_fields=["state", "generation", "updated"])
    log_action(worker, "resume")
    _after_commit(worker, "resume", f"resume {worker} by {actor}", actor)
    return worker
