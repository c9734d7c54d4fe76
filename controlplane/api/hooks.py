"""Calls into other apps after an API action, tolerant of apps that are not there yet."""

from __future__ import annotations

import importlib
import logging

from django.db import transaction

log = logging.getLogger(__name__)


def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def after_worker_state_change(worker, verb: str, actor_name: str) -> None:
    """Tell the node's agent (command API) and ask for a routing-table publish, after commit."""
    send_command = _optional("controlplane.telemetry.commands", "send_command")
    request_publish = _optional("controlplane.routing.service", "request_publish")
    cluster_id = worker.node.cluster_id

    def run():
        if send_command is not None:
            try:
                args = {"worker": worker.name, "worker_id": worker.pk,
                        "generation": worker.generation}
                send_command(worker.node_id, verb, args)
            except Exception:
                log.exception("send_command(%s, %s) failed", worker.node, verb)
        if request_publish is not None:
            try:
                request_publish(cluster_id, cause=f"worker {verb}: {worker}", actor=actor_name)
            except Exception:
                log.exception("request_publish(%s) failed", cluster_id)

    transaction.on_commit(run)
